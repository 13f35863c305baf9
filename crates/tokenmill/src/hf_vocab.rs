//! The `tokenizer.*` GGUF metadata of a Hugging Face folder's byte-level BPE tokenizer, as
//! llama.cpp's `convert_hf_to_gguf.py` writes it (`_set_vocab_gpt2`, `gguf.SpecialVocab`).
//!
//! * `tokenizer.ggml.model = "gpt2"`; `tokens` are the vocabulary by id, padded to the
//!   model's `vocab_size` with `[PAD{i}]` (type UNUSED); `token_type` is CONTROL for special
//!   added tokens, USER_DEFINED for other added tokens, NORMAL for the rest; `merges` are
//!   `"a b"` strings (either `tokenizer.json` form: strings or pairs), written even when empty
//!   (llama.cpp requires the key).
//! * `tokenizer.ggml.pre` names the pre-tokenizer for llama.cpp (and tokenmill's GGUF
//!   tokenizer): recognised structurally from `tokenizer.json`'s `pre_tokenizer` — GPT-2's
//!   `ByteLevel(use_regex)` → `gpt-2`, StarCoder/SmolLM's `Digits` + `ByteLevel` → `smollm`, the
//!   Llama 3 and Qwen2 split regexes → `llama-bpe` / `qwen2`. Anything else is an error rather
//!   than a guess: a wrong pre-tokenizer silently changes token ids.
//! * `bos/eos/padding_token_id` from `tokenizer_config.json`'s token texts (else
//!   `config.json`'s ids); `add_bos_token` from `tokenizer_config.json`, else whether the
//!   `tokenizer.json` post-processor starts with BOS (Llama 3); `add_eos_token` when stated;
//!   `tokenizer.chat_template` from `tokenizer_config.json` (a string, or the `default`/first
//!   of a list) or `chat_template.jinja`.
//!
//! Only byte-level BPE vocabularies are exported; SentencePiece (`Metaspace`) tokenizers are
//! refused with a message.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value as Json;
use tokenmill_gguf::{Array, Value};

/// GGUF token types (`gguf.TokenType`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// Llama 3's split regex, as `tokenizer.json` spells it.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split regex (Llama 3's with single digits).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn read_json(path: &Path) -> anyhow::Result<Option<Json>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The llama.cpp name of a `tokenizer.json` `pre_tokenizer`.
pub fn pre_tokenizer_name(pre: &Json) -> anyhow::Result<&'static str> {
    let steps: Vec<&Json> = match pre.get("type").and_then(Json::as_str) {
        Some("Sequence") => pre
            .get("pretokenizers")
            .and_then(Json::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => vec![pre],
    };
    fn ty(s: &Json) -> &str {
        s.get("type").and_then(Json::as_str).unwrap_or("")
    }
    let flag =
        |s: &Json, k: &str, default: bool| s.get(k).and_then(Json::as_bool).unwrap_or(default);
    let byte_level =
        |s: &Json, regex: bool| ty(s) == "ByteLevel" && flag(s, "use_regex", true) == regex;
    let split = |s: &Json, re: &str| {
        ty(s) == "Split"
            && s.pointer("/pattern/Regex").and_then(Json::as_str) == Some(re)
            && !flag(s, "invert", false)
    };
    Ok(match steps.as_slice() {
        [b] if byte_level(b, true) => "gpt-2",
        [d, b]
            if ty(d) == "Digits" && flag(d, "individual_digits", false) && byte_level(b, true) =>
        {
            "smollm"
        }
        [s, b] if split(s, LLAMA3_REGEX) && byte_level(b, false) => "llama-bpe",
        [s, b] if split(s, QWEN2_REGEX) && byte_level(b, false) => "qwen2",
        _ => bail!(
            "tokenizer.json pre_tokenizer {} is not one llama.cpp knows by name here \
             (GPT-2, SmolLM/StarCoder, Llama 3, Qwen2)",
            pre
        ),
    })
}

/// The text of a `tokenizer_config.json` token entry: a string or `{"content": ...}`.
fn token_text(v: &Json) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Json::as_str))
}

