//! Loading a model with its tokenizer and starting its engine: what `tokenmill serve` and the
//! end-to-end tests do before serving. A GGUF file gives the tokenizer and the model; a folder
//! is a Hugging Face model (`config.json`, safetensors, `tokenizer.json`). The engine starts
//! through the engine crate's one front door, [`tokenmill_engine::launch`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokenmill_engine::{EngineConfig, EngineError, EngineHandle, SchedulerConfig};
use tokenmill_gguf::GgufFile;
use tokenmill_model::Model;
use tokenmill_tokenizer::Tokenizer;

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
}

/// A loaded model with its engine running.
pub struct Loaded {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub engine_thread: JoinHandle<()>,
    pub config: SchedulerConfig,
    /// Warnings worth showing the operator (tokenizer warnings, lowered limits).
    pub warnings: Vec<String>,
    /// KV bytes cached per token, all layers (DeepSeek MLA: the latent row only).
    pub kv_bytes_per_token: usize,
}

/// Opens the model at `path` with its tokenizer and launches its engine with `config`.
pub fn load(path: &Path, config: &EngineConfig) -> Result<Loaded, LaunchError> {
    let (tokenizer, model) = if path.is_dir() {
        (Tokenizer::from_hf_dir(path)?, Model::open(path)?)
    } else {
        let file = open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        (tokenizer, Model::from_gguf(file)?)
    };
    let launched = tokenmill_engine::launch(config, model)?;
    let mut warnings: Vec<String> = tokenizer.warnings().to_vec();
    warnings.extend(launched.warnings);
    Ok(Loaded {
        engine: launched.handle,
        tokenizer: Arc::new(tokenizer),
        engine_thread: launched.thread,
        config: launched.config,
        warnings,
        kv_bytes_per_token: launched.kv_bytes_per_token,
    })
}

/// Opens a GGUF file (also for a tokenizer-only process).
pub fn open(path: &Path) -> Result<GgufFile, LaunchError> {
    GgufFile::open(path).map_err(|source| LaunchError::Gguf {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads only the tokenizer of a model (`tokenmill tokenizer-server`).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, LaunchError> {
    if path.is_dir() {
        return Ok(Tokenizer::from_hf_dir(path)?);
    }
    Ok(Tokenizer::from_gguf(&open(path)?)?)
}
