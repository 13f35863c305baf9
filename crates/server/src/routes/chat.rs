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
use serde_json::{Map, Value, json};

use super::common::{ChunkEnvelope, chat_logprobs, now_secs, response_id, usage};
use crate::error::ApiError;
use crate::generation::{self, GenerationRequest};
use crate::json::{Fields, JsonBody};
use crate::output::{StopReason, Update};
use crate::sampling::{self, Api, resolve_max_tokens};
use crate::sse::{drive, sse_frame, sse_response};
use crate::state::SharedState;

/// Most messages in one conversation.
const MAX_MESSAGES: usize = 4096;

/// Checks and normalises `messages` for the template: content parts joined into strings.
pub fn parse_messages(v: Option<&Value>) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("messages", msg);
    let Some(Value::Array(msgs)) = v else {
        return Err(bad("`messages` must be a non-empty array".into()));
    };
    if msgs.is_empty() || msgs.len() > MAX_MESSAGES {
        return Err(bad(format!(
            "`messages` must hold between 1 and {MAX_MESSAGES} messages"
        )));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(bad(format!("messages[{i}] must be an object")));
        };
        if !matches!(m.get("role"), Some(Value::String(_))) {
            return Err(bad(format!("messages[{i}].role must be a string")));
        }
        let mut m = m.clone();
        let content = match m.get("content") {
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                        _ => {
                            return Err(bad(format!(
                                "messages[{i}].content: only text parts are supported"
                            )));
                        }
                    }
                }
                Value::String(texts.join("\n"))
            }
            Some(_) => {
                return Err(bad(format!(
                    "messages[{i}].content must be a string or an array of parts"
                )));
            }
        };
        m.insert("content".into(), content);
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

/// The template variables beyond `messages`: `tools`, `chat_template_kwargs`.
fn template_extra(f: &Fields) -> Result<Map<String, Value>, ApiError> {
    let mut extra = Map::new();
    match f.get("chat_template_kwargs") {
        None => {}
        Some(Value::Object(kw)) => extra.extend(kw.clone()),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "chat_template_kwargs",
                "`chat_template_kwargs` must be an object",
            ));
        }
    }
    match f.get("tools") {
        None => {}
        Some(t @ Value::Array(_)) => {
            extra.insert("tools".into(), t.clone());
        }
        Some(_) => {
            return Err(ApiError::invalid_param("tools", "`tools` must be an array"));
        }
    }
    Ok(extra)
}

/// Renders the conversation to prompt text (on the tokenizer pool or the remote service).
pub async fn render_prompt(state: &SharedState, f: &Fields) -> Result<String, ApiError> {
    let messages = parse_messages(f.get("messages"))?;
    let continue_final = f.bool_or("continue_final_message", false)?;
    let add_generation_prompt = f.bool_or("add_generation_prompt", !continue_final)?;
    if continue_final && add_generation_prompt {
        return Err(ApiError::invalid_param(
            "continue_final_message",
            "continue_final_message and add_generation_prompt cannot both be true",
        ));
    }
    let extra = template_extra(f)?;
    let last = messages
        .as_array()
        .and_then(|a| a.last())
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut text = state
        .pool
        .render_chat(messages, add_generation_prompt, extra)
        .await?;
    if continue_final && !last.is_empty() {
        let Some(pos) = text.rfind(&last) else {
            return Err(ApiError::invalid_param(
                "continue_final_message",
                "the final message does not appear in the rendered conversation",
            ));
        };
        text.truncate(pos + last.len());
    }
    Ok(text)
}

pub async fn chat_completions(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    state.check_model(f.str("model")?)?;
    let tok = state.pool.tokenizer().clone();
    let s = sampling::parse(&f, Api::Chat, &tok)?;
    if let Some(rf) = f.get("response_format")
        && rf.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::invalid_param(
            "response_format",
            "only response_format {\"type\": \"text\"} is supported",
        ));
    }
    state.admission.precheck(s.n, &state.metrics)?;
    let text = render_prompt(&state, &f).await?;
    let add_special_tokens = f.bool_or("add_special_tokens", false)?;
    let prompt = state
        .pool
        .encode(text, add_special_tokens, "messages")
        .await?;
    let cfg = state.engine.config();
    let max_tokens = resolve_max_tokens(
        s.max_tokens,
        prompt.len(),
        cfg.max_model_len,
        cfg.block_size,
        cfg.num_blocks,
        "messages",
    )?;
    let prompt_tokens = prompt.len();
    let want_logprobs = s.params.sampling.logprobs.is_some();
    let running = generation::submit(
        &state,
        GenerationRequest {
            prompts: vec![prompt],
            max_tokens: vec![max_tokens],
            n: s.n,
            params: s.params.clone(),
            output: s.output.clone(),
        },
    )?;
    let id = response_id("chatcmpl");
    let model = state.model_name().to_string();
    let created = now_secs();
    if s.stream {
        let fmt = ChatChunks {
            env: ChunkEnvelope {
                id,
                object: "chat.completion.chunk",
                created,
                model,
                include_usage: s.include_usage,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_normalised_and_checked() {
        let m = parse_messages(Some(&json!([
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "name": "x"},
        ])))
        .unwrap();
        assert_eq!(m[0]["content"], "a\nb");
        assert_eq!(m[1]["name"], "x");
        for bad in [
            json!([]),
            json!("hi"),
            json!([{"content": "x"}]),
            json!([{"role": 1, "content": "x"}]),
            json!([{"role": "user", "content": 5}]),
            json!([{"role": "user", "content": [{"type": "image_url"}]}]),
            json!([3]),
        ] {
            let e = parse_messages(Some(&bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("messages"), "{bad}");
        }
    }
}
