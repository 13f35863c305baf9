//! Tokenizers built from small synthetic vocabularies: the SentencePiece (`llama`) model,
//! byte-level BPE, validation of hostile vocabularies, the committed tiny GGUF fixtures.

mod common;

use common::{check_stream, gpt2_vocab, stream, workspace_root};
use tokenmill_tokenizer::gguf_vocab::{MAX_VOCAB_SIZE, token_type as tt};
use tokenmill_tokenizer::{GgufVocab, Tokenizer, TokenizerError};

/// A tiny SentencePiece vocabulary: specials, 256 byte tokens, a few pieces with scores.
fn spm_vocab() -> GgufVocab {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![tt::UNKNOWN, tt::CONTROL, tt::CONTROL];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(tt::BYTE);
        scores.push(0.0);
    }
    let pieces = [
        "▁", "h", "e", "l", "o", "w", "r", "d", "ll", "▁h", "▁he", "llo", "▁hello", "▁w", "or",
        "▁wor", "ld", "▁world", "<tool>",
    ];
    for (i, p) in pieces.iter().enumerate() {
        tokens.push((*p).to_owned());
        types.push(if *p == "<tool>" {
            tt::USER_DEFINED
        } else {
            tt::NORMAL
        });
        scores.push(-(i as f32));
    }
    GgufVocab {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..GgufVocab::default()
    }
}

fn id(tok: &Tokenizer, piece: &str) -> u32 {
    tok.token_to_id(piece)
        .unwrap_or_else(|| panic!("{piece:?} not in vocab"))
}

#[test]
fn spm_encodes_with_scores_prefix_and_byte_fallback() {
    let tok = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    assert_eq!(tok.vocab_size(), 3 + 256 + 19);
    assert!(tok.add_bos_token()); // llama.cpp's default for SentencePiece
    assert_eq!(tok.stop_token_ids(), [2]);

    let (hello, world) = (id(&tok, "▁hello"), id(&tok, "▁world"));
    assert_eq!(tok.encode("hello world", true).unwrap(), [1, hello, world]);
    assert_eq!(tok.encode("hello world", false).unwrap(), [hello, world]);
    assert_eq!(tok.decode(&[1, hello, world], true).unwrap(), "hello world");
    assert_eq!(
        tok.decode(&[1, hello, world], false).unwrap(),
        "<s> hello world"
    );

    // A leading space is kept (SentencePiece/llama.cpp: "▁" prefix + "▁" for the space).
    let ids = tok.encode(" hello", false).unwrap();
    assert_eq!(ids, [id(&tok, "▁"), hello]);
    assert_eq!(tok.decode(&ids, false).unwrap(), " hello");

    // Characters outside the vocabulary fall back to their UTF-8 bytes.
    let ids = tok.encode("hé", false).unwrap();
    assert_eq!(
        ids,
        [id(&tok, "▁h"), id(&tok, "<0xC3>"), id(&tok, "<0xA9>")]
    );
    assert_eq!(tok.decode(&ids, false).unwrap(), "hé");
    let ids = tok.encode("👋", false).unwrap();
    assert_eq!(ids.len(), 5, "{ids:?}"); // ▁ + 4 bytes
    assert_eq!(tok.decode(&ids, false).unwrap(), "👋");

    // Special and user-defined tokens are matched whole; a new run after a special token gets
    // its own "▁" prefix (as in llama.cpp).
    let ids = tok.encode("hello<tool>world</s>", false).unwrap();
    assert_eq!(ids, [hello, id(&tok, "<tool>"), world, 2]);
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello<tool> world");
}

#[test]
fn spm_piece_table_agrees_with_the_hf_decoder() {
    let tok = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    for text in [
        "hello world",
        " hello",
        "hé 👋 日本",
        "<s>hello</s> world<tool>",
        "  two  spaces  ",
        "",
    ] {
        let ids = tok.encode(text, true).unwrap();
        for skip in [false, true] {
            let hf = tok.hf_tokenizer().decode(&ids, skip).unwrap();
            assert_eq!(tok.decode(&ids, skip).unwrap(), hf, "{text:?} skip={skip}");
        }
        if !text.contains("</s>") {
            // (After a special token a run gets its own "▁" prefix, which decodes to a space.)
            assert_eq!(tok.decode(&ids, true).unwrap(), text.replace("<s>", ""));
        }
    }
}

#[test]
fn spm_streaming_holds_back_byte_fallback_characters() {
    let tok = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    for text in [
        "hello 👨\u{200d}👩\u{200d}👧 world",
        "日本語 hello",
        "é",
        " hello  world ",
        "<s>hello</s>",
    ] {
        let ids = tok.encode(text, true).unwrap();
        let (pushes, tail) = stream(&tok, &ids, true);
        for p in &pushes {
            assert!(
                !p.contains(char::REPLACEMENT_CHARACTER),
                "{text:?}: {pushes:?}"
            );
        }
        assert_eq!(pushes.concat() + &tail, tok.decode(&ids, true).unwrap());
        check_stream(&tok, &ids, true);
        check_stream(&tok, &ids, false);
    }
    // The leading-space rule applies once, at the start of the stream.
    let (hello, world) = (id(&tok, "▁hello"), id(&tok, "▁world"));
    let (pushes, _) = stream(&tok, &[1, hello, world, hello], true);
    assert_eq!(pushes, ["", "hello", " world", " hello"]);
    // Emoji bytes: nothing until the last byte.
    let ids = tok.encode("👋", false).unwrap();
    let (pushes, _) = stream(&tok, &ids, true);
    assert_eq!(pushes, ["", "", "", "", "👋"]);
}

