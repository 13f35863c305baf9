//! tokenmill-tokenizer: text to token ids and back, and chat templates.
//!
//! A [`Tokenizer`] is built from a GGUF file's metadata ([`Tokenizer::from_gguf`]) or from a
//! Hugging Face folder ([`Tokenizer::from_hf_dir`]). Encoding runs on the HF `tokenizers`
//! crate; decoding runs on a table of per-token bytes (`pieces.rs`) shared with the streaming
//! [`IncrementalDecoder`]; chat templates render with minijinja ([`ChatTemplate`]).
//!
//! # Design
//!
//! - **One seam to the file format.** [`GgufVocab::from_metadata`] copies the `tokenizer.*`
//!   keys into a plain struct; [`Tokenizer::from_gguf_vocab`] builds from that struct alone, so
//!   every model type is testable with a synthetic vocabulary.
//! - **llama.cpp semantics for GGUF.** Model types (`gpt2`, `llama`), pre-tokenizer names,
//!   defaults for absent keys, token types that become special tokens, end-of-generation
//!   tokens, all follow `llama-vocab.cpp`, so a GGUF tokenizes here as it does there (and as
//!   transformers does when it loads the same file, which the tests check id for id).
//! - **Decoding is bytes.** Every token maps to a fixed byte string computed at load time;
//!   text is those bytes read as lossy UTF-8 (`pieces::Utf8Sink`). `decode` and the
//!   incremental decoder run the same code, so streamed text always concatenates to the
//!   decoded text, and a character split across tokens is never emitted half-way.
//! - **Shareable.** `Tokenizer` is immutable after construction, `Send + Sync`; put it in an
//!   `Arc` and call it from a blocking pool. Per-request state lives in [`IncrementalDecoder`].
//!
//! # Invariants
//!
//! - No input (file, text, id, template) makes this crate panic: malformed vocabularies are
//!   [`TokenizerError`]s at load, unknown ids are [`TokenizerError::TokenOutOfRange`], hostile
//!   templates run out of fuel ([`TokenizerError::TemplateLimit`]).
//! - Special tokens present in the text (`<|im_start|>`) encode as their ids.
//! - `encode` adds BOS/EOS only when `add_special_tokens` and the model's metadata says so.
//! - For every id sequence, `concat(decoder.push(id)) + decoder.flush() == decode(ids)` (for
//!   the same `skip_special_tokens`).

mod build;
pub mod chat;
mod detok;
mod error;
pub mod gguf_vocab;
mod hf;
mod namespaces;
mod pieces;
pub mod pretokenizers;

use std::path::Path;

pub use chat::{ChatMessage, ChatTemplate, TemplateValue};
pub use detok::IncrementalDecoder;
pub use error::TokenizerError;
pub use gguf_vocab::GgufVocab;
pub use pretokenizers::PreTokenizerKind;

/// A tokenizer: encode, decode, special tokens, chat template.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    decoding: Decoding,
    vocab_size: usize,
    specials: SpecialTokens,
    /// Whether `encode(.., true)` lets the `tokenizer.json` post-processor add special tokens
    /// (HF folders without `add_bos_token`/`add_eos_token`); otherwise BOS/EOS are added here.
    hf_post_processor: bool,
    chat_template: Option<ChatTemplate>,
    warnings: Vec<String>,
}

/// How ids become text.
#[derive(Clone, Debug)]
enum Decoding {
    /// Per-token bytes (GGUF vocabularies and the usual `tokenizer.json` decoders).
    Pieces(pieces::PieceTable),
    /// The `tokenizers` decoder (other `tokenizer.json` decoders).
    Hf,
}

#[derive(Clone, Debug)]
struct SpecialTokens {
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    stop: Vec<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes (`tokenizer.*` metadata).
    pub fn from_gguf(gguf: &tokenmill_gguf::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_gguf_vocab(&GgufVocab::from_metadata(gguf.metadata())?)
    }

    /// Opens a GGUF file and builds its tokenizer.
    pub fn from_gguf_path(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_gguf(&tokenmill_gguf::GgufFile::open(path.as_ref())?)
    }

