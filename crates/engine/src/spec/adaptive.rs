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
//! How likely a draft is depends on where its proposal came from, so acceptance is kept
//! **by class** ([`DraftClass`]): a draft model's; prompt lookup's, by the length of the match
//! (a one-token match is weak evidence, a four-token one strong); and a lookup proposal that
//! **continues** the previous one — its source is where the source of a proposal whose drafts
//! were all accepted goes on — which is a copy in progress. On the edit prompts of
//! `scripts/bench-spec.sh` (BENCHMARKS.md) a continuing proposal's first draft was accepted
//! 97% of the time and a fresh one's 38%, so one rate per request took too few drafts in a
//! copy and too many after it. A request's rate for a class is its own recent drafts of that
//! class, smoothed toward the engine's rate for the class ([`ClassCounts`], which guesses feed
//! too).
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

/// Weight, in drafts, of a prior rate: the engine's prior in its rate for a class, and the
/// engine's rate for a class in a request's.
const PRIOR_DRAFTS: f64 = 4.0;
/// The engine's rate for a class before its first drafts: optimistic, so speculation gets
/// tried.
pub const ENGINE_PRIOR: f64 = 0.7;
/// Weight, in drafts, of the engine's rate for a class in a request's rate for it: requests
/// alike in kind (the same workload) share most of what a class predicts, and a request has
/// few drafts of each class of its own.
const REQUEST_PRIOR_DRAFTS: f64 = 16.0;
/// Each verification step of a class scales a request's earlier record of it by this.
const DECAY: f64 = 0.9;
/// Each settled guess (one draft, a step) scales it by this: about 30 guesses' memory, so
/// a request whose guesses all hold reaches ~0.97 even from a prior of 0.
const GUESS_DECAY: f64 = 0.97;
/// A probe every this many steps that had a proposal but verified nothing...
pub const PROBE_EVERY: u32 = 8;
/// ...where a row costs at most this share of the step's tokens per row.
pub const PROBE_BELOW: f64 = 0.5;
/// Match lengths told apart; longer matches count as this long.
pub const MATCH_LENGTHS: usize = 8;
/// Classes of [`DraftClass`].
pub const CLASSES: usize = 2 + MATCH_LENGTHS;

/// Where a proposal came from, as the proposer reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A draft model's guesses.
    Model,
    /// Prompt lookup: the last `n` tokens matched earlier, the proposal is the tokens from
    /// index `from` of the request's tokens.
    Lookup { n: usize, from: usize },
}

/// The kind of a proposal, for the acceptance its drafts can expect (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftClass(usize);

impl DraftClass {
    pub const MODEL: DraftClass = DraftClass(0);
    /// A lookup proposal continuing one whose drafts were all accepted.
    pub const CONTINUED: DraftClass = DraftClass(1);

    /// A fresh lookup match of `n` tokens.
    pub fn matched(n: usize) -> DraftClass {
        DraftClass(1 + n.clamp(1, MATCH_LENGTHS))
    }
}

/// Accepted and verified drafts by class (the engine's, over all requests; settled guesses
/// count as verified drafts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounts {
    accepted: [u64; CLASSES],
    verified: [u64; CLASSES],
}

impl ClassCounts {
    pub fn verified(&mut self, class: DraftClass, drafts: usize) {
        self.verified[class.0] += drafts as u64;
    }

    pub fn accepted(&mut self, class: DraftClass) {
        self.accepted[class.0] += 1;
    }

    /// The class's acceptance rate, with [`PRIOR_DRAFTS`] drafts at [`ENGINE_PRIOR`].
    pub fn rate(&self, class: DraftClass) -> f64 {
        acceptance(self.accepted[class.0], self.verified[class.0], ENGINE_PRIOR)
    }
}

/// Accepted and verified drafts of one class, recent ones weighing most.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Tally {
    accepted: f64,
    verified: f64,
}

/// A draft not verified: the position it proposed a token for, the token, its class, and
/// where in the request's tokens it was taken from (prompt lookup).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Guess {
    pos: usize,
    token: u32,
    class: DraftClass,
    from: Option<usize>,
}

/// The drafts of the step in flight: their class, how many, how many were accepted so far,
/// and where in the request's tokens they were taken from (prompt lookup).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Verifying {
    class: DraftClass,
    drafts: usize,
    accepted: usize,
    from: Option<usize>,
}

