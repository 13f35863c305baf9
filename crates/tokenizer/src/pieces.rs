//! Token ids to bytes: the [`PieceTable`] and the [`Utf8Sink`] that turns bytes into text.
//!
//! Every decoder this crate understands reduces to "each token is a fixed byte string, the
//! output is their concatenation read as (lossy) UTF-8, minus up to `n` leading spaces":
//!
//! - byte-level BPE (GPT-2 style): each character of a token stands for one byte through
//!   GPT-2's `bytes_to_unicode` table (`Ġ` = `0x20`); a token with characters outside that
//!   alphabet (control or user-defined tokens stored as raw text) is its own UTF-8.
//! - SentencePiece BPE: `▁` is a space, `<0xNN>` (with byte fallback) is the byte `0xNN`,
//!   everything else is its own UTF-8; with `add_space_prefix` one leading space of the whole
//!   output is dropped (the space the encoder added).
//!
//! So the table holds each token's bytes once, computed at load time, and [`Utf8Sink`] is the
//! single place where bytes become text, used by both `decode` and the incremental decoder.
//! That is what makes `concat(push(id) for id in ids) + flush() == decode(ids)` hold by
//! construction: both run the same sink over the same bytes, and the sink emits a prefix of
//! the text only once no later byte can change it.
//!
//! Invariants of [`Utf8Sink`]: `pending` only ever holds an incomplete (but so far valid)
//! UTF-8 sequence, at most 3 bytes; invalid bytes become one U+FFFD per maximal invalid
//! subsequence, exactly as [`String::from_utf8_lossy`] does on the whole byte string.

use std::sync::OnceLock;

use crate::error::TokenizerError;

/// How a token's text maps to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PieceStyle {
    /// GPT-2 byte-level alphabet.
    ByteLevel,
    /// SentencePiece: `▁` is a space; `<0xNN>` is a byte when `byte_fallback`.
    SentencePiece { byte_fallback: bool },
}

/// Per-token bytes and flags, indexed by token id.
#[derive(Clone, Debug)]
pub(crate) struct PieceTable {
    /// `None` for an id with no token (a hole in an HF vocabulary).
    pieces: Vec<Option<Box<[u8]>>>,
    special: Vec<bool>,
    /// How many leading spaces of the whole output to drop (SentencePiece's added prefix).
    pub(crate) strip_leading_spaces: usize,
}

impl PieceTable {
    pub(crate) fn new(strip_leading_spaces: usize) -> PieceTable {
        PieceTable {
            pieces: Vec::new(),
            special: Vec::new(),
            strip_leading_spaces,
        }
    }

    /// Sets token `id`'s bytes, growing the table as needed.
    pub(crate) fn set(&mut self, id: u32, bytes: Vec<u8>, special: bool) {
        let i = id as usize;
        if i >= self.pieces.len() {
            self.pieces.resize(i + 1, None);
            self.special.resize(i + 1, false);
        }
        self.pieces[i] = Some(bytes.into_boxed_slice());
        self.special[i] = special;
    }

    pub(crate) fn mark_special(&mut self, id: u32) {
        if let Some(s) = self.special.get_mut(id as usize) {
            *s = true;
        }
    }

    pub(crate) fn piece(&self, id: u32) -> Result<&[u8], TokenizerError> {
        match self.pieces.get(id as usize) {
            Some(Some(p)) => Ok(p),
            _ => Err(TokenizerError::TokenOutOfRange(id)),
        }
    }

    pub(crate) fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Checks every id before any work, so a bad id fails the whole call.
    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<(), TokenizerError> {
        ids.iter().try_for_each(|&id| self.piece(id).map(|_| ()))
    }

    /// Decodes `ids` (all of them checked first).
    pub(crate) fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.check_ids(ids)?;
        let mut sink = Utf8Sink::new(self.strip_leading_spaces);
        let mut out = String::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            sink.push(self.piece(id)?, &mut out);
        }
        sink.finish(&mut out);
        Ok(out)
    }
}

/// Bytes in, text out: emits the longest prefix of the byte stream that later bytes cannot
/// change, holds back an incomplete trailing UTF-8 sequence.
#[derive(Clone, Debug)]
pub(crate) struct Utf8Sink {
    pending: Vec<u8>,
    strip: usize,
}

impl Utf8Sink {
    pub(crate) fn new(strip_leading_spaces: usize) -> Utf8Sink {
        Utf8Sink {
            pending: Vec::with_capacity(4),
            strip: strip_leading_spaces,
        }
    }

    /// Appends `bytes` and writes whatever became final to `out`.
    pub(crate) fn push(&mut self, mut bytes: &[u8], out: &mut String) {
        if self.strip > 0 && !bytes.is_empty() {
            let k = bytes
                .iter()
                .take(self.strip)
                .take_while(|&&b| b == b' ')
                .count();
            bytes = &bytes[k..];
            self.strip = if bytes.is_empty() { self.strip - k } else { 0 };
        }
        if bytes.is_empty() {
            return;
        }
        self.pending.extend_from_slice(bytes);
        self.drain(out, false);
    }

    /// Writes out everything held back (an incomplete sequence becomes U+FFFD).
    pub(crate) fn finish(&mut self, out: &mut String) {
        self.drain(out, true);
    }

