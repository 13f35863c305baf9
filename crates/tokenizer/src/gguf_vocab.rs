//! [`GgufVocab`]: the tokenizer half of a GGUF file's metadata, as plain data.
//!
//! [`GgufVocab::from_metadata`] is the only function here that knows the GGUF crate; everything
//! downstream ([`crate::Tokenizer::from_gguf_vocab`]) builds from this struct, so tokenizers can
//! be tested on small synthetic vocabularies without writing GGUF files.
//!
//! Keys read (llama.cpp's names, `llama-vocab.cpp`):
//!
//! | key | field |
//! |---|---|
//! | `tokenizer.ggml.model` (string, required) | `model` |
//! | `tokenizer.ggml.pre` (string) | `pre` |
//! | `tokenizer.ggml.tokens` (string array, required) | `tokens` |
//! | `tokenizer.ggml.scores` (f32 or i32 array) | `scores` |
//! | `tokenizer.ggml.token_type` (i32 array) | `token_types` |
//! | `tokenizer.ggml.merges` (string array) | `merges` |
//! | `tokenizer.ggml.{bos,eos,eot,eom,unknown,padding}_token_id` (integer) | `*_id` |
//! | `tokenizer.ggml.add_bos_token`, `add_eos_token`, `add_space_prefix` (bool) | `add_*` |
//! | `tokenizer.chat_template` (string) | `chat_template` |
//!
//! Invariants after a successful extraction (checked again by the builder, since the struct
//! has public fields): a present key has the right type (else
//! [`TokenizerError::BadMetadataType`]); `tokens` has at most [`MAX_VOCAB_SIZE`] entries;
//! `scores`/`token_types`, when present, have exactly one entry per token.

use tokenmill_gguf::{Array, Metadata, Value};

use crate::error::TokenizerError;

/// The most tokens a vocabulary may have. Real models stay under ~260k; a file claiming more
/// than this is corrupt or hostile.
pub const MAX_VOCAB_SIZE: usize = 1 << 21;