#[test]
fn spm_matches_sentencepiece_merge_order() {
    // "▁hello" must win over the split "▁he" + "llo" only through the merges; with the score of
    // "▁hello" lower than its parts the merge still happens (SentencePiece merges any pair that
    // forms a token, best score first).
    let tok = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    assert_eq!(
        tok.encode("hell", false).unwrap(),
        [id(&tok, "▁he"), id(&tok, "ll")]
    );
    assert_eq!(tok.encode("world", false).unwrap(), [id(&tok, "▁world")]);
    assert_eq!(
        tok.encode("wd", false).unwrap(),
        [id(&tok, "▁w"), id(&tok, "d")]
    );
}

#[test]
fn gpt2_synthetic() {
    let tok = Tokenizer::from_gguf_vocab(&gpt2_vocab()).unwrap();
    assert_eq!(tok.encode(" hi<|end|>", true).unwrap(), [257, 258]);
    assert_eq!(tok.decode(&[257, 258], false).unwrap(), " hi<|end|>");
    assert_eq!(tok.decode(&[257, 258], true).unwrap(), " hi");
    assert_eq!(tok.stop_token_ids(), [258]);
    assert!(tok.warnings().is_empty());
}

fn expect_err(v: &GgufVocab) -> TokenizerError {
    match Tokenizer::from_gguf_vocab(v) {
        Ok(_) => panic!("built a tokenizer from a bad vocabulary"),
        Err(e) => e,
    }
}

#[test]
fn hostile_metadata_is_rejected() {
    let good = gpt2_vocab();

    let mut v = good.clone();
    v.model = "bert".into();
    assert!(matches!(expect_err(&v), TokenizerError::UnsupportedModel(m) if m == "bert"));

    let mut v = good.clone();
    v.pre = Some("who-knows".into());
    assert!(matches!(
        expect_err(&v),
        TokenizerError::UnknownPreTokenizer(_)
    ));

    let mut v = good.clone();
    v.merges = None;
    assert!(matches!(
        expect_err(&v),
        TokenizerError::MissingMetadata("tokenizer.ggml.merges")
    ));

    for (merge, reason) in [
        ("Ġ zz", "right part is not a token"),
        ("q! h", "left part is not a token"),
        ("nospace", "no space between the two parts"),
        ("a b", "merged result is not a token"),
        ("a ", "empty right part"),
    ] {
        let mut v = good.clone();
        v.merges.as_mut().unwrap().push(merge.into());
        match expect_err(&v) {
            TokenizerError::BadMerge {
                index,
                merge: m,
                reason: r,
            } => {
                assert_eq!((index, m.as_str(), r), (2, merge, reason));
            }
            other => panic!("{merge:?}: {other:?}"),
        }
    }

    let mut v = good.clone();
    v.eos_id = Some(259);
    assert!(matches!(
        expect_err(&v),
        TokenizerError::BadSpecialToken {
            key: "tokenizer.ggml.eos_token_id",
            id: 259,
            vocab_size: 259
        }
    ));

    let mut v = good.clone();
    v.add_bos = Some(true);
    assert!(matches!(
        expect_err(&v),
        TokenizerError::MissingMetadata("tokenizer.ggml.bos_token_id")
    ));

    let mut v = good.clone();
    v.tokens[5] = v.tokens[6].clone();
    assert!(matches!(expect_err(&v), TokenizerError::BadVocab(m) if m.contains("twice")));

    let mut v = good.clone();
    v.token_types.as_mut().unwrap().pop();
    assert!(matches!(expect_err(&v), TokenizerError::BadVocab(_)));

    let mut v = good.clone();
    v.tokens.push("x".repeat(1 << 20));
    v.token_types = None;
    assert!(matches!(expect_err(&v), TokenizerError::BadVocab(m) if m.contains("bytes long")));

    let v = GgufVocab {
        model: "gpt2".into(),
        merges: Some(vec![]),
        ..GgufVocab::default()
    };
    assert!(matches!(expect_err(&v), TokenizerError::BadVocab(_)));

    let v = GgufVocab {
        model: "gpt2".into(),
        tokens: vec![String::new(); MAX_VOCAB_SIZE + 1],
        ..GgufVocab::default()
    };
    assert!(matches!(
        expect_err(&v),
        TokenizerError::VocabTooLarge { .. }
    ));

    let mut v = spm_vocab();
    v.scores.as_mut().unwrap()[270] = f32::NAN;
    assert!(matches!(expect_err(&v), TokenizerError::BadVocab(m) if m.contains("non-finite")));

    let mut v = spm_vocab();
    v.scores = None;
    assert!(matches!(
        expect_err(&v),
        TokenizerError::MissingMetadata("tokenizer.ggml.scores")
    ));
}

#[test]
fn missing_pre_tokenizer_falls_back_with_a_warning() {
    let mut v = gpt2_vocab();
    v.pre = None;
    let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
    assert_eq!(tok.warnings().len(), 1);
    assert_eq!(tok.encode(" hi", false).unwrap(), [257]);
}

#[test]
fn broken_chat_template_is_a_warning_not_a_load_failure() {
    let mut v = gpt2_vocab();
    v.chat_template = Some("{% for %}".into());
    let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
    assert!(tok.chat_template().is_none());
    assert!(
        tok.warnings()[0].contains("chat template"),
        "{:?}",
        tok.warnings()
    );
}

#[test]
fn tiny_fixture_models_load() {
    // The committed tiny models have a bare 256-byte vocabulary and no merges.
    for name in ["llama", "mistral", "qwen2", "llama3-rope"] {
        let path = workspace_root().join(format!("tests/fixtures/tiny/{name}.gguf"));
        let tok = Tokenizer::from_gguf_path(&path).unwrap();
        assert_eq!(tok.vocab_size(), 256);
        let text = "Hi, 👋 ünïcode\n";
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(ids.len(), text.len());
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
        check_stream(&tok, &ids, false);
    }
}