    /// Whether an incomplete character is held back.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn drain(&mut self, out: &mut String, at_end: bool) {
        let mut start = 0;
        while start < self.pending.len() {
            let rest = &self.pending[start..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&rest[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += valid + bad;
                        }
                        None if at_end => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = self.pending.len();
                        }
                        None => {
                            start += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
    }
}

/// GPT-2's `bytes_to_unicode` inverted: character code (all below 0x144) to byte, or -1.
fn byte_level_table() -> &'static [i16; 0x144] {
    static TABLE: OnceLock<[i16; 0x144]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [-1i16; 0x144];
        let mut n = 0u32;
        for b in 0u32..256 {
            let printable = (0x21..=0x7e).contains(&b)
                || (0xa1..=0xac).contains(&b)
                || (0xae..=0xff).contains(&b);
            let c = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            table[c as usize] = b as i16;
        }
        table
    })
}

/// The bytes a byte-level token stands for, or `None` if a character is outside the alphabet.
pub(crate) fn byte_level_bytes(token: &str) -> Option<Vec<u8>> {
    let table = byte_level_table();
    token
        .chars()
        .map(|c| {
            table
                .get(c as usize)
                .copied()
                .filter(|&b| b >= 0)
                .map(|b| b as u8)
        })
        .collect()
}

/// The byte of a `<0xNN>` byte-fallback token.
pub(crate) fn byte_fallback_byte(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A token's bytes under `style` (HF decoder semantics).
pub(crate) fn piece_bytes(style: PieceStyle, token: &str) -> Vec<u8> {
    match style {
        PieceStyle::ByteLevel => {
            byte_level_bytes(token).unwrap_or_else(|| token.as_bytes().to_vec())
        }
        PieceStyle::SentencePiece { byte_fallback } => {
            if byte_fallback && let Some(b) = byte_fallback_byte(token) {
                return vec![b];
            }
            token.replace('\u{2581}', " ").into_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet() {
        assert_eq!(byte_level_bytes("Ġhello").unwrap(), b" hello");
        assert_eq!(byte_level_bytes("Ċ").unwrap(), b"\n");
        assert_eq!(byte_level_bytes("<|im_start|>").unwrap(), b"<|im_start|>");
        assert_eq!(byte_level_bytes("ðŁĳĭ").unwrap(), "👋".as_bytes());
        assert_eq!(byte_level_bytes("a b"), None); // a raw space is not in the alphabet
        // All 256 bytes are reachable, each from exactly one character.
        let t = byte_level_table();
        let mut seen = [false; 256];
        for &b in t.iter().filter(|&&b| b >= 0) {
            assert!(!seen[b as usize]);
            seen[b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn sentencepiece_pieces() {
        let spm = PieceStyle::SentencePiece {
            byte_fallback: true,
        };
        assert_eq!(piece_bytes(spm, "▁hello"), b" hello");
        assert_eq!(piece_bytes(spm, "<0x0A>"), b"\n");
        assert_eq!(piece_bytes(spm, "<0xE2>"), [0xE2]);
        assert_eq!(piece_bytes(spm, "<0xZZ>"), b"<0xZZ>");
        let no_fallback = PieceStyle::SentencePiece {
            byte_fallback: false,
        };
        assert_eq!(piece_bytes(no_fallback, "<0x0A>"), b"<0x0A>");
    }

    fn stream(chunks: &[&[u8]], strip: usize) -> (Vec<String>, String) {
        let mut sink = Utf8Sink::new(strip);
        let mut outs = Vec::new();
        for c in chunks {
            let mut s = String::new();
            sink.push(c, &mut s);
            outs.push(s);
        }
        let mut tail = String::new();
        sink.finish(&mut tail);
        (outs, tail)
    }

    #[test]
    fn sink_holds_incomplete_sequences() {
        let euro = "€".as_bytes(); // E2 82 AC
        let (outs, tail) = stream(&[b"a", &euro[..1], &euro[1..2], &euro[2..], b"b"], 0);
        assert_eq!(outs, ["a", "", "", "€", "b"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn sink_matches_lossy_on_invalid_bytes() {
        let cases: &[&[&[u8]]] = &[
            &[&[0xE2, 0x82], b"A"],
            &[&[0xFF], &[0xE2], &[0x82, 0xAC]],
            &[&[0xF0, 0x9F], &[0x91]],
            &[&[0xC0, 0x80, b'x']],
            &[&[0xED, 0xA0, 0x80]],
        ];
        for chunks in cases {
            let (outs, tail) = stream(chunks, 0);
            let all: Vec<u8> = chunks.concat();
            assert_eq!(
                outs.concat() + &tail,
                String::from_utf8_lossy(&all),
                "{chunks:?}"
            );
        }
    }

    #[test]
    fn sink_strips_leading_spaces_of_the_whole_output() {
        assert_eq!(stream(&[b" hello", b" world"], 1).0.concat(), "hello world");
        assert_eq!(stream(&[b"", b" ", b" x"], 1).0.concat(), " x");
        assert_eq!(stream(&[b" ", b" x"], 2).0.concat(), "x");
        assert_eq!(stream(&[b"x", b" y"], 1).0.concat(), "x y");
    }
}