/// Whether the post-processor is a template that starts with the BOS token (Llama 3).
fn post_processor_adds_bos(tj: &Json, bos: &str) -> bool {
    let first = tj
        .pointer("/post_processor/single/0/SpecialToken/id")
        .or_else(|| {
            // A Sequence of processors (Llama 3.1+: ByteLevel then TemplateProcessing).
            tj.pointer("/post_processor/processors")?
                .as_array()?
                .iter()
                .find_map(|p| p.pointer("/single/0/SpecialToken/id"))
        });
    first.and_then(Json::as_str) == Some(bos)
}

/// The tokens by id and their types, padded to `vocab_size`.
fn tokens(tj: &Json, vocab_size: usize) -> anyhow::Result<(Vec<String>, Vec<i32>)> {
    let vocab = tj
        .pointer("/model/vocab")
        .and_then(Json::as_object)
        .context("tokenizer.json has no model.vocab")?;
    let mut by_id: Vec<Option<(String, i32)>> = vec![None; vocab_size];
    let mut put = |id: Option<u64>, text: &str, ty: i32| -> anyhow::Result<()> {
        let id = id.context("tokenizer.json: a token id is not an integer")? as usize;
        let slot = by_id.get_mut(id).with_context(|| {
            format!("tokenizer.json token {text:?} has id {id}, beyond vocab_size {vocab_size}")
        })?;
        *slot = Some((text.to_owned(), ty));
        Ok(())
    };
    for (text, id) in vocab {
        put(id.as_u64(), text, NORMAL)?;
    }
    for t in tj
        .get("added_tokens")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let text = t.get("content").and_then(Json::as_str).unwrap_or_default();
        let special = t.get("special").and_then(Json::as_bool).unwrap_or(false);
        put(
            t.get("id").and_then(Json::as_u64),
            text,
            if special { CONTROL } else { USER_DEFINED },
        )?;
    }
    Ok(by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED)))
        .unzip())
}

/// `model.merges` as `"a b"` strings.
fn merges(tj: &Json) -> anyhow::Result<Vec<String>> {
    let list = match tj.pointer("/model/merges") {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(m) => m
            .as_array()
            .context("tokenizer.json model.merges is not a list")?,
    };
    list.iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) => match pair.as_slice() {
                [Json::String(a), Json::String(b)] => Ok(format!("{a} {b}")),
                _ => bail!("tokenizer.json merge {m} is not a pair of strings"),
            },
            _ => bail!("tokenizer.json merge {m} is neither a string nor a pair"),
        })
        .collect()
}

