//! Token sampling from logits: logits processors (logit bias, banned tokens, repetition /
//! presence / frequency penalties), then greedy or temperature sampling with top-k, top-p
//! (nucleus) and min-p, with a per-request seeded RNG so a `seed` reproduces a completion
//! whatever else shares the batch. Also the top-N logprobs of the raw distribution.
//!
//! Order follows vLLM: penalties and bias edit the logits; temperature scales them; top-k,
//! top-p and min-p cut the candidate set; one token is drawn from the renormalised rest.
//! `temperature == 0` is greedy (argmax, lowest id on ties). Logprobs are those of the model's
//! raw output (before processors), as vLLM reports by default.
//!
//! No vocabulary-sized allocation per step: the candidate buffer lives in the [`Sampler`] and
//! is reused; top-p sorts only as many candidates as its mass needs (a doubling partial
//! selection), so a typical step is O(vocab).

use std::collections::{HashMap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The most logprobs a request may ask for per token (OpenAI's and vLLM's limit).
pub const MAX_LOGPROBS: usize = 20;

/// Sampling parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` × the top probability (0 = off).
    pub min_p: f32,
    pub seed: Option<u64>,
    /// Divides positive / multiplies negative logits of tokens seen in prompt or output (1 = off).
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated (0 = off).
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated (0 = off).
    pub frequency_penalty: f32,
    /// Added to the logits of the given tokens.
    pub logit_bias: Vec<(u32, f32)>,
    /// Return the top-N logprobs of each sampled position (N ≤ [`MAX_LOGPROBS`]).
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Whether any processor edits the logits (otherwise they are sampled as they are).
    fn has_processors(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || !self.logit_bias.is_empty()
    }
}

/// What one sampling step produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Log-probability of `token` under the raw model distribution; NaN unless `logprobs`
    /// was asked for (its log-sum-exp over the vocabulary is a fifth of a decode step's
    /// sampling time otherwise spent for nothing).
    pub logprob: f32,
    /// The top-N raw logprobs, best first (empty unless `logprobs` was asked for).
    pub top: Vec<(u32, f32)>,
    /// The request's output constraint is complete with this token: the output ends here.
    pub complete: bool,
}

