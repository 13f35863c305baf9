//! SLA-aware batching: an online model of step time and the latency targets it serves.
//!
//! Model: `t ≈ c0 + c_prefill·prefill_tokens + c_decode·decode_seqs + c_ctx·context_tokens`
//! ([`StepFeatures`]), where `context_tokens` counts query·key pairs attended (a decode of a
//! sequence at length `n` reads `n`; a prefill chunk of `L` tokens from `s` reads
//! `L·s + L(L+1)/2`), so attention's quadratic cost is linear in the feature.
//!
//! Fit: an exponentially weighted least-squares fit (forgetting factor `λ`, ≈ the last
//! `1/(1-λ)` steps) with a ridge term pulling toward the priors, under `c ≥ 0`:
//!
//! ```text
//! minimise Σ_k λ^(n-k) (x_k·c − t_k)² + w Σ_i (c_i − prior_i)²   subject to c ≥ 0
//! ```
//!
//! The normal equations are kept as a 4×4 matrix and vector (O(1) per step, no history). The
//! non-negative solution is exact: the optimum is the unconstrained optimum of one face
//! `{c_i = 0, i ∉ S}`, so all 16 faces are solved and the best feasible one kept. Features are
//! scaled internally so the ridge weighs all coefficients alike. The ridge keeps the system
//! well-posed when the workload does not excite every feature (e.g. decode-only stretches).
//!
//! Tail: the fit predicts a step's *mean* time, but a target is a percentile (vLLM and
//! `tokenmill bench` report P95). The model also tracks the 95th percentile of
//! `measured / predicted` online — stochastic quantile tracking in log space: up by
//! `η·0.95` after a step over the tracked ratio, down by `η·0.05` after one under it, which
//! settles where 5% of steps exceed it — and the scheduler plans with
//! [`StepTimeModel::predict_tail_ms`] (prediction × that ratio), so step-time noise the
//! linear model cannot explain (cache misses, the OS, a neighbour) is budgeted for instead
//! of pushing the tail over the target.
//!
//! The model is always fitted and always predicts (so predicted vs measured can be reported);
//! only [`SlaTargets`] make the scheduler act on it (see `scheduler.rs`).

use std::time::Duration;

/// Optional latency targets; `None` = unconstrained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlaTargets {
    /// Time to first token: caps steps that run prefill only.
    pub ttft: Option<Duration>,
    /// Time per output token: caps steps that contain decodes, and how many sequences may
    /// decode together.
    pub tpot: Option<Duration>,
}

impl SlaTargets {
    pub fn is_set(&self) -> bool {
        self.ttft.is_some() || self.tpot.is_some()
    }
}

/// What a step computes, as the cost model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepFeatures {
    /// Tokens in chunks that are not single-token decodes.
    pub prefill_tokens: usize,
    /// Decode rows: one per decoding sequence, plus the drafts it verifies (each a row
    /// with its own LM head, as a decode is).
    pub decode_seqs: usize,
    /// Query·key pairs attended, all chunks together.
    pub context_tokens: usize,
}

impl StepFeatures {
    /// Attention pairs of a chunk of `len` tokens starting at `start_pos`.
    pub fn attention_pairs(start_pos: usize, len: usize) -> usize {
        len * start_pos + len * (len + 1) / 2
    }

    /// Adds a chunk; `is_decode` for the new token of a sequence past its prompt (and the
    /// drafts after it: `len - 1`).
    pub fn add_chunk(&mut self, start_pos: usize, len: usize, is_decode: bool) {
        if is_decode {
            self.decode_seqs += len;
        } else {
            self.prefill_tokens += len;
        }
        self.context_tokens += Self::attention_pairs(start_pos, len);
    }

    pub fn with_chunk(mut self, start_pos: usize, len: usize, is_decode: bool) -> Self {
        self.add_chunk(start_pos, len, is_decode);
        self
    }

    fn vector(&self) -> [f64; 4] {
        [
            1.0,
            self.prefill_tokens as f64,
            self.decode_seqs as f64,
            self.context_tokens as f64,
        ]
    }
}

/// Coefficients in milliseconds per unit of each feature.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCoefficients {
    pub base_ms: f64,
    pub prefill_ms_per_token: f64,
    pub decode_ms_per_seq: f64,
    pub context_ms_per_token: f64,
}

impl StepCoefficients {
    /// Priors for a small model on a few CPU cores: deliberately pessimistic, so the first
    /// batches are small and the fit corrects upward from measured steps.
    pub const PRIOR: StepCoefficients = StepCoefficients {
        base_ms: 2.0,
        prefill_ms_per_token: 1.0,
        decode_ms_per_seq: 2.0,
        context_ms_per_token: 1e-4,
    };

