//! Fuzz target: `Tokenizer::from_hf_json` (what `Tokenizer::from_hf_dir` runs on a Hugging
//! Face folder's `tokenizer.json` + `tokenizer_config.json`) on arbitrary bytes returns `Ok`
//! or a typed `Err`, never panics; a tokenizer it builds encodes and decodes a short text
//! without panicking, keeps the crate's streaming invariant
//! (`concat(decoder.push(id)) + flush == decode(ids)` wherever the decoder is prefix-stable on
//! those ids — the only case any streaming can be exact, see `detok.rs`), rejects an id past
//! the vocabulary, and renders its chat template (if any) to `Ok` or `Err`.
//!
//! Input: `tokenizer.json` bytes, optionally followed by a NUL byte and the
//! `tokenizer_config.json` bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmill_tokenizer::{ChatMessage, Tokenizer};

const TEXT: &str = "Hello wörld! <s> 12 345\n\t<|im_start|>user\u{1F600}";

fuzz_target!(|data: &[u8]| {
    let (tj, config) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let Ok(tj) = std::str::from_utf8(tj) else {
        return;
    };
    let config = match config.map(std::str::from_utf8) {
        Some(Err(_)) => return,
        Some(Ok(c)) => Some(c),
        None => None,
    };
    let Ok(tok) = Tokenizer::from_hf_json(tj, config) else {
        return;
    };
    let vocab = tok.vocab_size();
    for add_special in [false, true] {
        let Ok(ids) = tok.encode(TEXT, add_special) else {
            continue;
        };
        for skip in [false, true] {
            let Ok(text) = tok.decode(&ids, skip) else {
                continue;
            };
            let mut d = tok.decoder_with(skip);
            let mut streamed = String::new();
            for &id in &ids {
                streamed.push_str(&d.push(&tok, id).expect("an id encode produced decodes"));
            }
            streamed.push_str(&d.flush(&tok).expect("flush"));
            if prefix_stable(&tok, &ids, skip) {
                assert_eq!(streamed, text, "streamed text differs from decode({ids:?})");
            }
        }
        for &id in &ids {
            let _ = tok.token_to_piece(id);
            let _ = tok.token_bytes(id);
            let _ = tok.is_special(id);
        }
    }
    let past = u32::try_from(vocab).unwrap_or(u32::MAX);
    assert!(
        tok.decode(&[past], false).is_err(),
        "id {past} past the vocabulary decoded"
    );
    let _ = tok.token_to_piece(past);
    let _ = (tok.bos_token_id(), tok.eos_token_id(), tok.stop_token_ids());
    if let Some(t) = tok.chat_template() {
        let t = t.clone().with_limits(100_000, 1 << 20);
        let _ = t.render(&[ChatMessage::new("user", "hi")], true);
    }
});

/// Whether the text of every prefix of `ids` that does not end in U+FFFD (an incomplete
/// character) is a prefix of the text of every longer prefix.
fn prefix_stable(tok: &Tokenizer, ids: &[u32], skip: bool) -> bool {
    let texts: Vec<String> = (0..=ids.len())
        .map(|k| tok.decode(&ids[..k], skip).unwrap_or_default())
        .collect();
    texts.iter().enumerate().all(|(j, t)| {
        t.ends_with(char::REPLACEMENT_CHARACTER)
            || texts[j + 1..].iter().all(|l| l.starts_with(t.as_str()))
    })
}
