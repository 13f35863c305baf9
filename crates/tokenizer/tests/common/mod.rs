//! Shared helpers for the tokenizer's integration tests: the default model and the HF fixtures.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use tokenmill_tokenizer::gguf_vocab::token_type as tt;
use tokenmill_tokenizer::{GgufVocab, Tokenizer};

pub use tokenmill_testutil::{model_path, workspace_root};

/// The SmolLM2 tokenizer, built once per test binary.
pub fn smollm2() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        Arc::new(Tokenizer::from_gguf_path(model_path()).expect("loading the SmolLM2 tokenizer"))
    })
    .clone()
}

pub fn fixture(name: &str) -> serde_json::Value {
    let path = workspace_root().join("tests/fixtures/smollm2").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

pub fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an id array")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Streams `ids` through a fresh decoder; returns every push's output and the flush.
pub fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> (Vec<String>, String) {
    let mut dec = tok.decoder_with(skip_special);
    let pushes = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
    let tail = dec.flush(tok).unwrap();
    (pushes, tail)
}

/// Checks the streaming contract on `ids`: the concatenation equals `decode`, and after every
/// push the text so far is exactly the decoded prefix minus an incomplete trailing character.
pub fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) {
    let (pushes, tail) = stream(tok, ids, skip_special);
    let full = tok.decode(ids, skip_special).unwrap();
    assert_eq!(
        pushes.concat() + &tail,
        full,
        "stream != decode for {ids:?}"
    );
    let mut dec = tok.decoder_with(skip_special);
    let mut so_far = String::new();
    for (k, &id) in ids.iter().enumerate() {
        so_far.push_str(&dec.push(tok, id).unwrap());
        let mut probe = dec.clone();
        let rest = probe.flush(tok).unwrap();
        assert_eq!(
            so_far.clone() + &rest,
            tok.decode(&ids[..=k], skip_special).unwrap(),
            "prefix {k} of {ids:?}"
        );
        // Only an incomplete character may be held back.
        assert!(
            rest.chars().count() <= 1,
            "held back {rest:?} after prefix {k} of {ids:?}"
        );
    }
}

/// A small deterministic PRNG (xorshift64*), so tests need no `rand`.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A byte-level vocabulary: the 256 GPT-2 byte characters, `Ġh`, `Ġhi` (two merges) and the
/// control token `<|end|>` (EOS, id 258).
pub fn gpt2_vocab() -> GgufVocab {
    // Byte-level: all 256 byte characters, a few merges, one control token.
    let table: Vec<char> = {
        let mut printable: Vec<u32> = (0x21..=0x7e)
            .chain(0xa1..=0xac)
            .chain(0xae..=0xff)
            .collect();
        let mut n = 0;
        let mut map = vec!['\0'; 256];
        for b in 0..256u32 {
            if let Some(pos) = printable.iter().position(|&p| p == b) {
                map[b as usize] = char::from_u32(printable[pos]).unwrap();
            } else {
                map[b as usize] = char::from_u32(256 + n).unwrap();
                n += 1;
            }
        }
        printable.clear();
        map
    };
    let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
    tokens.extend(["Ġh", "Ġhi", "<|end|>"].map(String::from));
    let mut types = vec![tt::NORMAL; tokens.len()];
    *types.last_mut().unwrap() = tt::CONTROL;
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types: Some(types),
        merges: Some(vec!["Ġ h".into(), "Ġh i".into()]),
        eos_id: Some(258),
        ..GgufVocab::default()
    }
}
