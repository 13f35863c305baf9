//! Fuzz target: a tokenizer built from a GGUF file's vocabulary metadata.
//!
//! The input is structured (`arbitrary`): a model name, pre-tokenizer, tokens drawn from a
//! small alphabet (so merges and special-token texts collide with real tokens), scores, token
//! types, merges made of token pairs, special ids, flags, a chat template and, sometimes, a
//! key of the wrong type. It is written as a GGUF file by `tokenmill_gguf::GgufWriter`, parsed
//! back by `GgufFile::from_bytes` and handed to `Tokenizer::from_gguf` (what `tokenmill serve`
//! runs), so every input gets past the parser. Property: `Ok` or a typed `Err`, never a
//! panic; a tokenizer that builds encodes and decodes text, keeps the streaming invariant
//! (`concat(push) + flush == decode`) on the encoded ids and on arbitrary in-vocabulary ids,
//! and refuses the id one past its vocabulary.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenmill_gguf::{Array, GgufFile, GgufWriter, Value};
use tokenmill_tokenizer::Tokenizer;

const PRE: &[&str] = &[
    "default",
    "gpt2",
    "smollm",
    "llama-bpe",
    "qwen2",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "falcon",
    "glm4",
    "tekken",
    "gpt-4o",
    "no-such-pre",
];

/// Pieces tokens are made of: byte-level and SentencePiece spellings, byte tokens, specials.
const ALPHABET: &[&str] = &[
    "a",
    "b",
    "c",
    "Ġ",
    "Ċ",
    "▁",
    "é",
    "ö",
    "😀",
    "<0x41>",
    "<0xC3>",
    "<0xA9>",
    "<0xF0>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<unk>",
    "1",
    "2",
    " ",
    "\n",
    "Ã",
    "©",
    "ðŁ",
    "<",
    ">",
    "|",
];

#[derive(Arbitrary, Debug)]
enum Tok {
    /// Concatenation of alphabet pieces.
    Pieces(Vec<u8>),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Merge {
    Pair(u16, u16),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    model: u8,
    pre: Option<u8>,
    tokens: Vec<Tok>,
    /// Scores: `None` absent; the vector is cut/padded to the token count unless `bad_len`.
    scores: Option<Vec<i16>>,
    types: Option<Vec<u8>>,
    bad_len: bool,
    merges: Option<Vec<Merge>>,
    ids: [Option<u16>; 6],
    flags: [Option<bool>; 3],
    chat_template: Option<String>,
    /// Replaces one tokenizer key with a value of another type.
    wrong_type: Option<(u8, u8)>,
    text: String,
    extra_ids: Vec<u16>,
}

const ID_KEYS: [&str; 6] = [
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
];
const FLAG_KEYS: [&str; 3] = [
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
];

fn token_text(t: &Tok) -> String {
    match t {
        Tok::Pieces(p) => p
            .iter()
            .take(8)
            .map(|&i| ALPHABET[i as usize % ALPHABET.len()])
            .collect(),
        Tok::Raw(s) => s.chars().take(64).collect(),
    }
}

fn fit<T: Clone>(v: &[T], n: usize, fill: T, exact: bool) -> Vec<T> {
    if !exact {
        return v.to_vec();
    }
    let mut out: Vec<T> = v.iter().take(n).cloned().collect();
    out.resize(n, fill);
    out
}

fn metadata(inp: &Input) -> Vec<(String, Value)> {
    let tokens: Vec<String> = inp.tokens.iter().take(512).map(token_text).collect();
    let n = tokens.len();
    let mut md: Vec<(String, Value)> = Vec::new();
    let model = match inp.model % 8 {
        0..=3 => "gpt2".to_string(),
        4..=6 => "llama".to_string(),
        _ => "bert".to_string(),
    };
    md.push(("tokenizer.ggml.model".into(), Value::String(model)));
    if let Some(p) = inp.pre {
        let name = PRE[p as usize % PRE.len()];
        md.push(("tokenizer.ggml.pre".into(), Value::String(name.into())));
    }
    if let Some(s) = &inp.scores {
        let s: Vec<f32> = s.iter().map(|&x| f32::from(x) / 16.0).collect();
        md.push((
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(fit(&s, n, 0.0, !inp.bad_len))),
        ));
    }
    if let Some(t) = &inp.types {
        let t: Vec<i32> = t.iter().map(|&x| i32::from(x % 8)).collect();
        md.push((
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(fit(&t, n, 1, !inp.bad_len))),
        ));
    }
    if let Some(m) = &inp.merges {
        let merges = m
            .iter()
            .take(1024)
            .map(|m| match m {
                Merge::Pair(a, b) if n > 0 => format!(
                    "{} {}",
                    tokens[*a as usize % n].replace(' ', "Ġ"),
                    tokens[*b as usize % n].replace(' ', "Ġ")
                ),
                Merge::Pair(..) => String::new(),
                Merge::Raw(s) => s.chars().take(64).collect(),
            })
            .collect();
        md.push((
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(merges)),
        ));
    }
    md.push((
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::String(tokens)),
    ));
    for (key, id) in ID_KEYS.iter().zip(inp.ids) {
        if let Some(id) = id {
            // Mostly in range; sometimes just past it or far out.
            let v = match id % 16 {
                15 => u32::from(id),
                14 => n as u32,
                _ => u32::from(id) % (n as u32).max(1),
            };
            md.push((key.to_string(), Value::U32(v)));
        }
    }
    for (key, flag) in FLAG_KEYS.iter().zip(inp.flags) {
        if let Some(b) = flag {
            md.push((key.to_string(), Value::Bool(b)));
        }
    }
    if let Some(t) = &inp.chat_template {
        md.push(("tokenizer.chat_template".into(), Value::String(t.clone())));
    }
    if let Some((k, ty)) = inp.wrong_type {
        let i = k as usize % md.len();
        md[i].1 = match ty % 4 {
            0 => Value::U8(ty),
            1 => Value::String("x".into()),
            2 => Value::Array(Array::U32(vec![1, 2])),
            _ => Value::I64(-1),
        };
    }
    md
}

