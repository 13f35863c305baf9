//! `POST /v1/chat/completions`: messages rendered with the model's chat template (on the
//! tokenizer pool, fuel-bounded), then generated like a completion.
//!
//! Message `content` may be a string, `null`, or a list of `{"type": "text"}` parts (joined
//! with newlines, as vLLM does); other part types are rejected. `tools` and
//! `chat_template_kwargs` become template variables. `continue_final_message` renders
//! without the generation prompt and cuts the text right after the last message's content,
//! so the model continues it. Streaming sends a role chunk per choice first, then content
//! deltas, the finish reason with the last delta, the usage chunk if asked for, `[DONE]`.
//!
//! With `tools` (and `tool_choice` other than `none`) the reply's calls are read out of the
//! text ([`crate::tools::parser`]): the message carries `tool_calls` and the finish reason
//! is `tool_calls`; streamed, each call comes as a delta with its id and name, then deltas
//! of its `arguments` as they are generated.

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
use crate::output::{Finish, StopReason, Update};
use crate::sse::{drive, sse_frame, sse_response};
use crate::state::SharedState;
use crate::tools::parser::{CallStream, Piece, ToolCall, parse_reply};
use crate::validation::{Api, ToolCalls, validate};
use tokenmill_engine::FinishReason;

pub async fn chat_completions(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    let v = validate(&state, &f, Api::Chat).await?;
    let prompt_tokens = v.prompt_tokens();
    let want_logprobs = v.wants_logprobs();
    let (stream_out, include_usage) = (v.stream, v.include_usage);
    let tool_calls = v.tool_calls.clone();
    let running = generation::submit(&state, v.generation)?;
    let id = response_id("chatcmpl");
    let model = state.model_name().to_string();
    let created = now_secs();
    if stream_out {
        let mut fmt = ChatChunks {
            calls: (0..running.len())
                .map(|_| tool_calls.as_ref().map(ToolCalls::stream))
                .collect(),
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
            let (content, calls) = match &tool_calls {
                Some(t) => parse_reply(t.format, t.names.clone(), &r.text),
                None => (Some(r.text), Vec::new()),
            };
            let calls_json: Vec<Value> = calls.iter().map(call_json).collect();
            json!({
                "index": i,
                "message": {"role": "assistant", "content": content, "tool_calls": calls_json},
                "logprobs": want_logprobs.then(|| chat_logprobs(&r.logprobs)),
                "finish_reason": finish.map(|f| finish_reason(f, !calls.is_empty())),
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

/// OpenAI's finish reason, `tool_calls` when a reply that stopped by itself made calls.
fn finish_reason(f: &Finish, made_calls: bool) -> &'static str {
    if made_calls && f.reason == FinishReason::Stop {
        "tool_calls"
    } else {
        f.as_str()
    }
}

fn call_json(c: &ToolCall) -> Value {
    json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

struct ChatChunks {
    env: ChunkEnvelope,
    want_logprobs: bool,
    /// Per choice, the tool-call reader (with tools).
    calls: Vec<Option<CallStream>>,
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

    fn format(&mut self, i: usize, up: Update) -> Vec<Bytes> {
        if let Some(e) = up.error {
            return vec![sse_frame(&e.body())];
        }
        self.env.count_tokens(up.token_ids.len());
        let finish = up.finish.as_ref();
        let deltas: Vec<Value> = match self.calls.get_mut(i).and_then(Option::as_mut) {
            Some(reader) => {
                let mut pieces = reader.push(&up.text);
                if finish.is_some() {
                    pieces.extend(reader.finish());
                }
                pieces.into_iter().map(piece_delta).collect()
            }
            None if up.text.is_empty() => Vec::new(),
            None => vec![json!({"content": up.text})],
        };
        if deltas.is_empty() && up.logprobs.is_empty() && finish.is_none() {
            return Vec::new();
        }
        let made_calls = self
            .calls
            .get(i)
            .and_then(Option::as_ref)
            .is_some_and(|r| r.num_calls() > 0);
        let n = deltas.len().max(1);
        let mut deltas = deltas.into_iter();
        (0..n)
            .map(|k| {
                let last = k + 1 == n;
                let choice = json!({
                    "index": i,
                    "delta": deltas.next().unwrap_or_else(|| json!({})),
                    "logprobs": (self.want_logprobs && k == 0).then(|| chat_logprobs(&up.logprobs)),
                    "finish_reason": finish.filter(|_| last).map(|f| finish_reason(f, made_calls)),
                    "stop_reason": StopReason::to_json(
                        &finish.filter(|_| last).and_then(|f| f.stop_reason.clone())
                    ),
                });
                sse_frame(&self.env.chunk(json!([choice])))
            })
            .collect()
    }
}

/// The delta of one streamed piece.
fn piece_delta(p: Piece) -> Value {
    match p {
        Piece::Content(text) => json!({"content": text}),
        Piece::CallStart { index, id, name } => json!({"tool_calls": [{
            "index": index,
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }]}),
        Piece::Arguments { index, delta } => json!({"tool_calls": [{
            "index": index,
            "function": {"arguments": delta},
        }]}),
    }
}
