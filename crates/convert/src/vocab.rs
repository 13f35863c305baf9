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
//! refused ([`ConvertError::UnsupportedTokenizer`]).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value as Json;
use tokenmill_gguf::{Array, Value};

use crate::error::{ConvertError, Result};

/// GGUF token types (`gguf.TokenType`).
pub const NORMAL: i32 = 1;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;
pub const UNUSED: i32 = 5;

/// Llama 3's split regex, as `tokenizer.json` spells it.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split regex (Llama 3's with single digits).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The file's text, or `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConvertError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| ConvertError::ParseJson {
            path: path.to_owned(),
            source,
        })
}

/// The llama.cpp name of a `tokenizer.json` `pre_tokenizer`.
pub fn pre_tokenizer_name(pre: &Json) -> Result<&'static str> {
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
        _ => {
            return Err(ConvertError::UnknownPreTokenizer {
                pre: pre.to_string(),
            });
        }
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
fn tokens(tj: &Json, vocab_size: usize) -> Result<(Vec<String>, Vec<i32>)> {
    let vocab = tj
        .pointer("/model/vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| ConvertError::MalformedTokenizer("has no model.vocab".into()))?;
    let mut by_id: Vec<Option<(String, i32)>> = vec![None; vocab_size];
    let mut put = |id: Option<u64>, text: &str, ty: i32| -> Result<()> {
        let id = id.ok_or(ConvertError::NonIntegerTokenId)? as usize;
        let slot = by_id
            .get_mut(id)
            .ok_or_else(|| ConvertError::TokenIdOutOfRange {
                text: text.to_owned(),
                id,
                vocab_size,
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
fn merges(tj: &Json) -> Result<Vec<String>> {
    let malformed = |what: String| ConvertError::MalformedTokenizer(what);
    let list = match tj.pointer("/model/merges") {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(m) => m
            .as_array()
            .ok_or_else(|| malformed("model.merges is not a list".into()))?,
    };
    list.iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) => match pair.as_slice() {
                [Json::String(a), Json::String(b)] => Ok(format!("{a} {b}")),
                _ => Err(malformed(format!("merge {m} is not a pair of strings"))),
            },
            _ => Err(malformed(format!(
                "merge {m} is neither a string nor a pair"
            ))),
        })
        .collect()
}

/// The chat template: `tokenizer_config.json`'s, else `chat_template.jinja`.
fn chat_template(dir: &Path, tc: &Json) -> Result<Option<String>> {
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
    read_optional(&dir.join("chat_template.jinja"))
}

/// Refuses anything but a byte-level BPE `tokenizer.json`.
fn check_byte_level_bpe(tj: &Json) -> Result<()> {
    let model = tj.pointer("/model/type").and_then(Json::as_str);
    let decoder = tj.pointer("/decoder/type").and_then(Json::as_str);
    if model != Some("BPE") || decoder != Some("ByteLevel") {
        return Err(ConvertError::UnsupportedTokenizer {
            model: model.map(str::to_owned),
            decoder: decoder.map(str::to_owned),
        });
    }
    Ok(())
}

/// The special-token ids: `tokenizer_config.json`'s `{key}_token` text looked up in `tokens`,
/// else `config.json`'s `{key}_token_id` when it is inside the vocabulary.
struct SpecialIds<'a> {
    ids: HashMap<&'a str, u32>,
    tc: &'a Json,
    config: &'a Json,
    vocab_size: usize,
}

impl SpecialIds<'_> {
    fn get(&self, key: &str) -> Result<Option<u32>> {
        if let Some(text) = self.tc.get(format!("{key}_token")).and_then(token_text) {
            let id = self
                .ids
                .get(text)
                .ok_or_else(|| ConvertError::SpecialTokenNotInVocab {
                    key: key.to_owned(),
                    text: text.to_owned(),
                })?;
            return Ok(Some(*id));
        }
        let id = self
            .config
            .get(format!("{key}_token_id"))
            .and_then(Json::as_u64);
        Ok(id
            .filter(|&i| (i as usize) < self.vocab_size)
            .map(|i| i as u32))
    }
}

