//! Helpers shared by the golden tests (`tiny_models.rs`, `hf_models.rs`, `int4_models.rs`,
//! `deepseek.rs`, `deepseek_gguf.rs`): reading reference logits, the error measure they are
//! held to, and running a model over one sequence — all positions (in prefill chunks) or
//! greedily.
//! Each test binary uses a subset, hence `dead_code` is allowed.
#![allow(dead_code)]

use serde_json::Value;
use tokenmill_model::deepseek::DeepSeekModel;
use tokenmill_model::{KvCache, KvDtype, LlamaModel, LogitsWanted, SeqChunk, Workspace};
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
/// (KV blocks used out of order, on purpose); `forward` runs one chunk and appends its
/// logits.
pub fn logits_chunked_by(
    tokens: &[u32],
    chunk: usize,
    mut forward: impl FnMut(SeqChunk<'_>, &mut Vec<f32>),
) -> Vec<f32> {
    let table: Vec<u32> = (0..8).rev().collect();
    let mut out = Vec::new();
    for (i, part) in tokens.chunks(chunk).enumerate() {
        let c = SeqChunk {
            tokens: part,
            start_pos: i * chunk,
            block_table: &table,
            logits: LogitsWanted::All,
        };
        forward(c, &mut out);
    }
    out
}

/// The `n` tokens greedy decoding appends to `prompt`, one decode step per token; `next`
/// runs one chunk and returns the argmax of its last logits.
pub fn greedy_by(prompt: &[u32], n: usize, mut next: impl FnMut(SeqChunk<'_>) -> u32) -> Vec<u32> {
    let table: Vec<u32> = (0..8).collect();
    let mut tokens = prompt.to_vec();
    let mut start = 0;
    for _ in 0..n {
        let c = SeqChunk {
            tokens: &tokens[start..],
            start_pos: start,
            block_table: &table,
            logits: LogitsWanted::Last,
        };
        let token = next(c);
        start = tokens.len();
        tokens.push(token);
    }
    tokens.split_off(prompt.len())
}

/// [`logits_chunked_by`] for a Llama-family model (8 KV blocks of 4 positions).
pub fn logits_chunked(model: &LlamaModel, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut kv = KvCache::new(model.config(), 8, 4);
    let mut ws = Workspace::default();
    logits_chunked_by(tokens, chunk, |c, out| {
        out.extend_from_slice(model.forward(&[c], &mut kv, &mut ws).unwrap())
    })
}

/// All-position logits of `tokens` in one pass.
pub fn all_logits(model: &LlamaModel, tokens: &[u32]) -> Vec<f32> {
    logits_chunked(model, tokens, tokens.len())
}

/// [`greedy_by`] for a Llama-family model.
pub fn greedy(model: &LlamaModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size;
    let mut kv = KvCache::new(model.config(), 8, 4);
    let mut ws = Workspace::default();
    greedy_by(prompt, n, |c| {
        argmax(&model.forward(&[c], &mut kv, &mut ws).unwrap()[..vocab])
    })
}

/// [`logits_chunked_by`] for a DeepSeek model (8 latent KV blocks of 4 positions).
pub fn deepseek_logits_chunked(model: &DeepSeekModel, tokens: &[u32], chunk: usize) -> Vec<f32> {
    deepseek_logits_chunked_kv(model, KvDtype::F32, tokens, chunk)
}

/// [`deepseek_logits_chunked`] over a latent cache of `dtype` rows.
pub fn deepseek_logits_chunked_kv(
    model: &DeepSeekModel,
    dtype: KvDtype,
    tokens: &[u32],
    chunk: usize,
) -> Vec<f32> {
    let mut kv = model.kv_cache_with_dtype(8, 4, dtype);
    let mut ws = Workspace::default();
    logits_chunked_by(tokens, chunk, |c, out| {
        out.extend_from_slice(model.forward(&[c], &mut kv, &mut ws).unwrap())
    })
}

/// [`greedy_by`] for a DeepSeek model.
pub fn deepseek_greedy(model: &DeepSeekModel, prompt: &[u32], n: usize) -> Vec<u32> {
    deepseek_greedy_kv(model, KvDtype::F32, prompt, n)
}

/// [`deepseek_greedy`] over a latent cache of `dtype` rows.
pub fn deepseek_greedy_kv(
    model: &DeepSeekModel,
    dtype: KvDtype,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let mut kv = model.kv_cache_with_dtype(8, 4, dtype);
    let mut ws = Workspace::default();
    greedy_by(prompt, n, |c| {
        argmax(model.forward(&[c], &mut kv, &mut ws).unwrap())
    })
}
