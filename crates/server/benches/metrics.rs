//! One `/metrics` scrape, rendered by `tokenmill_server::metrics` (hand-written, text format
//! 0.0.4) and by the `prometheus-client` crate (its Prometheus text 0.0.4 encoder,
//! `prometheus_text::encode`, and its OpenMetrics one, `text::encode`) over a registry holding
//! the same metrics as closely as the crate can: counters and histograms registered once,
//! engine gauges and counters from the stats snapshot through a `Collector` at scrape time, as
//! a server would use it. All have the same state: every request counter and histogram
//! observed, speculative decoding on, the process memory read from `/proc/self/status` (also
//! timed alone, `proc_status_read`: all pay it).
//!
//! ```text
//! cargo bench -p tokenmill-server --bench metrics
//! METRICS_BENCH_ROUNDS=1 cargo bench -p tokenmill-server --bench metrics  # in turns
//! METRICS_BENCH_PRINT=1 cargo bench -p tokenmill-server --bench metrics   # the texts
//! ```

use std::hint::black_box;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokenmill_engine::{
    EngineStats, FinishReason, SchedulerConfig, SpecDecodeStats, SpeculativeConfig,
};
use tokenmill_server::metrics::{Metrics, RejectReason};

const MODEL: &str = "smollm2";

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
const REJECT_LABELS: [&str; 6] = [
    "max_waiting_requests",
    "max_waiting_tokens",
    "draining",
    "invalid_request",
    "unauthorized",
    "max_connections",
];

type FloatCounter = Counter<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Finished {
    finished_reason: &'static str,
    model_name: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Rejected {
    reason: &'static str,
    model_name: &'static str,
}

/// What the engine reports, read at scrape time.
#[derive(Debug, Default)]
struct Snapshot {
    stats: EngineStats,
    block_size: usize,
    speculative: bool,
}

/// Engine gauges and counters labelled `model_name` (a sub-registry's constant label).
#[derive(Debug)]
struct EngineCollector(Arc<Mutex<Snapshot>>);

/// `vllm:cache_config_info` (its `model_name` label last, as vLLM orders it) and the
/// process memory (no label).
#[derive(Debug)]
struct RootCollector(Arc<Mutex<Snapshot>>);

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(v as f64).encode(m)
}

impl Collector for EngineCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.lock().unwrap();
        let stats = &snap.stats;
        let s = &stats.scheduler;
        let step = &s.step_time;
        let secs = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64());
        for (name, help, v) in [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                s.num_running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                s.num_waiting as f64,
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
        ] {
            gauge(&mut e, name, help, v)?;
        }
        let pc = &s.prefix_cache;
        for (name, help, v) in [
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                pc.query_tokens,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                pc.hit_tokens,
            ),
            (
                "vllm:num_preemptions",
                "Cumulative number of preemptions from the engine.",
                s.num_preemptions,
            ),
            ("tokenmill_engine_steps", "Engine steps run.", stats.steps),
        ] {
            counter(&mut e, name, help, v)?;
        }
        if snap.speculative {
            let sd = &s.spec_decode;
            for (name, help, v) in [
                (
                    "vllm:spec_decode_num_drafts",
                    "Number of spec decoding drafts.",
                    sd.num_drafts,
                ),
                (
                    "vllm:spec_decode_num_draft_tokens",
                    "Number of draft tokens.",
                    sd.num_draft_tokens,
                ),
                (
                    "vllm:spec_decode_num_accepted_tokens",
                    "Number of accepted tokens.",
                    sd.num_accepted_tokens,
                ),
            ] {
                counter(&mut e, name, help, v)?;
            }
            let rate = sd.acceptance_rate();
            let help = "Speculative token acceptance rate.";
            gauge(&mut e, "vllm:spec_decode_draft_acceptance_rate", help, rate)?;
        }
        Ok(())
    }
}

