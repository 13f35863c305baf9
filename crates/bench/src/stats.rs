//! Request timing records and their summary.
//!
//! Definitions follow `vllm bench serve` (`benchmarks/serve.py`, `calculate_metrics`):
//! - TTFT = first content chunk time − send time;
//! - E2EL = last content chunk time − send time;
//! - TPOT = (E2EL − TTFT) / (output tokens − 1), per request with more than one output token;
//! - ITL = every gap between consecutive content chunks (a chunk may carry several tokens);
//! - output tokens = the server's `usage.completion_tokens` when it reports it, else the
//!   number of content chunks;
//! - goodput = completed requests meeting every SLO (`ttft`, `tpot`, `e2el`, in ms; a
//!   single-token request has TPOT 0) per second of benchmark duration.
//!
//! Percentiles use linear interpolation between closest ranks (numpy's default), so they agree
//! with vLLM's reports. Everything here is a pure function of the records: the HTTP driver only
//! records timestamps, and these functions are tested on synthetic records.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::spec_decode::SpecDecodeFigures;

/// Why a request failed, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// HTTP 429 (admission control said no).
    RateLimited,
    /// HTTP 5xx, or an error object inside the stream.
    ServerError,
    /// Any other non-2xx status (400, 404, …): usually a workload the server rejects.
    ClientError,
    /// The connection could not be made.
    Connect,
    /// The stream ended (or broke) before `[DONE]`.
    Disconnected,
    /// The request took longer than the client's timeout.
    Timeout,
    /// The response could not be understood (not SSE / not JSON).
    Protocol,
    /// The stream ended normally but with fewer tokens than required (in-process mode).
    Incomplete,
}

impl ErrorKind {
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::RateLimited => "HTTP 429",
            ErrorKind::ServerError => "server error (5xx)",
            ErrorKind::ClientError => "client error (4xx)",
            ErrorKind::Connect => "connect error",
            ErrorKind::Disconnected => "disconnected mid-stream",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Protocol => "bad response",
            ErrorKind::Incomplete => "incomplete output",
        }
    }
}

/// A failed request: its kind and what the server or transport said.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestError {
    pub kind: ErrorKind,
    pub message: String,
}

/// What one request did, as the client saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRecord {
    pub prompt_tokens: usize,
    /// When the request was sent, from the start of the benchmark.
    pub start: Duration,
    /// Arrival time of each content chunk (usually one token), from the moment it was sent.
    pub token_times: Vec<Duration>,
    /// `usage.completion_tokens`, when the server reported it.
    pub reported_output_tokens: Option<usize>,
    /// `None` = completed.
    pub error: Option<RequestError>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    pub fn output_tokens(&self) -> usize {
        self.reported_output_tokens
            .unwrap_or(self.token_times.len())
    }

    pub fn ttft(&self) -> Option<Duration> {
        self.token_times.first().copied()
    }

    pub fn e2e(&self) -> Option<Duration> {
        self.token_times.last().copied()
    }

    /// Mean time per output token after the first (`None` with fewer than two tokens).
    pub fn tpot(&self) -> Option<Duration> {
        let (first, last, n) = (self.ttft()?, self.e2e()?, self.output_tokens());
        (n > 1).then(|| (last - first) / (n as u32 - 1))
    }

    pub fn itls(&self) -> impl Iterator<Item = Duration> + '_ {
        self.token_times.windows(2).map(|w| w[1] - w[0])
    }

    /// Whether this completed request meets every SLO of `slo`.
    pub fn meets(&self, slo: &Slo) -> bool {
        let within = |limit: Option<f64>, v: Option<Duration>| {
            limit.is_none_or(|l| ms(v.unwrap_or_default()) <= l)
        };
        self.ok()
            && within(slo.ttft_ms, self.ttft())
            && within(slo.tpot_ms, self.tpot())
            && within(slo.e2el_ms, self.e2e())
    }
}

/// Service-level objectives for goodput, in milliseconds (`None` = no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// Parses vLLM's `--goodput ttft:MS tpot:MS e2el:MS` (any subset, any order).
    pub fn parse(items: &[String]) -> Result<Slo, String> {
        let mut slo = Slo::default();
        for item in items {
            let (k, v) = item
                .split_once(':')
                .ok_or_else(|| format!("goodput `{item}`: expected NAME:MS"))?;
            let v: f64 = v
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("goodput `{item}`: `{v}` is not a duration in ms"))?;
            match k {
                "ttft" => slo.ttft_ms = Some(v),
                "tpot" => slo.tpot_ms = Some(v),
                "e2el" => slo.e2el_ms = Some(v),
                _ => return Err(format!("goodput `{item}`: unknown metric `{k}`")),
            }
        }
        Ok(slo)
    }

    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none() && self.e2el_ms.is_none()
    }
}