/// How a request's drafts have fared, by class; steps since it last verified one; its
/// pending guess or verification; and where a proposal would continue a copy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftRecord {
    tallies: [Tally; CLASSES],
    idle_proposals: u32,
    guess: Option<Guess>,
    verifying: Option<Verifying>,
    continues_at: Option<usize>,
}

impl Default for DraftRecord {
    fn default() -> Self {
        DraftRecord {
            tallies: [Tally::default(); CLASSES],
            idle_proposals: 0,
            guess: None,
            verifying: None,
            continues_at: None,
        }
    }
}

impl DraftRecord {
    /// The class of a proposal from `source`.
    pub fn class(&self, source: Source) -> DraftClass {
        match source {
            Source::Model => DraftClass::MODEL,
            Source::Lookup { from, .. } if self.continues_at == Some(from) => DraftClass::CONTINUED,
            Source::Lookup { n, .. } => DraftClass::matched(n),
        }
    }

    /// The verification step of the drafts taken last (its accepted ones follow, one by
    /// one); returns their class.
    pub fn verified(&mut self, drafts: usize) -> DraftClass {
        // Without a plan (verification not adaptive), the drafts count as a model's.
        let v = self.verifying.get_or_insert(Verifying {
            class: DraftClass::MODEL,
            drafts,
            accepted: 0,
            from: None,
        });
        v.drafts = drafts;
        v.accepted = 0;
        let t = &mut self.tallies[v.class.0];
        t.accepted *= DECAY;
        t.verified = t.verified * DECAY + drafts as f64;
        self.idle_proposals = 0;
        v.class
    }

    /// One more of the drafts in verification was accepted; returns their class.
    pub fn accepted(&mut self) -> DraftClass {
        let Some(v) = self.verifying.as_mut() else {
            return DraftClass::MODEL;
        };
        self.tallies[v.class.0].accepted += 1.0;
        v.accepted += 1;
        if v.accepted == v.drafts {
            // All accepted, then the token after them: the source's next one if it holds.
            self.continues_at = v.from.map(|f| f + v.drafts + 1);
        }
        v.class
    }

    /// The request's acceptance rate for `class`: its own record, with
    /// [`REQUEST_PRIOR_DRAFTS`] drafts at the engine's rate `engine`.
    pub fn rate(&self, class: DraftClass, engine: f64) -> f64 {
        let t = &self.tallies[class.0];
        (t.accepted + REQUEST_PRIOR_DRAFTS * engine) / (t.verified + REQUEST_PRIOR_DRAFTS)
    }

    /// Whether up to `k` drafts of `class` could be verified this step under `threshold`, by
    /// their chance or as a probe, the engine's rate for the class being `engine`; if not,
    /// proposing them is wasted work.
    pub fn worth_proposing(
        &self,
        k: usize,
        class: DraftClass,
        engine: f64,
        threshold: f64,
    ) -> bool {
        k > 0
            && (threshold < PROBE_BELOW
                || drafts_to_verify(k, self.rate(class, engine), threshold) > 0)
    }

    /// Of `proposal` (drafts for positions `pos`, `pos + 1`, …, from `source`, of `class`
    /// ([`DraftRecord::class`]), the engine's rate for the class being `engine`), those to
    /// verify this step under `threshold` (see the module); if none, its first draft
    /// becomes the guess.
    pub fn drafts_to_take(
        &mut self,
        proposal: &[u32],
        source: Source,
        class: DraftClass,
        pos: usize,
        engine: f64,
        threshold: f64,
    ) -> usize {
        let proposed = proposal.len();
        let take = drafts_to_verify(proposed, self.rate(class, engine), threshold);
        let from = match source {
            Source::Model => None,
            Source::Lookup { from, .. } => Some(from),
        };
        self.guess = None;
        self.verifying = None;
        self.continues_at = None;
        let verify = |drafts: usize| Verifying {
            class,
            drafts,
            accepted: 0,
            from,
        };
        if take > 0 || proposed == 0 {
            self.verifying = (take > 0).then(|| verify(take));
            return take;
        }
        if threshold < PROBE_BELOW {
            self.idle_proposals += 1;
            if self.idle_proposals >= PROBE_EVERY {
                self.idle_proposals = 0;
                self.verifying = Some(verify(1));
                return 1;
            }
        }
        self.guess = Some(Guess {
            pos,
            token: proposal[0],
            class,
            from,
        });
        0
    }