    fn to_array(self) -> [f64; 4] {
        [
            self.base_ms,
            self.prefill_ms_per_token,
            self.decode_ms_per_seq,
            self.context_ms_per_token,
        ]
    }

    fn from_array(a: [f64; 4]) -> Self {
        StepCoefficients {
            base_ms: a[0],
            prefill_ms_per_token: a[1],
            decode_ms_per_seq: a[2],
            context_ms_per_token: a[3],
        }
    }
}

/// Predicted vs measured step time, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimeStats {
    pub num_steps: u64,
    pub last_predicted: Option<Duration>,
    pub last_measured: Option<Duration>,
    /// Mean |predicted − measured| over all recorded steps, in milliseconds.
    pub mean_abs_error_ms: f64,
    /// Tracked 95th percentile of measured / predicted (1 before any step).
    pub tail_ratio: f64,
}

/// The percentile of `measured / predicted` the tail ratio tracks.
const TAIL_QUANTILE: f64 = 0.95;
/// Step size of the tracking, in log units (a step over the ratio raises it by ~4.9%).
const TAIL_RATE: f64 = 0.05;
/// The tracked ratio stays within these bounds (a wild step cannot stall admission).
const TAIL_BOUNDS: (f64, f64) = (0.5, 4.0);
/// Predictions below this are too small for their ratio to mean anything.
const TAIL_MIN_PREDICTED_MS: f64 = 0.05;

/// Online step-time model (module doc).
#[derive(Clone, Debug)]
pub struct StepTimeModel {
    /// Feature scales: the model works on `x / scale` so the ridge is even-handed.
    scale: [f64; 4],
    /// Σ λ^(n-k) x xᵀ (scaled features).
    xtx: [[f64; 4]; 4],
    /// Σ λ^(n-k) x t.
    xty: [f64; 4],
    prior: [f64; 4],
    prior_weight: f64,
    forget: f64,
    /// Current coefficients (scaled).
    coef: [f64; 4],
    /// ln of the tracked tail ratio (module doc).
    log_tail: f64,
    stats: StepTimeStats,
}

impl Default for StepTimeModel {
    fn default() -> Self {
        Self::new(StepCoefficients::PRIOR)
    }
}

impl StepTimeModel {
    pub fn new(prior: StepCoefficients) -> StepTimeModel {
        let scale = [1.0, 256.0, 16.0, 65536.0];
        let p = prior.to_array();
        let prior: [f64; 4] = std::array::from_fn(|i| p[i].max(0.0) * scale[i]);
        StepTimeModel {
            scale,
            xtx: [[0.0; 4]; 4],
            xty: [0.0; 4],
            prior,
            prior_weight: 0.01,
            forget: 0.995,
            coef: prior,
            log_tail: 0.0,
            stats: StepTimeStats {
                tail_ratio: 1.0,
                ..StepTimeStats::default()
            },
        }
    }

    /// Current coefficients in real units (all ≥ 0).
    pub fn coefficients(&self) -> StepCoefficients {
        StepCoefficients::from_array(std::array::from_fn(|i| self.coef[i] / self.scale[i]))
    }

    /// Predicted step time in milliseconds.
    pub fn predict_ms(&self, f: &StepFeatures) -> f64 {
        let x = f.vector();
        (0..4).map(|i| self.coef[i] * x[i] / self.scale[i]).sum()
    }

    /// Predicted 95th-percentile step time in milliseconds: [`Self::predict_ms`] × the
    /// tracked tail ratio. What the scheduler holds against the targets.
    pub fn predict_tail_ms(&self, f: &StepFeatures) -> f64 {
        self.predict_ms(f) * self.log_tail.exp()
    }

    pub fn predict(&self, f: &StepFeatures) -> Duration {
        Duration::from_secs_f64(self.predict_ms(f).max(0.0) / 1e3)
    }

    pub fn stats(&self) -> StepTimeStats {
        self.stats
    }

