//! [`TokenizerError`]: the one error type of this crate.
//!
//! Every failure is typed so that callers can tell a bad model file (`BadVocab`, `BadMerge`,
//! `BadSpecialToken`, ...) from a bad request (`TokenOutOfRange`, `TemplateRaised`) without
//! parsing messages. Nothing in this crate panics on untrusted input; it returns one of these.

use std::path::PathBuf;

/// Errors from building a tokenizer, encoding, decoding or rendering a chat template.
#[derive(thiserror::Error, Debug)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("unsupported tokenizer model `{0}` (supported: gpt2, llama)")]
    UnsupportedModel(String),

    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know (llama.cpp refuses
    /// these too rather than tokenizing differently from how the model was trained).
    #[error("unknown pre-tokenizer `{0}`")]
    UnknownPreTokenizer(String),

    /// `tokenizer.json` asks for a decoder setting the `tokenizers` crate cannot run on
    /// every token (it would panic mid-generation), refused at load.
    #[error("unsupported decoder in tokenizer.json: {0}")]
    UnsupportedDecoder(String),

    /// A metadata key the tokenizer needs is absent.
    #[error("missing metadata `{0}`")]
    MissingMetadata(&'static str),

    /// A metadata key is present with the wrong type.
    #[error("metadata `{key}` should be {expected}, found {found}")]
    BadMetadataType {
        key: &'static str,
        expected: &'static str,
        found: &'static str,
    },

    /// The vocabulary is inconsistent (duplicate tokens, array lengths that disagree, a token
    /// too long, non-finite scores, ...).
    #[error("bad vocabulary: {0}")]
    BadVocab(String),

    /// The vocabulary has more tokens than any real model (a corrupt or hostile file).
    #[error("vocabulary has {size} tokens, more than the limit of {limit}")]
    VocabTooLarge { size: usize, limit: usize },

    /// A BPE merge is malformed or refers to tokens that are not in the vocabulary.
    #[error("bad merge #{index} `{merge}`: {reason}")]
    BadMerge {
        index: usize,
        merge: String,
        reason: &'static str,
    },

    /// A special token id (BOS, EOS, ...) is outside the vocabulary.
    #[error("special token `{key}` = {id} is outside the vocabulary of {vocab_size} tokens")]
    BadSpecialToken {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },

    /// A token id given to `decode`/`push` is not in the vocabulary.
    #[error("token id {0} is out of range")]
    TokenOutOfRange(u32),

    /// The chat template does not parse.
    #[error("chat template syntax error: {0}")]
    TemplateSyntax(String),

    /// The chat template called `raise_exception(message)` (usually: the conversation has a
    /// shape the model does not support, e.g. roles that do not alternate). A client error.
    #[error("chat template rejected the conversation: {0}")]
    TemplateRaised(String),

    /// The chat template ran out of fuel or produced too much output (a runaway or hostile
    /// template).
    #[error("chat template exceeded its limits: {0}")]
    TemplateLimit(String),

    /// Any other chat template rendering failure.
    #[error("chat template render error: {0}")]
    Template(String),

    /// The HF `tokenizers` crate failed (loading `tokenizer.json`, building a model, encoding).
    #[error("tokenizers: {0}")]
    Tokenizers(String),

    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file does not parse.
    #[error("parsing {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// Opening the GGUF file failed (only from [`crate::Tokenizer::from_gguf_path`]).
    #[error("gguf: {0}")]
    Gguf(#[from] tokenmill_gguf::GgufError),
}

impl From<tokenizers::Error> for TokenizerError {
    fn from(e: tokenizers::Error) -> Self {
        TokenizerError::Tokenizers(e.to_string())
    }
}