/// Per-request sampler state: parameters, RNG, token counts for penalties, scratch buffers.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Occurrences of each generated token (presence / frequency penalties).
    output_counts: HashMap<u32, u32>,
    /// Tokens of the prompt (repetition penalty).
    prompt_tokens: HashSet<u32>,
    candidates: Vec<(u32, f32)>,
    /// (token, raw logit) of the logits the processors changed this step.
    touched: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler::with_prompt(params, &[])
    }

    /// A sampler whose repetition penalty also covers the prompt's tokens.
    pub fn with_prompt(params: SamplingParams, prompt: &[u32]) -> Sampler {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let prompt_tokens = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Sampler {
            params,
            rng,
            output_counts: HashMap::new(),
            prompt_tokens,
            candidates: Vec::new(),
            touched: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from one row of logits, which it edits in place (processors).
    /// `banned` tokens are never picked (e.g. EOS before `min_tokens`). The token is recorded
    /// for the penalties of later steps.
    pub fn sample(&mut self, logits: &mut [f32], banned: &[u32]) -> Sampled {
        let (lse, top) = match self.params.logprobs {
            None => (f32::NAN, Vec::new()),
            Some(n) => {
                let (_, lse) = max_and_logsumexp(logits);
                let top = match n.min(MAX_LOGPROBS) {
                    0 => Vec::new(),
                    n => top_logprobs_with(logits, n, lse, &mut self.candidates),
                };
                (lse, top)
            }
        };
        self.apply_processors(logits, banned);
        let token = if self.params.temperature <= 0.0 {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        // Processors only touched logits of the tokens in `self.touched`; restore the raw one.
        let raw = self
            .touched
            .iter()
            .find(|e| e.0 == token)
            .map_or(logits[token as usize], |e| e.1);
        *self.output_counts.entry(token).or_insert(0) += 1;
        Sampled {
            token,
            logprob: raw - lse,
            top,
            complete: false,
        }
    }

    /// Edits `logits` in place; remembers the raw value of every logit it changes.
    fn apply_processors(&mut self, logits: &mut [f32], banned: &[u32]) {
        self.touched.clear();
        if !self.params.has_processors() && banned.is_empty() {
            return;
        }
        let p = &self.params;
        let touched = &mut self.touched;
        let mut edit = |t: u32, f: &dyn Fn(f32) -> f32| {
            if let Some(l) = logits.get_mut(t as usize) {
                touched.push((t, *l)); // the first entry of a token holds its raw logit
                *l = f(*l);
            }
        };
        if p.repetition_penalty != 1.0 {
            let rp = p.repetition_penalty;
            let output_only = self
                .output_counts
                .keys()
                .filter(|t| !self.prompt_tokens.contains(t));
            for &t in self.prompt_tokens.iter().chain(output_only) {
                edit(t, &|l| if l > 0.0 { l / rp } else { l * rp });
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.output_counts {
                edit(t, &|l| {
                    l - p.presence_penalty - p.frequency_penalty * n as f32
                });
            }
        }
        for &(t, b) in &p.logit_bias {
            edit(t, &|l| l + b);
        }
        for &t in banned {
            edit(t, &|_| f32::NEG_INFINITY);
        }
    }

    /// Temperature + top-k + top-p + min-p sampling.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|e| e.1.is_finite())
                .map(|(i, &l)| (i as u32, l / p.temperature)),
        );
        if c.is_empty() {
            return argmax(logits);
        }
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            c.truncate(p.top_k);
        }
        // Softmax weights (unnormalised, max = 1).
        let max = c.iter().map(|e| e.1).fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for e in c.iter_mut() {
            e.1 = (e.1 - max).exp();
            sum += e.1;
        }
        if p.min_p > 0.0 {
            c.retain(|e| e.1 >= p.min_p); // the top weight is 1, so this is min_p × top prob
            sum = c.iter().map(|e| e.1).sum();
        }
        if p.top_p < 1.0 {
            sum = truncate_to_mass(c, p.top_p * sum);
        }
        let mut r = self.rng.random::<f32>() * sum;
        for &(id, w) in c.iter() {
            if r < w {
                return id;
            }
            r -= w;
        }
        c[c.len() - 1].0
    }
}

fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the most likely candidates whose weights first reach `mass`; returns their sum.
/// Sorts only a prefix: select the top 64, 256, 1024, ... until the prefix holds the mass.
fn truncate_to_mass(c: &mut Vec<(u32, f32)>, mass: f32) -> f32 {
    let mut k = 64.min(c.len());
    loop {
        if k < c.len() {
            c.select_nth_unstable_by(k - 1, by_logit_desc);
        }
        let prefix: f32 = c[..k].iter().map(|e| e.1).sum();
        if prefix >= mass || k == c.len() {
            c[..k].sort_unstable_by(by_logit_desc);
            let mut acc = 0.0;
            let keep = c[..k]
                .iter()
                .position(|e| {
                    acc += e.1;
                    acc >= mass
                })
                .map_or(k, |i| i + 1);
            c.truncate(keep);
            return c.iter().map(|e| e.1).sum();
        }
        k = (k * 4).min(c.len());
    }
}

/// Max and log-sum-exp of a row.
fn max_and_logsumexp(logits: &[f32]) -> (f32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (
        max,
        max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln(),
    )
}

/// Index of the largest logit (first on ties; NaN never wins; 0 when nothing beats −∞).
///
/// Sixteen lanes each keep their best value and index, so the compare-and-select loop
/// vectorises (a vocabulary of 49,152 in a few microseconds, against a fifth of a millisecond
/// for a scalar scan); then the lanes are reduced, lowest index first on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    const L: usize = 16;
    let mut best = [f32::NEG_INFINITY; L];
    let mut at = [0u32; L];
    let chunks = logits.chunks_exact(L);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        let base = (c * L) as u32;
        for l in 0..L {
            let better = chunk[l] > best[l];
            best[l] = if better { chunk[l] } else { best[l] };
            at[l] = if better { base + l as u32 } else { at[l] };
        }
    }
    let mut win = (f32::NEG_INFINITY, 0u32);
    let offset = logits.len() - tail.len();
    let tail_best = tail
        .iter()
        .enumerate()
        .map(|(i, &x)| (x, (offset + i) as u32));
    for (v, i) in best.into_iter().zip(at).chain(tail_best) {
        if v > win.0 || (v == win.0 && v > f32::NEG_INFINITY && i < win.1) {
            win = (v, i);
        }
    }
    win.1
}

