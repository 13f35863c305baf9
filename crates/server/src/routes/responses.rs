//! `POST /v1/responses` and `GET /v1/responses/{id}`: OpenAI's Responses API for text, over the
//! chat pipeline (the request becomes chat messages, validated and generated exactly as a
//! `/v1/chat/completions` request; one choice).
//!
//! - `input`: a string (one user message) or a list of messages (`{"role", "content"}`, with
//!   or without `"type": "message"`; content a string or `input_text`/`output_text` parts).
//! - `instructions`: a system message first (not carried over to the next turn, as OpenAI's).
//! - `previous_response_id`: the conversation of a stored response (its inputs and its reply)
//!   comes before this input. Responses are stored unless `"store": false`, in bounded memory
//!   ([`crate::response_store`]); an unknown id is a 400 naming the parameter.
//! - `max_output_tokens`, `temperature`, `top_p`, `metadata` (echoed), `stream`.
//! - Not supported yet (400): `tools`, and a `text.format` other than plain text.
//!
//! A reply cut by `max_output_tokens` has `"status": "incomplete"` with
//! `incomplete_details.reason = "max_output_tokens"`. Streaming sends the Responses events
//! (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`…, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, `response.completed`), each
//! with its `sequence_number`, as `event:` + `data:` SSE frames.

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use serde_json::{Map, Value, json};

use super::common::{now_secs, response_id};
use crate::error::ApiError;
use crate::generation;
use crate::json::{Fields, JsonBody};
use crate::output::Update;
use crate::response_store::Stored;
use crate::sse::sse_response;
use crate::state::SharedState;
use crate::validation::{Api, validate};
use tokenmill_engine::FinishReason;

pub async fn create(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    for unsupported in ["tools", "reasoning"] {
        if f.get(unsupported).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid_param(
                unsupported,
                format!("`{unsupported}` is not supported on /v1/responses yet"),
            ));
        }
    }
    if let Some(format) = f.get("text").and_then(|t| t.get("format"))
        && format.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::invalid_param(
            "text.format",
            "only `{\"type\": \"text\"}` is supported on /v1/responses yet",
        ));
    }
    let previous = match f.str("previous_response_id")? {
        Some(id) => Some(state.responses.get(id).ok_or_else(|| {
            ApiError::invalid_param(
                "previous_response_id",
                format!("Previous response with id '{id}' not found."),
            )
        })?),
        None => None,
    };
    let mut conversation: Vec<Value> = previous
        .as_ref()
        .map(|p| p.conversation.clone())
        .unwrap_or_default();
    conversation.extend(input_messages(f.get("input"))?);
    let instructions = f.str("instructions")?.map(str::to_owned);
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = &instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(conversation.iter().cloned());

    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("model", "model"),
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
    ] {
        if let Some(v) = f.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    let v = validate(&state, &Fields(chat), Api::Chat)
        .await
        .map_err(responses_param)?;
    let stream_out = v.stream;
    let head = Head {
        id: response_id("resp").replace('-', "_"),
        msg_id: response_id("msg").replace('-', "_"),
        created_at: now_secs(),
        model: state.model_name().to_string(),
        input_tokens: v.prompt_tokens(),
        request: echo_fields(&f),
        store: f.bool_or("store", true)?,
        conversation,
    };
    let running = generation::submit(&state, v.generation)?;
    if stream_out {
        let mut events = Events {
            head,
            state: state.clone(),
            seq: 0,
            text: String::new(),
            output_tokens: 0,
        };
        let start = events.start();
        let body = running
            .into_stream()
            .flat_map(move |(_, up)| stream::iter(events.update(up)))
            .boxed();
        return Ok(sse_response(stream::iter(start).chain(body).boxed()));
    }
    let mut results = running.collect().await?;
    let r = results
        .pop()
        .ok_or_else(|| ApiError::internal("no choice"))?;
    let cut = r
        .finish
        .as_ref()
        .is_some_and(|f| f.reason == FinishReason::Length);
    let response = head.response(
        &r.text,
        r.token_ids.len(),
        if cut { "incomplete" } else { "completed" },
    );
    head.store_into(&state, &r.text, &response);
    Ok(Json(response).into_response())
}

pub async fn retrieve(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state
        .responses
        .get(&id)
        .map(|s| Json(s.response))
        .ok_or_else(|| ApiError::not_found(format!("Response with id '{id}' not found.")))
}

/// A chat validation error, named by the Responses API's parameter (`max_output_tokens`,
/// `input`) rather than the chat one it was mapped to.
fn responses_param(mut e: ApiError) -> ApiError {
    e.param = e.param.map(|p| match p.as_str() {
        "max_tokens" => "max_output_tokens".to_string(),
        p if p.starts_with("messages") => "input".to_string(),
        _ => p.to_string(),
    });
    e.message = e.message.replace("`max_tokens`", "`max_output_tokens`");
    e
}

