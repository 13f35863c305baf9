//! Tokenizers loaded from Hugging Face folders (`tokenizer.json` + configs).

mod common;

use common::{check_stream, stream};
use tokenmill_tokenizer::{Tokenizer, TokenizerError};

#[test]
fn hf_folder_round_trip() {
    // Write the SmolLM2 tokenizer out as a tokenizer.json folder and load it back.
    let gguf = common::smollm2();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        gguf.hf_tokenizer().to_string(false).unwrap(),
    )
    .unwrap();
    let template = gguf.chat_template().unwrap().source().to_owned();
    let config = serde_json::json!({
        "bos_token": {"content": "<|im_start|>", "special": true},
        "eos_token": "<|im_end|>",
        "add_bos_token": false,
        "chat_template": template,
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )
    .unwrap();

    let hf = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(hf.vocab_size(), gguf.vocab_size());
    assert_eq!((hf.bos_token_id(), hf.eos_token_id()), (Some(1), Some(2)));
    assert_eq!(hf.stop_token_ids(), [2, 0]);
    assert!(hf.warnings().is_empty(), "{:?}", hf.warnings());
    let fx = common::fixture("tokenize.json");
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = gguf.encode(text, true).unwrap();
        assert_eq!(hf.encode(text, true).unwrap(), ids, "{text:?}");
        assert_eq!(
            hf.decode(&ids, false).unwrap(),
            gguf.decode(&ids, false).unwrap()
        );
        check_stream(&hf, &ids, true);
    }
    let msgs = [tokenmill_tokenizer::ChatMessage::new("user", "hi")];
    assert_eq!(
        hf.chat_template().unwrap().render(&msgs, true).unwrap(),
        gguf.chat_template().unwrap().render(&msgs, true).unwrap()
    );

    // add_bos_token = true: BOS comes from this crate, once.
    let config = serde_json::json!({"bos_token": "<|im_start|>", "add_bos_token": true});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let hf = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(hf.encode("hi", true).unwrap(), [1, 6004]);
    assert_eq!(hf.encode("hi", false).unwrap(), [6004]);

    // No tokenizer.json: a typed I/O error.
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        Tokenizer::from_hf_dir(empty.path()),
        Err(TokenizerError::Io { .. })
    ));
}

#[test]
fn hf_folder_with_an_unrecognised_decoder_still_streams() {
    // A WordPiece-style decoder is not a byte table: decoding goes through `tokenizers` and the
    // incremental decoder that re-decodes the ids.
    let gguf = common::smollm2();
    let mut json: serde_json::Value =
        serde_json::from_str(&gguf.hf_tokenizer().to_string(false).unwrap()).unwrap();
    json["decoder"] = serde_json::json!({"type": "Sequence", "decoders": [{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}]});
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    let hf = Tokenizer::from_hf_dir(dir.path()).unwrap();
    for text in [
        "Hello 👨\u{200d}👩\u{200d}👧 日本語 world",
        "<|im_start|>user\nhi<|im_end|>",
    ] {
        let ids = hf.encode(text, false).unwrap();
        let (pushes, tail) = stream(&hf, &ids, false);
        assert_eq!(pushes.concat() + &tail, text);
        for p in &pushes {
            assert!(!p.contains(char::REPLACEMENT_CHARACTER));
        }
    }
    assert!(matches!(
        hf.decode(&[u32::MAX], false),
        Err(TokenizerError::TokenOutOfRange(_))
    ));
    assert_eq!(hf.token_to_piece(2).as_deref(), Some("<|im_end|>"));
}

#[test]
fn from_hf_json_matches_the_folder() {
    let gguf = common::smollm2();
    let tj = gguf.hf_tokenizer().to_string(false).unwrap();
    let template = gguf.chat_template().unwrap().source().to_owned();
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "chat_template": template,
    })
    .to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), &tj).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), &config).unwrap();
    let from_dir = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let from_json = Tokenizer::from_hf_json(&tj, Some(&config)).unwrap();
    assert_eq!(from_json.vocab_size(), from_dir.vocab_size());
    assert_eq!(from_json.stop_token_ids(), from_dir.stop_token_ids());
    let ids = from_dir.encode("Hello, world!", true).unwrap();
    assert_eq!(from_json.encode("Hello, world!", true).unwrap(), ids);
    assert_eq!(
        from_json.decode(&ids, false).unwrap(),
        from_dir.decode(&ids, false).unwrap()
    );
    assert!(from_json.chat_template().is_some());
    // Bad JSON names the file it came from.
    match Tokenizer::from_hf_json("{", None) {
        Err(TokenizerError::Json { path, .. }) => assert_eq!(path.to_str(), Some("tokenizer.json")),
        other => panic!("{other:?}"),
    }
    match Tokenizer::from_hf_json(&tj, Some("[")) {
        Err(TokenizerError::Json { path, .. }) => {
            assert_eq!(path.to_str(), Some("tokenizer_config.json"))
        }
        other => panic!("{other:?}"),
    }
}