/// The chat template: `tokenizer_config.json`'s, else `chat_template.jinja`.
fn chat_template(dir: &Path, tc: &Json) -> anyhow::Result<Option<String>> {
    match tc.get("chat_template") {
        Some(Json::String(s)) => return Ok(Some(s.clone())),
        Some(Json::Array(list)) => {
            let named = |name: Option<&str>| {
                list.iter()
                    .find(|t| name.is_none() || t.get("name").and_then(Json::as_str) == name)
                    .and_then(|t| t.get("template"))
                    .and_then(Json::as_str)
                    .map(str::to_owned)
            };
            return Ok(named(Some("default")).or_else(|| named(None)));
        }
        _ => {}
    }
    let path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The `tokenizer.*` metadata of the folder `dir` for a model of `vocab_size` tokens.
pub fn tokenizer_metadata(dir: &Path, vocab_size: usize) -> anyhow::Result<Vec<(String, Value)>> {
    let tj = read_json(&dir.join("tokenizer.json"))?
        .with_context(|| format!("{} has no tokenizer.json", dir.display()))?;
    let tc = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
    let config = read_json(&dir.join("config.json"))?.unwrap_or(Json::Null);
    let model_ty = tj.pointer("/model/type").and_then(Json::as_str);
    let decoder = tj.pointer("/decoder/type").and_then(Json::as_str);
    if model_ty != Some("BPE") || decoder != Some("ByteLevel") {
        bail!(
            "only byte-level BPE tokenizers are exported (tokenizer.json model {model_ty:?}, \
             decoder {decoder:?}); SentencePiece vocabularies are not supported"
        );
    }
    let pre = pre_tokenizer_name(tj.get("pre_tokenizer").unwrap_or(&Json::Null))?;
    let (tokens, types) = tokens(&tj, vocab_size)?;
    let ids: HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let special = |key: &str| -> anyhow::Result<Option<u32>> {
        if let Some(text) = tc.get(format!("{key}_token")).and_then(token_text) {
            let id = ids.get(text).with_context(|| {
                format!("tokenizer_config.json {key}_token {text:?} is not in the vocabulary")
            })?;
            return Ok(Some(*id));
        }
        let id = config.get(format!("{key}_token_id")).and_then(Json::as_u64);
        Ok(id.filter(|&i| (i as usize) < vocab_size).map(|i| i as u32))
    };
    let mut md = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".to_owned(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".to_owned(),
            Value::Array(Array::String(tokens.clone())),
        ),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(Array::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".to_owned(),
            Value::Array(Array::String(merges(&tj)?)),
        ),
    ];
    let bos = special("bos")?;
    for (key, id) in [
        ("bos", bos),
        ("eos", special("eos")?),
        ("padding", special("pad")?),
    ] {
        if let Some(id) = id {
            md.push((format!("tokenizer.ggml.{key}_token_id"), Value::U32(id)));
        }
    }
    let add_bos = match tc.get("add_bos_token").and_then(Json::as_bool) {
        Some(b) => b,
        None => bos.is_some_and(|id| post_processor_adds_bos(&tj, &tokens[id as usize])),
    };
    md.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)));
    if let Some(b) = tc.get("add_eos_token").and_then(Json::as_bool) {
        md.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(b)));
    }
    if let Some(t) = chat_template(dir, &tc)? {
        md.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pre_tokenizers_are_recognised_by_structure() {
        let bl =
            |re: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": re});
        assert_eq!(pre_tokenizer_name(&bl(true)).unwrap(), "gpt-2");
        let smollm = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, bl(true)]});
        assert_eq!(pre_tokenizer_name(&smollm).unwrap(), "smollm");
        for (re, name) in [(LLAMA3_REGEX, "llama-bpe"), (QWEN2_REGEX, "qwen2")] {
            let seq = json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated",
                 "invert": false}, bl(false)]});
            assert_eq!(pre_tokenizer_name(&seq).unwrap(), name);
        }
        // Unknown shapes are refused, not guessed.
        for bad in [
            json!(null),
            bl(false),
            json!({"type": "Metaspace", "replacement": "▁"}),
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\s+"}}, bl(false)]}),
        ] {
            let err = pre_tokenizer_name(&bad).unwrap_err().to_string();
            assert!(err.contains("pre_tokenizer"), "{err}");
        }
    }

    #[test]
    fn merges_in_both_forms_and_tokens_padded() {
        let tj = json!({
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                      "merges": ["a b", ["ab", "b"]]},
            "added_tokens": [
                {"id": 3, "content": "<s>", "special": true},
                {"id": 4, "content": "word", "special": false}
            ]
        });
        assert_eq!(merges(&tj).unwrap(), ["a b", "ab b"]);
        let (tokens, types) = tokens(&tj, 6).unwrap();
        assert_eq!(tokens, ["a", "b", "ab", "<s>", "word", "[PAD5]"]);
        assert_eq!(
            types,
            [NORMAL, NORMAL, NORMAL, CONTROL, USER_DEFINED, UNUSED]
        );
        let err = super::tokens(&tj, 4).unwrap_err().to_string();
        assert!(err.contains("beyond vocab_size 4"), "{err}");
    }

    #[test]
    fn bos_from_a_template_post_processor() {
        let tj = json!({"post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel"},
            {"type": "TemplateProcessing", "single": [
                {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}]}]}});
        assert!(post_processor_adds_bos(&tj, "<|begin_of_text|>"));
        assert!(!post_processor_adds_bos(&tj, "<s>"));
        assert!(!post_processor_adds_bos(&json!({}), "<s>"));
    }
}
