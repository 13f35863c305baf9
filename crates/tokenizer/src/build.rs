//! Building a [`Tokenizer`] from a [`GgufVocab`].
//!
//! - `gpt2` (byte-level BPE): an HF `BPE` model over the file's tokens and merges, the
//!   pre-tokenizer named by `tokenizer.ggml.pre` ([`PreTokenizerKind`]), GPT-2 byte mapping.
//! - `llama` (SentencePiece BPE with scores): an HF `BPE` model with byte fallback whose merges
//!   are derived from the scores the way transformers does it (`generate_merges`: every split
//!   of every token into two tokens, ranked by the token's score), SentencePiece's input
//!   handling as a normalizer (`▁` for spaces, one `▁` prepended to each run of text between
//!   special tokens when `add_space_prefix`, as llama.cpp does) and no pre-tokenizer.
//!
//! In both, tokens typed CONTROL or UNKNOWN become *special* added tokens and USER_DEFINED ones
//! plain added tokens, so they are matched whole in input text (llama.cpp's `parse_special`).
//! Their ids are the file's: every token is in the model vocabulary at its own id, and the
//! builder checks that the added vocabulary resolved each one to that id.
//!
//! Everything from the file is validated before use: vocabulary size and token lengths,
//! duplicate tokens, per-token array lengths, finite scores, merges (shape and membership),
//! special token ids. A bad file is a [`TokenizerError`], never a panic.

use std::borrow::Cow;
use std::collections::HashMap;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::{NormalizerWrapper, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::chat::ChatTemplate;
use crate::error::TokenizerError;
use crate::gguf_vocab::{
    GgufVocab, MAX_TOKEN_BYTES, check_per_token_len, check_vocab_size, token_type,
};
use crate::pieces::{PieceStyle, PieceTable, byte_fallback_byte, byte_level_bytes, piece_bytes};
use crate::pretokenizers::PreTokenizerKind;
use crate::{Decoding, SpecialTokens, Tokenizer};

/// Most merges a file may list (real files have fewer merges than tokens).
const MAX_MERGES: usize = 4 * crate::gguf_vocab::MAX_VOCAB_SIZE;

/// Token texts that end generation when present (llama.cpp's EOG list, `llama-vocab.cpp`).
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gpt2,
    Llama,
}

pub(crate) fn from_gguf_vocab(v: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let kind = match v.model.as_str() {
        "gpt2" => Kind::Gpt2,
        "llama" => Kind::Llama,
        other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
    };
    let n = v.tokens.len();
    check_vocab_size(n)?;
    check_per_token_len("tokenizer.ggml.scores", v.scores.as_ref().map(Vec::len), n)?;
    check_per_token_len(
        "tokenizer.ggml.token_type",
        v.token_types.as_ref().map(Vec::len),
        n,
    )?;
    let mut warnings = Vec::new();
    let keys = vocab_keys(v)?;
    let index = key_index(&keys)?;
    let ids = SpecialIds::resolve(v, kind, n)?;
    let types = TokenTypes {
        types: v
            .token_types
            .clone()
            .unwrap_or_else(|| vec![token_type::NORMAL; n]),
        eog_forced: EOG_TEXTS
            .iter()
            .filter_map(|t| index.get(t).copied())
            .collect(),
    };
    let model = match kind {
        Kind::Gpt2 => gpt2_model(v, &keys, &index, &mut warnings)?,
        Kind::Llama => llama_model(v, &keys, &index, &ids)?,
    };
    let ModelParts {
        mut inner,
        style,
        strip,
        add_bos_default,
    } = model;
    add_vocab_tokens(&mut inner, v, &types, &index)?;
    let vocab_size = inner.get_vocab_size(true);
    if vocab_size != n {
        return Err(TokenizerError::BadVocab(format!(
            "built {vocab_size} tokens from a vocabulary of {n}"
        )));
    }
    let mut pieces = piece_table(v, kind, style, strip, &types);
    let specials = special_tokens(v, &ids, &types, add_bos_default, &mut pieces)?;
    let chat_template = chat_template(v, &ids, &mut warnings);
    Ok(Tokenizer {
        inner,
        decoding: Decoding::Pieces(pieces),
        vocab_size: n,
        specials,
        hf_post_processor: false,
        chat_template,
        warnings,
    })
}

/// Vocabulary keys: the tokens as stored; an empty token gets a placeholder key (as in
/// llama.cpp) so that it stays addressable and decodes to nothing.
fn vocab_keys(v: &GgufVocab) -> Result<Vec<Cow<'_, str>>, TokenizerError> {
    v.tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.len() > MAX_TOKEN_BYTES {
                return Err(TokenizerError::BadVocab(format!(
                    "token {i} is {} bytes long (limit {MAX_TOKEN_BYTES})",
                    t.len()
                )));
            }
            Ok(if t.is_empty() {
                format!("[EMPTY_{i}]").into()
            } else {
                t.as_str().into()
            })
        })
        .collect()
}

