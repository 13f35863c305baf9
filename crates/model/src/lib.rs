//! tokenmill-model: model architectures and the batched forward pass.
//!
//! Loads a model's configuration and weights from a GGUF file (weights stay memory-mapped in
//! their quantized format) and computes logits for a batch of sequence chunks over a paged KV
//! cache. Knows nothing of requests, scheduling or HTTP.

mod batch;
mod config;
mod kv_cache;
mod llama;
mod profile;
mod weights;

pub use batch::{LogitsWanted, SeqChunk};
pub use config::{Arch, ModelConfig, RopeScaling};
pub use kv_cache::KvCache;
pub use llama::{LlamaModel, Workspace};
pub use profile::{OpKind, OpProfile};

/// Why a model could not be loaded or a batch could not run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] tokenmill_gguf::GgufError),
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