/// The longest a single token may be, in bytes.
pub const MAX_TOKEN_BYTES: usize = 1 << 14;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The tokenizer described by a GGUF file's metadata. `None` means "the key is absent"; the
/// builder applies llama.cpp's per-model defaults for absent keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer (split regexes) of a `gpt2` vocabulary.
    pub pre: Option<String>,
    /// Token text by id. Byte-level vocabularies store normal tokens in the GPT-2 byte
    /// alphabet (`Ġ` for a space) and control/user-defined tokens as raw text; SentencePiece
    /// vocabularies use `▁` for a space and `<0xNN>` for byte-fallback tokens.
    pub tokens: Vec<String>,
    /// Per-token scores (SentencePiece merge priorities).
    pub scores: Option<Vec<f32>>,
    /// Per-token types, see [`token_type`].
    pub token_types: Option<Vec<i32>>,
    /// BPE merges, `"left right"`, highest priority first.
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`: a Jinja template.
    pub chat_template: Option<String>,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

impl GgufVocab {
    /// Extracts the tokenizer metadata. Fails on a missing model/tokens key, on a key of the
    /// wrong type, and on array lengths or sizes that cannot be right.
    pub fn from_metadata(md: &Metadata) -> Result<GgufVocab, TokenizerError> {
        let model = get_str(md, KEY_MODEL)?.ok_or(TokenizerError::MissingMetadata(KEY_MODEL))?;
        let pre = get_str(md, KEY_PRE)?;
        let tokens = match get_array(md, KEY_TOKENS, "a string array")? {
            Some(Array::String(v)) => {
                check_vocab_size(v.len())?;
                v.clone()
            }
            Some(other) => {
                return Err(bad_type(
                    KEY_TOKENS,
                    "a string array",
                    other.elem_type_name(),
                ));
            }
            None => return Err(TokenizerError::MissingMetadata(KEY_TOKENS)),
        };
        let n = tokens.len();
        let scores = match get_array(md, KEY_SCORES, "an f32 array")? {
            Some(Array::F32(v)) => Some(v.clone()),
            // llama.cpp accepts integer scores too.
            Some(Array::I32(v)) => Some(v.iter().map(|&s| s as f32).collect()),
            Some(other) => {
                return Err(bad_type(KEY_SCORES, "an f32 array", other.elem_type_name()));
            }
            None => None,
        };
        let token_types = match get_array(md, KEY_TOKEN_TYPE, "an i32 array")? {
            Some(Array::I32(v)) => Some(v.clone()),
            Some(other) => {
                return Err(bad_type(
                    KEY_TOKEN_TYPE,
                    "an i32 array",
                    other.elem_type_name(),
                ));
            }
            None => None,
        };
        let merges = match get_array(md, KEY_MERGES, "a string array")? {
            Some(Array::String(v)) => Some(v.clone()),
            Some(other) => {
                return Err(bad_type(
                    KEY_MERGES,
                    "a string array",
                    other.elem_type_name(),
                ));
            }
            None => None,
        };
        check_per_token_len("tokenizer.ggml.scores", scores.as_ref().map(Vec::len), n)?;
        check_per_token_len(
            "tokenizer.ggml.token_type",
            token_types.as_ref().map(Vec::len),
            n,
        )?;

        Ok(GgufVocab {
            model: model.to_owned(),
            pre: pre.map(str::to_owned),
            tokens,
            scores,
            token_types,
            merges,
            bos_id: get_id(md, "tokenizer.ggml.bos_token_id")?,
            eos_id: get_id(md, "tokenizer.ggml.eos_token_id")?,
            eot_id: get_id(md, "tokenizer.ggml.eot_token_id")?,
            eom_id: get_id(md, "tokenizer.ggml.eom_token_id")?,
            unk_id: get_id(md, "tokenizer.ggml.unknown_token_id")?,
            pad_id: get_id(md, "tokenizer.ggml.padding_token_id")?,
            add_bos: get_bool(md, "tokenizer.ggml.add_bos_token")?,
            add_eos: get_bool(md, "tokenizer.ggml.add_eos_token")?,
            add_space_prefix: get_bool(md, "tokenizer.ggml.add_space_prefix")?,
            chat_template: get_str(md, KEY_CHAT_TEMPLATE)?.map(str::to_owned),
        })
    }
}

pub(crate) fn check_vocab_size(size: usize) -> Result<(), TokenizerError> {
    if size > MAX_VOCAB_SIZE {
        return Err(TokenizerError::VocabTooLarge {
            size,
            limit: MAX_VOCAB_SIZE,
        });
    }
    if size == 0 {
        return Err(TokenizerError::BadVocab("the vocabulary is empty".into()));
    }
    Ok(())
}

pub(crate) fn check_per_token_len(
    what: &str,
    len: Option<usize>,
    n_tokens: usize,
) -> Result<(), TokenizerError> {
    match len {
        Some(len) if len != n_tokens => Err(TokenizerError::BadVocab(format!(
            "{what} has {len} entries for {n_tokens} tokens"
        ))),
        _ => Ok(()),
    }
}

fn bad_type(key: &'static str, expected: &'static str, found: &'static str) -> TokenizerError {
    TokenizerError::BadMetadataType {
        key,
        expected,
        found,
    }
}

fn found_name(v: &Value) -> &'static str {
    v.type_name()
}

fn get_str<'a>(md: &'a Metadata, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(bad_type(key, "a string", found_name(other))),
    }
}

fn get_bool(md: &Metadata, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad_type(key, "a bool", found_name(other))),
    }
}

fn get_array<'a>(
    md: &'a Metadata,
    key: &'static str,
    expected: &'static str,
) -> Result<Option<&'a Array>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(other) => Err(bad_type(key, expected, found_name(other))),
    }
}

/// A token id: any integer type holding a value in `0..=u32::MAX`. Range against the
/// vocabulary is checked by the builder ([`TokenizerError::BadSpecialToken`]).
fn get_id(md: &Metadata, key: &'static str) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    if matches!(
        v,
        Value::F32(_) | Value::F64(_) | Value::Bool(_) | Value::String(_) | Value::Array(_)
    ) {
        return Err(bad_type(key, "an integer", found_name(v)));
    }
    match v.as_i64() {
        Some(id) => match u32::try_from(id) {
            Ok(id) => Ok(Some(id)),
            Err(_) => Err(TokenizerError::BadSpecialToken {
                key,
                id: id as u64,
                vocab_size: 0,
            }),
        },
        None => Err(TokenizerError::BadSpecialToken {
            key,
            id: v.as_u64().unwrap_or(u64::MAX),
            vocab_size: 0,
        }),
    }
}