    /// The request generated `token` at position `pos`: settles the guess for it, if any
    /// (returns its class and whether it held).
    pub fn generated(&mut self, pos: usize, token: u32) -> Option<(DraftClass, bool)> {
        let g = self.guess.take_if(|g| g.pos == pos)?;
        let held = g.token == token;
        let t = &mut self.tallies[g.class.0];
        t.accepted = t.accepted * GUESS_DECAY + f64::from(u8::from(held));
        t.verified = t.verified * GUESS_DECAY + 1.0;
        self.continues_at = g.from.filter(|_| held).map(|f| f + 1);
        Some((g.class, held))
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

/// An engine-wide rate: `accepted` of `verified` drafts, with [`PRIOR_DRAFTS`] at `prior`.
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

    /// A lookup proposal of `n` matched tokens from index `from`.
    fn lookup(n: usize, from: usize) -> Source {
        Source::Lookup { n, from }
    }

    #[test]
    fn a_requests_rate_starts_at_the_engines_and_follows_its_recent_drafts() {
        let mut r = DraftRecord::default();
        let c = DraftClass::matched(3);
        assert_eq!(r.rate(c, 0.5), 0.5);
        let verify = |r: &mut DraftRecord, accepted: usize| {
            assert_eq!(
                r.drafts_to_take(&[1, 2, 3, 4], lookup(3, 0), c, 9, 0.5, 0.0),
                4
            );
            assert_eq!(r.verified(4), c);
            (0..accepted).for_each(|_| assert_eq!(r.accepted(), c));
        };
        for _ in 0..40 {
            verify(&mut r, 4);
        }
        // ~40 drafts of its own against 16 at the engine's 0.5: (40 + 8) / 56.
        assert!(r.rate(c, 0.5) > 0.85, "{}", r.rate(c, 0.5));
        // Other classes still start at the engine's rate for them.
        assert_eq!(r.rate(DraftClass::matched(1), 0.2), 0.2);
        // Twenty rejected steps later, the record has turned.
        for _ in 0..20 {
            verify(&mut r, 0);
        }
        assert!(r.rate(c, 0.5) < 0.25, "{}", r.rate(c, 0.5));
        assert!((acceptance(96, 96, 0.5) - 0.98).abs() < 1e-9);
        let mut engine = ClassCounts::default();
        assert_eq!(engine.rate(c), ENGINE_PRIOR);
        engine.verified(c, 6);
        (0..6).for_each(|_| engine.accepted(c));
        assert!((engine.rate(c) - (6.0 + 4.0 * ENGINE_PRIOR) / 10.0).abs() < 1e-12);
        assert_eq!(engine.rate(DraftClass::CONTINUED), ENGINE_PRIOR);
    }

    #[test]
    fn a_proposal_continuing_one_whose_drafts_all_held_is_its_own_class() {
        let mut r = DraftRecord::default();
        // A fresh 2-token match from index 40, three drafts.
        let first = lookup(2, 40);
        assert_eq!(r.class(first), DraftClass::matched(2));
        assert_eq!(
            r.drafts_to_take(&[7, 8, 9], first, DraftClass::matched(2), 100, 0.5, 0.1),
            3
        );
        r.verified(3);
        (0..3).for_each(|_| _ = r.accepted());
        // All held, then the token after them: the copy goes on at 40 + 3 + 1.
        assert_eq!(r.class(lookup(4, 44)), DraftClass::CONTINUED);
        assert_eq!(r.class(lookup(4, 43)), DraftClass::matched(4));
        assert_eq!(r.class(Source::Model), DraftClass::MODEL);
        // Long matches share the longest class.
        assert_eq!(DraftClass::matched(40), DraftClass::matched(MATCH_LENGTHS));
        // A rejected draft ends the copy.
        let c = DraftClass::CONTINUED;
        assert_eq!(
            r.drafts_to_take(&[1, 2], lookup(4, 44), c, 104, 0.9, 0.1),
            2
        );
        r.verified(2);
        _ = r.accepted();
        assert_eq!(r.class(lookup(4, 47)), DraftClass::matched(4));
        // So does a step without a proposal.
        assert_eq!(r.drafts_to_take(&[1], lookup(2, 60), c, 106, 0.9, 0.1), 1);
        r.verified(1);
        _ = r.accepted();
        assert_eq!(r.class(lookup(2, 62)), DraftClass::CONTINUED);
        assert_eq!(
            r.drafts_to_take(&[], Source::Model, DraftClass::MODEL, 108, 0.9, 0.1),
            0
        );
        assert_eq!(r.class(lookup(2, 62)), DraftClass::matched(2));
        // A guess that holds continues too, one token on.
        let m = DraftClass::matched(3);
        assert_eq!(
            r.drafts_to_take(&[5, 6], lookup(3, 70), m, 110, 0.0, 0.95),
            0
        );
        assert_eq!(r.generated(110, 5), Some((m, true)));
        assert_eq!(r.class(lookup(3, 71)), DraftClass::CONTINUED);
        assert_eq!(
            r.drafts_to_take(&[5, 6], lookup(3, 80), m, 111, 0.0, 0.95),
            0
        );
        assert_eq!(r.generated(111, 4), Some((m, false)));
        assert_eq!(r.class(lookup(3, 81)), DraftClass::matched(3));
    }

    #[test]
    fn a_request_that_stopped_drafting_probes_where_rows_are_cheap_and_not_under_load() {
        let c = DraftClass::MODEL;
        let mut r = DraftRecord::default();
        for _ in 0..30 {
            assert_eq!(
                r.drafts_to_take(&[1, 2, 3, 4], Source::Model, c, 9, 0.7, 0.0),
                4
            );
            r.verified(4);
        }
        let steps = |r: &mut DraftRecord, threshold| {
            (0..2 * PROBE_EVERY)
                .map(|_| r.drafts_to_take(&[7, 8, 9], Source::Model, c, 50, 0.0, threshold))
                .collect::<Vec<_>>()
        };
        let cheap = steps(&mut r, 0.2);
        assert_eq!(cheap.iter().sum::<usize>(), 2, "{cheap:?}");
        assert_eq!(cheap[PROBE_EVERY as usize - 1], 1);
        assert_eq!(steps(&mut r, 0.9).iter().sum::<usize>(), 0);
        // So under load it is not worth proposing for; where rows are cheap it is (probes).
        assert!(!r.worth_proposing(3, c, 0.0, 0.9));
        assert!(r.worth_proposing(3, c, 0.0, 0.2));
        assert!(DraftRecord::default().worth_proposing(3, c, 0.7, 0.5));
        assert!(!DraftRecord::default().worth_proposing(0, c, 0.7, 0.0));
        // No proposal, no probe.
        assert_eq!(r.drafts_to_take(&[], Source::Model, c, 50, 0.0, 0.0), 0);
    }

    #[test]
    fn guesses_settled_by_the_generated_tokens_lift_a_request_over_a_high_threshold() {
        // Under load (threshold 0.9) a new request starts at the engine's 0.74: no drafts.
        let (engine, threshold, c) = (0.74, 0.9, DraftClass::matched(4));
        let mut r = DraftRecord::default();
        let step = |r: &mut DraftRecord, pos: usize, right: bool| {
            let taken = r.drafts_to_take(&[5, 6, 7], lookup(4, 3), c, pos, engine, threshold);
            if taken == 0 {
                assert_eq!(
                    r.generated(pos, if right { 5 } else { 4 }),
                    Some((c, right))
                );
            }
            taken
        };
        assert_eq!(step(&mut r, 10, true), 0);
        // Its guesses hold step after step: some steps later (~50 guesses against the
        // engine's 16 drafts) it verifies drafts.
        let first = (11..100).find(|&pos| step(&mut r, pos, true) > 0);
        assert!(first.is_some_and(|p| p < 70), "{first:?}");
        // A request whose guesses mostly miss stays off: 3 in 4 right is below 0.9.
        let mut miss = DraftRecord::default();
        let taken: usize = (0..400).map(|i| step(&mut miss, i, i % 4 != 0)).sum();
        assert_eq!(taken, 0);
        // A guess settles only at its own position, once.
        let mut g = DraftRecord::default();
        assert_eq!(
            g.drafts_to_take(&[5], lookup(4, 3), c, 10, 0.0, threshold),
            0
        );
        assert_eq!(g.generated(11, 5), None);
        assert_eq!(g.rate(c, 0.0), 0.0);
        assert_eq!(g.generated(10, 5), Some((c, true)));
        assert_eq!(g.generated(10, 5), None);
        assert!(
            (g.rate(c, 0.0) - 1.0 / 17.0).abs() < 1e-12,
            "{}",
            g.rate(c, 0.0)
        );
    }
}
