//! Building a [`Tokenizer`] from a Hugging Face model folder.
//!
//! - `tokenizer.json` (required) is loaded by the `tokenizers` crate as is.
//! - `tokenizer_config.json` (optional): `bos_token`/`eos_token` (a string or an
//!   `{"content": ...}` object), `add_bos_token`/`add_eos_token`, `chat_template` (a string, or
//!   a list of `{"name", "template"}` of which `default` or the first is used).
//! - `chat_template.jinja` (optional): the template of newer repositories.
//! - `generation_config.json` (optional): `eos_token_id` (an id or a list) adds stop tokens.
//!
//! BOS/EOS on `encode(.., add_special_tokens=true)`: when `tokenizer_config.json` states
//! `add_bos_token` or `add_eos_token`, that decides (the `tokenizer.json` post-processor is
//! dropped, as transformers' Llama tokenizers rebuild it from those flags); otherwise the
//! `tokenizer.json` post-processor is used as is (Llama 3 adds `<|begin_of_text|>` that way).
//!
//! Decoding: the decoders LLM tokenizers use (`ByteLevel`; `Metaspace`; `Sequence` of
//! `Replace(▁, " ")`, `ByteFallback`, `Fuse`, `Strip(" ", n, 0)`) are turned into a
//! [`PieceTable`], so decoding and streaming work exactly as for GGUF vocabularies. Any other
//! decoder falls back to the `tokenizers` decoder, streamed by re-decoding the ids (`detok.rs`).

use std::path::Path;
use std::str::FromStr;

use serde_json::Value;
use tokenizers::DecoderWrapper;
use tokenizers::Tokenizer as HfTokenizer;
use tokenizers::processors::PostProcessorWrapper;

use crate::build::EOG_TEXTS;
use crate::chat::ChatTemplate;
use crate::error::TokenizerError;
use crate::gguf_vocab::check_vocab_size;
use crate::pieces::{PieceStyle, PieceTable, piece_bytes};
use crate::{Decoding, SpecialTokens, Tokenizer};

pub(crate) fn from_hf_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
    let tj_path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&tj_path).map_err(|source| TokenizerError::Io {
        path: tj_path.clone(),
        source,
    })?;
    let config = read_optional_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let gen_config =
        read_optional_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
    build(&text, &tj_path, &config, &gen_config, || {
        let path = dir.join("chat_template.jinja");
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(TokenizerError::Io { path, source }),
        }
    })
}

/// [`from_hf_dir`] on files already in memory: `tokenizer.json` and, when given,
/// `tokenizer_config.json` (no `generation_config.json`, no `chat_template.jinja`). JSON
/// errors name the file as `tokenizer.json` / `tokenizer_config.json`.
pub(crate) fn from_hf_json(
    tokenizer_json: &str,
    tokenizer_config: Option<&str>,
) -> Result<Tokenizer, TokenizerError> {
    let config = match tokenizer_config {
        Some(text) => serde_json::from_str(text).map_err(|source| TokenizerError::Json {
            path: "tokenizer_config.json".into(),
            source,
        })?,
        None => Value::Null,
    };
    build(
        tokenizer_json,
        Path::new("tokenizer.json"),
        &config,
        &Value::Null,
        || Ok(None),
    )
}

/// Refuses decoder settings that `tokenizers` (0.22) cannot decode every token with: a
/// `Strip` decoder with `stop > 0` indexes before the start of a token that is shorter than
/// `stop` and made only of the stripped character (an empty token, say) — a panic in the
/// middle of a generation. Real tokenizers strip at the start only (`"start": 1, "stop": 0`).
/// Checked on the parsed decoder: its JSON is untagged, so a `Strip` need not say `"type"`.
fn check_decoder(decoder: &DecoderWrapper) -> Result<(), TokenizerError> {
    match decoder {
        DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().try_for_each(check_decoder),
        DecoderWrapper::Strip(strip) if strip.stop > 0 => Err(TokenizerError::UnsupportedDecoder(
            "a Strip decoder with `stop` > 0 (only stripping at the start is supported)".into(),
        )),
        _ => Ok(()),
    }
}

