//! [`SchedulerOutput`]: what one step runs — plain data, no borrows into the scheduler, and
//! everything the runner needs (vLLM's `SchedulerOutput`): the runner never asks the
//! scheduler anything.
//!
//! - [`NewRequest`]s: the prompt and parameters of each request scheduled for the first
//!   time, sent once; the runner keeps them (and the request's sampler) until the request's id
//!   comes back in `finished_req_ids` — preemption does not end a request.
//! - One [`ScheduledChunk`] per scheduled request, each mapping 1:1 onto the model's
//!   [`SeqChunk`]: the token ids to run, their start position, the request's block table,
//!   which logits are wanted and how many output tokens the request had when scheduled.
//!   Token ids and block tables live in two flat buffers owned by the output, so a caller
//!   that keeps one `SchedulerOutput` and passes it to
//!   [`Scheduler::schedule_into`](crate::scheduler::Scheduler::schedule_into) every step
//!   allocates nothing once the buffers have grown (a new request's prompt is copied once, into
//!   the shared slice the runner keeps).
//!
//! What comes back, [`Scheduler::update_from_output`](crate::scheduler::Scheduler::update_from_output),
//! is one complete [`RequestOutput`] per delivered token.
//!
//! Invariants: chunks name distinct requests; a chunk's request is in `new_requests` of this
//! step or an earlier one and not yet finished; `tokens(c).len() == c.num_tokens`;
//! `block_table(c)` covers positions `< c.start_pos + c.num_tokens`; a chunk with `sample`
//! ends at its request's last known token — followed by its `num_draft_tokens` drafts, if it
//! verifies any — and its logits are `Last` or `All` (`All` with drafts).

use std::sync::Arc;
use std::time::Duration;

use tokenmill_model::{LogitsWanted, SeqChunk};

use crate::block_pool::BlockId;
use crate::request::{FinishReason, RequestId, RequestParams};
use crate::sla::StepFeatures;

/// A request the runner has not seen before: sent once, at its first scheduling.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRequest {
    pub req_id: RequestId,
    /// The runner keeps this (a shared slice: one copy of the prompt, made here).
    pub prompt: Arc<[u32]>,
    pub params: RequestParams,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub req_id: RequestId,
    /// Position of the first token; equals the request's `num_computed_tokens`.
    pub start_pos: usize,
    pub num_tokens: usize,
    pub logits: LogitsWanted,
    /// The chunk completes the request's known tokens: sample its next token from the last
    /// logits row and pass it to `update_from_output`.
    pub sample: bool,
    /// A new token past the prompt, with its drafts if any (for the step-time model).
    pub is_decode: bool,
    /// Speculative decoding: the chunk's last `num_draft_tokens` tokens are drafts to verify
    /// (its logits are `All`; row `i` samples the token after token `i`).
    pub num_draft_tokens: usize,
    /// A draft model should propose for this request after the step (set by the scheduler).
    pub propose: bool,
    /// Output tokens the request had when this step was planned (`min_tokens` counts them).
    pub num_output_tokens: usize,
    token_offset: usize,
    block_offset: usize,
    num_blocks: usize,
}

/// A pad row of a static batch: what a padded slot computes — `num_tokens` tokens from
/// position `start_pos` (attending over every position before them, as a padded row does) and,
/// with `logits`, the LM head of its last token. Its outputs are discarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PadChunk {
    pub num_tokens: usize,
    pub start_pos: usize,
    pub logits: bool,
}

#[derive(Clone, Debug, Default)]
pub struct SchedulerOutput {
    /// Requests scheduled for the first time (before any chunk of theirs runs).
    pub new_requests: Vec<NewRequest>,
    pub chunks: Vec<ScheduledChunk>,
    /// Σ `num_tokens` over chunks.
    pub num_scheduled_tokens: usize,
    /// Requests preempted this step (their KV is gone; they will recompute).
    pub preempted: Vec<RequestId>,
    /// Requests finished or aborted since the last step: drop any per-request state.
    pub finished_req_ids: Vec<RequestId>,
    /// The step as the cost model sees it, and the time it predicts.
    pub features: StepFeatures,
    pub predicted: Duration,
    /// Static batching only: the pad rows the step computes besides its chunks (see
    /// `Scheduler`'s static mode); the runner runs them on a scratch block and discards them.
    pub pads: Vec<PadChunk>,
    /// `[Σ num_tokens]`
    token_ids: Vec<u32>,
    /// `[Σ num_blocks]`
    block_ids: Vec<u32>,
}

impl SchedulerOutput {
    pub fn new() -> SchedulerOutput {
        SchedulerOutput::default()
    }

