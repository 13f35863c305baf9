//! How many drafts a step verifies.
//!
//! Verifying a draft adds a row to the step: a row of every matmul, one of the LM head, and
//! its attention. Whether it pays depends on the batch. A step of `R` rows that takes `T`
//! yields `R / T` tokens per unit time; one more row costs `c` and yields its draft's chance
//! of being accepted, `π`. The row raises throughput iff `π / c > R / T`, i.e.
//! `π > c · R / T` — the **threshold**.
//!
//! `c` is the step-time model's marginal cost of a decode row. For a lone decode it is at
//! most that of a prefill token: every step of one stream has one decode row, so the fit
//! cannot tell that row's cost from the step's base, and it may put all of the step on the
//! row (measured on a Zen 5 machine: base 0, 3.7 ms a decode row, 0.6 ms a prefill token).
//! The threshold was then 1 and no draft was ever verified, so no multi-row step ever
//! corrected the fit. A draft is one more row of its request's chunk, which reads the keys
//! the chunk reads anyway, as a prefill token does. In batches the decode rows vary and the
//! fit tells them apart; there the decode row's cost stands.
//! When one sequence decodes, the step is bound by streaming the weights (`T ≫ c`), the
//! threshold is small and even an unsure draft pays; in a large batch the step is
//! compute-bound (`T ≈ R · c`), the threshold nears 1 and only near-certain drafts are taken.
//!
//! A request's `j`-th draft is accepted only if the ones before it were, so with acceptance
//! rate `α` its chance is `α^j`: a request verifies the longest prefix of its proposal whose
//! last draft still clears the threshold. `α` is the request's own accepted / verified
//! drafts ([`DraftRecord`]), recent ones weighing most (text turns repetitive and back), and
//! smoothed toward the engine's rate (a request's first drafts count on the others').
//!
//! A request that verifies no drafts would never learn that its text turned into something
//! the proposer predicts — under load, a request whose estimate starts at the engine's rate
//! (say 0.74, from earlier traffic) below the step's threshold (0.9) would never speculate,
//! however well its own drafts would do. So a proposal not verified is kept as a **guess**:
//! the token the request then generates at that position settles it, accepted as the draft
//! would have been (greedy: the same token; sampled: with the chance `p(draft)` the accept
//! rule gives it), at no cost but the proposing. Guesses come one a step, so the record
//! forgets them more slowly ([`GUESS_DECAY`]) than verified drafts, which come several a step.
//! Prompt lookup proposes every step; a draft model only where its guesses could be verified
//! (they cost forward passes), so where rows are cheap (threshold below [`PROBE_BELOW`]) a
//! request that has proposals but verifies none also verifies one every [`PROBE_EVERY`]
//! steps: a probe costs one row now and then, and only there.

use crate::sla::{StepFeatures, StepTimeModel};

/// Weight, in drafts, of the engine-wide acceptance rate in a request's estimate.
const PRIOR_DRAFTS: f64 = 4.0;
/// Each verification step scales a request's earlier record by this.
const DECAY: f64 = 0.9;
/// Each settled guess (one draft, a step) scales it by this: about 30 guesses' memory, so
/// a request whose guesses all hold reaches ~0.97 even from a prior of 0.
const GUESS_DECAY: f64 = 0.97;
/// A probe every this many steps that had a proposal but verified nothing...
pub const PROBE_EVERY: u32 = 8;
/// ...where a row costs at most this share of the step's tokens per row.
pub const PROBE_BELOW: f64 = 0.5;

/// How a request's drafts have fared: verified and accepted drafts (settled guesses among
/// them), recent ones weighing most, steps since it last verified one, and its pending guess.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DraftRecord {
    accepted: f64,
    verified: f64,
    idle_proposals: u32,
    /// A draft not verified: (the position it proposed a token for, the token).
    guess: Option<(usize, u32)>,
}

impl DraftRecord {
    /// A verification step of `drafts` drafts (its accepted ones follow, one by one).
    pub fn verified(&mut self, drafts: usize) {
        self.accepted *= DECAY;
        self.verified = self.verified * DECAY + drafts as f64;
        self.idle_proposals = 0;
    }

    pub fn accepted(&mut self) {
        self.accepted += 1.0;
    }

    /// The request's acceptance rate, with [`PRIOR_DRAFTS`] drafts at the engine's `global`.
    pub fn rate(&self, global: f64) -> f64 {
        (self.accepted + PRIOR_DRAFTS * global) / (self.verified + PRIOR_DRAFTS)
    }

    /// Whether up to `k` proposed drafts could be verified this step under `threshold`, by
    /// their chance or as a probe; if not, proposing them is wasted work.
    pub fn worth_proposing(&self, k: usize, global: f64, threshold: f64) -> bool {
        k > 0 && (threshold < PROBE_BELOW || drafts_to_verify(k, self.rate(global), threshold) > 0)
    }

