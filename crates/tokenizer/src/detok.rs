//! [`IncrementalDecoder`]: per-request streaming detokenization.
//!
//! Push token ids one at a time, get back the text that became final (possibly empty); call
//! [`IncrementalDecoder::flush`] at the end of the stream.
//!
//! For piece-table tokenizers (every GGUF vocabulary and the usual `tokenizer.json` decoders)
//! a push appends the token's bytes to a [`Utf8Sink`], which emits everything up to the last
//! complete UTF-8 character. So:
//!
//! - a character split across byte tokens (byte-level BPE pieces of an emoji, SentencePiece
//!   `<0xF0><0x9F><0x98><0x80>`) is held back until its last byte arrives; no broken UTF-8 is
//!   ever emitted mid-stream;
//! - the SentencePiece leading-space rule (drop the space the encoder prepended) is applied
//!   once to the start of the stream, as `decode` applies it to the start of the text;
//! - `concat(push(id)...) + flush() == decode(ids)` exactly (same sink, same bytes); state is
//!   O(1): at most 3 pending bytes, no history of ids.
//!
//! For other `tokenizer.json` decoders the decoder keeps a window of recent ids and emits the
//! difference between decoding the window with and without the new id once it no longer ends
//! in U+FFFD (the vLLM/TGI algorithm); the concatenation then equals `decode` for decoders
//! whose output for a prefix is a prefix of the output, which holds for the common ones.

use crate::error::TokenizerError;
use crate::pieces::Utf8Sink;
use crate::{Decoding, Tokenizer};

/// How many ids before the window's start are kept before being dropped (fallback mode).
const WINDOW_KEEP: usize = 64;

/// Per-request streaming state. Cheap to create; tied to the tokenizer it came from only by
/// convention (pass the same [`Tokenizer`] to every call).
#[derive(Clone, Debug)]
pub struct IncrementalDecoder {
    skip_special_tokens: bool,
    state: State,
}

#[derive(Clone, Debug)]
enum State {
    Bytes(Utf8Sink),
    Window {
        ids: Vec<u32>,
        prefix_offset: usize,
        read_offset: usize,
    },
}

impl IncrementalDecoder {
    pub(crate) fn new(tok: &Tokenizer, skip_special_tokens: bool) -> IncrementalDecoder {
        let state = match &tok.decoding {
            Decoding::Pieces(p) => State::Bytes(Utf8Sink::new(p.strip_leading_spaces)),
            Decoding::Hf => State::Window {
                ids: Vec::new(),
                prefix_offset: 0,
                read_offset: 0,
            },
        };
        IncrementalDecoder {
            skip_special_tokens,
            state,
        }
    }

    /// Whether special tokens (BOS, `<|im_end|>`, ...) are left out of the text.
    pub fn skips_special_tokens(&self) -> bool {
        self.skip_special_tokens
    }

    /// Feeds one token; returns the text that became final (often empty for byte pieces).
    /// An id outside the vocabulary is an error and leaves the state unchanged.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let mut out = String::new();
        match (&mut self.state, &tok.decoding) {
            (State::Bytes(sink), Decoding::Pieces(pieces)) => {
                let piece = pieces.piece(id)?;
                if !(self.skip_special_tokens && pieces.is_special(id)) {
                    sink.push(piece, &mut out);
                }
            }
            (
                State::Window {
                    ids,
                    prefix_offset,
                    read_offset,
                },
                _,
            ) => {
                tok.check_id(id)?;
                ids.push(id);
                let skip = self.skip_special_tokens;
                let prefix = tok.decode(&ids[*prefix_offset..*read_offset], skip)?;
                let full = tok.decode(&ids[*prefix_offset..], skip)?;
                if full.len() > prefix.len()
                    && !full.ends_with(char::REPLACEMENT_CHARACTER)
                    && let Some(new) = full.get(prefix.len()..)
                {
                    out.push_str(new);
                    *prefix_offset = *read_offset;
                    *read_offset = ids.len();
                    if *prefix_offset > WINDOW_KEEP {
                        ids.drain(..*prefix_offset);
                        *read_offset -= *prefix_offset;
                        *prefix_offset = 0;
                    }
                }
            }
            (State::Bytes(_), Decoding::Hf) => {
                return Err(TokenizerError::Tokenizers(
                    "incremental decoder used with a different tokenizer".into(),
                ));
            }
        }
        Ok(out)
    }

    /// Ends the stream: returns whatever was held back (an incomplete character becomes
    /// U+FFFD, as in `decode`). The decoder is reset and can be reused.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, TokenizerError> {
        let mut out = String::new();
        match &mut self.state {
            State::Bytes(sink) => sink.finish(&mut out),
            State::Window {
                ids,
                prefix_offset,
                read_offset,
            } => {
                let skip = self.skip_special_tokens;
                let prefix = tok.decode(&ids[*prefix_offset..*read_offset], skip)?;
                let full = tok.decode(&ids[*prefix_offset..], skip)?;
                if let Some(new) = full.get(prefix.len()..) {
                    out.push_str(new);
                }
            }
        }
        *self = IncrementalDecoder::new(tok, self.skip_special_tokens);
        Ok(out)
    }

    /// Whether part of a character is held back (the next push may complete it).
    pub fn has_pending(&self) -> bool {
        match &self.state {
            State::Bytes(sink) => sink.has_pending(),
            State::Window {
                ids, read_offset, ..
            } => ids.len() > *read_offset,
        }
    }
}