/// `input` as chat messages.
fn input_messages(input: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("input", m.to_string());
    match input {
        Some(Value::String(s)) => Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                if let Some(t) = item.get("type").and_then(Value::as_str)
                    && t != "message"
                {
                    return Err(bad(&format!("input items of type `{t}` are not supported")));
                }
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("every input message needs a `role`"))?;
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(bad(&format!("unknown role `{role}`")));
                }
                let role = if role == "developer" { "system" } else { role };
                let content = match item.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .map(|p| match p.get("type").and_then(Value::as_str) {
                            Some("input_text" | "output_text" | "text") => p
                                .get("text")
                                .and_then(Value::as_str)
                                .map(str::to_owned)
                                .ok_or_else(|| bad("a text part needs `text`")),
                            other => Err(bad(&format!(
                                "content parts of type {} are not supported",
                                other.map_or("(none)".into(), |t| format!("`{t}`"))
                            ))),
                        })
                        .collect::<Result<Vec<_>, _>>()?
                        .join("\n"),
                    _ => return Err(bad("every input message needs `content`")),
                };
                Ok(json!({"role": role, "content": content}))
            })
            .collect(),
        Some(_) => Err(bad("`input` must be a string or a list of messages")),
        None => Err(bad("`input` is required")),
    }
}

/// Request fields a response object repeats.
fn echo_fields(f: &Fields) -> Map<String, Value> {
    let mut m = Map::new();
    for (key, default) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        ("previous_response_id", Value::Null),
        ("temperature", json!(1.0)),
        ("top_p", json!(1.0)),
        ("metadata", json!({})),
    ] {
        m.insert(key.into(), f.get(key).cloned().unwrap_or(default));
    }
    m
}

/// What every event and the final object of one response share.
struct Head {
    id: String,
    msg_id: String,
    created_at: u64,
    model: String,
    input_tokens: usize,
    request: Map<String, Value>,
    store: bool,
    /// The conversation up to this turn's input (without instructions).
    conversation: Vec<Value>,
}

impl Head {
    fn message(&self, text: &str, status: &str) -> Value {
        json!({
            "type": "message",
            "id": self.msg_id,
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        })
    }

    fn response(&self, text: &str, output_tokens: usize, status: &str) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            "model": self.model,
            "output": if status == "in_progress" { json!([]) } else {
                json!([self.message(text, if status == "completed" { "completed" } else { "incomplete" })])
            },
            "parallel_tool_calls": false,
            "tool_choice": "none",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "store": self.store,
            "usage": (status != "in_progress").then(|| json!({
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + output_tokens,
            })),
        });
        if let Value::Object(o) = &mut r {
            o.extend(self.request.clone());
        }
        r
    }

    fn store_into(&self, state: &SharedState, text: &str, response: &Value) {
        if !self.store {
            return;
        }
        let mut conversation = self.conversation.clone();
        conversation.push(json!({"role": "assistant", "content": text}));
        state.responses.put(
            self.id.clone(),
            Stored {
                conversation,
                response: response.clone(),
            },
        );
    }
}

/// The streamed events of one response.
struct Events {
    head: Head,
    state: SharedState,
    seq: u64,
    text: String,
    output_tokens: usize,
}

impl Events {
    fn frame(&mut self, ty: &str, mut body: Value) -> Bytes {
        if let Value::Object(o) = &mut body {
            o.insert("type".into(), json!(ty));
            o.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        Bytes::from(format!("event: {ty}\ndata: {body}\n\n"))
    }

    fn part(text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    fn start(&mut self) -> Vec<Bytes> {
        let r = self.head.response("", 0, "in_progress");
        let mut item = self.head.message("", "in_progress");
        item["content"] = json!([]);
        vec![
            self.frame("response.created", json!({"response": r})),
            self.frame("response.in_progress", json!({"response": r})),
            self.frame(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ),
            self.frame(
                "response.content_part.added",
                json!({"item_id": self.head.msg_id, "output_index": 0, "content_index": 0,
                    "part": Self::part("")}),
            ),
        ]
    }

    fn update(&mut self, up: Update) -> Vec<Bytes> {
        if let Some(e) = up.error {
            // OpenAI's `error` event: the error body's fields, `type` being the event's.
            let mut err = match e.body().get_mut("error").map(Value::take) {
                Some(Value::Object(o)) => o,
                _ => Map::new(),
            };
            err.remove("type");
            err.entry("message").or_insert_with(|| json!("error"));
            return vec![self.frame("error", Value::Object(err))];
        }
        self.output_tokens += up.token_ids.len();
        let mut out = Vec::new();
        if !up.text.is_empty() {
            self.text.push_str(&up.text);
            let id = self.head.msg_id.clone();
            out.push(self.frame(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": 0, "content_index": 0,
                    "delta": up.text, "logprobs": []}),
            ));
        }
        if let Some(finish) = up.finish {
            let status = if finish.reason == FinishReason::Length {
                "incomplete"
            } else {
                "completed"
            };
            let (id, text) = (self.head.msg_id.clone(), self.text.clone());
            out.push(self.frame(
                "response.output_text.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text,
                    "logprobs": []}),
            ));
            out.push(self.frame(
                "response.content_part.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0,
                    "part": Self::part(&text)}),
            ));
            let item = self.head.message(&text, status);
            out.push(self.frame(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ));
            let response = self.head.response(&text, self.output_tokens, status);
            self.head.store_into(&self.state, &text, &response);
            let ty = if status == "completed" {
                "response.completed"
            } else {
                "response.incomplete"
            };
            out.push(self.frame(ty, json!({"response": response})));
        }
        out
    }
}