/// Refuses BPE merges that `tokenizers` (0.22) would panic on while loading: with a
/// `continuing_subword_prefix` of n bytes it slices the second token of every merge at byte
/// n, which panics when that token is shorter than n bytes or n falls inside a character.
/// Such a file could never load (a merge whose tokens are not in the vocabulary is an error
/// there too), so it is refused with the merge named. Every top-level `"model"` key is
/// checked, as `tokenizers` builds each one; inside a model the last of a repeated key wins,
/// as in `serde_json::Value`, which is what `tokenizers` reads a model through.
fn check_merge_prefixes(text: &str, tj_path: &Path) -> Result<(), TokenizerError> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    struct Models(Vec<Value>);
    impl<'de> Visitor<'de> for Models {
        type Value = Vec<Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a tokenizer.json object")
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Vec<Value>, A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                if key == "model" {
                    self.0.push(map.next_value()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(self.0)
        }
    }
    let models = serde_json::Deserializer::from_str(text)
        .deserialize_map(Models(Vec::new()))
        .map_err(|source| TokenizerError::Json {
            path: tj_path.to_owned(),
            source,
        })?;
    for model in &models {
        let Some(prefix) = model
            .get("continuing_subword_prefix")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let Some(merges) = model.get("merges").and_then(Value::as_array) else {
            continue;
        };
        for (index, merge) in merges.iter().enumerate() {
            let second = match merge {
                Value::String(line) => {
                    let mut parts = line.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(_), Some(b), None) => Some(b),
                        _ => None,
                    }
                }
                Value::Array(pair) => pair.get(1).and_then(Value::as_str),
                _ => None,
            };
            if second.is_some_and(|b| b.get(prefix.len()..).is_none()) {
                return Err(TokenizerError::BadMerge {
                    index,
                    merge: merge.to_string(),
                    reason: "its second token is shorter than continuing_subword_prefix or \
                             has a character cut at that length",
                });
            }
        }
    }
    Ok(())
}

/// Builds from `tokenizer.json`'s text and the optional configs; `template_file` reads
/// `chat_template.jinja` when the config names no template.
fn build(
    text: &str,
    tj_path: &Path,
    config: &Value,
    gen_config: &Value,
    template_file: impl FnOnce() -> Result<Option<String>, TokenizerError>,
) -> Result<Tokenizer, TokenizerError> {
    let json: Value = serde_json::from_str(text).map_err(|source| TokenizerError::Json {
        path: tj_path.to_owned(),
        source,
    })?;
    check_merge_prefixes(text, tj_path)?;
    let mut inner = HfTokenizer::from_str(text)?;
    if let Some(decoder) = inner.get_decoder() {
        check_decoder(decoder)?;
    }
    let mut warnings = Vec::new();

    let vocab = inner.get_vocab(true);
    let vocab_size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
    check_vocab_size(vocab_size)?;

    let mut lookup = |key: &str| -> Option<u32> {
        let text = token_text(config.get(key)?)?;
        let id = inner.token_to_id(&text);
        if id.is_none() {
            warnings.push(format!(
                "tokenizer_config.json {key} {text:?} is not in the vocabulary"
            ));
        }
        id
    };
    let bos = lookup("bos_token");
    let eos = lookup("eos_token");

    let add_bos_cfg = config.get("add_bos_token").and_then(Value::as_bool);
    let add_eos_cfg = config.get("add_eos_token").and_then(Value::as_bool);
    let hf_post_processor = add_bos_cfg.is_none() && add_eos_cfg.is_none();
    let (add_bos, add_eos) = (add_bos_cfg.unwrap_or(false), add_eos_cfg.unwrap_or(false));
    if !hf_post_processor {
        inner.with_post_processor(None::<PostProcessorWrapper>);
    }
    if add_bos && bos.is_none() {
        return Err(TokenizerError::MissingMetadata(
            "tokenizer_config.json bos_token",
        ));
    }
    if add_eos && eos.is_none() {
        return Err(TokenizerError::MissingMetadata(
            "tokenizer_config.json eos_token",
        ));
    }

    let stop = stop_tokens(&inner, eos, gen_config, vocab_size);
    let decoding = decoding(&inner, &json, &vocab);
    let chat_template = match template_source(config, template_file)? {
        Some(src) => {
            let text_of = |id: Option<u32>| id.and_then(|id| inner.id_to_token(id));
            match ChatTemplate::new(&src, text_of(bos), text_of(eos)) {
                Ok(t) => Some(t),
                Err(e) => {
                    warnings.push(format!("chat template unusable: {e}"));
                    None
                }
            }
        }
        None => None,
    };

    Ok(Tokenizer {
        inner,
        decoding,
        vocab_size,
        specials: SpecialTokens {
            bos,
            eos,
            add_bos,
            add_eos,
            stop,
        },
        hf_post_processor,
        chat_template,
        warnings,
    })
}

