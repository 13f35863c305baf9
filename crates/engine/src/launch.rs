//! The one front door to the engine: an [`EngineConfig`] (what the operator asks for, in the
//! units of the `serve` flags) and [`launch`], which turns it and a loaded [`Model`] into a
//! running engine thread. `tokenmill serve`, `bench-engine`, `profile`, `generate` and every
//! test that runs an engine go through here, so what the tests run is what production runs.
//!
//! Resolving the configuration against the model ([`EngineConfig::scheduler_config`]):
//! - the KV cache gets `budget / (block_size · bytes_per_token)` blocks of the chosen element
//!   type (an error if that is none);
//! - `max_model_len` is the model's context unless set lower; above the context it is an error
//!   (as in vLLM), and it is lowered, with a warning, to what the whole KV cache holds, so every
//!   admissible request can run alone;
//! - the result must pass [`SchedulerConfig::validate`].

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use tokenmill_model::{KvDtype, KvShape, Model};

use crate::engine::{EngineHandle, start};
use crate::error::EngineError;
use crate::kv_memory::{KvCacheMemory, num_blocks_for_memory, system_memory_bytes};
use crate::runner::ModelRunner;
use crate::scheduler::{Batching, SchedulerConfig, SchedulingPolicy};
use crate::sla::SlaTargets;
use crate::spec::{SpecMethod, SpeculativeConfig};

/// Static batching (for comparison runs): a batch forms once full or after this wait.
pub const STATIC_BATCH_MAX_WAIT: Duration = Duration::from_millis(100);

/// What the operator asks of the engine (the engine's `serve` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Prompt + output tokens of one request at most; `None`: the model's context length.
    pub max_model_len: Option<usize>,
    /// KV cache size: bytes or a fraction of physical memory.
    pub kv_cache_memory: KvCacheMemory,
    /// What the KV cache stores (default f16: twice the tokens of f32 in the same memory, and
    /// half the bytes each decode step's attention reads; f32 is the reference numerics).
    pub kv_cache_dtype: KvDtype,
    /// Tokens per KV block.
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    pub policy: SchedulingPolicy,
    pub batching: Batching,
    pub sla: SlaTargets,
    /// Speculative decoding (`--speculative-config`).
    pub speculative: Option<SpeculativeConfig>,
    /// The draft model of [`SpecMethod::DraftModel`] speculation (`--speculative-model`).
    pub speculative_model: Option<PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_model_len: None,
            kv_cache_memory: KvCacheMemory::Bytes(1 << 30),
            kv_cache_dtype: KvDtype::F16,
            block_size: 16,
            enable_prefix_caching: true,
            policy: SchedulingPolicy::Fcfs,
            batching: Batching::Continuous,
            sla: SlaTargets::default(),
            speculative: None,
            speculative_model: None,
        }
    }
}

/// A running engine and what its configuration resolved to.
pub struct Launched {
    pub handle: EngineHandle,
    pub thread: JoinHandle<()>,
    /// The scheduler configuration the engine runs with.
    pub config: SchedulerConfig,
    /// KV bytes cached per token, all layers (DeepSeek MLA: the latent row only).
    pub kv_bytes_per_token: usize,
    /// What the model caches per token (with what an expanded K/V cache would).
    pub kv_shape: KvShape,
    /// Limits lowered to what the machine holds, worth showing the operator.
    pub warnings: Vec<String>,
}

impl EngineConfig {
    /// The scheduler configuration this asks for on `model`, and the warnings of any limit
    /// it lowered.
    pub fn scheduler_config(
        &self,
        model: &Model,
    ) -> Result<(SchedulerConfig, Vec<String>), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidConfig(m));
        if self.block_size == 0 {
            return bad("--block-size must be positive".into());
        }
        let budget = self
            .kv_cache_memory
            .resolve(system_memory_bytes().unwrap_or(8 << 30));
        let num_blocks = num_blocks_for_memory(
            &model.kv_shape(),
            self.block_size,
            self.kv_cache_dtype,
            budget,
        );
        if num_blocks == 0 {
            return bad(format!(
                "--kv-cache-memory ({budget} bytes) holds no KV block of {} tokens",
                self.block_size
            ));
        }
        let context_length = model.context_length();
        let mut max_model_len = match self.max_model_len {
            Some(m) if m > context_length => {
                return bad(format!(
                    "--max-model-len {m} exceeds the model's context length {context_length}"
                ));
            }
            Some(m) => m,
            None => context_length,
        };
        let mut warnings = Vec::new();
        let kv_tokens = num_blocks * self.block_size;
        if max_model_len > kv_tokens {
            warnings.push(format!(
                "max_model_len lowered from {max_model_len} to {kv_tokens}: the whole KV cache \
                 holds {kv_tokens} tokens (raise --kv-cache-memory for more)"
            ));
            max_model_len = kv_tokens;
        }
        let config = SchedulerConfig {
            block_size: self.block_size,
            num_blocks,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            max_model_len,
            policy: self.policy,
            enable_prefix_caching: self.enable_prefix_caching,
            batching: self.batching,
            sla: self.sla,
            speculative: self.speculative,
            ..SchedulerConfig::default()
        };
        config.validate()?;
        Ok((config, warnings))
    }
}

/// Resolves `config` against `model` and starts the engine thread over it (opening the
/// draft model first, if speculation uses one).
pub fn launch(config: &EngineConfig, model: Model) -> Result<Launched, EngineError> {
    tokenmill_model::trace_pool_workers();
    let (scheduler, warnings) = config.scheduler_config(&model)?;
    let draft_method = matches!(
        config.speculative.map(|s| s.method),
        Some(SpecMethod::DraftModel)
    );
    let draft = match (&config.speculative_model, draft_method) {
        (Some(path), true) => Some(Model::open(path).map_err(|e| {
            EngineError::InvalidConfig(format!("speculative model {}: {e}", path.display()))
        })?),
        (None, false) => None,
        (Some(_), false) => {
            return Err(EngineError::InvalidConfig(
                "a speculative model needs speculative decoding by draft model".into(),
            ));
        }
        (None, true) => {
            return Err(EngineError::InvalidConfig(
                "speculative decoding by draft model needs --speculative-model".into(),
            ));
        }
    };
    let kv_shape = model.kv_shape();
    let mut runner = ModelRunner::with_kv_dtype(model, &scheduler, config.kv_cache_dtype);
    if let Some(draft) = draft {
        runner = runner.with_draft(draft, &scheduler, config.kv_cache_dtype)?;
    }
    let kv_bytes_per_token = runner.kv_bytes_per_token();
    let (handle, thread) = start(runner, scheduler.clone())?;
    Ok(Launched {
        handle,
        thread,
        config: scheduler,
        kv_bytes_per_token,
        kv_shape,
        warnings,
    })
}