fn check_stream(tok: &Tokenizer, ids: &[u32]) {
    for skip in [false, true] {
        let Ok(text) = tok.decode(ids, skip) else {
            continue;
        };
        let mut d = tok.decoder_with(skip);
        let mut streamed = String::new();
        for &id in ids {
            streamed.push_str(&d.push(tok, id).expect("an id decode accepted"));
        }
        streamed.push_str(&d.flush(tok).expect("flush"));
        assert_eq!(streamed, text, "ids {ids:?}, skip {skip}");
    }
}

fuzz_target!(|inp: Input| {
    let md = metadata(&inp);
    let Ok(w) = GgufWriter::new(Vec::new(), &md, &[]) else {
        return;
    };
    let bytes = w.finish().expect("no tensors to write");
    let file = GgufFile::from_bytes(bytes).expect("the writer's output parses");
    let Ok(tok) = Tokenizer::from_gguf(&file) else {
        return;
    };
    let n = tok.vocab_size();
    assert!(n > 0 || inp.tokens.is_empty());
    let text: String = inp.text.chars().take(256).collect();
    for add in [false, true] {
        if let Ok(ids) = tok.encode(&text, add) {
            assert!(ids.iter().all(|&id| (id as usize) < n), "{ids:?} vocab {n}");
            check_stream(&tok, &ids);
        }
    }
    if n > 0 {
        let ids: Vec<u32> = inp
            .extra_ids
            .iter()
            .take(64)
            .map(|&i| u32::from(i) % n as u32)
            .collect();
        assert!(tok.decode(&ids, false).is_ok(), "in-vocabulary ids {ids:?}");
        check_stream(&tok, &ids);
    }
    assert!(tok.decode(&[n as u32], false).is_err());
    if let Some(t) = tok.chat_template() {
        let t = t.clone().with_limits(100_000, 1 << 20);
        let _ = t.render(
            &[tokenmill_tokenizer::ChatMessage::new("user", &text)],
            true,
        );
    }
});