/// Key → id; a key that appears twice is an error.
fn key_index<'k>(keys: &'k [Cow<'_, str>]) -> Result<HashMap<&'k str, u32>, TokenizerError> {
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        if let Some(prev) = index.insert(k, i as u32) {
            return Err(TokenizerError::BadVocab(format!(
                "token {k:?} appears twice (ids {prev} and {i})"
            )));
        }
    }
    Ok(index)
}

/// Token types, and which tokens are special (control, unknown, or an end-of-generation text).
struct TokenTypes {
    types: Vec<i32>,
    eog_forced: Vec<u32>,
}

impl TokenTypes {
    fn is_special(&self, i: usize) -> bool {
        matches!(self.types[i], token_type::CONTROL | token_type::UNKNOWN)
            || self.eog_forced.contains(&(i as u32))
    }
}

/// The HF model of one vocabulary kind, with how its pieces decode.
struct ModelParts {
    inner: HfTokenizer,
    style: PieceStyle,
    /// Leading spaces the decoder strips from a text's first piece.
    strip: usize,
    add_bos_default: bool,
}

fn vocab_of(keys: &[Cow<'_, str>]) -> Vocab {
    keys.iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), i as u32))
        .collect()
}

/// `gpt2`: byte-level BPE over the file's merges with the named pre-tokenizer.
fn gpt2_model(
    v: &GgufVocab,
    keys: &[Cow<'_, str>],
    index: &HashMap<&str, u32>,
    warnings: &mut Vec<String>,
) -> Result<ModelParts, TokenizerError> {
    let pre = PreTokenizerKind::from_gguf_name(v.pre.as_deref())?;
    if v.pre.is_none() {
        warnings.push(
            "tokenizer.ggml.pre is missing: using llama.cpp's `default` pre-tokenizer; \
             tokenization may differ from the model's training"
                .to_owned(),
        );
    }
    let merges = parse_merges(v.merges.as_deref(), index)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(keys), merges)
        .ignore_merges(pre.ignore_merges())
        .build()?;
    let mut inner = HfTokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre.build()?));
    inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    Ok(ModelParts {
        inner,
        style: PieceStyle::ByteLevel,
        strip: 0,
        add_bos_default: pre.default_add_bos(),
    })
}

/// `llama`: SentencePiece BPE with byte fallback, merges from the scores.
fn llama_model(
    v: &GgufVocab,
    keys: &[Cow<'_, str>],
    index: &HashMap<&str, u32>,
    ids: &SpecialIds,
) -> Result<ModelParts, TokenizerError> {
    let scores = v
        .scores
        .as_deref()
        .ok_or(TokenizerError::MissingMetadata("tokenizer.ggml.scores"))?;
    if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
        return Err(TokenizerError::BadVocab(format!(
            "token {i} has a non-finite score"
        )));
    }
    let merges = spm_merges(keys, scores, index);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab_of(keys), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = ids.unk {
        builder = builder.unk_token(keys[unk as usize].to_string());
    }
    let add_space_prefix = v.add_space_prefix.unwrap_or(true);
    let mut inner = HfTokenizer::new(builder.build()?);
    inner.with_normalizer(Some(spm_normalizer(add_space_prefix)?));
    inner.with_decoder(Some(spm_decoder(add_space_prefix)?));
    Ok(ModelParts {
        inner,
        style: PieceStyle::SentencePiece {
            byte_fallback: true,
        },
        strip: usize::from(add_space_prefix),
        add_bos_default: true,
    })
}

/// Added tokens, matched whole in text at their own ids: special ones and user-defined ones.
fn add_vocab_tokens(
    inner: &mut HfTokenizer,
    v: &GgufVocab,
    types: &TokenTypes,
    index: &HashMap<&str, u32>,
) -> Result<(), TokenizerError> {
    let mut special_tokens = Vec::new();
    let mut user_tokens = Vec::new();
    for (i, t) in v.tokens.iter().enumerate() {
        if t.is_empty() {
            continue;
        }
        if types.is_special(i) {
            special_tokens.push(AddedToken::from(t.as_str(), true).normalized(false));
        } else if types.types[i] == token_type::USER_DEFINED {
            user_tokens.push(AddedToken::from(t.as_str(), false).normalized(false));
        }
    }
    inner.add_special_tokens(&special_tokens);
    inner.add_tokens(&user_tokens);
    for t in special_tokens.iter().chain(&user_tokens) {
        let want = index[t.content.as_str()];
        if inner.token_to_id(&t.content) != Some(want) {
            return Err(TokenizerError::BadVocab(format!(
                "added token {:?} did not resolve to its id {want}",
                t.content
            )));
        }
    }
    Ok(())
}