impl Collector for RootCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let (block_size, blocks) = {
            let snap = self.0.lock().unwrap();
            (snap.block_size, snap.stats.scheduler.num_blocks)
        };
        let help = "Information of the KV cache configuration.";
        let mut m = e.encode_descriptor("vllm:cache_config_info", help, None, MetricType::Gauge)?;
        let labels = [
            ("block_size", block_size.to_string()),
            ("num_gpu_blocks", blocks.to_string()),
            ("model_name", MODEL.to_string()),
        ];
        ConstGauge::new(1.0).encode(m.encode_family(&labels)?)?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<i64>().ok())
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
                let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
                ConstGauge::new(v * 1024).encode(m)?;
            }
        }
        Ok(())
    }
}

/// The same metrics in a `prometheus-client` registry.
struct Client {
    registry: Registry,
    snapshot: Arc<Mutex<Snapshot>>,
    prompt_tokens: FloatCounter,
    generation_tokens: FloatCounter,
    success: Family<Finished, FloatCounter>,
    rejected: Family<Rejected, FloatCounter>,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
}

impl Client {
    fn new() -> Client {
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let c = Client {
            registry: Registry::default(),
            snapshot: snapshot.clone(),
            prompt_tokens: FloatCounter::default(),
            generation_tokens: FloatCounter::default(),
            success: Family::default(),
            rejected: Family::default(),
            ttft: Histogram::new(TTFT_BUCKETS.iter().copied()),
            itl: Histogram::new(ITL_BUCKETS.iter().copied()),
            e2e: Histogram::new(LATENCY_BUCKETS.iter().copied()),
            queue: Histogram::new(LATENCY_BUCKETS.iter().copied()),
        };
        let mut registry = Registry::default();
        // `register` appends a full stop to the help text.
        registry.register(
            "vllm:request_success",
            "Count of successfully processed requests",
            c.success.clone(),
        );
        registry.register(
            "tokenmill_rejected_requests",
            "Requests turned away before reaching the engine, by reason",
            c.rejected.clone(),
        );
        for finished_reason in ["stop", "length", "abort"] {
            let l = Finished {
                finished_reason,
                model_name: MODEL,
            };
            let _ = c.success.get_or_create(&l);
        }
        for reason in REJECT_LABELS {
            let l = Rejected {
                reason,
                model_name: MODEL,
            };
            let _ = c.rejected.get_or_create(&l);
        }
        registry.register_collector(Box::new(RootCollector(snapshot.clone())));
        let model = registry.sub_registry_with_label(("model_name".into(), MODEL.into()));
        model.register_collector(Box::new(EngineCollector(snapshot)));
        model.register(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed",
            c.prompt_tokens.clone(),
        );
        model.register(
            "vllm:generation_tokens",
            "Number of generation tokens processed",
            c.generation_tokens.clone(),
        );
        for (h, name, help) in [
            (
                &c.ttft,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds",
            ),
            (
                &c.itl,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds",
            ),
            (
                &c.e2e,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds",
            ),
            (
                &c.queue,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request",
            ),
        ] {
            model.register(name, help, h.clone());
        }
        Client { registry, ..c }
    }

    /// In the Prometheus text format 0.0.4 (`openmetrics: false`) or in OpenMetrics.
    fn render(&self, stats: &EngineStats, config: &SchedulerConfig, openmetrics: bool) -> String {
        {
            let mut snap = self.snapshot.lock().unwrap();
            snap.stats = stats.clone();
            snap.block_size = config.block_size;
            snap.speculative = config.speculative.is_some();
        }
        let mut out = String::with_capacity(16 << 10);
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry).unwrap();
        }
        out
    }
}

fn stats() -> EngineStats {
    let mut stats = EngineStats::default();
    let s = &mut stats.scheduler;
    (s.num_running, s.num_waiting, s.kv_usage) = (12, 3, 0.4375);
    (s.num_blocks, s.num_free_blocks, s.num_preemptions) = (4096, 2304, 2);
    (s.prefix_cache.query_tokens, s.prefix_cache.hit_tokens) = (123_456, 65_432);
    s.step_time.last_predicted = Some(Duration::from_micros(18_250));
    s.step_time.last_measured = Some(Duration::from_micros(19_875));
    (s.step_time.tail_ratio, s.step_time.mean_abs_error_ms) = (1.0625, 0.75);
    s.spec_decode = SpecDecodeStats {
        num_drafts: 900,
        num_draft_tokens: 3600,
        num_accepted_tokens: 2700,
    };
    (stats.steps, stats.last_batch_seqs, stats.last_batch_tokens) = (50_000, 12, 268);
    stats.kv_bytes_per_token = 98_304;
    stats
}