/// Percentile `p` (0..=100) of `sorted` by linear interpolation; `None` if empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Mean, median and chosen percentiles of one metric, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Distribution {
    pub mean: f64,
    pub median: f64,
    /// `(p, value)` for each requested percentile.
    pub percentiles: Vec<(f64, f64)>,
}

impl Distribution {
    pub fn of(values_ms: &mut [f64], ps: &[f64]) -> Distribution {
        values_ms.sort_by(f64::total_cmp);
        let mean = if values_ms.is_empty() {
            0.0
        } else {
            values_ms.iter().sum::<f64>() / values_ms.len() as f64
        };
        Distribution {
            mean,
            median: percentile(values_ms, 50.0).unwrap_or(0.0),
            percentiles: ps
                .iter()
                .map(|&p| (p, percentile(values_ms, p).unwrap_or(0.0)))
                .collect(),
        }
    }

    pub fn at(&self, p: f64) -> Option<f64> {
        self.percentiles.iter().find(|e| e.0 == p).map(|e| e.1)
    }
}

/// Server memory seen during a run, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MemoryFigures {
    /// The largest resident set sampled during the run.
    pub max_rss_bytes: Option<u64>,
    /// The kernel's high-water mark (`VmHWM`) at the end of the run: the peak over the
    /// process's whole life, model load included.
    pub peak_hwm_bytes: Option<u64>,
}

impl MemoryFigures {
    /// The best peak figure available.
    pub fn peak_bytes(&self) -> Option<u64> {
        self.peak_hwm_bytes.or(self.max_rss_bytes)
    }
}

