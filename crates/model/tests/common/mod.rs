//! Helpers shared by the Llama-family golden tests (`tiny_models.rs`, `hf_models.rs`,
//! `int4_models.rs`): reading reference logits, the error measure they are held to, and
//! running a model over one sequence — all positions (in prefill chunks) or greedily.
//! Each test binary uses a subset, hence `dead_code` is allowed.
#![allow(dead_code)]

use serde_json::Value;
use tokenmill_model::{KvCache, LlamaModel, LogitsWanted, SeqChunk, Workspace};
use tokenmill_testutil::argmax;

/// A JSON array of rows of numbers, flattened.
pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter())
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

/// The largest `|got − want| / (1 + |want|)`.
pub fn worst_rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0f32, f32::max)
}

/// All-position logits of `tokens` as one sequence, prefilled in chunks of `chunk` tokens
/// (KV blocks used out of order, on purpose).
pub fn logits_chunked(model: &LlamaModel, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut kv = KvCache::new(model.config(), 8, 4);
    let table: Vec<u32> = (0..8).rev().collect();
    let mut ws = Workspace::default();
    let mut out = Vec::new();
    for (i, part) in tokens.chunks(chunk).enumerate() {
        let c = SeqChunk {
            tokens: part,
            start_pos: i * chunk,
            block_table: &table,
            logits: LogitsWanted::All,
        };
        out.extend_from_slice(model.forward(&[c], &mut kv, &mut ws).unwrap());
    }
    out
}

/// All-position logits of `tokens` in one pass.
pub fn all_logits(model: &LlamaModel, tokens: &[u32]) -> Vec<f32> {
    logits_chunked(model, tokens, tokens.len())
}

/// The `n` tokens greedy decoding appends to `prompt`, one decode step per token.
pub fn greedy(model: &LlamaModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size;
    let mut kv = KvCache::new(model.config(), 8, 4);
    let table: Vec<u32> = (0..8).collect();
    let mut ws = Workspace::default();
    let mut tokens = prompt.to_vec();
    let mut start = 0;
    for _ in 0..n {
        let c = SeqChunk {
            tokens: &tokens[start..],
            start_pos: start,
            block_table: &table,
            logits: LogitsWanted::Last,
        };
        let next = argmax(&model.forward(&[c], &mut kv, &mut ws).unwrap()[..vocab]);
        start = tokens.len();
        tokens.push(next);
    }
    tokens.split_off(prompt.len())
}