/// Found by the `tokenizer_json` fuzz target: `tokenizers` 0.22's `Strip` decoder with
/// `stop > 0` subtracts past the start of a token made only of the stripped character (here
/// the empty text a lone byte-fallback piece leaves) and panics while decoding. Such a file
/// is refused at load with a typed error; the usual `"stop": 0` loads and decodes.
#[test]
fn a_strip_decoder_that_would_panic_is_refused_at_load() {
    let json = |stop: u32, tagged: bool| {
        let mut strip = serde_json::json!({"content": " ", "start": 1, "stop": stop});
        if tagged {
            strip["type"] = "Strip".into();
        }
        serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                strip]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
                "byte_fallback": true, "ignore_merges": false,
                "vocab": {"<unk>": 0, "<0xC3>": 1, "\u{2581}": 2, "a": 3}, "merges": []}
        })
        .to_string()
    };
    // The decoder JSON is untagged: a Strip without `"type"` is still a Strip (the second
    // input the fuzzer found).
    for tagged in [true, false] {
        match Tokenizer::from_hf_json(&json(1, tagged), None) {
            Err(TokenizerError::UnsupportedDecoder(m)) => assert!(m.contains("Strip"), "{m}"),
            other => panic!("{:?}", other.map(|t| t.vocab_size())),
        }
    }
    let ok = Tokenizer::from_hf_json(&json(0, true), None).unwrap();
    for ids in [&[1u32][..], &[2], &[2, 3], &[3, 1, 2]] {
        ok.decode(ids, false).unwrap();
    }
}

/// `tokenizers` 0.22 slices the second token of every BPE merge at the byte length of
/// `continuing_subword_prefix` while loading, and panicked on a token shorter than that or
/// with a character cut there (found by the fuzzer). Such a file is refused with `BadMerge`,
/// in either merge form, without `"type"`, and in an earlier of two `"model"` keys (each is
/// built); merges that do carry the prefix load and merge.
#[test]
fn a_merge_shorter_than_the_subword_prefix_is_refused_at_load() {
    let model = |prefix: &str, merges: serde_json::Value, tagged: bool| {
        let mut m = serde_json::json!({"dropout": null, "unk_token": null,
            "continuing_subword_prefix": prefix, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": {"a": 0, "b": 1, "ab": 2, "##b": 3, "\u{e9}": 4, "a\u{e9}": 5},
            "merges": merges});
        if tagged {
            m["type"] = "BPE".into();
        }
        m.to_string()
    };
    let doc = |models: &[String]| {
        let keys: Vec<String> = models.iter().map(|m| format!("\"model\": {m}")).collect();
        format!(
            r#"{{"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
                "post_processor": null, "decoder": null, {}}}"#,
            keys.join(", ")
        )
    };
    let good = model("##", serde_json::json!([["a", "##b"]]), true);
    let bad = [
        model("##", serde_json::json!([["a", "b"]]), true),
        model("##", serde_json::json!(["a b"]), false),
        model("#", serde_json::json!(["a \u{e9}"]), true),
    ];
    for b in &bad {
        for models in [vec![b.clone()], vec![b.clone(), good.clone()]] {
            match Tokenizer::from_hf_json(&doc(&models), None) {
                Err(TokenizerError::BadMerge {
                    index: 0, reason, ..
                }) => {
                    assert!(reason.contains("continuing_subword_prefix"), "{reason}")
                }
                other => panic!("{models:?}: {:?}", other.map(|t| t.vocab_size())),
            }
        }
    }
    let tok = Tokenizer::from_hf_json(&doc(&[good]), None).unwrap();
    assert_eq!(tok.encode("ab", false).unwrap(), [2]);
}

/// A decoder whose output depends on the start of the whole text (two `Strip`s after a
/// `Fuse`: up to two leading spaces of the text go) is not a piece table, so it streams by
/// re-decoding. A window over recent ids (the vLLM/TGI algorithm, used here before) stripped
/// the spaces at the window's start too and lost a space mid-text (found by the fuzzer).
#[test]
fn a_decoder_that_strips_the_texts_start_streams_exactly() {
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": 1, "content": "<s>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": true, "ignore_merges": false,
            "vocab": {"<unk>": 0, "<s>": 1, "\u{2581}": 2, "a": 3}, "merges": []}
    })
    .to_string();
    let tok = Tokenizer::from_hf_json(&json, None).unwrap();
    assert_eq!(tok.decode(&[2, 2, 2, 3], false).unwrap(), " a");
    for ids in [
        &[2u32, 1, 2, 2, 3, 2, 1, 2, 2, 3][..],
        &[2, 2, 2, 3, 2, 2, 2, 3],
        &[3, 2, 1, 2, 2, 1, 2, 3, 2, 2],
    ] {
        for skip in [false, true] {
            common::check_stream(&tok, ids, skip);
        }
    }
}