/// Bytes of every token. Control/unknown/user-defined tokens are raw text (llama.cpp's
/// `token_to_piece`), byte tokens are their byte, normal tokens follow the style.
fn piece_table(
    v: &GgufVocab,
    kind: Kind,
    style: PieceStyle,
    strip: usize,
    types: &TokenTypes,
) -> PieceTable {
    let mut pieces = PieceTable::new(strip);
    for (i, t) in v.tokens.iter().enumerate() {
        let ty = types.types[i];
        let bytes = if matches!(
            ty,
            token_type::CONTROL | token_type::UNKNOWN | token_type::USER_DEFINED
        ) || types.is_special(i)
        {
            match (kind, ty) {
                (Kind::Llama, token_type::USER_DEFINED) => t.replace('\u{2581}', " ").into_bytes(),
                _ => t.as_bytes().to_vec(),
            }
        } else if ty == token_type::BYTE {
            match byte_fallback_byte(t) {
                Some(b) => vec![b],
                None => byte_level_bytes(t).unwrap_or_else(|| t.as_bytes().to_vec()),
            }
        } else {
            piece_bytes(style, t)
        };
        pieces.set(i as u32, bytes, types.is_special(i));
    }
    pieces
}

/// BOS/EOS use and the stop tokens; designated tokens the file marks as non-normal are
/// hidden on decode.
fn special_tokens(
    v: &GgufVocab,
    ids: &SpecialIds,
    types: &TokenTypes,
    add_bos_default: bool,
    pieces: &mut PieceTable,
) -> Result<SpecialTokens, TokenizerError> {
    let add_bos = v.add_bos.unwrap_or(add_bos_default);
    let add_eos = v.add_eos.unwrap_or(false);
    if add_bos && ids.bos.is_none() {
        return Err(TokenizerError::MissingMetadata(
            "tokenizer.ggml.bos_token_id",
        ));
    }
    if add_eos && ids.eos.is_none() {
        return Err(TokenizerError::MissingMetadata(
            "tokenizer.ggml.eos_token_id",
        ));
    }
    let mut stop = Vec::new();
    for id in [ids.eos, ids.eot, ids.eom]
        .into_iter()
        .flatten()
        .chain(types.eog_forced.iter().copied())
    {
        if !stop.contains(&id) {
            stop.push(id);
        }
    }
    for id in [ids.bos, ids.eos, ids.eot, ids.eom, ids.unk, ids.pad]
        .into_iter()
        .flatten()
    {
        if types.types[id as usize] != token_type::NORMAL {
            pieces.mark_special(id);
        }
    }
    Ok(SpecialTokens {
        bos: ids.bos,
        eos: ids.eos,
        add_bos,
        add_eos,
        stop,
    })
}

/// The file's chat template; an unusable one is a warning, not an error.
fn chat_template(
    v: &GgufVocab,
    ids: &SpecialIds,
    warnings: &mut Vec<String>,
) -> Option<ChatTemplate> {
    let text_of = |id: Option<u32>| id.map(|id| v.tokens[id as usize].clone());
    let src = v.chat_template.as_ref()?;
    match ChatTemplate::new(src, text_of(ids.bos), text_of(ids.eos)) {
        Ok(t) => Some(t),
        Err(e) => {
            warnings.push(format!("chat template unusable: {e}"));
            None
        }
    }
}

/// The special token ids of a vocabulary of `n` tokens, all checked to be in range.
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
}

impl SpecialIds {
    fn resolve(v: &GgufVocab, kind: Kind, n: usize) -> Result<SpecialIds, TokenizerError> {
        let check = |key: &'static str, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(TokenizerError::BadSpecialToken {
                key,
                id: id.into(),
                vocab_size: n,
            }),
            other => Ok(other),
        };
        // llama.cpp's defaults for SentencePiece vocabularies that do not say.
        let (bos_default, eos_default, unk_default) = match kind {
            Kind::Llama => (Some(1), Some(2), Some(0)),
            Kind::Gpt2 => (None, None, None),
        };
        let in_range = |d: Option<u32>| d.filter(|&d| (d as usize) < n);
        Ok(SpecialIds {
            bos: check("tokenizer.ggml.bos_token_id", v.bos_id)?.or(in_range(bos_default)),
            eos: check("tokenizer.ggml.eos_token_id", v.eos_id)?.or(in_range(eos_default)),
            eot: check("tokenizer.ggml.eot_token_id", v.eot_id)?,
            eom: check("tokenizer.ggml.eom_token_id", v.eom_id)?,
            unk: check("tokenizer.ggml.unknown_token_id", v.unk_id)?.or(in_range(unk_default)),
            pad: check("tokenizer.ggml.padding_token_id", v.pad_id)?,
        })
    }
}

