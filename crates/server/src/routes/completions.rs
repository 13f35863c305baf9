//! `POST /v1/completions`: OpenAI's legacy completions, with vLLM's extensions.
//!
//! Prompts may be a string, strings, token ids or lists of token ids; each gets `n` choices
//! (index `prompt * n + j`). `echo` prepends the prompt text and, with `logprobs`, the prompt
//! tokens' logprobs (the first prompt token's is `null`, nothing predicts it). Streaming
//! sends one `text_completion` chunk per update and, with `stream_options.include_usage`, a
//! final chunk with no choices and the usage, then `[DONE]`.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::common::{ChunkEnvelope, completion_logprobs, now_secs, response_id, usage};
use crate::error::ApiError;
use crate::generation;
use crate::json::JsonBody;
use crate::output::{StopReason, TokenLogprob, Update};
use crate::sse::{drive, sse_frame, sse_response};
use crate::state::SharedState;
use crate::validation::{Api, PromptInput, validate};

/// What `echo` prepends to one prompt's choices.
#[derive(Clone, Debug, Default)]
struct Echo {
    text: String,
    /// The first prompt token (no logprob), when logprobs are asked for.
    first: Option<TokenLogprob>,
}

pub async fn completions(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    let v = validate(&state, &f, Api::Completions).await?;
    let want_logprobs = v.wants_logprobs();
    let echoes = if v.echo {
        echo_info(&state, &v.inputs, &v.generation.prompts, want_logprobs).await?
    } else {
        Vec::new()
    };
    let prompt_tokens = v.prompt_tokens();
    let n = v.generation.n;
    let running = generation::submit(&state, v.generation)?;
    let id = response_id("cmpl");
    let model = state.model_name().to_string();
    let created = now_secs();
    if v.stream {
        let mut fmt = ChunkFormatter {
            env: ChunkEnvelope {
                id,
                object: "text_completion",
                created,
                model,
                include_usage: v.include_usage,
                completion_tokens: Arc::new(AtomicUsize::new(0)),
            },
            n,
            echoes,
            want_logprobs,
            echo_sent: vec![false; running.len()],
            offsets: vec![0; running.len()],
        };
        let tail = fmt.env.tail(prompt_tokens);
        let body = drive(running.into_stream(), move |i, up| fmt.format(i, up), tail);
        return Ok(sse_response(body));
    }
    let results = running.collect().await?;
    let mut completion_tokens = 0;
    let choices: Vec<Value> = results
        .into_iter()
        .enumerate()
        .map(|(k, r)| {
            completion_tokens += r.token_ids.len();
            let e = echoes.get(k / n).cloned().unwrap_or_default();
            let logprobs = want_logprobs.then(|| {
                let entries: Vec<TokenLogprob> = e
                    .first
                    .into_iter()
                    .chain(r.prompt_logprobs)
                    .chain(r.logprobs)
                    .collect();
                completion_logprobs(&entries, &mut 0)
            });
            let finish = r.finish.as_ref();
            json!({
                "index": k,
                "text": e.text + &r.text,
                "logprobs": logprobs,
                "finish_reason": finish.map(|f| f.as_str()),
                "stop_reason": StopReason::to_json(&finish.and_then(|f| f.stop_reason.clone())),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

/// Echo texts (the client's string, or the ids decoded) on the tokenizer pool.
async fn echo_info(
    state: &SharedState,
    inputs: &[PromptInput],
    prompts: &[Vec<u32>],
    want_logprobs: bool,
) -> Result<Vec<Echo>, ApiError> {
    let inputs = inputs.to_vec();
    let prompts = prompts.to_vec();
    state
        .pool
        .run(move |tok| {
            inputs
                .into_iter()
                .zip(prompts)
                .map(|(input, ids)| Echo {
                    text: match input {
                        PromptInput::Text(t) => t,
                        PromptInput::Ids(_) => tok.decode(&ids, false).unwrap_or_default(),
                    },
                    first: ids
                        .first()
                        .filter(|_| want_logprobs)
                        .map(|&id| TokenLogprob::without_logprob(tok, id)),
                })
                .collect()
        })
        .await
}

/// Formats streaming chunks; one per request.
struct ChunkFormatter {
    env: ChunkEnvelope,
    n: usize,
    echoes: Vec<Echo>,
    want_logprobs: bool,
    echo_sent: Vec<bool>,
    /// Text offset (characters) per choice, for `text_offset`.
    offsets: Vec<usize>,
}

impl ChunkFormatter {
    fn format(&mut self, i: usize, up: Update) -> Vec<bytes::Bytes> {
        if let Some(e) = up.error {
            return vec![sse_frame(&e.body())];
        }
        self.env.count_tokens(up.token_ids.len());
        let mut text = String::new();
        let mut entries = Vec::new();
        if let Some(e) = self.echoes.get(i / self.n)
            && !self.echo_sent[i]
        {
            self.echo_sent[i] = true;
            text.push_str(&e.text);
            entries.extend(e.first.clone());
        }
        text.push_str(&up.text);
        entries.extend(up.prompt_logprobs);
        entries.extend(up.logprobs);
        if text.is_empty() && entries.is_empty() && up.finish.is_none() {
            return Vec::new();
        }
        let logprobs = self
            .want_logprobs
            .then(|| completion_logprobs(&entries, &mut self.offsets[i]));
        let finish = up.finish.as_ref();
        let choice = json!({
            "index": i,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish.map(|f| f.as_str()),
            "stop_reason": StopReason::to_json(&finish.and_then(|f| f.stop_reason.clone())),
        });
        vec![sse_frame(&self.env.chunk(json!([choice])))]
    }
}
