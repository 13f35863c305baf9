//! Prometheus metrics under vLLM's names (label `model_name`), so dashboards, autoscaling
//! rules and routers built for vLLM work unchanged, plus `tokenmill_*` metrics for what vLLM
//! lacks (predicted vs measured step time, batch size, rejected requests by reason).
//!
//! Gauges (running, waiting, KV usage, cache config, prefix cache, preemptions, step stats)
//! are read from the engine's stats snapshot at scrape time; counters and histograms of
//! requests are recorded here by the request path ([`crate::generation`]). Rendered by hand
//! in the text exposition format 0.0.4, which `/metrics` declares and vLLM serves.
//!
//! # Why not the `prometheus-client` crate
//!
//! Evaluated with prometheus-client 0.26 over a registry holding these same metrics
//! (`benches/metrics.rs`; `METRICS_BENCH_PRINT=1` prints the three expositions). Neither of its
//! encoders writes what vLLM writes:
//!
//! - Its Prometheus text 0.0.4 encoder (`prometheus_text::encode`) matches 144 of the 191 lines
//!   of a full exposition (names, `_total` counters under `# HELP`/`# TYPE`, label order,
//!   values) but writes the `le` of a whole-number bucket bound as Go does, `le="1"`, where
//!   vLLM (Python's client) and this module write `le="1.0"`: 47 of the 83 bucket series
//!   (bounds 1, 2, 5, 10 … 7680 s) change name. Prometheus before 3.0 (which normalises `le` as
//!   it scrapes) stores them as series other than vLLM's, so rules and alerts that name a
//!   bucket (`vllm:time_to_first_token_seconds_bucket{le="1.0"}`: requests with TTFT under 1 s)
//!   miss them, and `sum by (le)` over a mixed vLLM/tokenmill fleet splits the buckets. The
//!   crate formats `le` itself (a private type in its histogram encoder), with no option.
//! - Its OpenMetrics encoder (`text::encode`) writes `le="1.0"` but names the 11 counter
//!   families without `_total` in `# HELP`/`# TYPE` (`# TYPE vllm:prompt_tokens counter` over
//!   samples `vllm:prompt_tokens_total`) and ends with `# EOF`: served as text 0.0.4 those
//!   counters read as untyped; served as `application/openmetrics-text` instead, `/metrics`
//!   would answer in a format vLLM does not serve.
//!
//! Speed decides nothing. A full scrape (191 lines, speculative decoding on, the process memory
//! read from `/proc/self/status`, ~10 µs of it) takes 22.1–22.5 µs here, 21.3–21.6 µs with the
//! crate's text 0.0.4 encoder and 20.3–20.4 µs with its OpenMetrics one: the crate is ~1 µs
//! faster a scrape (fastest of 30 alternating rounds of 2000, three runs, 2-core development
//! machine: `METRICS_BENCH_ROUNDS=1 cargo bench -p tokenmill-server --bench metrics`;
//! criterion's own runs, without the variable, agree within the machine's load).
//! `tests::exposition_parses_as_text_format` checks the output as a Prometheus text-format
//! parser reads it.
//!
//! Histogram buckets are vLLM's. `vllm:request_queue_time_seconds` is the time a request
//! waited in the engine's queue before it was first scheduled, as the engine reports it with
//! the request's first token.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokenmill_engine::{EngineStats, FinishReason, SchedulerConfig, SpecDecodeStats};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Why a request was turned away before reaching the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    WaitingRequests,
    WaitingTokens,
    Draining,
    InvalidRequest,
    Unauthorized,
    /// A connection over `--max-connections`.
    MaxConnections,
}

impl RejectReason {
    const ALL: [RejectReason; 6] = [
        RejectReason::WaitingRequests,
        RejectReason::WaitingTokens,
        RejectReason::Draining,
        RejectReason::InvalidRequest,
        RejectReason::Unauthorized,
        RejectReason::MaxConnections,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RejectReason::WaitingRequests => "max_waiting_requests",
            RejectReason::WaitingTokens => "max_waiting_tokens",
            RejectReason::Draining => "draining",
            RejectReason::InvalidRequest => "invalid_request",
            RejectReason::Unauthorized => "unauthorized",
            RejectReason::MaxConnections => "max_connections",
        }
    }
}

