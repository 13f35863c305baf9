//! How many drafts a step verifies.
//!
//! Verifying a draft adds a row to the step: a row of every matmul, one of the LM head, and
//! its attention. Whether it pays depends on the batch. A step of `R` rows that takes `T`
//! yields `R / T` tokens per unit time; one more row costs `c` (the step-time model's
//! marginal cost of a decode row) and yields its draft's chance of being accepted, `π`. The
//! row raises throughput iff `π / c > R / T`, i.e. `π > c · R / T` — the **threshold**.
//! When one sequence decodes, the step is bound by streaming the weights (`T ≫ c`), the
//! threshold is small and even an unsure draft pays; in a large batch the step is
//! compute-bound (`T ≈ R · c`), the threshold nears 1 and only near-certain drafts are taken.
//!
//! A request's `j`-th draft is accepted only if the ones before it were, so with acceptance
//! rate `α` its chance is `α^j`: a request verifies the longest prefix of its proposal whose
//! last draft still clears the threshold. `α` is the request's own accepted / verified
//! drafts, smoothed toward the engine's rate (a request's first drafts count on the others').

use crate::sla::{StepFeatures, StepTimeModel};

/// Weight, in drafts, of the engine-wide acceptance rate in a request's estimate.
const PRIOR_DRAFTS: f64 = 4.0;

/// The acceptance chance a draft must clear in a step shaped like `features` (its decode rows
/// counted, `mean_context` keys per row).
pub fn threshold(model: &StepTimeModel, features: &StepFeatures, mean_context: usize) -> f64 {
    let rows = features.decode_seqs + features.prefill_tokens;
    let t = model.predict_ms(features);
    if rows == 0 || t <= 0.0 {
        return 0.0;
    }
    let one_more = features.with_chunk(mean_context, 1, true);
    let marginal = (model.predict_ms(&one_more) - t).max(0.0);
    (marginal * rows as f64 / t).min(1.0)
}

/// A request's acceptance rate: its `accepted` of `verified` drafts, with [`PRIOR_DRAFTS`]
/// drafts at the engine's rate `global`.
pub fn acceptance(accepted: u64, verified: u64, global: f64) -> f64 {
    (accepted as f64 + PRIOR_DRAFTS * global) / (verified as f64 + PRIOR_DRAFTS)
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

    fn model(base_ms: f64, decode_ms_per_seq: f64) -> StepTimeModel {
        StepTimeModel::new(StepCoefficients {
            base_ms,
            prefill_ms_per_token: 0.5,
            decode_ms_per_seq,
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
    fn drafts_stop_where_their_compound_chance_falls_below_the_threshold() {
        // 0.8, 0.64, 0.512, 0.41: above 0.5 for three drafts.
        assert_eq!(drafts_to_verify(8, 0.8, 0.5), 3);
        assert_eq!(drafts_to_verify(2, 0.8, 0.5), 2);
        assert_eq!(drafts_to_verify(8, 0.0, 0.0), 0);
        assert_eq!(drafts_to_verify(0, 1.0, 0.0), 0);
    }

    #[test]
    fn a_requests_rate_starts_at_the_engines_and_follows_its_own() {
        assert_eq!(acceptance(0, 0, 0.5), 0.5);
        assert!((acceptance(96, 96, 0.5) - 0.98).abs() < 1e-9);
        assert!(acceptance(0, 96, 0.5) < 0.03);
    }
}