    /// Of `proposal` (drafts for positions `pos`, `pos + 1`, …), those to verify this step
    /// under `threshold` (see the module); if none, its first draft becomes the guess.
    pub fn drafts_to_take(
        &mut self,
        proposal: &[u32],
        pos: usize,
        global: f64,
        threshold: f64,
    ) -> usize {
        let proposed = proposal.len();
        let take = drafts_to_verify(proposed, self.rate(global), threshold);
        self.guess = None;
        if take > 0 || proposed == 0 {
            return take;
        }
        if threshold < PROBE_BELOW {
            self.idle_proposals += 1;
            if self.idle_proposals >= PROBE_EVERY {
                self.idle_proposals = 0;
                return 1;
            }
        }
        self.guess = Some((pos, proposal[0]));
        0
    }

    /// The request generated `token` at position `pos`: settles the guess for it.
    pub fn generated(&mut self, pos: usize, token: u32) {
        if let Some((at, draft)) = self.guess.take()
            && at == pos
        {
            self.accepted = self.accepted * GUESS_DECAY + f64::from(u8::from(draft == token));
            self.verified = self.verified * GUESS_DECAY + 1.0;
        }
    }
}

/// The acceptance chance a draft must clear in a step shaped like `features` (its decode rows
/// counted, `mean_context` keys per row).
pub fn threshold(model: &StepTimeModel, features: &StepFeatures, mean_context: usize) -> f64 {
    let rows = features.decode_seqs + features.prefill_tokens;
    let t = model.predict_ms(features);
    if rows == 0 || t <= 0.0 {
        return 0.0;
    }
    let mut marginal = model.predict_ms(&features.with_chunk(mean_context, 1, true)) - t;
    if rows == 1 {
        // A lone decode (module docs): at most a prefill token's cost.
        let as_prefill = model.predict_ms(&features.with_chunk(mean_context, 1, false)) - t;
        marginal = marginal.min(as_prefill);
    }
    let marginal = marginal.max(0.0);
    (marginal * rows as f64 / t).min(1.0)
}

/// The engine-wide rate: `accepted` of `verified` drafts, with [`PRIOR_DRAFTS`] at `prior`.
pub fn acceptance(accepted: u64, verified: u64, prior: f64) -> f64 {
    (accepted as f64 + PRIOR_DRAFTS * prior) / (verified as f64 + PRIOR_DRAFTS)
}

