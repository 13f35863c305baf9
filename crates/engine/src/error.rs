//! [`EngineError`]: the one error enum of this crate.
//!
//! Running out of KV blocks is *not* an error (allocation returns `None` and the scheduler
//! waits or preempts); errors are for things that can never succeed: a request that cannot
//! fit, a configuration that contradicts itself.

use crate::request::RequestId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(RequestId),
    #[error("request {0} asks for max_tokens = 0")]
    ZeroMaxTokens(RequestId),
    #[error("request {0} already exists")]
    DuplicateRequest(RequestId),
    #[error(
        "request {id}: prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds \
         the maximum model length ({max_model_len})"
    )]
    ExceedsMaxModelLen {
        id: RequestId,
        prompt_tokens: usize,
        max_tokens: usize,
        max_model_len: usize,
    },
    #[error(
        "request {id} needs {needed_blocks} KV blocks at its longest but the whole cache has \
         {num_blocks}"
    )]
    ExceedsKvCache {
        id: RequestId,
        needed_blocks: usize,
        num_blocks: usize,
    },
    #[error(
        "invalid KV cache memory '{0}': expected bytes (e.g. 4GiB, 512MiB, 1000000) or a fraction in (0, 1]"
    )]
    InvalidKvCacheMemory(String),
    /// A request's output constraint failed mid-generation (a grammar over its step limits,
    /// or one that allows no token at all).
    #[error("request {id}: the output constraint failed: {message}")]
    Constraint { id: RequestId, message: String },
    /// The forward pass refused a batch (a bug in the engine, not in the request).
    #[error("model error: {0}")]
    Model(String),
    /// The engine thread is gone (shut down or crashed).
    #[error("the engine has stopped")]
    EngineStopped,
}