    /// Pad tokens of the step (Σ over `pads`).
    pub fn num_pad_tokens(&self) -> usize {
        self.pads.iter().map(|p| p.num_tokens).sum()
    }

    /// Empties the output, keeping its buffers.
    pub fn clear(&mut self) {
        self.new_requests.clear();
        self.chunks.clear();
        self.num_scheduled_tokens = 0;
        self.preempted.clear();
        self.finished_req_ids.clear();
        self.features = StepFeatures::default();
        self.predicted = Duration::ZERO;
        self.pads.clear();
        self.token_ids.clear();
        self.block_ids.clear();
    }

    /// Nothing to run this step.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub fn tokens(&self, c: &ScheduledChunk) -> &[u32] {
        &self.token_ids[c.token_offset..c.token_offset + c.num_tokens]
    }

    /// The request's block table (`BlockId::NULL.0` where a sliding window freed a block).
    pub fn block_table(&self, c: &ScheduledChunk) -> &[u32] {
        &self.block_ids[c.block_offset..c.block_offset + c.num_blocks]
    }

    /// Chunk `i` as the model's input.
    pub fn seq_chunk(&self, i: usize) -> SeqChunk<'_> {
        let c = &self.chunks[i];
        SeqChunk {
            tokens: self.tokens(c),
            start_pos: c.start_pos,
            block_table: self.block_table(c),
            logits: c.logits,
        }
    }

    /// All chunks as the model's input, in order.
    pub fn seq_chunks(&self) -> impl Iterator<Item = SeqChunk<'_>> + '_ {
        (0..self.chunks.len()).map(|i| self.seq_chunk(i))
    }

    /// Chunks that produce a token this step.
    pub fn num_sampled(&self) -> usize {
        self.chunks.iter().filter(|c| c.sample).count()
    }

    /// Adds a chunk of `tokens ++ drafts`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_chunk(
        &mut self,
        req_id: RequestId,
        tokens: &[u32],
        drafts: &[u32],
        start_pos: usize,
        blocks: &[BlockId],
        logits: LogitsWanted,
        sample: bool,
        is_decode: bool,
        num_output_tokens: usize,
    ) {
        let num_tokens = tokens.len() + drafts.len();
        self.chunks.push(ScheduledChunk {
            req_id,
            start_pos,
            num_tokens,
            logits,
            sample,
            is_decode,
            num_draft_tokens: drafts.len(),
            propose: false,
            num_output_tokens,
            token_offset: self.token_ids.len(),
            block_offset: self.block_ids.len(),
            num_blocks: blocks.len(),
        });
        self.token_ids.extend_from_slice(tokens);
        self.token_ids.extend_from_slice(drafts);
        self.block_ids.extend(blocks.iter().map(|b| b.0));
        self.num_scheduled_tokens += num_tokens;
        self.features.add_chunk(start_pos, num_tokens, is_decode);
    }
}

/// One generated token of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOutput {
    pub token: u32,
    pub logprob: f32,
    /// Top-N logprobs when the request asked for them.
    pub top_logprobs: Vec<(u32, f32)>,
    pub finish_reason: Option<FinishReason>,
    /// Prompt tokens served from the prefix cache.
    pub num_cached_tokens: usize,
    /// On the first token only: time in the engine's waiting queue before first scheduled.
    pub queue_time: Option<Duration>,
}

/// A token delivered to a request by [`Scheduler::update_from_output`](crate::scheduler::Scheduler::update_from_output).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOutput {
    pub req_id: RequestId,
    pub output: TokenOutput,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_map_onto_seq_chunks_and_buffers_are_reused() {
        let mut out = SchedulerOutput::new();
        out.push_chunk(
            RequestId(1),
            &[5, 6, 7],
            &[],
            0,
            &[BlockId(3)],
            LogitsWanted::Last,
            true,
            false,
            0,
        );
        out.push_chunk(
            RequestId(2),
            &[9],
            &[],
            20,
            &[BlockId(0), BlockId(1)],
            LogitsWanted::Last,
            true,
            true,
            4,
        );
        let seqs: Vec<_> = out.seq_chunks().collect();
        assert_eq!(seqs[0].tokens, &[5, 6, 7]);
        assert_eq!(seqs[1].tokens, &[9]);
        assert_eq!(seqs[1].start_pos, 20);
        assert_eq!(seqs[1].block_table, &[0, 1]);
        assert_eq!(out.num_scheduled_tokens, 4);
        assert_eq!(out.features.decode_seqs, 1);
        assert_eq!(out.features.prefill_tokens, 3);
        let cap = out.token_ids.capacity();
        out.clear();
        assert!(out.is_empty());
        assert_eq!(out.token_ids.capacity(), cap);
    }
}