    /// Builds a tokenizer from extracted GGUF tokenizer metadata.
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
        build::from_gguf_vocab(vocab)
    }

    /// Builds a tokenizer from a Hugging Face folder: `tokenizer.json`, and when present
    /// `tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        hf::from_hf_dir(dir)
    }

    /// [`Tokenizer::from_hf_dir`] on files in memory: the text of `tokenizer.json` and,
    /// optionally, of `tokenizer_config.json` (for tools and the fuzz targets; no
    /// `generation_config.json` or `chat_template.jinja`).
    pub fn from_hf_json(
        tokenizer_json: &str,
        tokenizer_config: Option<&str>,
    ) -> Result<Tokenizer, TokenizerError> {
        hf::from_hf_json(tokenizer_json, tokenizer_config)
    }

    /// Token ids of `text`. Special tokens written in the text are recognised. With
    /// `add_special_tokens`, BOS/EOS are added as the model's metadata says.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens && self.hf_post_processor)?;
        let add = |flag: bool, id: Option<u32>| id.filter(|_| add_special_tokens && flag);
        let bos = add(self.specials.add_bos, self.specials.bos);
        let eos = add(self.specials.add_eos, self.specials.eos);
        let mut ids = Vec::with_capacity(enc.len() + 2);
        ids.extend(bos);
        ids.extend_from_slice(enc.get_ids());
        ids.extend(eos);
        Ok(ids)
    }

    /// Text of `ids`. Any id outside the vocabulary fails the call. With
    /// `skip_special_tokens`, special tokens (BOS, EOS, `<|im_start|>`, ...) are left out.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        match &self.decoding {
            Decoding::Pieces(p) => p.decode(ids, skip_special_tokens),
            Decoding::Hf => {
                ids.iter().try_for_each(|&id| self.check_id(id))?;
                Ok(self.inner.decode(ids, skip_special_tokens)?)
            }
        }
    }

    fn check_id(&self, id: u32) -> Result<(), TokenizerError> {
        match &self.decoding {
            Decoding::Pieces(p) => p.piece(id).map(|_| ()),
            Decoding::Hf => match self.inner.id_to_token(id) {
                Some(_) => Ok(()),
                None => Err(TokenizerError::TokenOutOfRange(id)),
            },
        }
    }

    /// Number of token ids (one past the largest id).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.specials.bos
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.specials.eos
    }

    /// Whether `encode(.., true)` prepends BOS (from this crate; an HF post-processor may add
    /// it too, see [`Tokenizer::from_hf_dir`]).
    pub fn add_bos_token(&self) -> bool {
        self.specials.add_bos
    }

    /// Tokens that end generation: EOS first, then end-of-turn / end-of-message tokens.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.specials.stop
    }

    /// The text of one token on its own (for logprob displays): its bytes as lossy UTF-8,
    /// special tokens as written. `None` for an id outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> Option<String> {
        match &self.decoding {
            Decoding::Pieces(p) => p
                .piece(id)
                .ok()
                .map(|b| String::from_utf8_lossy(b).into_owned()),
            Decoding::Hf => {
                self.inner.id_to_token(id)?;
                self.inner.decode(&[id], false).ok()
            }
        }
    }

    /// The raw bytes of one token (OpenAI's logprob `bytes`), when known.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        match &self.decoding {
            Decoding::Pieces(p) => p.piece(id).ok(),
            Decoding::Hf => None,
        }
    }

    /// The id of a token given its vocabulary text (`"<|im_end|>"`, `"Ġthe"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` is a special token (left out by `skip_special_tokens`).
    pub fn is_special(&self, id: u32) -> bool {
        match &self.decoding {
            Decoding::Pieces(p) => p.is_special(id),
            Decoding::Hf => self
                .inner
                .id_to_token(id)
                .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t)),
        }
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// A streaming decoder for one request, skipping special tokens.
    pub fn decoder(&self) -> IncrementalDecoder {
        IncrementalDecoder::new(self, true)
    }

    /// A streaming decoder with an explicit `skip_special_tokens`.
    pub fn decoder_with(&self, skip_special_tokens: bool) -> IncrementalDecoder {
        IncrementalDecoder::new(self, skip_special_tokens)
    }

    /// Things worth telling the operator that did not prevent loading (a missing
    /// pre-tokenizer name, an unusable chat template, ...).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The underlying `tokenizers` tokenizer (encoding pipeline).
    pub fn hf_tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<ChatTemplate>();
        assert_send_sync::<IncrementalDecoder>();
    }
}
