//! tokenmill-engine: what turns requests into batches — the KV block pool and block tables
//! with prefix caching, the scheduler (continuous batching, chunked prefill, preemption,
//! SLA-aware batching), the sampler and the engine loop thread on top of these. Its front
//! door is [`launch`]: an [`EngineConfig`] and a loaded model in, a running engine out.
//!
//! Data path of one step: [`Scheduler::schedule_into`] → [`SchedulerOutput`] (plain data:
//! the [`NewRequest`]s the runner has not seen, one [`ScheduledChunk`] per request, each a
//! `tokenmill_model::SeqChunk`) → [`ModelRunner::execute`]: forward, one sampled token per
//! `sample` chunk (several when a chunk verifies drafts: [`spec`]) →
//! [`Scheduler::update_from_output`] → one [`RequestOutput`] per token;
//! [`Scheduler::record_step`] feeds the measured step time back.

pub mod block_hash;
pub mod block_pool;
pub mod constraint;
pub mod engine;
pub mod error;
pub mod kv_events;
pub mod kv_manager;
pub mod kv_memory;
pub mod kv_occupancy;
pub mod launch;
pub mod pooling;
pub mod request;
pub mod runner;
pub mod sampler;
pub mod scheduler;
pub mod scheduler_config;
pub mod scheduler_output;
pub mod sla;
pub mod spec;

pub use block_pool::{BlockId, BlockPool};
pub use constraint::{Constraint, ConstraintState, OutputConstraint, TokenMask};
pub use engine::{EngineHandle, EngineStats, RequestStream, StreamEvent, start};
pub use error::EngineError;
pub use kv_events::{KvEvent, KvEventBatch};
pub use kv_manager::{KvCacheManager, PrefixCacheStats};
pub use kv_memory::{KvCacheMemory, num_blocks_for_memory, system_memory_bytes};
pub use kv_occupancy::KvOccupancy;
pub use launch::{EngineConfig, Launched, STATIC_BATCH_MAX_WAIT, launch};
pub use pooling::Pooling;
pub use request::{FinishReason, Request, RequestId, RequestParams, RequestStatus};
pub use runner::{ModelRunner, PromptLogprob, StepResult};
pub use sampler::{Sampled, Sampler, SamplingParams, argmax, top_logprobs};
pub use scheduler::{Scheduler, SchedulerStats};
pub use scheduler_config::{Batching, SchedulerConfig, SchedulingPolicy};
pub use scheduler_output::{
    NewRequest, PadChunk, RequestOutput, ScheduledChunk, SchedulerOutput, TokenOutput,
};
pub use sla::{SlaTargets, StepCoefficients, StepFeatures, StepTimeModel, StepTimeStats};
pub use spec::{SpecDecodeStats, SpecMethod, SpeculativeConfig};
pub use tokenmill_model::KvDtype;
