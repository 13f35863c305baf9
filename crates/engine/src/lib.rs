//! tokenmill-engine: what turns requests into batches — the KV block pool and block tables
//! with prefix caching, the scheduler (continuous batching, chunked prefill, preemption,
//! SLA-aware batching) and the sampler; the engine loop thread lands on top of these.
//!
//! Data path of one step: [`Scheduler::schedule_into`] → [`SchedulerOutput`] (plain data,
//! one [`ScheduledChunk`] per request, each a `tokenmill_model::SeqChunk`) → forward →
//! sample one token per `sample` chunk → [`Scheduler::update_from_output`] →
//! [`RequestEvent`]s; [`Scheduler::record_step`] feeds the measured step time back.

pub mod block_hash;
pub mod block_pool;
pub mod engine;
pub mod error;
pub mod kv_layout;
pub mod kv_manager;
pub mod request;
pub mod runner;
pub mod sampler;
pub mod scheduler;
pub mod scheduler_output;
pub mod sla;

pub use block_pool::{BlockId, BlockPool};
pub use engine::{EngineHandle, EngineStats, RequestStream, StreamEvent, TokenOutput, start};
pub use error::EngineError;
pub use kv_layout::{KvCacheMemory, KvLayout, num_blocks_for_memory, system_memory_bytes};
pub use kv_manager::{KvCacheManager, PrefixCacheStats};
pub use request::{FinishReason, Request, RequestId, RequestParams, RequestStatus};
pub use runner::{ModelRunner, PromptLogprob, StepResult};
pub use sampler::{Sampler, SamplingParams, argmax, top_logprobs};
pub use scheduler::{Batching, Scheduler, SchedulerConfig, SchedulerStats, SchedulingPolicy};
pub use scheduler_output::{PadChunk, RequestEvent, ScheduledChunk, SchedulerOutput};
pub use sla::{SlaTargets, StepCoefficients, StepFeatures, StepTimeModel, StepTimeStats};
pub use tokenmill_model::KvDtype;