/// `log_softmax(logits)` of the `n` most likely tokens, best first.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let (_, lse) = max_and_logsumexp(logits);
    top_logprobs_with(logits, n, lse, &mut Vec::new())
}

fn top_logprobs_with(
    logits: &[f32],
    n: usize,
    lse: f32,
    buf: &mut Vec<(u32, f32)>,
) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    buf.clear();
    buf.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
    buf.select_nth_unstable_by(n - 1, by_logit_desc);
    buf[..n].sort_unstable_by(by_logit_desc);
    buf[..n].iter().map(|&(i, l)| (i, l - lse)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(s: &mut Sampler, logits: &[f32]) -> u32 {
        s.sample(&mut logits.to_vec(), &[]).token
    }

    /// The plain twin of [`argmax`]: one scan, the first strictly larger value wins.
    fn argmax_reference(logits: &[f32]) -> u32 {
        let (mut best, mut at) = (f32::NEG_INFINITY, 0);
        for (i, &x) in logits.iter().enumerate() {
            if x > best {
                (best, at) = (x, i as u32);
            }
        }
        at
    }

    #[test]
    fn argmax_matches_its_reference_on_ties_nan_and_infinities() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for len in [0, 1, 5, 15, 16, 17, 33, 100, 1000, 49152] {
            for trial in 0..20 {
                // Few distinct values, so ties are common; some NaN and ±inf.
                let v: Vec<f32> = (0..len)
                    .map(|_| match rng.random_range(0..40) {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 if trial % 5 == 0 => f32::INFINITY,
                        k => (k % 7) as f32 - 3.0,
                    })
                    .collect();
                assert_eq!(argmax(&v), argmax_reference(&v), "len {len} trial {trial}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 20]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 20]), 0);
        let mut v = vec![0.0f32; 40];
        (v[37], v[21], v[38]) = (2.0, 2.0, 2.0);
        assert_eq!(argmax(&v), 21);
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(sample(&mut s, &[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let params = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: Some(1),
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        for _ in 0..50 {
            assert_eq!(sample(&mut s, &[0.0, 1.0, 0.5, 0.9]), 1);
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // probs ≈ [0.64, 0.24, 0.09, 0.03]: top_p 0.8 keeps the first two.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let params = SamplingParams {
            top_p: 0.8,
            seed: Some(7),
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        let mut seen = [0usize; 4];
        for _ in 0..2000 {
            seen[sample(&mut s, &logits) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        // The kept pair is renormalised: ≈ 0.73 / 0.27.
        let share = seen[0] as f64 / 2000.0;
        assert!((0.68..0.78).contains(&share), "{share}");
    }

    #[test]
    fn top_p_over_a_large_vocabulary_matches_a_full_sort() {
        // 5000 tokens with a slowly decaying distribution: the nucleus needs > 64 candidates,
        // so the doubling selection must widen; compare its cut with a full sort's.
        let logits: Vec<f32> = (0..5000)
            .map(|i| -(i as f32) * 0.002 + ((i * 7919) % 13) as f32 * 0.01)
            .collect();
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let mut w: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, (l - max).exp()))
            .collect();
        let total: f32 = w.iter().map(|e| e.1).sum();
        let mut full = w.clone();
        full.sort_by(by_logit_desc);
        let mut acc = 0.0;
        let want = full
            .iter()
            .position(|e| {
                acc += e.1;
                acc >= 0.5 * total
            })
            .unwrap()
            + 1;
        truncate_to_mass(&mut w, 0.5 * total);
        assert_eq!(w.len(), want);
        assert!(want > 64);
        assert_eq!(
            w.iter().map(|e| e.0).collect::<Vec<_>>(),
            full[..want].iter().map(|e| e.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let logits = [5.0, 4.5, 0.0];
        let params = SamplingParams {
            min_p: 0.1,
            seed: Some(3),
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        for _ in 0..500 {
            assert_ne!(sample(&mut s, &logits), 2);
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams {
            temperature: 0.8,
            seed: Some(42),
            ..Default::default()
        };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        let ta: Vec<u32> = (0..20).map(|_| sample(&mut a, &logits)).collect();
        let tb: Vec<u32> = (0..20).map(|_| sample(&mut b, &logits)).collect();
        assert_eq!(ta, tb);
        assert!(
            ta.iter().any(|&t| t != ta[0]),
            "temperature 0.8 should vary: {ta:?}"
        );
    }

    #[test]
    fn banned_tokens_are_never_picked() {
        let params = SamplingParams {
            logprobs: Some(0),
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params);
        let out = s.sample(&mut [1.0, 9.0, 2.0], &[1]);
        assert_eq!(out.token, 2);
        // The reported logprob is the raw model one, before banning.
        let lse = (1f32.exp() + 9f32.exp() + 2f32.exp()).ln();
        assert!((out.logprob - (2.0 - lse)).abs() < 1e-5);
    }

    #[test]
    fn logit_bias_steers_greedy_and_logprob_stays_raw() {
        let params = SamplingParams {
            logit_bias: vec![(0, 10.0)],
            logprobs: Some(0),
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params);
        let out = s.sample(&mut [1.0, 3.0], &[]);
        assert_eq!(out.token, 0);
        let lse = (1f32.exp() + 3f32.exp()).ln();
        assert!((out.logprob - (1.0 - lse)).abs() < 1e-5, "{}", out.logprob);
    }

    #[test]
    fn penalties_discourage_repeats() {
        // Frequency penalty: after picking token 0 twice, 0 falls below 1.
        let params = SamplingParams {
            frequency_penalty: 0.6,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params);
        let picks: Vec<u32> = (0..3).map(|_| sample(&mut s, &[2.0, 1.0])).collect();
        assert_eq!(picks, vec![0, 0, 1]);
        // Presence penalty: once is enough.
        let params = SamplingParams {
            presence_penalty: 1.5,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params);
        let picks: Vec<u32> = (0..2).map(|_| sample(&mut s, &[2.0, 1.0])).collect();
        assert_eq!(picks, vec![0, 1]);
        // Repetition penalty covers prompt tokens, applied once even if also generated.
        let params = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::with_prompt(params, &[0]);
        let mut logits = [3.0, 2.0, -1.0];
        s.apply_processors(&mut logits, &[]);
        assert_eq!(logits, [1.5, 2.0, -1.0]);
        assert_eq!(sample(&mut s, &[3.0, 2.0, -1.0]), 1);
        let mut logits = [3.0, 2.0, -1.0];
        s.apply_processors(&mut logits, &[]);
        assert_eq!(logits, [1.5, 1.0, -1.0]);
    }

    #[test]
    fn logprobs_are_raw_sorted_and_capped() {
        let params = SamplingParams {
            logprobs: Some(50),
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params);
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.1).cos()).collect();
        let out = s.sample(&mut logits.clone(), &[]);
        assert_eq!(out.top.len(), MAX_LOGPROBS);
        assert!(out.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(out.top[0].0, out.token);
        assert!((out.top[0].1 - out.logprob).abs() < 1e-6);
        assert_eq!(out.top, top_logprobs(&logits, MAX_LOGPROBS));
    }

    #[test]
    fn without_logprobs_the_token_is_the_same_and_its_logprob_is_not_computed() {
        let logits = [0.5, 2.5, -1.0, 2.0];
        let mut plain = Sampler::new(SamplingParams::greedy());
        let out = plain.sample(&mut logits.clone(), &[]);
        assert_eq!(out.token, 1);
        assert!(out.logprob.is_nan() && out.top.is_empty());
        let mut with = Sampler::new(SamplingParams {
            logprobs: Some(0),
            ..SamplingParams::greedy()
        });
        let out = with.sample(&mut logits.clone(), &[]);
        assert_eq!(out.token, 1);
        assert!(out.logprob < 0.0 && out.top.is_empty());
    }

    #[test]
    fn top_logprobs_are_sorted_log_probabilities() {
        let lp = top_logprobs(&[1.0, 3.0, 2.0], 2);
        assert_eq!(lp.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2]);
        let total: f32 = [1.0f32, 3.0, 2.0].iter().map(|l| l.exp()).sum();
        assert!((lp[0].1 - (3f32.exp() / total).ln()).abs() < 1e-6);
    }
}
