//! [`Request`]: the engine-side state of one generation request.
//!
//! A request is a token sequence `prompt ++ output` (one `Vec`, `num_prompt_tokens` marks the
//! boundary) and a cursor, `num_computed_tokens`: how many leading tokens have their KV in the
//! cache. The scheduler's only job per request is to move that cursor to the end; the next
//! token is sampled when it gets there. There are no prefill/decode phases: a fresh prompt, a
//! chunked prompt, a decode step and a recompute after preemption are all "catch up".
//!
//! Invariants: `num_computed_tokens ≤ num_tokens()`; `block_hashes` covers exactly the full
//! blocks of `token_ids` (`num_tokens / block_size` entries) once the scheduler has seen it.

use std::fmt;
use std::time::Instant;

use crate::block_hash::{BlockHash, extend_block_hashes};
use crate::constraint::Constraint;
use crate::pooling::Pooling;
use crate::sampler::SamplingParams;
use crate::spec::adaptive::DraftRecord;

/// Engine-wide request id (assigned by the caller, unique among live requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or EOS was generated.
    Stop,
    /// `max_tokens` or the model length was reached.
    Length,
    /// Cancelled by the client.
    Abort,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestStatus {
    Waiting,
    Running,
    /// Evicted from the KV cache; waits to recompute (its output so far is kept).
    Preempted,
    Finished(FinishReason),
}

/// What the caller decides about a request besides its prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestParams {
    /// Output tokens at most; `None` = up to the model length.
    pub max_tokens: Option<usize>,
    /// Stop tokens and EOS are ignored until this many tokens were generated.
    pub min_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-sequence token (ignored if `ignore_eos`).
    pub eos_token_id: Option<u32>,
    pub ignore_eos: bool,
    /// Lower runs first under the priority policy (vLLM's convention).
    pub priority: i32,
    /// Compute logits of every prompt token (prompt logprobs / echo). Disables prefix-cache
    /// hits for this request: cached tokens would have no logits.
    pub prompt_logprobs: bool,
    pub sampling: SamplingParams,
    /// Structured output: only tokens the constraint allows are sampled, and the output
    /// ends when the constraint is complete.
    pub constraint: Option<Constraint>,
    /// An embedding request: the prompt's final hidden states pooled into one vector
    /// ([`StreamEvent::Embedding`](crate::StreamEvent::Embedding)) and nothing generated;
    /// `max_tokens` is then ignored.
    pub pooling: Option<Pooling>,
}

