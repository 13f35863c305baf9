//! `POST /v1/chat/completions`: messages rendered with the model's chat template (on the
//! tokenizer pool, fuel-bounded), then generated like a completion.
//!
//! Message `content` may be a string, `null`, or a list of `{"type": "text"}` parts (joined
//! with newlines, as vLLM does); other part types are rejected. `tools` and
//! `chat_template_kwargs` become template variables. `continue_final_message` renders
//! without the generation prompt and cuts the text right after the last message's content,
//! so the model continues it. Streaming sends a role chunk per choice first, then content
//! deltas, the finish reason with the last delta, the usage chunk if asked for, `[DONE]`.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use serde_json::{Value, json};

use super::common::{ChunkEnvelope, chat_logprobs, now_secs, response_id, usage};
use crate::error::ApiError;
use crate::generation;
use crate::json::JsonBody;
use crate::output::{StopReason, Update};
use crate::sse::{drive, sse_frame, sse_response};
use crate::state::SharedState;
use crate::validation::{Api, validate};

pub async fn chat_completions(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    let v = validate(&state, &f, Api::Chat).await?;
    let prompt_tokens = v.prompt_tokens();
    let want_logprobs = v.wants_logprobs();
    let (stream_out, include_usage) = (v.stream, v.include_usage);
    let running = generation::submit(&state, v.generation)?;
    let id = response_id("chatcmpl");
    let model = state.model_name().to_string();
    let created = now_secs();
    if stream_out {
        let fmt = ChatChunks {
            env: ChunkEnvelope {
                id,
                object: "chat.completion.chunk",
                created,
                model,
                include_usage,
                completion_tokens: Arc::new(AtomicUsize::new(0)),
            },
            want_logprobs,
        };
        let roles: Vec<Bytes> = (0..running.len()).map(|i| fmt.role_frame(i)).collect();
        let tail = fmt.env.tail(prompt_tokens);
        let body = drive(running.into_stream(), move |i, up| fmt.format(i, up), tail);
        return Ok(sse_response(stream::iter(roles).chain(body).boxed()));
    }
    let results = running.collect().await?;
    let completion_tokens: usize = results.iter().map(|r| r.token_ids.len()).sum();
    let choices: Vec<Value> = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let finish = r.finish.as_ref();
            json!({
                "index": i,
                "message": {"role": "assistant", "content": r.text, "tool_calls": []},
                "logprobs": want_logprobs.then(|| chat_logprobs(&r.logprobs)),
                "finish_reason": finish.map(|f| f.as_str()),
                "stop_reason": StopReason::to_json(&finish.and_then(|f| f.stop_reason.clone())),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

struct ChatChunks {
    env: ChunkEnvelope,
    want_logprobs: bool,
}

impl ChatChunks {
    fn role_frame(&self, i: usize) -> Bytes {
        sse_frame(&self.env.chunk(json!([{
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": null,
            "finish_reason": null,
        }])))
    }

    fn format(&self, i: usize, up: Update) -> Vec<Bytes> {
        if let Some(e) = up.error {
            return vec![sse_frame(&e.body())];
        }
        self.env.count_tokens(up.token_ids.len());
        if up.text.is_empty() && up.logprobs.is_empty() && up.finish.is_none() {
            return Vec::new();
        }
        let finish = up.finish.as_ref();
        let delta = if up.text.is_empty() && finish.is_some() {
            json!({})
        } else {
            json!({"content": up.text})
        };
        let choice = json!({
            "index": i,
            "delta": delta,
            "logprobs": self.want_logprobs.then(|| chat_logprobs(&up.logprobs)),
            "finish_reason": finish.map(|f| f.as_str()),
            "stop_reason": StopReason::to_json(&finish.and_then(|f| f.stop_reason.clone())),
        });
        vec![sse_frame(&self.env.chunk(json!([choice])))]
    }
}