fn bench(c: &mut Criterion) {
    let ours = Metrics::new(MODEL.into());
    let client = Client::new();
    // The same observations into both: 500 requests of 200 tokens.
    for k in 0..500u64 {
        let ttft = Duration::from_millis(20 + k % 300);
        let queue = Duration::from_millis(k % 50);
        let e2e = ttft + Duration::from_millis(2000 + 7 * k);
        ours.first_token(100, ttft, queue);
        client.prompt_tokens.inc_by(100.0);
        client.ttft.observe(ttft.as_secs_f64());
        client.queue.observe(queue.as_secs_f64());
        for t in 0..199 {
            let gap = Duration::from_micros(9_000 + (k * 37 + t * 11) % 20_000);
            ours.inter_token(gap);
            client.itl.observe(gap.as_secs_f64());
        }
        let reason = [FinishReason::Stop, FinishReason::Length][k as usize % 2];
        ours.finished(Some(reason), 200, e2e);
        client.generation_tokens.inc_by(200.0);
        let l = Finished {
            finished_reason: ["stop", "length"][k as usize % 2],
            model_name: MODEL,
        };
        client.success.get_or_create(&l).inc();
        client.e2e.observe(e2e.as_secs_f64());
    }
    ours.reject(RejectReason::WaitingRequests);
    let l = Rejected {
        reason: "max_waiting_requests",
        model_name: MODEL,
    };
    client.rejected.get_or_create(&l).inc();
    let stats = stats();
    let config = SchedulerConfig {
        speculative: Some(SpeculativeConfig::ngram(4)),
        ..SchedulerConfig::default()
    };
    if std::env::var_os("METRICS_BENCH_PRINT").is_some() {
        println!("--- hand-written\n{}", ours.render(&stats, &config, 0));
        println!(
            "--- prometheus-client\n{}",
            client.render(&stats, &config, false)
        );
        println!("--- openmetrics\n{}", client.render(&stats, &config, true));
    }
    if std::env::var_os("METRICS_BENCH_ROUNDS").is_some() {
        // The renderers in turn, 30 rounds of 2000 scrapes each: load from other processes
        // falls on all of them alike, as it does not across criterion's separate runs.
        let render: [(&str, &dyn Fn() -> String); 3] = [
            ("hand_written", &|| {
                ours.render(black_box(&stats), &config, 0)
            }),
            ("prometheus_client", &|| {
                client.render(black_box(&stats), &config, false)
            }),
            ("prometheus_client_openmetrics", &|| {
                client.render(black_box(&stats), &config, true)
            }),
        ];
        let mut us: [Vec<f64>; 3] = Default::default();
        for _ in 0..30 {
            for (i, (_, f)) in render.iter().enumerate() {
                let t = std::time::Instant::now();
                for _ in 0..2000 {
                    black_box(f());
                }
                us[i].push(t.elapsed().as_secs_f64() / 2000.0 * 1e6);
            }
        }
        for ((name, _), v) in render.iter().zip(&mut us) {
            v.sort_by(f64::total_cmp);
            println!("{name}: min {:.1} µs, median {:.1} µs", v[0], v[15]);
        }
        return;
    }
    let mut g = c.benchmark_group("metrics_scrape");
    g.bench_function("hand_written", |b| {
        b.iter(|| black_box(ours.render(black_box(&stats), &config, 0)))
    });
    g.bench_function("prometheus_client", |b| {
        b.iter(|| black_box(client.render(black_box(&stats), &config, false)))
    });
    g.bench_function("prometheus_client_openmetrics", |b| {
        b.iter(|| black_box(client.render(black_box(&stats), &config, true)))
    });
    g.bench_function("proc_status_read", |b| {
        b.iter(|| black_box(std::fs::read_to_string("/proc/self/status").unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