impl Default for RequestParams {
    fn default() -> Self {
        RequestParams {
            max_tokens: Some(16),
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            eos_token_id: None,
            ignore_eos: false,
            priority: 0,
            prompt_logprobs: false,
            sampling: SamplingParams::default(),
            constraint: None,
            pooling: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Request {
    pub id: RequestId,
    /// `prompt ++ output`.
    token_ids: Vec<u32>,
    num_prompt_tokens: usize,
    /// Tokens at the front of `token_ids` whose KV is in the cache.
    pub num_computed_tokens: usize,
    pub status: RequestStatus,
    pub params: RequestParams,
    /// Resolved output limit (`params.max_tokens` or what the model length leaves).
    pub max_tokens: usize,
    pub arrival_time: Instant,
    /// When the scheduler first admitted the request (end of its queue time).
    pub first_scheduled_at: Option<Instant>,
    /// Admission order, the tie-breaker of both policies (set by the scheduler).
    pub arrival_seq: u64,
    /// Prompt tokens served from the prefix cache at the first admission.
    pub num_cached_tokens: usize,
    /// Times this request was preempted.
    pub num_preemptions: u32,
    /// Prefix-cache keys of the full blocks of `token_ids`.
    pub(crate) block_hashes: Vec<BlockHash>,
    /// Whether the request has been admitted at least once (for prefix-cache stats).
    pub(crate) admitted_once: bool,
    /// Whether a `SchedulerOutput` has carried it to the runner (as a `NewRequest`).
    pub(crate) announced: bool,
    /// Speculative decoding: the drafts planned for this step (not part of `token_ids`
    /// until accepted), and how the request's drafts have fared (`spec::adaptive`).
    pub(crate) drafts: Vec<u32>,
    pub(crate) draft_record: DraftRecord,
    /// A draft model's proposal for when the request has this many tokens (stale otherwise).
    pub(crate) drafts_for: usize,
}

impl Request {
    pub fn new(id: RequestId, prompt: Vec<u32>, params: RequestParams) -> Request {
        Request {
            id,
            num_prompt_tokens: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            status: RequestStatus::Waiting,
            max_tokens: params.max_tokens.unwrap_or(0),
            params,
            arrival_time: Instant::now(),
            first_scheduled_at: None,
            arrival_seq: 0,
            num_cached_tokens: 0,
            num_preemptions: 0,
            block_hashes: Vec::new(),
            admitted_once: false,
            announced: false,
            drafts: Vec::new(),
            draft_record: DraftRecord::default(),
            drafts_for: 0,
        }
    }

    pub fn prompt(&self) -> &[u32] {
        &self.token_ids[..self.num_prompt_tokens]
    }

    pub fn output(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    /// `prompt ++ output`.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.num_prompt_tokens
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status, RequestStatus::Finished(_))
    }

    /// Tokens still to run through the model before the next token can be sampled.
    pub fn num_uncomputed_tokens(&self) -> usize {
        self.num_tokens() - self.num_computed_tokens
    }

    /// Largest number of KV slots this request can ever occupy (its last sampled token is
    /// never fed back; an embedding request's are its prompt's).
    pub fn max_kv_tokens(&self) -> usize {
        self.num_prompt_tokens + self.max_tokens.saturating_sub(1)
    }

    /// The request's tokens, and its draft buffer to propose into.
    pub(crate) fn tokens_and_drafts(&mut self) -> (&[u32], &mut Vec<u32>) {
        (&self.token_ids, &mut self.drafts)
    }

    /// Most drafts that can follow the last token: accepting `k` drafts and the token after
    /// them must stay within `max_tokens` and the model length.
    pub(crate) fn max_drafts(&self, max_model_len: usize) -> usize {
        let by_tokens = self.max_tokens.saturating_sub(self.num_output_tokens() + 1);
        let by_len = max_model_len.saturating_sub(self.num_tokens() + 1);
        by_tokens.min(by_len)
    }

    /// Recomputes the prefix-cache keys of the full blocks for `block_size`.
    pub(crate) fn rehash(&mut self, block_size: usize) {
        self.block_hashes.clear();
        extend_block_hashes(&mut self.block_hashes, &self.token_ids, block_size);
    }

    /// Appends a sampled token; `complete`: the request's output constraint allows nothing
    /// after it.
    pub(crate) fn append_output(
        &mut self,
        token: u32,
        complete: bool,
        block_size: usize,
        max_model_len: usize,
    ) -> Option<FinishReason> {
        self.token_ids.push(token);
        extend_block_hashes(&mut self.block_hashes, &self.token_ids, block_size);
        self.check_stop(token, complete, max_model_len)
    }

    /// Stop conditions after `token` was appended, in order: a complete output constraint,
    /// stop tokens and EOS (only once `min_tokens` are out; EOS unless `ignore_eos`), then
    /// `max_tokens` and the model length.
    fn check_stop(&self, token: u32, complete: bool, max_model_len: usize) -> Option<FinishReason> {
        let p = &self.params;
        if complete {
            return Some(FinishReason::Stop);
        }
        if self.num_output_tokens() >= p.min_tokens {
            let eos = !p.ignore_eos && p.eos_token_id == Some(token);
            if eos || p.stop_token_ids.contains(&token) {
                return Some(FinishReason::Stop);
            }
        }
        if self.num_output_tokens() >= self.max_tokens || self.num_tokens() >= max_model_len {
            return Some(FinishReason::Length);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(params: RequestParams) -> Request {
        let mut r = Request::new(RequestId(1), vec![1, 2, 3], params);
        r.max_tokens = r.params.max_tokens.unwrap_or(100);
        r
    }

    #[test]
    fn eos_respects_min_tokens_and_ignore_eos() {
        let params = RequestParams {
            max_tokens: Some(10),
            min_tokens: 2,
            eos_token_id: Some(0),
            ..Default::default()
        };
        let mut r = req(params.clone());
        assert_eq!(
            r.append_output(0, false, 4, 100),
            None,
            "EOS before min_tokens"
        );
        assert_eq!(r.append_output(0, false, 4, 100), Some(FinishReason::Stop));
        let mut r = req(RequestParams {
            ignore_eos: true,
            ..params
        });
        for _ in 0..9 {
            assert_eq!(r.append_output(0, false, 4, 100), None);
        }
        assert_eq!(
            r.append_output(0, false, 4, 100),
            Some(FinishReason::Length)
        );
        assert_eq!(r.output(), &[0; 10]);
    }

    #[test]
    fn stop_tokens_apply_even_with_ignore_eos() {
        let mut r = req(RequestParams {
            stop_token_ids: vec![7],
            ignore_eos: true,
            eos_token_id: Some(0),
            ..Default::default()
        });
        assert_eq!(r.append_output(0, false, 4, 100), None);
        assert_eq!(r.append_output(7, false, 4, 100), Some(FinishReason::Stop));
    }

    #[test]
    fn length_by_max_tokens_or_model_len() {
        let mut r = req(RequestParams {
            max_tokens: Some(2),
            ..Default::default()
        });
        assert_eq!(r.append_output(5, false, 4, 100), None);
        assert_eq!(
            r.append_output(5, false, 4, 100),
            Some(FinishReason::Length)
        );
        let mut r = req(RequestParams {
            max_tokens: None,
            ..Default::default()
        });
        assert_eq!(r.append_output(5, false, 4, 5), None);
        assert_eq!(r.append_output(5, false, 4, 5), Some(FinishReason::Length));
        // A stop token on the last allowed step reports Stop.
        let mut r = req(RequestParams {
            max_tokens: Some(1),
            stop_token_ids: vec![9],
            ..Default::default()
        });
        assert_eq!(r.append_output(9, false, 4, 100), Some(FinishReason::Stop));
    }

    #[test]
    fn a_complete_constraint_stops_even_before_min_tokens_and_with_ignore_eos() {
        let mut r = req(RequestParams {
            min_tokens: 5,
            ignore_eos: true,
            ..Default::default()
        });
        assert_eq!(r.append_output(3, false, 4, 100), None);
        assert_eq!(r.append_output(3, true, 4, 100), Some(FinishReason::Stop));
    }

    #[test]
    fn hashes_follow_appended_tokens() {
        let mut r = req(RequestParams::default());
        extend_block_hashes(&mut r.block_hashes, &r.token_ids, 2);
        assert_eq!(r.block_hashes.len(), 1);
        r.append_output(4, false, 2, 100);
        assert_eq!(r.block_hashes.len(), 2);
        assert_eq!(r.token_ids(), &[1, 2, 3, 4]);
        assert_eq!(r.num_uncomputed_tokens(), 4);
    }
}
