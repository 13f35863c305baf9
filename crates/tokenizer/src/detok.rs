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
//! For other `tokenizer.json` decoders the decoder keeps the request's ids and, on each push,
//! decodes all of them and emits what extends the text already emitted, once it no longer ends
//! in U+FFFD. The concatenation then equals `decode` for every decoder whose output for a prefix
//! of the ids is a prefix of the output (minus a trailing U+FFFD) — which holds for the usual
//! ones, and also for those whose output depends on the start of the whole text (a `Strip`
//! after a `Fuse`), where the vLLM/TGI window over recent ids goes wrong. A decoder that is not
//! prefix-stable (WordPiece's cleanup turns `a '` into `a'b` once `b` arrives) cannot be
//! streamed exactly by anyone, since emitted text is never retracted: the stream then emits
//! nothing until the text extends what was emitted again, and may end short of `decode`. The
//! cost is O(ids) per push — this path is only for decoders no LLM tokenizer we know uses.

use crate::error::TokenizerError;
use crate::pieces::Utf8Sink;
use crate::{Decoding, Tokenizer};

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
    /// The `tokenizers` decoder: every id so far and the text emitted from them.
    History {
        ids: Vec<u32>,
        emitted: String,
        /// Whether the last push left text unemitted.
        held: bool,
    },
}

impl IncrementalDecoder {
    pub(crate) fn new(tok: &Tokenizer, skip_special_tokens: bool) -> IncrementalDecoder {
        let state = match &tok.decoding {
            Decoding::Pieces(p) => State::Bytes(Utf8Sink::new(p.strip_leading_spaces)),
            Decoding::Hf => State::History {
                ids: Vec::new(),
                emitted: String::new(),
                held: false,
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
            (State::History { ids, emitted, held }, _) => {
                tok.check_id(id)?;
                ids.push(id);
                let full = tok.decode(ids, self.skip_special_tokens)?;
                *held = full != *emitted;
                if !full.ends_with(char::REPLACEMENT_CHARACTER)
                    && let Some(new) = full.strip_prefix(emitted.as_str())
                {
                    out.push_str(new);
                    emitted.push_str(new);
                    *held = false;
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
            State::History { ids, emitted, .. } => {
                let full = tok.decode(ids, self.skip_special_tokens)?;
                if let Some(new) = full.strip_prefix(emitted.as_str()) {
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
            State::History { held, .. } => *held,
        }
    }
}
