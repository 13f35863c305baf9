//! tokenmill-model: model architectures and the batched forward pass.
//!
//! Loads a model's configuration and weights from a GGUF file or a Hugging Face folder
//! (`config.json` + safetensors; weights stay memory-mapped in their stored format, see
//! `store.rs`) and computes logits for a batch of sequence chunks over a paged KV
//! cache. Knows nothing of requests, scheduling or HTTP.

mod batch;
mod config;
pub mod deepseek;
mod embed_head;
mod hf_config;
mod int4_linear;
mod kv_cache;
mod kv_shape;
mod llama;
mod model;
mod profile;
mod resident;
mod store;
mod weights;
mod workspace;

pub use batch::{LogitsWanted, SeqChunk};
pub use config::{Arch, ModelConfig, RopeScaling};
pub use int4_linear::{Int4Config, Int4Method, Weight};
pub use kv_cache::{KvCache, LayerKv, LayerKvMut};
pub use kv_shape::KvShape;
pub use llama::LlamaModel;
pub use model::{Model, ModelKv};
pub use profile::{OpKind, OpProfile, trace_pool_workers};
pub use store::{Linear, RawTensor, TensorRef, WeightStore};
pub use tokenmill_kernels::attention::KvDtype;
/// The one persistent thread pool the forward pass runs on (for work beside it, such as
/// the engine's constraint masks, that should share its threads rather than add more).
pub use tokenmill_kernels::pool::{ThreadPool, global as compute_pool};
pub use weights::Naming;
pub use workspace::Workspace;

/// Why a model could not be loaded or a batch could not run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] tokenmill_gguf::GgufError),
    #[error(transparent)]
    Safetensors(#[from] tokenmill_safetensors::SafetensorsError),
    #[error("reading {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("tensor '{name}' has dtype {dtype}, which is not supported (F32, F16, BF16)")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("unsupported quantization: {0}")]
    UnsupportedQuantization(String),
    #[error("int4 layer '{name}': {source}")]
    Int4 {
        name: String,
        source: tokenmill_kernels::int4::Int4Error,
    },
    #[error("unsupported architecture '{0}'")]
    UnsupportedArchitecture(String),
    #[error("missing metadata key '{key}'")]
    MissingMetadata { key: String },
    #[error("bad model configuration: {0}")]
    BadConfig(String),
    #[error("missing tensor '{name}'")]
    MissingTensor { name: String },
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("token id {token} is out of range (vocabulary size {vocab_size})")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    #[error("block table does not cover {positions} positions of the KV cache")]
    BadBlockTable { positions: usize },
}

/// The text of `dir/config.json`.
pub fn read_config_json(dir: &std::path::Path) -> Result<String, ModelError> {
    let path = dir.join("config.json");
    std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path, source })
}
