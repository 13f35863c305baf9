//! Pieces the generation routes share: prompt parsing and tokenization, response ids,
//! usage, and the two logprob formats (completions' parallel arrays, chat's list).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::output::{Candidate, TokenLogprob};
use crate::sse::{sse_done, sse_frame};

/// A fresh response id: `{prefix}-{32 hex digits}`.
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// Completions' logprobs: `{tokens, token_logprobs, top_logprobs, text_offset}`; offsets
/// continue from `offset` (characters), which is advanced.
pub fn completion_logprobs(entries: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut tokens = Vec::with_capacity(entries.len());
    let mut token_logprobs = Vec::with_capacity(entries.len());
    let mut top_logprobs = Vec::with_capacity(entries.len());
    let mut text_offset = Vec::with_capacity(entries.len());
    for e in entries {
        tokens.push(Value::from(e.chosen.text.clone()));
        text_offset.push(Value::from(*offset));
        *offset += e.chosen.text.chars().count();
        if !e.has_logprob {
            token_logprobs.push(Value::Null);
            top_logprobs.push(Value::Null);
            continue;
        }
        token_logprobs.push(json!(e.chosen.logprob));
        // vLLM's convention: the top-N plus the chosen token.
        let mut top: BTreeMap<String, f32> = BTreeMap::new();
        for c in e.top.iter().chain(std::iter::once(&e.chosen)) {
            top.entry(c.text.clone()).or_insert(c.logprob);
        }
        let top: Map<String, Value> = top.into_iter().map(|(k, v)| (k, json!(v))).collect();
        top_logprobs.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    })
}

fn chat_candidate(c: &Candidate) -> Value {
    json!({"token": c.text, "logprob": c.logprob, "bytes": c.bytes})
}

/// Chat's logprobs: `{"content": [{token, logprob, bytes, top_logprobs: [...]}]}`.
pub fn chat_logprobs(entries: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = chat_candidate(&e.chosen);
            v["top_logprobs"] = Value::Array(e.top.iter().map(chat_candidate).collect());
            v
        })
        .collect();
    json!({ "content": content })
}

/// What every streamed chunk of one response shares (OpenAI's chunk envelope), and the
/// stream's closing frames.
pub struct ChunkEnvelope {
    pub id: String,
    /// `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    /// The client asked for a final usage chunk (`stream_options.include_usage`): content
    /// chunks then carry `"usage": null`.
    pub include_usage: bool,
    /// Tokens streamed so far, for the usage chunk.
    pub completion_tokens: Arc<AtomicUsize>,
}

impl ChunkEnvelope {
    /// A chunk carrying `choices`.
    pub fn chunk(&self, choices: Value) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// Counts `n` streamed tokens for the usage chunk.
    pub fn count_tokens(&self, n: usize) {
        self.completion_tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// The closing frames: the usage chunk (if asked for) and `[DONE]`.
    pub fn tail(&self, prompt_tokens: usize) -> impl FnOnce() -> Vec<Bytes> + use<> {
        let usage_chunk = self.include_usage.then(|| {
            let mut v = self.chunk(json!([]));
            v.as_object_mut().map(|o| o.remove("usage"));
            v
        });
        let completion_tokens = self.completion_tokens.clone();
        move || {
            let mut frames = Vec::new();
            if let Some(mut v) = usage_chunk {
                v["usage"] = usage(prompt_tokens, completion_tokens.load(Ordering::Relaxed));
                frames.push(sse_frame(&v));
            }
            frames.push(sse_done());
            frames
        }
    }
}