    /// Feeds one measured step (its features and the prediction made when it was scheduled).
    pub fn observe(&mut self, f: &StepFeatures, predicted: Option<Duration>, measured: Duration) {
        let t = measured.as_secs_f64() * 1e3;
        let raw = f.vector();
        let x: [f64; 4] = std::array::from_fn(|i| raw[i] / self.scale[i]);
        for i in 0..4 {
            for j in 0..4 {
                self.xtx[i][j] = self.forget * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = self.forget * self.xty[i] + x[i] * t;
        }
        self.coef = self.solve();

        if let Some(p) = predicted.map(|p| p.as_secs_f64() * 1e3) {
            let s = &mut self.stats;
            s.mean_abs_error_ms += ((p - t).abs() - s.mean_abs_error_ms) / (s.num_steps + 1) as f64;
            if p >= TAIL_MIN_PREDICTED_MS {
                self.track_tail(t / p);
            }
        }
        let s = &mut self.stats;
        s.num_steps += 1;
        s.last_predicted = predicted;
        s.last_measured = Some(measured);
    }

    /// One step of the tail ratio's quantile tracking (module doc).
    fn track_tail(&mut self, ratio: f64) {
        let step = if ratio.ln() > self.log_tail {
            TAIL_RATE * TAIL_QUANTILE
        } else {
            -TAIL_RATE * (1.0 - TAIL_QUANTILE)
        };
        let (lo, hi) = TAIL_BOUNDS;
        self.log_tail = (self.log_tail + step).clamp(lo.ln(), hi.ln());
        self.stats.tail_ratio = self.log_tail.exp();
    }

    /// Non-negative ridge least squares by enumerating the 16 faces of the orthant.
    fn solve(&self) -> [f64; 4] {
        let w = self.prior_weight;
        let m: [[f64; 4]; 4] = std::array::from_fn(|i| {
            std::array::from_fn(|j| self.xtx[i][j] + w * (i == j) as u8 as f64)
        });
        let r: [f64; 4] = std::array::from_fn(|i| self.xty[i] + w * self.prior[i]);
        let objective = |c: &[f64; 4]| {
            let mut q = 0.0;
            for i in 0..4 {
                for j in 0..4 {
                    q += 0.5 * c[i] * m[i][j] * c[j];
                }
                q -= r[i] * c[i];
            }
            q
        };
        let mut best = ([0.0; 4], objective(&[0.0; 4]));
        for mask in 1u32..16 {
            let idx: Vec<usize> = (0..4).filter(|i| mask & (1 << i) != 0).collect();
            let n = idx.len();
            let mut a = [[0.0; 5]; 4];
            for (p, &i) in idx.iter().enumerate() {
                for (q, &j) in idx.iter().enumerate() {
                    a[p][q] = m[i][j];
                }
                a[p][4] = r[i];
            }
            let Some(sol) = gauss_solve(&mut a, n) else {
                continue;
            };
            if sol[..n].iter().any(|&v| v < 0.0) {
                continue;
            }
            let mut c = [0.0; 4];
            for (p, &i) in idx.iter().enumerate() {
                c[i] = sol[p];
            }
            let obj = objective(&c);
            if obj < best.1 {
                best = (c, obj);
            }
        }
        best.0
    }
}

/// Solves the `n×n` system in `a[..n][..n]` with right-hand side `a[..n][4]` (partial
/// pivoting). `None` if singular.
fn gauss_solve(a: &mut [[f64; 5]; 4], n: usize) -> Option<[f64; 4]> {
    for col in 0..n {
        let piv = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        for row in col + 1..n {
            let pivot_row = a[col];
            let f = a[row][col] / pivot_row[col];
            for (v, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *v -= f * p;
            }
        }
    }
    let mut x = [0.0; 4];
    for row in (0..n).rev() {
        let mut s = a[row][4];
        for k in row + 1..n {
            s -= a[row][k] * x[k];
        }
        x[row] = s / a[row][row];
    }
    Some(x)
}

/// Largest `len ≤ max_len` such that a prefill chunk of `len` tokens from `start_pos`, added
/// to `base`, has a tail prediction ([`StepTimeModel::predict_tail_ms`]) within `cap_ms` (0
/// if none is). Valid because the prediction is monotone in `len` (coefficients are
/// non-negative).
pub fn max_chunk_within(
    model: &StepTimeModel,
    base: &StepFeatures,
    start_pos: usize,
    max_len: usize,
    cap_ms: f64,
) -> usize {
    let fits =
        |len: usize| model.predict_tail_ms(&base.with_chunk(start_pos, len, false)) <= cap_ms;
    let (mut lo, mut hi) = (0, max_len);
    if fits(hi) {
        return hi;
    }
    // Invariant: the answer is in [lo, hi), fits(lo) or lo == 0.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo > 0 || fits(0) { lo } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    /// A synthetic machine: 3 ms + 0.2 ms/prefill token + 4 ms/decode + 2e-5 ms/pair.
    fn truth(f: &StepFeatures) -> f64 {
        3.0 + 0.2 * f.prefill_tokens as f64
            + 4.0 * f.decode_seqs as f64
            + 2e-5 * f.context_tokens as f64
    }

    #[test]
    fn learns_a_synthetic_cost_function() {
        let mut m = StepTimeModel::default();
        let mut seed = 1u64;
        let mut rnd = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for _ in 0..300 {
            let mut f = StepFeatures::default();
            for _ in 0..rnd(8) {
                f.add_chunk(100 + rnd(2000), 1, true);
            }
            if rnd(2) == 0 {
                f.add_chunk(rnd(512), 1 + rnd(256), false);
            }
            let p = m.predict(&f);
            m.observe(&f, Some(p), ms(truth(&f)));
        }
        let c = m.coefficients();
        assert!((c.base_ms - 3.0).abs() < 0.3, "{c:?}");
        assert!((c.prefill_ms_per_token - 0.2).abs() < 0.01, "{c:?}");
        assert!((c.decode_ms_per_seq - 4.0).abs() < 0.2, "{c:?}");
        assert!((c.context_ms_per_token - 2e-5).abs() < 1e-5, "{c:?}");
        let f = StepFeatures::default().with_chunk(1000, 1, true);
        assert!((m.predict_ms(&f) - truth(&f)).abs() < 0.5);
        assert!(m.stats().num_steps == 300 && m.stats().last_measured.is_some());
    }

    #[test]
    fn coefficients_never_go_negative() {
        // Time *decreases* with prefill tokens in this data: the fit must clamp, not go < 0.
        let mut m = StepTimeModel::default();
        for i in 0..50 {
            let f = StepFeatures {
                prefill_tokens: i * 10,
                decode_seqs: 1,
                context_tokens: 0,
            };
            m.observe(&f, None, ms(50.0 - i as f64 * 0.5));
        }
        let c = m.coefficients();
        for v in [
            c.base_ms,
            c.prefill_ms_per_token,
            c.decode_ms_per_seq,
            c.context_ms_per_token,
        ] {
            assert!(v >= 0.0, "{c:?}");
        }
    }

    #[test]
    fn tracks_prediction_error() {
        let mut m = StepTimeModel::default();
        let f = StepFeatures::default().with_chunk(0, 1, true);
        m.observe(&f, Some(ms(10.0)), ms(12.0));
        m.observe(&f, Some(ms(10.0)), ms(6.0));
        let s = m.stats();
        assert!((s.mean_abs_error_ms - 3.0).abs() < 1e-9);
        assert_eq!(s.last_predicted, Some(ms(10.0)));
    }

    #[test]
    fn tail_ratio_settles_at_the_95th_percentile() {
        // The fit is exact, then measured = truth × a ratio spread evenly over [0.9, 1.3]:
        // 5% of steps are over 1.28, so the tracked ratio must settle near 1.28.
        let mut m = StepTimeModel::default();
        let f = StepFeatures::default().with_chunk(500, 1, true);
        assert_eq!(m.stats().tail_ratio, 1.0);
        assert_eq!(m.predict_tail_ms(&f), m.predict_ms(&f));
        let mut tracked = Vec::new();
        for i in 0..4000u64 {
            let ratio = 0.9 + 0.4 * ((i * 7919) % 1000) as f64 / 1000.0;
            let p = m.predict(&f);
            m.observe(&f, Some(p), ms(p.as_secs_f64() * 1e3 * ratio));
            if i >= 2000 {
                tracked.push(m.stats().tail_ratio);
            }
        }
        let mean = tracked.iter().sum::<f64>() / tracked.len() as f64;
        assert!((mean - 1.28).abs() < 0.04, "tracked tail ratio {mean}");
        let tail = m.predict_tail_ms(&f) / m.predict_ms(&f);
        assert!((tail - m.stats().tail_ratio).abs() < 1e-9);
    }

    #[test]
    fn tail_ratio_is_bounded() {
        let mut m = StepTimeModel::default();
        let f = StepFeatures::default().with_chunk(0, 1, true);
        for _ in 0..500 {
            m.observe(&f, Some(ms(1.0)), ms(1000.0));
        }
        assert!((m.stats().tail_ratio - TAIL_BOUNDS.1).abs() < 1e-9);
        // Predictions too small to mean anything do not move it.
        let before = m.stats().tail_ratio;
        m.observe(&f, Some(ms(0.01)), ms(0.001));
        assert_eq!(m.stats().tail_ratio, before);
    }

    #[test]
    fn max_chunk_is_the_largest_fitting() {
        let m = StepTimeModel::new(StepCoefficients {
            base_ms: 1.0,
            prefill_ms_per_token: 0.5,
            decode_ms_per_seq: 2.0,
            context_ms_per_token: 0.0,
        });
        let base = StepFeatures::default().with_chunk(10, 1, true); // 3 ms
        assert_eq!(max_chunk_within(&m, &base, 0, 100, 8.0), 10);
        assert_eq!(max_chunk_within(&m, &base, 0, 4, 8.0), 4);
        assert_eq!(max_chunk_within(&m, &base, 0, 100, 2.0), 0);
        assert_eq!(
            StepFeatures::default()
                .with_chunk(5, 3, false)
                .context_tokens,
            3 * 5 + 6
        );
    }
}