/// Parses `"left right"` merges and checks that left, right and left+right are tokens.
fn parse_merges(
    merges: Option<&[String]>,
    index: &HashMap<&str, u32>,
) -> Result<Vec<(String, String)>, TokenizerError> {
    let merges = merges.ok_or(TokenizerError::MissingMetadata("tokenizer.ggml.merges"))?;
    if merges.len() > MAX_MERGES {
        return Err(TokenizerError::BadVocab(format!(
            "{} merges, more than the limit of {MAX_MERGES}",
            merges.len()
        )));
    }
    let bad = |index: usize, merge: &str, reason| TokenizerError::BadMerge {
        index,
        merge: merge.to_owned(),
        reason,
    };
    let mut out = Vec::with_capacity(merges.len());
    let mut joined = String::new();
    for (i, m) in merges.iter().enumerate() {
        // Split at the first space after the first character (llama.cpp), so that a left part
        // that is itself a space still parses.
        let split = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(p, _)| p);
        let Some(p) = split else {
            return Err(bad(i, m, "no space between the two parts"));
        };
        let (l, r) = (&m[..p], &m[p + 1..]);
        if r.is_empty() {
            return Err(bad(i, m, "empty right part"));
        }
        if !index.contains_key(l) {
            return Err(bad(i, m, "left part is not a token"));
        }
        if !index.contains_key(r) {
            return Err(bad(i, m, "right part is not a token"));
        }
        joined.clear();
        joined.push_str(l);
        joined.push_str(r);
        if !index.contains_key(joined.as_str()) {
            return Err(bad(i, m, "merged result is not a token"));
        }
        out.push((l.to_owned(), r.to_owned()));
    }
    Ok(out)
}

/// transformers' `generate_merges(vocab, vocab_scores)`: for every token, every split into two
/// tokens (ordered by their ids), then all of them sorted by the token's score, then the
/// lengths (in characters) of the left and right parts, all descending; the sort is stable.
fn spm_merges(
    keys: &[std::borrow::Cow<'_, str>],
    scores: &[f32],
    index: &HashMap<&str, u32>,
) -> Vec<(String, String)> {
    struct Cand {
        left: u32,
        right: u32,
        score: f32,
        left_chars: usize,
        right_chars: usize,
    }
    let mut all = Vec::new();
    let mut local = Vec::new();
    for (i, tok) in keys.iter().enumerate() {
        local.clear();
        for (p, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(p);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                local.push((li, ri, l.chars().count(), r.chars().count()));
            }
        }
        local.sort_by_key(|&(l, r, _, _)| (l, r));
        all.extend(
            local
                .iter()
                .map(|&(left, right, left_chars, right_chars)| Cand {
                    left,
                    right,
                    score: scores[i],
                    left_chars,
                    right_chars,
                }),
        );
    }
    all.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    all.into_iter()
        .map(|c| {
            (
                keys[c.left as usize].to_string(),
                keys[c.right as usize].to_string(),
            )
        })
        .collect()
}

/// SentencePiece's input handling (and llama.cpp's, and the `tokenizer.json` of Llama 2): one
/// `▁` before each run of text (each piece between special tokens) when `add_space_prefix`,
/// then every space to `▁`. So `" hi"` is `▁▁hi`, and decoding (which drops one leading space)
/// round-trips it.
fn spm_normalizer(add_space_prefix: bool) -> Result<NormalizerWrapper, TokenizerError> {
    let mut steps = Vec::new();
    if add_space_prefix {
        steps.push(NormalizerWrapper::Prepend(Prepend::new(
            "\u{2581}".to_owned(),
        )));
    }
    steps.push(NormalizerWrapper::Replace(Replace::new(" ", "\u{2581}")?));
    Ok(NormalizerWrapper::Sequence(NormalizerSequence::new(steps)))
}

/// transformers' `LlamaTokenizer` decoder: `▁` to space, byte fallback, fuse, strip the prefix.
fn spm_decoder(add_space_prefix: bool) -> Result<DecoderWrapper, TokenizerError> {
    let mut steps = vec![
        DecoderWrapper::Replace(Replace::new("\u{2581}", " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        steps.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    Ok(DecoderWrapper::Sequence(DecoderSequence::new(steps)))
}
