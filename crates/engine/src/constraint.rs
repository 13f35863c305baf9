//! Output constraints (structured outputs): which tokens a request may sample next.
//!
//! A [`Constraint`] is compiled once (a JSON schema, a regex, a grammar — by whoever knows
//! the tokenizer; the engine does not) and shared by every request that uses it. Each
//! request runs its own [`ConstraintState`], which the runner keeps beside the request's
//! sampler: before a sampled step it fills the request's [`TokenMask`] (the step's masks in
//! parallel on the compute pool), the mask cuts the logits before sampling, and the sampled
//! token advances the state. A state that reports itself complete ends the request.
//!
//! The engine never sees how a constraint is built; it depends on these two traits only.

use std::fmt;
use std::sync::Arc;

/// A compiled output constraint: a factory of per-request states.
pub trait OutputConstraint: Send + Sync {
    /// A fresh state, at the start of the output.
    fn start(&self) -> Box<dyn ConstraintState>;
    /// What the constraint is, for logs (`json_schema`, `regex`, ...).
    fn describe(&self) -> String;
}

/// One request's position in its constraint.
pub trait ConstraintState: Send {
    /// Sets in `mask` the tokens that may come next (it arrives cleared).
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String>;
    /// Advances past the sampled `token`. `Ok(true)`: the constraint is complete and nothing
    /// may follow, so the output ends here.
    fn accept(&mut self, token: u32) -> Result<bool, String>;
}

/// A shared handle on a compiled constraint, carried in `RequestParams`. Two handles are
/// equal when they share one compiled constraint.
#[derive(Clone)]
pub struct Constraint(Arc<dyn OutputConstraint>);

impl Constraint {
    pub fn new(c: Arc<dyn OutputConstraint>) -> Constraint {
        Constraint(c)
    }

    pub fn start(&self) -> Box<dyn ConstraintState> {
        self.0.start()
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Constraint({})", self.0.describe())
    }
}

/// A set of token ids as a bit per token (32 to a word, token `t` is bit `t % 32` of word
/// `t / 32`, the layout llguidance's masks use).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    num_tokens: usize,
}

impl TokenMask {
    /// An empty mask over `num_tokens` ids.
    pub fn new(num_tokens: usize) -> TokenMask {
        TokenMask {
            words: vec![0; num_tokens.div_ceil(32)],
            num_tokens,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Disallows every token.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Allows `token` (ignored when outside the mask).
    pub fn allow(&mut self, token: u32) {
        if (token as usize) < self.num_tokens {
            self.words[token as usize / 32] |= 1 << (token % 32);
        }
    }

    pub fn is_allowed(&self, token: u32) -> bool {
        (token as usize) < self.num_tokens
            && self.words[token as usize / 32] >> (token % 32) & 1 == 1
    }

    /// The words, for filling in bulk. Bits past `num_tokens` are ignored.
    pub fn words_mut(&mut self) -> &mut [u32] {
        &mut self.words
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        (0..self.num_tokens)
            .step_by(32)
            .map(|t| {
                let w = self.words[t / 32];
                let valid = self.num_tokens - t;
                let w = if valid < 32 {
                    w & ((1 << valid) - 1)
                } else {
                    w
                };
                w.count_ones() as usize
            })
            .sum()
    }

    /// Sets every disallowed logit to −∞; logits past the mask's tokens (an LM head wider
    /// than the vocabulary) are disallowed too.
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            let w = self.words.get(i).copied().unwrap_or(0);
            if w == u32::MAX && (i + 1) * 32 <= self.num_tokens {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if w >> b & 1 == 0 || i * 32 + b >= self.num_tokens {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_keeps_exactly_its_tokens() {
        let mut m = TokenMask::new(70);
        assert_eq!(m.count(), 0);
        for t in [0, 31, 32, 69, 70, 500] {
            m.allow(t);
        }
        assert_eq!(m.count(), 4);
        let allowed: Vec<u32> = (0..80).filter(|&t| m.is_allowed(t)).collect();
        assert_eq!(allowed, [0, 31, 32, 69]);
        // An LM head wider than the vocabulary: the extra rows are cut too.
        let mut logits = vec![1.0f32; 80];
        m.apply(&mut logits);
        let kept: Vec<usize> = (0..80).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(kept, [0, 31, 32, 69]);
        m.clear();
        assert_eq!(m.count(), 0);
    }

    #[test]
    fn bits_past_the_vocabulary_do_not_count() {
        let mut m = TokenMask::new(33);
        m.words_mut()[1] = !1; // only bits for ids ≥ 33 set
        assert_eq!(m.count(), 0);
        let mut logits = vec![0.0f32; 64];
        m.words_mut()[0] = u32::MAX;
        m.apply(&mut logits);
        assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), 32);
    }
}
