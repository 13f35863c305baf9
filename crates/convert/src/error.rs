//! [`ConvertError`]: why a conversion failed, one variant per cause.
//!
//! The messages are the command line's: a variant that wraps a lower crate's error names what
//! was being done (`opening`, `loading`, `creating`, `reading`, `parsing` a path) and keeps the
//! cause as its [`source`](std::error::Error::source), so a caller that prints the error chain
//! (`anyhow`'s `{:?}`) shows both. Errors of the model crate met after loading, and the GGUF
//! writer's, are passed through unchanged (`transparent`).

use std::path::PathBuf;

use tokenmill_gguf::{GgmlType, GgufError, WriteError};
use tokenmill_model::ModelError;

use crate::types::TargetType;

/// Why a model could not be converted.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum ConvertError {
    /// A target type name that is none of [`TargetType::ALL`].
    #[error(
        "unsupported target type {0:?} (supported: {list})",
        list = TargetType::names().join(", ")
    )]
    UnsupportedType(String),

    /// The source GGUF could not be opened or is not a valid GGUF file.
    #[error("opening {}", path.display())]
    OpenGguf {
        path: PathBuf,
        #[source]
        source: GgufError,
    },

    /// A source tensor is already quantized; re-quantizing loses precision twice (refused
    /// as llama-quantize does without `--allow-requantize`).
    #[error(
        "tensor {name:?} is already quantized ({ty}); quantize from an F32/F16/BF16 model, or \
         pass --allow-requantize"
    )]
    Requantize { name: String, ty: GgmlType },

    /// The Hugging Face folder does not load as a model: no or a bad `config.json`, an
    /// unsupported architecture, missing or misshaped weights, broken safetensors.
    #[error("loading {}", path.display())]
    LoadModel {
        path: PathBuf,
        #[source]
        source: ModelError,
    },

    /// A model-crate error after the folder loaded (looking a tensor up in its store).
    #[error(transparent)]
    Model(#[from] ModelError),

    /// Llama 3 RoPE scaling (per-dimension frequency factors) on a Qwen2 model: llama.cpp's
    /// `qwen2` graph reads no `rope_freqs` tensor, so the file could not describe the model.
    #[error(
        "Llama 3 RoPE scaling on a Qwen2 model has no GGUF form (llama.cpp's qwen2 has no rope_freqs)"
    )]
    UnsupportedRopeScaling,

    /// A DeepSeek layer whose routed experts are stored in different types (one 3-D GGUF
    /// tensor holds them all).
    #[error("layer {layer}: the routed experts mix {} and {}", types[0], types[1])]
    MixedExpertTypes { layer: usize, types: [GgmlType; 2] },

    /// A Q or K projection whose rows do not split into whole heads of even size (the Q/K
    /// permutation needs both).
    #[error("{name}: {rows} rows do not split into {heads} heads of even size")]
    BadHeadSplit {
        name: String,
        rows: usize,
        heads: usize,
    },

    /// The output file could not be created.
    #[error("creating {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file of the folder exists but could not be read.
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file of the folder is not valid JSON.
    #[error("parsing {}", path.display())]
    ParseJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// Writing the output GGUF failed (I/O, or specs the writer refuses).
    #[error(transparent)]
    Write(#[from] WriteError),

    /// The folder has no `tokenizer.json`.
    #[error("{} has no tokenizer.json", dir.display())]
    MissingTokenizer { dir: PathBuf },

    /// A tokenizer that is not byte-level BPE (SentencePiece `Metaspace`, WordPiece, ...).
    #[error(
        "only byte-level BPE tokenizers are exported (tokenizer.json model {model:?}, \
         decoder {decoder:?}); SentencePiece vocabularies are not supported"
    )]
    UnsupportedTokenizer {
        model: Option<String>,
        decoder: Option<String>,
    },

    /// A `pre_tokenizer` (as JSON text) that matches none of the llama.cpp names known here:
    /// guessing would silently change token ids.
    #[error(
        "tokenizer.json pre_tokenizer {pre} is not one llama.cpp knows by name here \
         (GPT-2, SmolLM/StarCoder, Llama 3, Qwen2)"
    )]
    UnknownPreTokenizer { pre: String },

    /// `tokenizer.json` lacks `model.vocab` or has a malformed `model.merges` (the message says
    /// which).
    #[error("tokenizer.json {0}")]
    MalformedTokenizer(String),

    /// A token id in `tokenizer.json` is not a non-negative integer.
    #[error("tokenizer.json: a token id is not an integer")]
    NonIntegerTokenId,

    /// A token id at or beyond the model's `vocab_size`.
    #[error("tokenizer.json token {text:?} has id {id}, beyond vocab_size {vocab_size}")]
    TokenIdOutOfRange {
        text: String,
        id: usize,
        vocab_size: usize,
    },

    /// `tokenizer_config.json` names a special token (`bos`, `eos`, `pad`) by a text that is
    /// not in the vocabulary.
    #[error("tokenizer_config.json {key}_token {text:?} is not in the vocabulary")]
    SpecialTokenNotInVocab { key: String, text: String },
}

/// The crate's result type.
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;
