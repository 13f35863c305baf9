//! Token sampling from logits: greedy, temperature, top-k, top-p (nucleus), min-p, with a
//! per-request seeded RNG so a `seed` reproduces a completion.
//!
//! Order of the filters follows vLLM / HF: temperature scales logits, then top-k, then
//! top-p, then min-p cut the candidate set, then one token is drawn from the renormalised
//! distribution. `temperature == 0` is greedy (argmax, lowest id on ties).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
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
}

/// Per-request sampler state: the parameters, the RNG and a reusable candidate buffer.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Sampler {
            params,
            rng,
            candidates: Vec::new(),
        }
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l / p.temperature)),
        );
        c.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 && p.top_k < c.len() {
            c.truncate(p.top_k);
        }
        // Softmax over the kept candidates (sorted, so c[0] is the max).
        let max = c[0].1;
        let mut sum = 0.0;
        for e in c.iter_mut() {
            e.1 = (e.1 - max).exp();
            sum += e.1;
        }
        for e in c.iter_mut() {
            e.1 /= sum;
        }
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            let keep = c
                .iter()
                .position(|e| {
                    mass += e.1;
                    mass >= p.top_p
                })
                .map_or(c.len(), |i| i + 1);
            c.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = c[0].1 * p.min_p;
            let keep = c.iter().take_while(|e| e.1 >= floor).count().max(1);
            c.truncate(keep);
        }
        let total: f32 = c.iter().map(|e| e.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        for &(id, prob) in c.iter() {
            if r < prob {
                return id;
            }
            r -= prob;
        }
        c[c.len() - 1].0
    }
}

/// Index of the largest logit (first on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// `log_softmax(logits)[i]` for the `n` most likely tokens, best first.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(idx.len());
    if n == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(n - 1, |&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    idx.truncate(n);
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    idx.into_iter()
        .map(|i| (i, logits[i as usize] - lse))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
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
            assert_eq!(s.sample(&[0.0, 1.0, 0.5, 0.9]), 1);
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
            seen[s.sample(&logits) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        // The kept pair is renormalised: ≈ 0.73 / 0.27.
        let share = seen[0] as f64 / 2000.0;
        assert!((0.68..0.78).contains(&share), "{share}");
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
            assert_ne!(s.sample(&logits), 2);
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
        let ta: Vec<u32> = (0..20).map(|_| a.sample(&logits)).collect();
        let tb: Vec<u32> = (0..20).map(|_| b.sample(&logits)).collect();
        assert_eq!(ta, tb);
        assert!(
            ta.iter().any(|&t| t != ta[0]),
            "temperature 0.8 should vary: {ta:?}"
        );
    }

    #[test]
    fn top_logprobs_are_sorted_log_probabilities() {
        let lp = top_logprobs(&[1.0, 3.0, 2.0], 2);
        assert_eq!(lp.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2]);
        let total: f32 = [1.0f32, 3.0, 2.0].iter().map(|l| l.exp()).sum();
        assert!((lp[0].1 - (3f32.exp() / total).ln()).abs() < 1e-6);
    }
}