/// The figures of one benchmark run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    /// Failed requests by kind.
    pub errors: BTreeMap<ErrorKind, usize>,
    pub duration: Duration,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub ttft: Distribution,
    pub tpot: Distribution,
    pub itl: Distribution,
    pub e2el: Distribution,
    /// Completed requests meeting every SLO, when SLOs were given.
    pub good_requests: Option<usize>,
    /// Set by the driver: `None` = unlimited (closed loop uses `max_concurrency`).
    pub request_rate: Option<f64>,
    pub max_concurrency: Option<usize>,
    pub memory: MemoryFigures,
    /// The server's speculative decoding during the run, when it exports the counters.
    pub spec_decode: Option<SpecDecodeFigures>,
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Summary {
    pub fn of(records: &[RequestRecord], duration: Duration, ps: &[f64]) -> Summary {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
        let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft()).map(ms).collect();
        let mut tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot()).map(ms).collect();
        let mut itl: Vec<f64> = ok.iter().flat_map(|r| r.itls()).map(ms).collect();
        let mut e2el: Vec<f64> = ok.iter().filter_map(|r| r.e2e()).map(ms).collect();
        let mut errors = BTreeMap::new();
        for e in records.iter().filter_map(|r| r.error.as_ref()) {
            *errors.entry(e.kind).or_insert(0) += 1;
        }
        Summary {
            completed: ok.len(),
            failed: records.len() - ok.len(),
            errors,
            duration,
            input_tokens: ok.iter().map(|r| r.prompt_tokens).sum(),
            output_tokens: ok.iter().map(|r| r.output_tokens()).sum(),
            ttft: Distribution::of(&mut ttft, ps),
            tpot: Distribution::of(&mut tpot, ps),
            itl: Distribution::of(&mut itl, ps),
            e2el: Distribution::of(&mut e2el, ps),
            ..Summary::default()
        }
    }

    /// [`Summary::of`] plus goodput against `slo` (skipped when `slo` is empty).
    pub fn with_slo(records: &[RequestRecord], duration: Duration, ps: &[f64], slo: &Slo) -> Self {
        let mut s = Summary::of(records, duration, ps);
        if !slo.is_empty() {
            s.good_requests = Some(records.iter().filter(|r| r.meets(slo)).count());
        }
        s
    }

    fn per_second(&self, n: usize) -> f64 {
        let secs = self.duration.as_secs_f64();
        if secs > 0.0 { n as f64 / secs } else { 0.0 }
    }

    pub fn request_throughput(&self) -> f64 {
        self.per_second(self.completed)
    }

    pub fn output_throughput(&self) -> f64 {
        self.per_second(self.output_tokens)
    }

    pub fn total_throughput(&self) -> f64 {
        self.per_second(self.input_tokens + self.output_tokens)
    }

    pub fn goodput(&self) -> Option<f64> {
        self.good_requests.map(|n| self.per_second(n))
    }

    /// The four latency metrics with their vLLM names: (title, short label, key, values).
    pub fn latencies(&self) -> [(&'static str, &'static str, &'static str, &Distribution); 4] {
        [
            ("Time to First Token", "TTFT", "ttft", &self.ttft),
            (
                "Time per Output Token (excl. 1st token)",
                "TPOT",
                "tpot",
                &self.tpot,
            ),
            ("Inter-token Latency", "ITL", "itl", &self.itl),
            ("End-to-end Latency", "E2EL", "e2el", &self.e2el),
        ]
    }

    /// The scalar figures in `vllm bench serve`'s labels and JSON keys, in report order:
    /// (label, json key, value). Latencies are in ms, memory in MiB.
    pub fn figures(&self) -> Vec<(String, String, f64)> {
        let mut v: Vec<(String, String, f64)> = Vec::new();
        let mut push = |label: &str, key: &str, x: f64| v.push((label.into(), key.into(), x));
        push("Successful requests:", "completed", self.completed as f64);
        push("Failed requests:", "failed", self.failed as f64);
        push(
            "Benchmark duration (s):",
            "duration",
            self.duration.as_secs_f64(),
        );
        push(
            "Total input tokens:",
            "total_input_tokens",
            self.input_tokens as f64,
        );
        push(
            "Total generated tokens:",
            "total_output_tokens",
            self.output_tokens as f64,
        );
        push(
            "Request throughput (req/s):",
            "request_throughput",
            self.request_throughput(),
        );
        if let Some(g) = self.goodput() {
            push("Request goodput (req/s):", "request_goodput", g);
        }
        push(
            "Output token throughput (tok/s):",
            "output_throughput",
            self.output_throughput(),
        );
        push(
            "Total token throughput (tok/s):",
            "total_token_throughput",
            self.total_throughput(),
        );
        if let Some(b) = self.memory.peak_bytes() {
            push("Peak server memory (MiB):", "peak_memory_mib", mib(b));
        }
        if let Some(s) = &self.spec_decode {
            push(
                "Acceptance rate (%):",
                "spec_decode_acceptance_rate",
                100.0 * s.acceptance_rate(),
            );
            push(
                "Acceptance length:",
                "spec_decode_acceptance_length",
                s.acceptance_length(),
            );
            push("Drafts:", "spec_decode_num_drafts", s.drafts as f64);
            push(
                "Draft tokens:",
                "spec_decode_num_draft_tokens",
                s.draft_tokens as f64,
            );
            push(
                "Accepted tokens:",
                "spec_decode_num_accepted_tokens",
                s.accepted_tokens as f64,
            );
        }
        for (_, label, key, d) in self.latencies() {
            push(
                &format!("Mean {label} (ms):"),
                &format!("mean_{key}_ms"),
                d.mean,
            );
            push(
                &format!("Median {label} (ms):"),
                &format!("median_{key}_ms"),
                d.median,
            );
            for (p, x) in &d.percentiles {
                push(
                    &format!("P{p} {label} (ms):"),
                    &format!("p{p}_{key}_ms"),
                    *x,
                );
            }
        }
        v
    }

    /// The report in `vllm bench serve`'s labels.
    pub fn render(&self, title: &str) -> String {
        let mut s = format!("{:=^50}\n", format!(" {title} "));
        let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<40}{v:>10}\n"));
        line(&mut s, "Successful requests:", self.completed.to_string());
        line(&mut s, "Failed requests:", self.failed.to_string());
        for (kind, n) in &self.errors {
            line(&mut s, &format!("  {}:", kind.label()), n.to_string());
        }
        if let Some(c) = self.max_concurrency {
            line(&mut s, "Maximum request concurrency:", c.to_string());
        }
        if let Some(r) = self.request_rate {
            line(&mut s, "Traffic request rate:", format!("{r:.2}"));
        }
        let figures = self.figures();
        let first_latency = figures
            .iter()
            .position(|f| f.1.starts_with("mean_"))
            .unwrap_or(figures.len());
        for (label, key, x) in &figures[2..first_latency] {
            let v = if key.starts_with("total_") && !key.ends_with("throughput") {
                format!("{x:.0}")
            } else {
                format!("{x:.2}")
            };
            line(&mut s, label, v);
        }
        for (name, label, _, d) in self.latencies() {
            s.push_str(&format!("{name:-^50}\n"));
            let mut lat = |k: String, v: f64| s.push_str(&format!("{k:<40}{v:>10.2}\n"));
            lat(format!("Mean {label} (ms):"), d.mean);
            lat(format!("Median {label} (ms):"), d.median);
            for (p, v) in &d.percentiles {
                lat(format!("P{p} {label} (ms):"), *v);
            }
        }
        s.push_str(&"=".repeat(50));
        s
    }

    /// Every figure as JSON (vLLM's result keys, plus `errors` and memory in bytes).
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (_, key, x) in self.figures() {
            m.insert(key, serde_json::json!(x));
        }
        m.insert("errors".into(), serde_json::json!(self.errors));
        m.insert("memory".into(), serde_json::json!(self.memory));
        m.insert("request_rate".into(), serde_json::json!(self.request_rate));
        m.insert(
            "max_concurrency".into(),
            serde_json::json!(self.max_concurrency),
        );
        serde_json::Value::Object(m)
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// One record as JSON, for `--json` (times in ms).
pub fn record_json(r: &RequestRecord) -> serde_json::Value {
    serde_json::json!({
        "start_ms": ms(r.start),
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens(),
        "ttft_ms": r.ttft().map(ms),
        "tpot_ms": r.tpot().map(ms),
        "e2el_ms": r.e2e().map(ms),
        "itl_ms": r.itls().map(ms).collect::<Vec<_>>(),
        "error": r.error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn rec(times: &[u64]) -> RequestRecord {
        RequestRecord {
            prompt_tokens: 10,
            token_times: times.iter().map(|&t| ms(t)).collect(),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        // numpy.percentile([1,2,3,4], 95) == 3.85
        assert!((percentile(&v, 95.0).unwrap() - 3.85).abs() < 1e-12);
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn request_figures_match_hand_computation() {
        let r = rec(&[100, 120, 150, 160]);
        assert_eq!(r.ttft(), Some(ms(100)));
        assert_eq!(r.e2e(), Some(ms(160)));
        assert_eq!(r.tpot(), Some(ms(20)));
        assert_eq!(r.itls().collect::<Vec<_>>(), vec![ms(20), ms(30), ms(10)]);
        let failed = RequestRecord {
            error: Some(RequestError {
                kind: ErrorKind::RateLimited,
                message: "busy".into(),
            }),
            ..RequestRecord::default()
        };
        let s = Summary::of(&[r, failed], Duration::from_secs(2), &[50.0, 99.0]);
        assert_eq!(
            (s.completed, s.failed, s.output_tokens, s.input_tokens),
            (1, 1, 4, 10)
        );
        assert_eq!(s.errors, BTreeMap::from([(ErrorKind::RateLimited, 1)]));
        assert_eq!(s.output_throughput(), 2.0);
        assert_eq!(s.ttft.mean, 100.0);
        assert_eq!(s.itl.median, 20.0);
        let text = s.render("t");
        assert!(text.contains("Mean TTFT (ms):"), "{text}");
        assert!(text.contains("HTTP 429:"), "{text}");
    }

    #[test]
    fn reported_usage_sets_output_tokens_and_tpot() {
        // Two chunks carrying 5 tokens in all (a server that batches tokens per chunk).
        let r = RequestRecord {
            reported_output_tokens: Some(5),
            ..rec(&[100, 180])
        };
        assert_eq!(r.output_tokens(), 5);
        assert_eq!(r.tpot(), Some(ms(20)));
        assert_eq!(r.itls().collect::<Vec<_>>(), vec![ms(80)]);
        assert_eq!(rec(&[100]).tpot(), None);
    }

    #[test]
    fn goodput_counts_requests_meeting_every_slo() {
        let records = [
            rec(&[100, 120, 140]), // ttft 100, tpot 20, e2el 140
            rec(&[300, 310]),      // ttft 300 (too slow)
            rec(&[50, 150]),       // tpot 100 (too slow)
            rec(&[80]),            // single token: tpot counts as 0
        ];
        let slo = Slo::parse(&["ttft:200".into(), "tpot:50".into()]).unwrap();
        let s = Summary::with_slo(&records, Duration::from_secs(4), &[99.0], &slo);
        assert_eq!(s.good_requests, Some(2));
        assert_eq!(s.goodput(), Some(0.5));
        let none = Summary::with_slo(&records, Duration::from_secs(4), &[99.0], &Slo::default());
        assert_eq!(none.goodput(), None);
        assert!(Slo::parse(&["ttft".into()]).is_err());
        assert!(Slo::parse(&["foo:1".into()]).is_err());
        assert!(Slo::parse(&["ttft:-1".into()]).is_err());
        let e2el = Slo::parse(&["e2el:140".into()]).unwrap();
        assert_eq!(e2el.e2el_ms, Some(140.0));
        assert!(records[0].meets(&e2el) && !records[1].meets(&e2el));
    }

    #[test]
    fn json_has_vllm_keys() {
        let s = Summary::of(&[rec(&[100, 120])], Duration::from_secs(1), &[95.0]);
        let j = s.to_json();
        assert_eq!(j["completed"], 1.0);
        assert_eq!(j["mean_ttft_ms"], 100.0);
        assert_eq!(j["p95_itl_ms"], 20.0);
        assert_eq!(j["output_throughput"], 2.0);
        assert!(j.get("request_goodput").is_none());
    }
}