/// The `tokenizer.*` metadata of the folder `dir` for a model of `vocab_size` tokens.
pub fn tokenizer_metadata(dir: &Path, vocab_size: usize) -> Result<Vec<(String, Value)>> {
    let tj =
        read_json(&dir.join("tokenizer.json"))?.ok_or_else(|| ConvertError::MissingTokenizer {
            dir: dir.to_owned(),
        })?;
    let tc = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
    let config = read_json(&dir.join("config.json"))?.unwrap_or(Json::Null);
    check_byte_level_bpe(&tj)?;
    let pre = pre_tokenizer_name(tj.get("pre_tokenizer").unwrap_or(&Json::Null))?;
    let (tokens, types) = tokens(&tj, vocab_size)?;
    let special = SpecialIds {
        ids: tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect(),
        tc: &tc,
        config: &config,
        vocab_size,
    };
    let string = |s: &str| Value::String(s.into());
    let mut md = vec![
        ("tokenizer.ggml.model".to_owned(), string("gpt2")),
        ("tokenizer.ggml.pre".to_owned(), string(pre)),
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
    let bos = special.get("bos")?;
    for (key, id) in [
        ("bos", bos),
        ("eos", special.get("eos")?),
        ("padding", special.get("pad")?),
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
    use crate::testing::{edit_json, edited_copy, hf_fixture};
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
            match pre_tokenizer_name(&bad) {
                Err(e @ ConvertError::UnknownPreTokenizer { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains(&format!("pre_tokenizer {bad} ")), "{msg}");
                }
                other => panic!("{bad}: {other:?}"),
            }
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
        let err = super::tokens(&tj, 4).unwrap_err();
        assert!(
            matches!(&err, ConvertError::TokenIdOutOfRange { text, id: 4, vocab_size: 4 }
                if text == "word"),
            "{err:?}"
        );
        assert!(err.to_string().contains("beyond vocab_size 4"), "{err}");
    }

    #[test]
    fn malformed_vocabularies_and_merges_are_typed_errors() {
        let no_vocab = super::tokens(&json!({"model": {}}), 4).unwrap_err();
        assert_eq!(no_vocab.to_string(), "tokenizer.json has no model.vocab");
        let bad_id = super::tokens(&json!({"model": {"vocab": {"a": -1}}}), 4).unwrap_err();
        assert!(
            matches!(bad_id, ConvertError::NonIntegerTokenId),
            "{bad_id:?}"
        );
        for (m, needle) in [
            (json!("a b"), "model.merges is not a list"),
            (json!([["a", "b", "c"]]), "is not a pair of strings"),
            (json!([7]), "neither a string nor a pair"),
        ] {
            let err = merges(&json!({"model": {"merges": m}})).unwrap_err();
            assert!(
                matches!(err, ConvertError::MalformedTokenizer(_)),
                "{err:?}"
            );
            assert!(err.to_string().contains(needle), "{err}");
        }
        assert!(
            merges(&json!({"model": {"merges": null}}))
                .unwrap()
                .is_empty()
        );
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

    fn get<'a>(md: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
        md.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    #[test]
    fn the_fixture_tokenizer_becomes_gguf_metadata() {
        // 256 byte-level tokens, no merges; tokenizer_config.json names BOS "ā" (id 1) and
        // EOS "Ă" (id 2), says add_bos/add_eos false and carries the chat template.
        let dir = hf_fixture("llama");
        let md = tokenizer_metadata(&dir, 260).unwrap();
        let s = |key: &str| match get(&md, key) {
            Some(Value::String(s)) => s.clone(),
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(s("tokenizer.ggml.model"), "gpt2");
        assert_eq!(s("tokenizer.ggml.pre"), "gpt-2");
        let Some(Value::Array(Array::String(tokens))) = get(&md, "tokenizer.ggml.tokens") else {
            panic!("no tokens");
        };
        assert_eq!(tokens.len(), 260);
        assert_eq!((tokens[1].as_str(), tokens[2].as_str()), ("ā", "Ă"));
        assert_eq!(tokens[259], "[PAD259]");
        let Some(Value::Array(Array::I32(types))) = get(&md, "tokenizer.ggml.token_type") else {
            panic!("no token types");
        };
        assert_eq!((types[255], types[256]), (NORMAL, UNUSED));
        assert!(matches!(
            get(&md, "tokenizer.ggml.merges"),
            Some(Value::Array(Array::String(m))) if m.is_empty()
        ));
        assert!(matches!(
            get(&md, "tokenizer.ggml.bos_token_id"),
            Some(Value::U32(1))
        ));
        assert!(matches!(
            get(&md, "tokenizer.ggml.eos_token_id"),
            Some(Value::U32(2))
        ));
        assert!(get(&md, "tokenizer.ggml.padding_token_id").is_none());
        for key in ["add_bos_token", "add_eos_token"] {
            let v = get(&md, &format!("tokenizer.ggml.{key}"));
            assert!(matches!(v, Some(Value::Bool(false))), "{key}: {v:?}");
        }
        assert!(s("tokenizer.chat_template").starts_with("{% for m in messages %}"));
    }

    #[test]
    fn special_ids_fall_back_to_config_json_and_templates_to_the_jinja_file() {
        let d = edited_copy("llama", |d| {
            edit_json(&d.join("tokenizer_config.json"), |v| {
                let o = v.as_object_mut().unwrap();
                for k in ["bos_token", "add_bos_token", "chat_template"] {
                    o.remove(k);
                }
            });
            edit_json(&d.join("config.json"), |v| v["pad_token_id"] = 7.into());
            std::fs::write(d.join("chat_template.jinja"), "{{ messages }}").unwrap();
        });
        let md = tokenizer_metadata(d.path(), 256).unwrap();
        assert!(matches!(
            get(&md, "tokenizer.ggml.bos_token_id"),
            Some(Value::U32(1))
        ));
        assert!(matches!(
            get(&md, "tokenizer.ggml.padding_token_id"),
            Some(Value::U32(7))
        ));
        // No add_bos_token and no post-processor: BOS is not added.
        assert!(matches!(
            get(&md, "tokenizer.ggml.add_bos_token"),
            Some(Value::Bool(false))
        ));
        assert!(matches!(
            get(&md, "tokenizer.chat_template"),
            Some(Value::String(t)) if t == "{{ messages }}"
        ));
    }

    #[test]
    fn folder_problems_are_the_right_errors() {
        let d = edited_copy("llama", |d| {
            std::fs::remove_file(d.join("tokenizer.json")).unwrap()
        });
        match tokenizer_metadata(d.path(), 256) {
            Err(ConvertError::MissingTokenizer { dir }) => assert_eq!(dir, d.path()),
            other => panic!("{other:?}"),
        }
        let d = edited_copy("llama", |d| {
            edit_json(&d.join("tokenizer.json"), |v| {
                v["decoder"]["type"] = "Metaspace".into()
            })
        });
        match tokenizer_metadata(d.path(), 256) {
            Err(ConvertError::UnsupportedTokenizer { model, decoder }) => {
                assert_eq!(
                    (model.as_deref(), decoder.as_deref()),
                    (Some("BPE"), Some("Metaspace"))
                );
            }
            other => panic!("{other:?}"),
        }
        let d = edited_copy("llama", |d| {
            edit_json(&d.join("tokenizer_config.json"), |v| {
                v["eos_token"] = "nope".into()
            })
        });
        match tokenizer_metadata(d.path(), 256) {
            Err(ConvertError::SpecialTokenNotInVocab { key, text }) => {
                assert_eq!((key.as_str(), text.as_str()), ("eos", "nope"));
            }
            other => panic!("{other:?}"),
        }
        let d = edited_copy("llama", |d| {
            std::fs::write(d.join("tokenizer_config.json"), "{ not json").unwrap()
        });
        match tokenizer_metadata(d.path(), 256) {
            Err(ConvertError::ParseJson { path, .. }) => {
                assert_eq!(path, d.path().join("tokenizer_config.json"));
            }
            other => panic!("{other:?}"),
        }
        let err = tokenizer_metadata(&hf_fixture("llama"), 100).unwrap_err();
        assert!(
            matches!(err, ConvertError::TokenIdOutOfRange { id, vocab_size: 100, .. } if id >= 100),
            "{err:?}"
        );
    }
}
