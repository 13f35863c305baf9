//! [`SchedulerConfig`]: the limits and policies one [`Scheduler`](crate::scheduler::Scheduler)
//! plans under, as plain data: the KV cache's block size and count, the step's token budget
//! and sequence cap, the longest request, the admission policy, batching mode and SLA
//! targets. [`SchedulerConfig::validate`] rejects a configuration that contradicts itself.
//! The runner sizes its KV storage and workspace from the same struct.

use std::time::Duration;

use crate::error::EngineError;
use crate::sla::SlaTargets;
use crate::spec::SpeculativeConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// First come, first served.
    Fcfs,
    /// Lowest `priority` value first, then arrival.
    Priority,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    /// Iteration-level scheduling: requests join and leave the batch every step.
    Continuous,
    /// One fixed batch at a time, run to its slowest member; a batch forms once
    /// `max_num_seqs` requests wait or the oldest has waited `max_wait`.
    Static { max_wait: Duration },
}

#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV cache (see `kv_memory::num_blocks_for_memory`).
    pub num_blocks: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Prompt + output tokens of one request at most.
    pub max_model_len: usize,
    pub policy: SchedulingPolicy,
    pub enable_prefix_caching: bool,
    /// Split prompts longer than the remaining budget across steps.
    pub enable_chunked_prefill: bool,
    /// With chunked prefill: no request gets more than this many tokens in one step.
    pub long_prefill_token_threshold: Option<usize>,
    pub batching: Batching,
    /// Attention window of the model, if it has one: blocks that leave it are freed.
    pub sliding_window: Option<usize>,
    pub sla: SlaTargets,
    /// Speculative decoding (continuous batching only).
    pub speculative: Option<SpeculativeConfig>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            block_size: 16,
            num_blocks: 1024,
            max_num_batched_tokens: 2048,
            max_num_seqs: 64,
            max_model_len: 8192,
            policy: SchedulingPolicy::Fcfs,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            long_prefill_token_threshold: None,
            batching: Batching::Continuous,
            sliding_window: None,
            sla: SlaTargets::default(),
            speculative: None,
        }
    }
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: &str| Err(EngineError::InvalidConfig(m.to_string()));
        if self.block_size == 0 || self.num_blocks == 0 {
            return bad("block_size and num_blocks must be positive");
        }
        if self.max_num_seqs == 0 || self.max_model_len == 0 {
            return bad("max_num_seqs and max_model_len must be positive");
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return bad("max_num_batched_tokens must be at least max_num_seqs");
        }
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            return bad(
                "without chunked prefill, max_num_batched_tokens must be at least max_model_len",
            );
        }
        if self.long_prefill_token_threshold == Some(0) || self.sliding_window == Some(0) {
            return bad("long_prefill_token_threshold and sliding_window must be positive");
        }
        if let Some(spec) = &self.speculative {
            if self.batching != Batching::Continuous {
                return bad("speculative decoding needs continuous batching");
            }
            spec.validate()?;
        }
        Ok(())
    }
}