/// The stop tokens: EOS, `generation_config.json`'s `eos_token_id`s (in the vocabulary), and
/// the special tokens among llama.cpp's end-of-generation texts; each once.
fn stop_tokens(
    inner: &HfTokenizer,
    eos: Option<u32>,
    gen_config: &Value,
    vocab_size: usize,
) -> Vec<u32> {
    let added = inner.get_added_vocabulary();
    let is_special_id = |id: u32| {
        inner
            .id_to_token(id)
            .is_some_and(|t| added.is_special_token(&t))
    };
    let gen_eos: Vec<u64> = match gen_config.get("eos_token_id") {
        Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_u64).collect(),
        Some(v) => v.as_u64().into_iter().collect(),
        None => Vec::new(),
    };
    let gen_eos = gen_eos
        .into_iter()
        .filter_map(|id| u32::try_from(id).ok())
        .filter(|&id| (id as usize) < vocab_size);
    let eog = EOG_TEXTS
        .iter()
        .filter_map(|t| inner.token_to_id(t))
        .filter(|&id| is_special_id(id));
    let mut stop = Vec::new();
    for id in eos.into_iter().chain(gen_eos).chain(eog) {
        if !stop.contains(&id) {
            stop.push(id);
        }
    }
    stop
}

/// Our own piece table where the decoder is one we know; HF's decoder otherwise.
fn decoding(
    inner: &HfTokenizer,
    json: &Value,
    vocab: &std::collections::HashMap<String, u32>,
) -> Decoding {
    let added = inner.get_added_vocabulary();
    match json.get("decoder").and_then(piece_style) {
        Some((style, strip)) => {
            let mut pieces = PieceTable::new(strip);
            for (token, &id) in vocab {
                pieces.set(id, piece_bytes(style, token), added.is_special_token(token));
            }
            Decoding::Pieces(pieces)
        }
        None => Decoding::Hf,
    }
}

/// The chat template: `tokenizer_config.json`'s (a string, or the `default` of a named list),
/// else `chat_template.jinja` beside it (`template_file`).
fn template_source(
    config: &Value,
    template_file: impl FnOnce() -> Result<Option<String>, TokenizerError>,
) -> Result<Option<String>, TokenizerError> {
    Ok(match config.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => {
            let named = |name: Option<&str>| {
                list.iter()
                    .find(|t| name.is_none() || t.get("name").and_then(Value::as_str) == name)
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            named(Some("default")).or_else(|| named(None))
        }
        _ => template_file()?,
    })
}

fn read_optional_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| TokenizerError::Json {
                path: path.to_owned(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// A special token in `tokenizer_config.json`: `"<s>"` or `{"content": "<s>", ...}`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// Recognises the decoders that reduce to per-token bytes; returns the style and how many
/// leading spaces of the output to strip.
fn piece_style(decoder: &Value) -> Option<(PieceStyle, usize)> {
    let ty = decoder.get("type")?.as_str()?;
    match ty {
        "ByteLevel" => Some((PieceStyle::ByteLevel, 0)),
        "Metaspace" => {
            if decoder.get("replacement").and_then(Value::as_str) != Some("\u{2581}") {
                return None;
            }
            let prepends = match decoder.get("prepend_scheme").and_then(Value::as_str) {
                Some(scheme) => scheme != "never",
                None => decoder
                    .get("add_prefix_space")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            };
            Some((
                PieceStyle::SentencePiece {
                    byte_fallback: false,
                },
                usize::from(prepends),
            ))
        }
        "Sequence" => {
            let steps = decoder.get("decoders")?.as_array()?;
            let (mut replace, mut byte_fallback, mut strip) = (false, false, 0usize);
            for (i, step) in steps.iter().enumerate() {
                match step.get("type")?.as_str()? {
                    "Replace" => {
                        let pattern = step.get("pattern")?.get("String")?.as_str()?;
                        let content = step.get("content")?.as_str()?;
                        if replace || byte_fallback || pattern != "\u{2581}" || content != " " {
                            return None;
                        }
                        replace = true;
                    }
                    "ByteFallback" => byte_fallback = true,
                    "Fuse" => {}
                    "Strip" => {
                        let content = step.get("content")?.as_str()?;
                        let stop = step.get("stop")?.as_u64()?;
                        if content != " " || stop != 0 || i + 1 != steps.len() {
                            return None;
                        }
                        strip = usize::try_from(step.get("start")?.as_u64()?).ok()?;
                    }
                    _ => return None,
                }
            }
            replace.then_some((PieceStyle::SentencePiece { byte_fallback }, strip))
        }
        _ => None,
    }
}