/// A fixed-bucket histogram.
struct Histogram {
    buckets: &'static [f64],
    /// Per bucket (not cumulative), plus `+Inf` last; the sum; the count.
    state: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn new(buckets: &'static [f64]) -> Histogram {
        Histogram {
            buckets,
            state: Mutex::new((vec![0; buckets.len() + 1], 0.0, 0)),
        }
    }

    fn observe(&self, secs: f64) {
        let i = self
            .buckets
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.buckets.len());
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0[i] += 1;
        s.1 += secs;
        s.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, label: &str) {
        let (counts, sum, count) = self.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
        header(out, name, help, "histogram");
        let mut cum = 0;
        for (b, c) in self.buckets.iter().zip(&counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{{label},le=\"{b:?}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{{label}}} {sum:?}");
        let _ = writeln!(out, "{name}_count{{{label}}} {count}");
    }
}

/// Speculative decoding's counters (vLLM's names) and the acceptance rate so far.
fn render_spec_decode(out: &mut String, s: &SpecDecodeStats, l: &str) {
    let counters = [
        (
            "vllm:spec_decode_num_drafts_total",
            "Number of spec decoding drafts.",
            s.num_drafts,
        ),
        (
            "vllm:spec_decode_num_draft_tokens_total",
            "Number of draft tokens.",
            s.num_draft_tokens,
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_total",
            "Number of accepted tokens.",
            s.num_accepted_tokens,
        ),
    ];
    for (name, help, v) in counters {
        header(out, name, help, "counter");
        let _ = writeln!(out, "{name}{{{l}}} {v}.0");
    }
    let name = "vllm:spec_decode_draft_acceptance_rate";
    header(out, name, "Speculative token acceptance rate.", "gauge");
    let _ = writeln!(out, "{name}{{{l}}} {:?}", s.acceptance_rate());
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Escapes a Prometheus label value.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Request counters and histograms.
pub struct Metrics {
    /// `model_name="..."`, escaped.
    label: String,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    /// Finished requests by reason: stop, length, abort.
    success: [AtomicU64; 3],
    rejected: [AtomicU64; 6],
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
}

impl Metrics {
    pub fn new(model_name: String) -> Metrics {
        Metrics {
            label: format!("model_name=\"{}\"", escape_label(&model_name)),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            success: Default::default(),
            rejected: Default::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
            queue: Histogram::new(LATENCY_BUCKETS),
        }
    }

    pub fn reject(&self, reason: RejectReason) {
        let i = RejectReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.rejected[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self, reason: RejectReason) -> u64 {
        let i = RejectReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.rejected[i].load(Ordering::Relaxed)
    }

    /// First output of a request: prompt tokens, time to first token and queue time.
    pub fn first_token(&self, prompt_tokens: usize, ttft: Duration, queue: Duration) {
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.ttft.observe(ttft.as_secs_f64());
        self.queue.observe(queue.as_secs_f64());
    }

    /// An embedding request finished: its prompt tokens and end-to-end latency (no TTFT:
    /// it has no token).
    pub fn embedded(&self, prompt_tokens: usize, e2e: Duration) {
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.finished(Some(FinishReason::Stop), 0, e2e);
    }

    pub fn inter_token(&self, gap: Duration) {
        self.itl.observe(gap.as_secs_f64());
    }

    /// A request ended (`None`: aborted by the client or by a stop string).
    pub fn finished(&self, reason: Option<FinishReason>, output_tokens: usize, e2e: Duration) {
        let i = match reason {
            Some(FinishReason::Stop) => 0,
            Some(FinishReason::Length) => 1,
            Some(FinishReason::Abort) | None => 2,
        };
        self.success[i].fetch_add(1, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(output_tokens as u64, Ordering::Relaxed);
        self.e2e.observe(e2e.as_secs_f64());
    }

    /// The whole exposition: engine gauges from `stats`, then request metrics.
    pub fn render(
        &self,
        stats: &EngineStats,
        config: &SchedulerConfig,
        waiting_extra: usize,
    ) -> String {
        let l = &self.label;
        let block_size = config.block_size;
        let mut out = String::with_capacity(16 << 10);
        for (name, help, v) in gauges(stats, waiting_extra) {
            header(&mut out, name, help, "gauge");
            let _ = writeln!(out, "{name}{{{l}}} {v:?}");
        }
        header(
            &mut out,
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            "gauge",
        );
        let _ = writeln!(
            out,
            "vllm:cache_config_info{{block_size=\"{block_size}\",num_gpu_blocks=\"{}\",{l}}} 1.0",
            stats.scheduler.num_blocks
        );
        for (name, help, v) in self.counters(stats) {
            header(&mut out, name, help, "counter");
            let _ = writeln!(out, "{name}{{{l}}} {v}.0");
        }
        self.render_by_reason(&mut out);
        if let Some(tpot) = config.sla.tpot {
            let name = "tokenmill_sla_tpot_load";
            header(
                &mut out,
                name,
                "The step-time model's p95 time of a step decoding every running and waiting \
                 request, over the TPOT target: at 1 the worker is at its SLA's capacity.",
                "gauge",
            );
            let load = stats.scheduler.decode_step_p95.as_secs_f64() / tpot.as_secs_f64();
            let _ = writeln!(out, "{name}{{{l}}} {load:?}");
        }
        if config.speculative.is_some() {
            render_spec_decode(&mut out, &stats.scheduler.spec_decode, l);
        }
        let histograms = [
            (
                &self.ttft,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
            ),
            (
                &self.itl,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
            ),
            (
                &self.e2e,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
            ),
            (
                &self.queue,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
            ),
        ];
        for (h, name, help) in histograms {
            h.render(&mut out, name, help, l);
        }
        render_process_memory(&mut out, &read_proc_status());
        out
    }

    /// The counters without labels: (name, help, value).
    fn counters(&self, stats: &EngineStats) -> [(&'static str, &'static str, u64); 6] {
        let s = &stats.scheduler;
        let pc = &s.prefix_cache;
        [
            (
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                pc.query_tokens,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                pc.hit_tokens,
            ),
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemptions from the engine.",
                s.num_preemptions,
            ),
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                self.generation_tokens.load(Ordering::Relaxed),
            ),
            (
                "tokenmill_engine_steps_total",
                "Engine steps run.",
                stats.steps,
            ),
        ]
    }

    /// The counters with a reason label: finished requests and rejected ones.
    fn render_by_reason(&self, out: &mut String) {
        let l = &self.label;
        header(
            out,
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            "counter",
        );
        for (i, reason) in ["stop", "length", "abort"].iter().enumerate() {
            let v = self.success[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "vllm:request_success_total{{finished_reason=\"{reason}\",{l}}} {v}.0"
            );
        }
        header(
            out,
            "tokenmill_rejected_requests_total",
            "Requests turned away before reaching the engine, by reason.",
            "counter",
        );
        for (i, r) in RejectReason::ALL.iter().enumerate() {
            let v = self.rejected[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "tokenmill_rejected_requests_total{{reason=\"{}\",{l}}} {v}.0",
                r.label()
            );
        }
    }
}

/// The gauges without extra labels: (name, help, value).
fn gauges(stats: &EngineStats, waiting_extra: usize) -> [(&'static str, &'static str, f64); 11] {
    let s = &stats.scheduler;
    let step = &s.step_time;
    let secs = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64());
    [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            s.num_running as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            (s.num_waiting + waiting_extra) as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            s.kv_usage,
        ),
        (
            "tokenmill_step_time_predicted_seconds",
            "Step time the scheduler's cost model predicted for the last step.",
            secs(step.last_predicted),
        ),
        (
            "tokenmill_step_time_measured_seconds",
            "Measured duration of the last engine step.",
            secs(step.last_measured),
        ),
        (
            "tokenmill_step_time_tail_ratio",
            "Tracked 95th percentile of measured / predicted step time; SLA planning scales predictions by it.",
            step.tail_ratio,
        ),
        (
            "tokenmill_step_time_mean_abs_error_seconds",
            "Mean absolute error of the step-time model over all steps.",
            step.mean_abs_error_ms / 1e3,
        ),
        (
            "tokenmill_batch_size",
            "Sequences in the last engine step.",
            stats.last_batch_seqs as f64,
        ),
        (
            "tokenmill_batch_tokens",
            "Tokens in the last engine step.",
            stats.last_batch_tokens as f64,
        ),
        (
            "tokenmill_kv_cache_bytes_per_token",
            "KV-cache bytes one token takes over all layers (latent-only for MLA models).",
            stats.kv_bytes_per_token as f64,
        ),
        (
            "tokenmill_kv_cache_free_blocks",
            "Free KV-cache blocks.",
            s.num_free_blocks as f64,
        ),
    ]
}