/// Drafts worth verifying out of `proposed`: the largest `j ≤ proposed` with
/// `alpha^j > threshold`.
pub fn drafts_to_verify(proposed: usize, alpha: f64, threshold: f64) -> usize {
    let mut chance = 1.0;
    for j in 0..proposed {
        chance *= alpha;
        if chance <= threshold {
            return j;
        }
    }
    proposed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sla::StepCoefficients;

    /// A model whose rows cost `row_ms` whether decode rows or prefill tokens.
    fn model(base_ms: f64, row_ms: f64) -> StepTimeModel {
        StepTimeModel::new(StepCoefficients {
            base_ms,
            prefill_ms_per_token: row_ms,
            decode_ms_per_seq: row_ms,
            context_ms_per_token: 0.0,
        })
    }

    fn decodes(n: usize) -> StepFeatures {
        (0..n).fold(StepFeatures::default(), |f, _| f.with_chunk(100, 1, true))
    }

    #[test]
    fn a_weight_bound_single_decode_takes_drafts_a_compute_bound_batch_does_not() {
        // One decode: 10 ms of weights, 1 ms per row → a row pays if accepted 1 in 11.
        let m = model(10.0, 1.0);
        let single = threshold(&m, &decodes(1), 100);
        assert!((single - 1.0 / 11.0).abs() < 1e-9, "{single}");
        assert_eq!(drafts_to_verify(4, 0.6, single), 4);
        // 64 decodes: 74 ms for 64 rows → a row must be accepted 64 in 74 times.
        let batch = threshold(&m, &decodes(64), 100);
        assert!(batch > 0.85, "{batch}");
        assert_eq!(drafts_to_verify(4, 0.6, batch), 0);
        assert_eq!(drafts_to_verify(4, 0.97, batch), 4);
    }

    #[test]
    fn a_fit_that_puts_one_streams_whole_step_on_its_decode_row_still_takes_drafts() {
        // One stream: every step had one decode row, and the fit put all 3.7 ms on it. As a
        // decode row a draft would cost the whole step (threshold 1: never verified); as a
        // row of the request's chunk it costs what a prefill token does.
        let m = StepTimeModel::new(StepCoefficients {
            base_ms: 0.0,
            prefill_ms_per_token: 0.6,
            decode_ms_per_seq: 3.7,
            context_ms_per_token: 0.0,
        });
        let single = threshold(&m, &decodes(1), 100);
        assert!((single - 0.6 / 3.7).abs() < 1e-9, "{single}");
        assert_eq!(drafts_to_verify(5, 0.7, single), 5);
        // Two decode rows: the fit tells rows apart there, the decode row's cost stands.
        assert!((threshold(&m, &decodes(2), 100) - 1.0).abs() < 1e-9);
        // Where a decode row is the cheaper estimate, it is the one used.
        let m = StepTimeModel::new(StepCoefficients {
            base_ms: 10.0,
            prefill_ms_per_token: 2.0,
            decode_ms_per_seq: 1.0,
            context_ms_per_token: 0.0,
        });
        assert!((threshold(&m, &decodes(1), 100) - 1.0 / 11.0).abs() < 1e-9);
    }

    #[test]
    fn drafts_stop_where_their_compound_chance_falls_below_the_threshold() {
        // 0.8, 0.64, 0.512, 0.41: above 0.5 for three drafts.
        assert_eq!(drafts_to_verify(8, 0.8, 0.5), 3);
        assert_eq!(drafts_to_verify(2, 0.8, 0.5), 2);
        assert_eq!(drafts_to_verify(8, 0.0, 0.0), 0);
        assert_eq!(drafts_to_verify(0, 1.0, 0.0), 0);
    }

    #[test]
    fn a_requests_rate_starts_at_the_engines_and_follows_its_recent_drafts() {
        let mut r = DraftRecord::default();
        assert_eq!(r.rate(0.5), 0.5);
        for _ in 0..40 {
            r.verified(4);
            (0..4).for_each(|_| r.accepted());
        }
        assert!(r.rate(0.5) > 0.95, "{}", r.rate(0.5));
        // Twenty rejected steps later, the record has turned.
        for _ in 0..20 {
            r.verified(4);
        }
        assert!(r.rate(0.5) < 0.2, "{}", r.rate(0.5));
        assert!((acceptance(96, 96, 0.5) - 0.98).abs() < 1e-9);
    }

    #[test]
    fn a_request_that_stopped_drafting_probes_where_rows_are_cheap_and_not_under_load() {
        let mut r = DraftRecord::default();
        for _ in 0..30 {
            r.verified(4);
        }
        let steps = |r: &mut DraftRecord, threshold| {
            (0..2 * PROBE_EVERY)
                .map(|_| r.drafts_to_take(&[7, 8, 9], 50, 0.0, threshold))
                .collect::<Vec<_>>()
        };
        let cheap = steps(&mut r, 0.2);
        assert_eq!(cheap.iter().sum::<usize>(), 2, "{cheap:?}");
        assert_eq!(cheap[PROBE_EVERY as usize - 1], 1);
        assert_eq!(steps(&mut r, 0.9).iter().sum::<usize>(), 0);
        // So under load it is not worth proposing for; where rows are cheap it is (probes).
        assert!(!r.worth_proposing(3, 0.0, 0.9));
        assert!(r.worth_proposing(3, 0.0, 0.2));
        assert!(DraftRecord::default().worth_proposing(3, 0.7, 0.5));
        assert!(!DraftRecord::default().worth_proposing(0, 0.7, 0.0));
        // No proposal, no probe.
        assert_eq!(r.drafts_to_take(&[], 50, 0.0, 0.0), 0);
    }

    #[test]
    fn guesses_settled_by_the_generated_tokens_lift_a_request_over_a_high_threshold() {
        // Under load (threshold 0.9) a new request starts at the engine's 0.74: no drafts.
        let (global, threshold) = (0.74, 0.9);
        let mut r = DraftRecord::default();
        let step = |r: &mut DraftRecord, pos: usize, right: bool| {
            let taken = r.drafts_to_take(&[5, 6, 7], pos, global, threshold);
            if taken == 0 {
                r.generated(pos, if right { 5 } else { 4 });
            }
            taken
        };
        assert_eq!(step(&mut r, 10, true), 0);
        // Its guesses hold step after step: a few steps later (seven) it verifies drafts.
        let first = (11..60).find(|&pos| step(&mut r, pos, true) > 0);
        assert!(first.is_some_and(|p| p < 35), "{first:?}");
        // A request whose guesses mostly miss stays off: 3 in 4 right is below 0.9.
        let mut miss = DraftRecord::default();
        let taken: usize = (0..400).map(|i| step(&mut miss, i, i % 4 != 0)).sum();
        assert_eq!(taken, 0);
        // A guess settles only at its own position, once.
        let mut g = DraftRecord::default();
        assert_eq!(g.drafts_to_take(&[5], 10, 0.0, threshold), 0);
        g.generated(11, 5);
        assert_eq!(g.rate(0.0), 0.0);
        assert_eq!(g.drafts_to_take(&[5], 10, 0.0, threshold), 0);
        g.generated(10, 5);
        g.generated(10, 5);
        assert!((g.rate(0.0) - 1.0 / 5.0).abs() < 1e-12, "{}", g.rate(0.0));
    }
}
