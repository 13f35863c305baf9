//! Request timing records and their summary.
//!
//! Definitions follow `vllm bench serve`: TTFT = first token time − send time; TPOT = (E2E −
//! TTFT) / (output tokens − 1) per request; ITL = every gap between consecutive tokens;
//! E2EL = last token time − send time. Percentiles use linear interpolation between closest
//! ranks (numpy's default), so they agree with vLLM's reports.

use std::time::Duration;

/// What one request did, as the client saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRecord {
    pub prompt_tokens: usize,
    /// Arrival time of each output token, from the moment the request was sent.
    pub token_times: Vec<Duration>,
    pub ok: bool,
}

impl RequestRecord {
    pub fn output_tokens(&self) -> usize {
        self.token_times.len()
    }

    pub fn ttft(&self) -> Option<Duration> {
        self.token_times.first().copied()
    }

    pub fn e2e(&self) -> Option<Duration> {
        self.token_times.last().copied()
    }

    /// Mean time per output token after the first.
    pub fn tpot(&self) -> Option<Duration> {
        let n = self.token_times.len();
        (n > 1).then(|| (self.token_times[n - 1] - self.token_times[0]) / (n as u32 - 1))
    }

    pub fn itls(&self) -> impl Iterator<Item = Duration> + '_ {
        self.token_times.windows(2).map(|w| w[1] - w[0])
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

/// The figures of one benchmark run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    pub duration: Duration,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub ttft: Distribution,
    pub tpot: Distribution,
    pub itl: Distribution,
    pub e2el: Distribution,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Summary {
    pub fn of(records: &[RequestRecord], duration: Duration, ps: &[f64]) -> Summary {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft()).map(ms).collect();
        let mut tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot()).map(ms).collect();
        let mut itl: Vec<f64> = ok.iter().flat_map(|r| r.itls()).map(ms).collect();
        let mut e2el: Vec<f64> = ok.iter().filter_map(|r| r.e2e()).map(ms).collect();
        Summary {
            completed: ok.len(),
            failed: records.len() - ok.len(),
            duration,
            input_tokens: ok.iter().map(|r| r.prompt_tokens).sum(),
            output_tokens: ok.iter().map(|r| r.output_tokens()).sum(),
            ttft: Distribution::of(&mut ttft, ps),
            tpot: Distribution::of(&mut tpot, ps),
            itl: Distribution::of(&mut itl, ps),
            e2el: Distribution::of(&mut e2el, ps),
        }
    }

    pub fn request_throughput(&self) -> f64 {
        self.completed as f64 / self.duration.as_secs_f64()
    }

    pub fn output_throughput(&self) -> f64 {
        self.output_tokens as f64 / self.duration.as_secs_f64()
    }

    pub fn total_throughput(&self) -> f64 {
        (self.input_tokens + self.output_tokens) as f64 / self.duration.as_secs_f64()
    }

    /// The report in `vllm bench serve`'s labels.
    pub fn render(&self, title: &str) -> String {
        let mut s = format!("{:=^50}\n", format!(" {title} "));
        let mut line = |k: &str, v: String| s.push_str(&format!("{k:<40}{v:>10}\n"));
        line("Successful requests:", self.completed.to_string());
        line("Failed requests:", self.failed.to_string());
        line(
            "Benchmark duration (s):",
            format!("{:.2}", self.duration.as_secs_f64()),
        );
        line("Total input tokens:", self.input_tokens.to_string());
        line("Total generated tokens:", self.output_tokens.to_string());
        line(
            "Request throughput (req/s):",
            format!("{:.2}", self.request_throughput()),
        );
        line(
            "Output token throughput (tok/s):",
            format!("{:.2}", self.output_throughput()),
        );
        line(
            "Total token throughput (tok/s):",
            format!("{:.2}", self.total_throughput()),
        );
        for (name, label, d) in [
            ("Time to First Token", "TTFT", &self.ttft),
            (
                "Time per Output Token (excl. 1st token)",
                "TPOT",
                &self.tpot,
            ),
            ("Inter-token Latency", "ITL", &self.itl),
            ("End-to-end Latency", "E2EL", &self.e2el),
        ] {
            s.push_str(&format!("{:-^50}\n", format!("{name}")));
            s.push_str(&format!(
                "{:<40}{:>10.2}\n",
                format!("Mean {label} (ms):"),
                d.mean
            ));
            s.push_str(&format!(
                "{:<40}{:>10.2}\n",
                format!("Median {label} (ms):"),
                d.median
            ));
            for (p, v) in &d.percentiles {
                s.push_str(&format!(
                    "{:<40}{:>10.2}\n",
                    format!("P{p} {label} (ms):"),
                    v
                ));
            }
        }
        s.push_str(&"=".repeat(50));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
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
        let r = RequestRecord {
            prompt_tokens: 10,
            token_times: vec![ms(100), ms(120), ms(150), ms(160)],
            ok: true,
        };
        assert_eq!(r.ttft(), Some(ms(100)));
        assert_eq!(r.e2e(), Some(ms(160)));
        assert_eq!(r.tpot(), Some(ms(20)));
        assert_eq!(r.itls().collect::<Vec<_>>(), vec![ms(20), ms(30), ms(10)]);
        let failed = RequestRecord {
            ok: false,
            ..RequestRecord::default()
        };
        let s = Summary::of(&[r, failed], Duration::from_secs(2), &[50.0, 99.0]);
        assert_eq!(
            (s.completed, s.failed, s.output_tokens, s.input_tokens),
            (1, 1, 4, 10)
        );
        assert_eq!(s.output_throughput(), 2.0);
        assert_eq!(s.ttft.mean, 100.0);
        assert_eq!(s.itl.median, 20.0);
        assert!(s.render("t").contains("Mean TTFT (ms):"));
    }
}