/// `/proc/self/status` (empty where there is none).
fn read_proc_status() -> String {
    std::fs::read_to_string("/proc/self/status").unwrap_or_default()
}

/// The process's memory, as Prometheus' standard process collector names it (what load
/// testers such as `tokenmill bench --server-metrics` read), plus the peak resident size.
/// Fields missing from `status` are left out.
fn render_process_memory(out: &mut String, status: &str) {
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    for (name, field, help) in [
        (
            "process_resident_memory_bytes",
            "VmRSS",
            "Resident memory size in bytes.",
        ),
        (
            "process_virtual_memory_bytes",
            "VmSize",
            "Virtual memory size in bytes.",
        ),
        (
            "tokenmill_process_peak_resident_memory_bytes",
            "VmHWM",
            "Peak resident memory size in bytes since start.",
        ),
    ] {
        if let Some(v) = kib(field) {
            header(out, name, help, "gauge");
            let _ = writeln!(out, "{name} {}", v * 1024);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_memory_comes_from_proc_status_in_bytes() {
        let status = "Name:\ttokenmill\nVmHWM:\t  20480 kB\nVmRSS:\t   10240 kB\n";
        let mut out = String::new();
        render_process_memory(&mut out, status);
        assert!(
            out.contains("\nprocess_resident_memory_bytes 10485760\n"),
            "{out}"
        );
        assert!(out.contains("\ntokenmill_process_peak_resident_memory_bytes 20971520\n"));
        assert!(
            !out.contains("process_virtual_memory_bytes"),
            "absent field rendered"
        );
        // This process really has them.
        let mut real = String::new();
        render_process_memory(&mut real, &read_proc_status());
        assert!(real.contains("process_resident_memory_bytes "), "{real}");
    }

    #[test]
    fn the_sla_load_is_the_decode_step_over_the_tpot_target() {
        let m = Metrics::new("m".into());
        let mut stats = EngineStats::default();
        stats.scheduler.decode_step_p95 = Duration::from_millis(30);
        let off = m.render(&stats, &SchedulerConfig::default(), 0);
        assert!(
            !off.contains("tokenmill_sla_tpot_load"),
            "no target, no load"
        );
        let config = SchedulerConfig {
            sla: tokenmill_engine::SlaTargets {
                tpot: Some(Duration::from_millis(40)),
                ttft: None,
            },
            ..SchedulerConfig::default()
        };
        let on = m.render(&stats, &config, 0);
        assert!(
            on.contains("# TYPE tokenmill_sla_tpot_load gauge\n"),
            "{on}"
        );
        assert!(
            on.contains("\ntokenmill_sla_tpot_load{model_name=\"m\"} 0.75\n"),
            "{on}"
        );
    }

    #[test]
    fn spec_decode_metrics_appear_only_with_speculation() {
        let m = Metrics::new("m".into());
        let mut stats = EngineStats::default();
        stats.scheduler.spec_decode = SpecDecodeStats {
            num_drafts: 3,
            num_draft_tokens: 8,
            num_accepted_tokens: 6,
        };
        let off = m.render(&stats, &SchedulerConfig::default(), 0);
        assert!(!off.contains("spec_decode"));
        let config = SchedulerConfig {
            speculative: Some(tokenmill_engine::SpeculativeConfig::ngram(4)),
            ..SchedulerConfig::default()
        };
        let on = m.render(&stats, &config, 0);
        for line in [
            r#"vllm:spec_decode_num_drafts_total{model_name="m"} 3.0"#,
            r#"vllm:spec_decode_num_draft_tokens_total{model_name="m"} 8.0"#,
            r#"vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 6.0"#,
            r#"vllm:spec_decode_draft_acceptance_rate{model_name="m"} 0.75"#,
        ] {
            assert!(on.contains(line), "{line} missing from\n{on}");
        }
    }

    #[test]
    fn renders_vllm_names_with_model_label() {
        let m = Metrics::new("my \"model\"".into());
        m.first_token(5, Duration::from_millis(30), Duration::from_millis(10));
        m.inter_token(Duration::from_millis(12));
        m.finished(Some(FinishReason::Length), 7, Duration::from_millis(400));
        m.reject(RejectReason::WaitingTokens);
        let text = m.render(&EngineStats::default(), &SchedulerConfig::default(), 0);
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
            "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_count",
            "vllm:e2e_request_latency_seconds_sum",
            "vllm:request_queue_time_seconds_bucket",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
        assert!(text.contains(r#"model_name="my \"model\"""#));
        assert!(text.contains(r#"vllm:generation_tokens_total{model_name="my \"model\""} 7.0"#));
        assert!(text.contains(r#"finished_reason="length""#));
        assert!(text.contains(r#"reason="max_waiting_tokens",model_name="my \"model\""} 1.0"#));
        // Cumulative buckets: the 30 ms TTFT is in le=0.04 and above, not in le=0.02.
        assert!(text.contains(
            r#"vllm:time_to_first_token_seconds_bucket{model_name="my \"model\"",le="0.02"} 0"#
        ));
        assert!(text.contains(
            r#"vllm:time_to_first_token_seconds_bucket{model_name="my \"model\"",le="0.04"} 1"#
        ));
        // As vLLM (Python's client) writes them: whole-number bounds as floats, counters'
        // HELP and TYPE under the `_total` name.
        assert!(text.contains(
            r#"vllm:time_to_first_token_seconds_bucket{model_name="my \"model\"",le="1.0"} 1"#
        ));
        assert!(!text.contains(r#"le="1"}"#));
        assert!(text.contains(
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n\
             # TYPE vllm:prompt_tokens_total counter\n"
        ));
    }

    /// The labels of a sample (`a="x",b="y"`, escapes undone), checked as Prometheus'
    /// text-format parser reads them.
    fn parse_labels(mut s: &str, line: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        while !s.is_empty() {
            let (name, rest) = s
                .split_once("=\"")
                .unwrap_or_else(|| panic!("label: {line}"));
            assert!(
                valid_name(name) && !name.contains(':'),
                "label name: {line}"
            );
            assert!(out.iter().all(|(n, _)| n != name), "repeated label: {line}");
            let (mut value, mut chars) = (String::new(), rest.char_indices());
            let end = loop {
                match chars.next() {
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        _ => panic!("bad escape: {line}"),
                    },
                    Some((_, '\n')) | None => panic!("unterminated label value: {line}"),
                    Some((_, c)) => value.push(c),
                }
            };
            out.push((name.to_string(), value));
            s = &rest[end + 1..];
            if !s.is_empty() {
                s = s
                    .strip_prefix(',')
                    .unwrap_or_else(|| panic!("label list: {line}"));
            }
        }
        out
    }

    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// Checks `text` against the text exposition format 0.0.4 as Prometheus parses it, and
    /// a little more strictly: every family has one HELP then one TYPE line before its samples,
    /// which follow together; a sample is named as its family (a histogram's with `_bucket`,
    /// `_sum` or `_count`); counters end in `_total`; values are floats; no series repeats; a
    /// histogram's buckets rise in `le` and count, end at `+Inf` and equal `_count`.
    fn check_text_format(text: &str) {
        use std::collections::{BTreeMap, HashMap, HashSet};
        assert!(text.ends_with('\n'), "no final newline");
        let (mut help, mut types) = (HashSet::new(), HashMap::new());
        let (mut series, mut family) = (HashSet::new(), None);
        let mut buckets: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        let mut counts = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, _) = rest.split_once(' ').unwrap_or((rest, ""));
                assert!(valid_name(name) && help.insert(name), "{line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("{line}"));
                assert!(help.contains(name), "TYPE without HELP first: {line}");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert!(types.insert(name, kind).is_none(), "second TYPE: {line}");
                assert!(kind != "counter" || name.ends_with("_total"), "{line}");
                family = Some(name);
                continue;
            }
            assert!(
                !line.is_empty() && !line.starts_with('#'),
                "stray line: {line:?}"
            );
            let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("value: {line}")),
            };
            let (name, labels) = match key.split_once('{') {
                Some((n, l)) => (n, l.strip_suffix('}').unwrap_or_else(|| panic!("{line}"))),
                None => (key, ""),
            };
            let fam = family.unwrap_or_else(|| panic!("sample before any TYPE: {line}"));
            let suffix = name.strip_prefix(fam);
            let kind = types[fam];
            match (kind, suffix) {
                (_, Some("")) | ("histogram", Some("_bucket" | "_sum" | "_count")) => {}
                _ => panic!("sample outside its family {fam}: {line}"),
            }
            let labels = parse_labels(labels, line);
            assert!(series.insert(key), "repeated series: {line}");
            if kind == "histogram" {
                let le = labels.iter().find(|(n, _)| n == "le");
                let rest: Vec<_> = labels.iter().filter(|(n, _)| n != "le").collect();
                let id = (fam.to_string(), format!("{rest:?}"));
                match suffix {
                    Some("_bucket") => {
                        let le = le.unwrap_or_else(|| panic!("bucket without le: {line}"));
                        let bound = match le.1.as_str() {
                            "+Inf" => f64::INFINITY,
                            b => b.parse().unwrap_or_else(|_| panic!("le: {line}")),
                        };
                        buckets.entry(id).or_default().push((bound, value));
                    }
                    Some("_count") => assert!(counts.insert(id, value).is_none()),
                    _ => {}
                }
            }
        }
        assert!(!buckets.is_empty());
        for (id, b) in &buckets {
            let rising = b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
            assert!(rising, "{id:?}: buckets not rising: {b:?}");
            let last = b.last().unwrap();
            assert_eq!(last.0, f64::INFINITY, "{id:?}: no +Inf bucket");
            assert_eq!(
                Some(&last.1),
                counts.get(id),
                "{id:?}: +Inf bucket != _count"
            );
        }
    }

    #[test]
    fn exposition_parses_as_text_format() {
        // A name that needs every escape; speculative decoding on; all histograms observed.
        let m = Metrics::new("a\\b\"c\nd".into());
        m.first_token(5, Duration::from_millis(30), Duration::from_secs(2));
        m.inter_token(Duration::from_millis(12));
        m.inter_token(Duration::from_secs(90));
        m.finished(Some(FinishReason::Stop), 7, Duration::from_secs(1));
        m.finished(None, 1, Duration::from_secs(10_000));
        m.reject(RejectReason::Unauthorized);
        let mut stats = EngineStats::default();
        stats.scheduler.kv_usage = 0.25;
        stats.scheduler.spec_decode.num_drafts = 2;
        let config = SchedulerConfig {
            speculative: Some(tokenmill_engine::SpeculativeConfig::ngram(4)),
            ..SchedulerConfig::default()
        };
        let text = m.render(&stats, &config, 3);
        check_text_format(&text);
        assert!(text.contains(r#"{model_name="a\\b\"c\nd"}"#), "{text}");
        // And the checker catches what it is for.
        for bad in [
            "# HELP x_total x\n# TYPE x_total counter\ny_total 1\n",
            "# HELP x x\n# TYPE x counter\nx 1\n",
            "# HELP x x\n# TYPE x gauge\nx{a=\"1} 1\n",
            concat!(
                "# HELP h h\n# TYPE h histogram\n",
                "h_bucket{le=\"1.0\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n"
            ),
        ] {
            let caught = std::panic::catch_unwind(|| check_text_format(bad));
            assert!(caught.is_err(), "accepted {bad:?}");
        }
    }
}
