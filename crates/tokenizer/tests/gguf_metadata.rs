//! GGUF metadata extraction ([`GgufVocab::from_metadata`]) on hand-written GGUF files: a
//! complete byte-level vocabulary loads; missing or mistyped keys are typed errors.

mod common;

use common::gpt2_vocab;
use tokenmill_tokenizer::{Tokenizer, TokenizerError};

/// A minimal GGUF writer (v3, no tensors) for metadata tests.
mod gguf_writer {
    pub enum V<'a> {
        Str(&'a str),
        U32(u32),
        I32(i32),
        F32(f32),
        Bool(bool),
        StrArr(Vec<String>),
        I32Arr(Vec<i32>),
        F32Arr(Vec<f32>),
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    pub fn write(kvs: &[(&str, V<'_>)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (k, v) in kvs {
            string(&mut out, k);
            match v {
                V::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    string(&mut out, s);
                }
                V::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                V::I32(x) => {
                    out.extend(5u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                V::F32(x) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                V::Bool(b) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(u8::from(*b));
                }
                V::StrArr(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    for s in a {
                        string(&mut out, s);
                    }
                }
                V::I32Arr(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| out.extend(x.to_le_bytes()));
                }
                V::F32Arr(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(6u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| out.extend(x.to_le_bytes()));
                }
            }
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out
    }
}

#[test]
fn gguf_metadata_extraction() {
    use gguf_writer::{V, write};
    let v = gpt2_vocab();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let base = |extra: Vec<(&'static str, V<'static>)>, skip: &str| {
        let mut kvs: Vec<(&str, V<'_>)> = vec![
            ("general.architecture", V::Str("llama")),
            ("tokenizer.ggml.model", V::Str("gpt2")),
            ("tokenizer.ggml.pre", V::Str("gpt-2")),
            ("tokenizer.ggml.tokens", V::StrArr(v.tokens.clone())),
            (
                "tokenizer.ggml.token_type",
                V::I32Arr(v.token_types.clone().unwrap()),
            ),
            (
                "tokenizer.ggml.merges",
                V::StrArr(v.merges.clone().unwrap()),
            ),
            ("tokenizer.ggml.eos_token_id", V::U32(258)),
            ("tokenizer.ggml.add_bos_token", V::Bool(false)),
            (
                "tokenizer.chat_template",
                V::Str("{{ messages[0].content }}"),
            ),
        ];
        kvs.retain(|(k, _)| *k != skip && !extra.iter().any(|(e, _)| e == k));
        kvs.extend(extra);
        write(&kvs)
    };

    std::fs::write(&path, base(vec![], "")).unwrap();
    let tok = Tokenizer::from_gguf_path(&path).unwrap();
    assert_eq!(tok.encode(" hi<|end|>", false).unwrap(), [257, 258]);
    assert_eq!(tok.eos_token_id(), Some(258));
    let msgs = [tokenmill_tokenizer::ChatMessage::new("user", "x")];
    assert_eq!(
        tok.chat_template().unwrap().render(&msgs, false).unwrap(),
        "x"
    );

    type Case = (
        Vec<(&'static str, V<'static>)>,
        &'static str,
        fn(&TokenizerError) -> bool,
    );
    let cases: Vec<Case> = vec![
        (vec![], "tokenizer.ggml.model", |e| {
            matches!(e, TokenizerError::MissingMetadata("tokenizer.ggml.model"))
        }),
        (vec![], "tokenizer.ggml.tokens", |e| {
            matches!(e, TokenizerError::MissingMetadata("tokenizer.ggml.tokens"))
        }),
        (
            vec![("tokenizer.ggml.tokens", V::I32Arr(vec![1, 2]))],
            "",
            |e| {
                matches!(
                    e,
                    TokenizerError::BadMetadataType {
                        key: "tokenizer.ggml.tokens",
                        ..
                    }
                )
            },
        ),
        (vec![("tokenizer.ggml.model", V::U32(2))], "", |e| {
            matches!(
                e,
                TokenizerError::BadMetadataType {
                    key: "tokenizer.ggml.model",
                    ..
                }
            )
        }),
        (
            vec![("tokenizer.ggml.eos_token_id", V::F32(2.0))],
            "",
            |e| {
                matches!(
                    e,
                    TokenizerError::BadMetadataType {
                        key: "tokenizer.ggml.eos_token_id",
                        ..
                    }
                )
            },
        ),
        (vec![("tokenizer.ggml.bos_token_id", V::I32(-1))], "", |e| {
            matches!(
                e,
                TokenizerError::BadSpecialToken {
                    key: "tokenizer.ggml.bos_token_id",
                    ..
                }
            )
        }),
        (
            vec![("tokenizer.ggml.bos_token_id", V::U32(1 << 30))],
            "",
            |e| {
                matches!(
                    e,
                    TokenizerError::BadSpecialToken {
                        key: "tokenizer.ggml.bos_token_id",
                        ..
                    }
                )
            },
        ),
        (vec![("tokenizer.ggml.add_bos_token", V::U32(1))], "", |e| {
            matches!(
                e,
                TokenizerError::BadMetadataType {
                    key: "tokenizer.ggml.add_bos_token",
                    ..
                }
            )
        }),
        (
            vec![("tokenizer.ggml.token_type", V::I32Arr(vec![1; 3]))],
            "",
            |e| matches!(e, TokenizerError::BadVocab(_)),
        ),
        (
            vec![("tokenizer.ggml.scores", V::F32Arr(vec![0.0; 7]))],
            "",
            |e| matches!(e, TokenizerError::BadVocab(_)),
        ),
        (
            vec![("tokenizer.ggml.merges", V::StrArr(vec!["Ġ nope".into()]))],
            "",
            |e| matches!(e, TokenizerError::BadMerge { index: 0, .. }),
        ),
    ];
    for (i, (extra, skip, check)) in cases.into_iter().enumerate() {
        std::fs::write(&path, base(extra, skip)).unwrap();
        match Tokenizer::from_gguf_path(&path) {
            Err(e) => assert!(check(&e), "case {i}: {e:?}"),
            Ok(_) => panic!("case {i} loaded"),
        }
    }
}
