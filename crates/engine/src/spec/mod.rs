//! Speculative decoding: propose a few tokens a request is likely to produce next, verify them
//! all in one forward of the normal batched step, keep the ones the target model agrees with.
//!
//! The pieces, each where its stage of the step is:
//! - **propose**: prompt lookup ([`ngram`]) — the request's last n tokens matched earlier in
//!   its prompt and output, proposing what followed (vLLM's `ngram`, llama.cpp's lookup
//!   decoding), by the scheduler for each running decode when it plans the step; or a draft
//!   model ([`draft`]) — a smaller model with the same vocabulary, run by the runner after the
//!   target's step, its guesses handed to the scheduler for the next step.
//! - **how many** ([`adaptive`]): a draft costs a row of every matmul, its LM head and its
//!   attention whether accepted or not; the step-time model says what a row costs now, the
//!   request's acceptance so far what it is likely to return. A draft is verified only while
//!   its expected yield beats the step's own tokens per row, so a large (compute-bound) batch
//!   takes only near-certain ones and speculation does not cost throughput under load. A
//!   proposal not verified is a guess the request's next token settles, so its estimate
//!   keeps learning without a row spent.
//! - **schedule**: a decode with `k` drafts is one chunk of `1 + k` tokens — its last sampled
//!   token then the drafts — inside the step's token budget, with KV slots for all of them.
//! - **verify** (the runner): every row's logits; row `i` is sampled exactly as a plain decode
//!   would sample it (processors, `min_tokens` bans, temperature, top-k/p, min-p, the
//!   request's seeded RNG), and the draft at `i` is accepted iff the sampled token equals it.
//!   The first mismatch is the step's correction token; if all match, the last row gives a
//!   bonus token. This is the standard accept/reject rule for a proposer that puts all its
//!   mass on one token (accept `d` with probability `p(d)`, else draw from `p` without `d`),
//!   so the output distribution is the target's — and, drawing one random number per token as
//!   a plain decode does, a seeded request's output is the same token for token.
//! - **roll back** (the scheduler): the request's KV cursor advances over the accepted drafts
//!   only; slots past it are rewritten by the next step. Drafts never enter the request's
//!   token ids until accepted, so its block hashes (and the prefix cache) only ever cover
//!   verified tokens.
//!
//! Requests with an output constraint are not speculated (their masks are filled one token
//! at a time); neither are requests asking for prompt logprobs while still in their prompt.

pub mod adaptive;
pub mod draft;
pub mod ngram;

use crate::error::EngineError;

/// The most drafts one request may verify in a step.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// Where draft tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup over the request's own tokens: match its last `n` tokens
    /// (`prompt_lookup_max ≥ n ≥ prompt_lookup_min`, longest first) earlier in prompt and
    /// output, and propose what followed the latest match.
    Ngram {
        prompt_lookup_min: usize,
        prompt_lookup_max: usize,
    },
    /// A draft model (`EngineConfig::speculative_model`) sharing the target's vocabulary,
    /// proposing its greedy continuation.
    DraftModel,
}

/// `--speculative-config`, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculativeConfig {
    pub method: SpecMethod,
    /// Drafts a request verifies per step at most.
    pub num_speculative_tokens: usize,
    /// Let the step-time model choose how many drafts each step verifies (up to
    /// `num_speculative_tokens`); `false`: every draft the proposer finds.
    pub adaptive: bool,
}

impl SpeculativeConfig {
    /// Prompt lookup matching 4 down to 2 tokens (one repeated token is too weak a match),
    /// with adaptive draft counts.
    pub fn ngram(num_speculative_tokens: usize) -> SpeculativeConfig {
        SpeculativeConfig {
            method: SpecMethod::Ngram {
                prompt_lookup_min: 2,
                prompt_lookup_max: 4,
            },
            num_speculative_tokens,
            adaptive: true,
        }
    }

    /// A draft model proposing `num_speculative_tokens` tokens, adaptive verification.
    pub fn draft_model(num_speculative_tokens: usize) -> SpeculativeConfig {
        SpeculativeConfig {
            method: SpecMethod::DraftModel,
            num_speculative_tokens,
            adaptive: true,
        }
    }

    /// KV slots past a sampling chunk the scheduler reserves for the proposer to write its
    /// guesses' KV in (the draft model's; prompt lookup writes none).
    pub fn lookahead(&self) -> usize {
        match self.method {
            SpecMethod::Ngram { .. } => 0,
            SpecMethod::DraftModel => self.num_speculative_tokens,
        }
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidConfig(m));
        let k = self.num_speculative_tokens;
        if k == 0 || k > MAX_SPECULATIVE_TOKENS {
            return bad(format!(
                "num_speculative_tokens must be in 1..={MAX_SPECULATIVE_TOKENS}, not {k}"
            ));
        }
        let SpecMethod::Ngram {
            prompt_lookup_min: lo,
            prompt_lookup_max: hi,
        } = self.method
        else {
            return Ok(());
        };
        if lo == 0 || lo > hi {
            return bad(format!(
                "prompt_lookup_min ({lo}) must be at least 1 and at most prompt_lookup_max ({hi})"
            ));
        }
        Ok(())
    }
}

/// Speculation counters (vLLM's `spec_decode` metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecDecodeStats {
    /// Verification chunks that carried at least one draft.
    pub num_drafts: u64,
    /// Draft tokens verified.
    pub num_draft_tokens: u64,
    /// Draft tokens the target model agreed with.
    pub num_accepted_tokens: u64,
}

impl SpecDecodeStats {
    /// Accepted over verified drafts (0 before any draft).
    pub fn acceptance_rate(&self) -> f64 {
        if self.num_draft_tokens == 0 {
            0.0
        } else {
            self.num_accepted_tokens as f64 / self.num_draft_tokens as f64
        }
    }
}
