//! Loading a model and starting its engine: what `tokenmill serve` and the end-to-end tests
//! do before serving. One GGUF file gives the tokenizer and the model; the KV cache is sized
//! from a memory budget and the bytes of its element type (`--kv-cache-dtype`); `max_model_len` is the model's context unless set lower, and never
//! more than the whole KV cache holds (so every admissible request can run alone).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokenmill_engine::{
    Batching, EngineError, EngineHandle, KvCacheMemory, KvDtype, KvLayout, ModelRunner,
    SchedulerConfig, SlaTargets, num_blocks_for_memory, system_memory_bytes,
};
use tokenmill_gguf::GgufFile;
use tokenmill_model::Model;
use tokenmill_tokenizer::Tokenizer;

/// Engine settings (the `tokenmill serve` flags that are the engine's).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub model_path: PathBuf,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// `None`: the model's context length.
    pub max_model_len: Option<usize>,
    pub kv_cache_memory: KvCacheMemory,
    /// What the KV cache stores (f16: twice the tokens in the same memory).
    pub kv_cache_dtype: KvDtype,
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    pub sla: SlaTargets,
    pub batching: Batching,
}

impl EngineOptions {
    pub fn new(model_path: impl Into<PathBuf>) -> EngineOptions {
        EngineOptions {
            model_path: model_path.into(),
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_model_len: None,
            kv_cache_memory: KvCacheMemory::Bytes(2 << 30),
            kv_cache_dtype: KvDtype::F32,
            block_size: 16,
            enable_prefix_caching: true,
            sla: SlaTargets::default(),
            batching: Batching::Continuous,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("opening {path}: {source}")]
    Gguf {
        path: PathBuf,
        source: tokenmill_gguf::GgufError,
    },
    #[error("building the tokenizer: {0}")]
    Tokenizer(#[from] tokenmill_tokenizer::TokenizerError),
    #[error("loading the model: {0}")]
    Model(#[from] tokenmill_model::ModelError),
    #[error("starting the engine: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Config(String),
}

/// A loaded model with its engine running.
pub struct Loaded {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub engine_thread: JoinHandle<()>,
    pub config: SchedulerConfig,
    /// Warnings worth showing the operator (tokenizer warnings, clamped limits).
    pub warnings: Vec<String>,
    /// KV bytes cached per token, all layers (DeepSeek MLA: the latent row only).
    pub kv_bytes_per_token: usize,
}

/// Opens the model, sizes the KV cache from `opts` and starts the engine thread.
pub fn load(opts: &EngineOptions) -> Result<Loaded, LaunchError> {
    load_with_config(&opts.model_path, opts.kv_cache_dtype, |model| {
        scheduler_config(opts, model)
    })
}

/// The scheduler configuration `opts` asks for on a model of `cfg`.
pub fn scheduler_config(
    opts: &EngineOptions,
    model: &Model,
) -> Result<SchedulerConfig, LaunchError> {
    let context_length = model.context_length();
    if opts.block_size == 0 {
        return Err(LaunchError::Config("--block-size must be positive".into()));
    }
    let budget = opts
        .kv_cache_memory
        .resolve(system_memory_bytes().unwrap_or(8 << 30));
    let num_blocks = num_blocks_for_memory(
        &KvLayout::from_model(model),
        opts.block_size,
        model.kv_elem_bytes(opts.kv_cache_dtype),
        budget,
    );
    if num_blocks == 0 {
        return Err(LaunchError::Config(format!(
            "--kv-cache-memory ({budget} bytes) holds no KV block of {} tokens",
            opts.block_size
        )));
    }
    let max_model_len = match opts.max_model_len {
        Some(m) if m > context_length => {
            return Err(LaunchError::Config(format!(
                "--max-model-len {m} exceeds the model's context length {context_length}"
            )));
        }
        Some(m) => m,
        None => context_length,
    };
    Ok(SchedulerConfig {
        block_size: opts.block_size,
        num_blocks,
        max_num_batched_tokens: opts.max_num_batched_tokens,
        max_num_seqs: opts.max_num_seqs,
        max_model_len,
        enable_prefix_caching: opts.enable_prefix_caching,
        batching: opts.batching,
        sla: opts.sla,
        ..SchedulerConfig::default()
    })
}

/// Opens the model at `path`, asks `make_config` for the scheduler configuration, lowers
/// `max_model_len` to what the whole KV cache holds if needed (with a warning), and starts
/// the engine thread with K/V stored as `kv_dtype` (which `make_config` sized the blocks for).
pub fn load_with_config<E>(
    path: &Path,
    kv_dtype: KvDtype,
    make_config: impl FnOnce(&Model) -> Result<SchedulerConfig, E>,
) -> Result<Loaded, LaunchError>
where
    E: std::fmt::Display,
{
    // A folder is a Hugging Face model (config.json + safetensors + tokenizer.json).
    let (tokenizer, model) = if path.is_dir() {
        (Tokenizer::from_hf_dir(path)?, Model::open(path)?)
    } else {
        let file = open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        (tokenizer, Model::from_gguf(file)?)
    };
    let mut warnings: Vec<String> = tokenizer.warnings().to_vec();
    let mut config = make_config(&model).map_err(|e| LaunchError::Config(e.to_string()))?;
    let kv_tokens = config.num_blocks * config.block_size;
    if config.max_model_len > kv_tokens {
        warnings.push(format!(
            "max_model_len lowered from {} to {kv_tokens}: the whole KV cache holds \
             {kv_tokens} tokens (raise --kv-cache-memory for more)",
            config.max_model_len
        ));
        config.max_model_len = kv_tokens;
    }
    let runner = ModelRunner::with_kv_dtype(model, &config, kv_dtype);
    let kv_bytes_per_token = runner.kv_bytes_per_token();
    let (engine, engine_thread) = tokenmill_engine::start(runner, config.clone())?;
    Ok(Loaded {
        engine,
        kv_bytes_per_token,
        tokenizer: Arc::new(tokenizer),
        engine_thread,
        config,
        warnings,
    })
}

/// Opens a GGUF file (also for a tokenizer-only process).
pub fn open(path: &Path) -> Result<GgufFile, LaunchError> {
    GgufFile::open(path).map_err(|source| LaunchError::Gguf {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads only the tokenizer of a GGUF model (`tokenmill tokenizer-server`).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, LaunchError> {
    if path.is_dir() {
        return Ok(Tokenizer::from_hf_dir(path)?);
    }
    Ok(Tokenizer::from_gguf(&open(path)?)?)
}

/// Static batching for comparison runs: a batch forms once full or after this wait.
pub const STATIC_BATCH_MAX_WAIT: Duration = Duration::from_millis(50);
