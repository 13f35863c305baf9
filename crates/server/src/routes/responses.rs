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
//! - `tools` (function tools: `{"type": "function", "name", "description", "parameters",
//!   "strict"}`), `tool_choice` (`auto`, `none`, `required`, `{"type": "function", "name"}`)
//!   and `parallel_tool_calls`, through chat's tool calling: the reply's calls become
//!   `function_call` output items (`call_id`, `name`, `arguments`), and `function_call` /
//!   `function_call_output` input items become the assistant's calls and the tool results of
//!   the conversation. Streamed, a call is an `output_item.added`, then
//!   `response.function_call_arguments.delta`s and `.done`, then its `output_item.done`.
//! - Not supported yet (400): other tool types, `reasoning`, and a `text.format` other than
//!   plain text.
//!
//! A reply cut by `max_output_tokens` has `"status": "incomplete"` with
//! `incomplete_details.reason = "max_output_tokens"`. Streaming sends the Responses events
//! (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`…, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, `response.completed`), each
//! with its `sequence_number`, as `event:` + `data:` SSE frames. Output items are numbered in
//! the order they start: the message when its first text comes (or at the end, empty, when
//! nothing else came), each call when the model begins it.

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
use crate::tools::parser::{CallStream, Piece, ToolCall, parse_reply};
use crate::validation::{Api, ToolCalls, validate};
use tokenmill_engine::FinishReason;

pub async fn create(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    if f.get("reasoning").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid_param(
            "reasoning",
            "`reasoning` is not supported on /v1/responses yet",
        ));
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
        ("parallel_tool_calls", "parallel_tool_calls"),
    ] {
        if let Some(v) = f.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(tools) = f.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = f.get("tool_choice") {
        chat.insert("tool_choice".into(), chat_tool_choice(choice));
    }
    let v = validate(&state, &Fields(chat), Api::Chat)
        .await
        .map_err(responses_param)?;
    let stream_out = v.stream;
    let tool_calls = v.tool_calls.clone();
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
            reader: tool_calls.as_ref().map(ToolCalls::stream),
            message_index: None,
            calls: Vec::new(),
            next_index: 0,
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
    let status = if cut { "incomplete" } else { "completed" };
    let (content, calls) = match &tool_calls {
        Some(t) => parse_reply(t.format, t.names.clone(), &r.text),
        None => (Some(r.text), Vec::new()),
    };
    let mut output = Vec::new();
    if content.is_some() || calls.is_empty() {
        output.push(head.message(content.as_deref().unwrap_or(""), status));
    }
    for c in &calls {
        output.push(call_item(&fc_id(), c, "completed"));
    }
    let response = head.response(output, r.token_ids.len(), status);
    head.store_into(&state, content.as_deref(), &calls, &response);
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

/// Responses function tools (`{"type": "function", "name", ...}`) as chat's
/// (`{"type": "function", "function": {"name", ...}}`), which chat's validation then checks.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let bad = |m: String| ApiError::invalid_param("tools", m);
    let Value::Array(tools) = tools else {
        return Err(bad("`tools` must be a list of tools".into()));
    };
    let chat: Vec<Value> = tools
        .iter()
        .map(|t| match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = t.as_object().cloned().unwrap_or_default();
                function.remove("type");
                Ok(json!({"type": "function", "function": function}))
            }
            other => Err(bad(format!(
                "only function tools are supported, not {}",
                other.map_or("a tool without a `type`".into(), |t| format!("`{t}`"))
            ))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Value::Array(chat))
}

/// Responses' `tool_choice` in chat's shape (`{"type": "function", "name"}` nests the name).
fn chat_tool_choice(choice: &Value) -> Value {
    match choice.get("name") {
        Some(name) if choice.get("type").and_then(Value::as_str) == Some("function") => {
            json!({"type": "function", "function": {"name": name}})
        }
        _ => choice.clone(),
    }
}

/// `input` as chat messages.
fn input_messages(input: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("input", m.to_string());
    match input {
        Some(Value::String(s)) => Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => {
            let mut messages: Vec<Value> = Vec::with_capacity(items.len());
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("function_call") => add_call(&mut messages, item)?,
                    Some("function_call_output") => messages.push(call_output(item)?),
                    _ => messages.push(input_message(item)?),
                }
            }
            Ok(messages)
        }
        Some(_) => Err(bad("`input` must be a string or a list of messages")),
        None => Err(bad("`input` is required")),
    }
}

/// A `function_call` input item: a call of the assistant's, added to its message of calls
/// right before (consecutive calls are one turn), or a new one.
fn add_call(messages: &mut Vec<Value>, item: &Value) -> Result<(), ApiError> {
    let field = |k: &str| {
        item.get(k).and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_param(
                "input",
                format!("a `function_call` item needs a string `{k}`"),
            )
        })
    };
    let call = json!({
        "id": field("call_id")?,
        "type": "function",
        "function": {"name": field("name")?, "arguments": field("arguments")?},
    });
    if let Some(Value::Array(calls)) = messages
        .last_mut()
        .filter(|m| m["role"] == "assistant" && m["content"].is_null())
        .and_then(|m| m.get_mut("tool_calls"))
    {
        calls.push(call);
    } else {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    }
    Ok(())
}

/// A `function_call_output` input item: the tool's result, as chat's `tool` message.
fn call_output(item: &Value) -> Result<Value, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("input", m.to_string());
    let id = item.get("call_id").and_then(Value::as_str);
    let id = id.ok_or_else(|| bad("a `function_call_output` item needs a string `call_id`"))?;
    let output = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(bad("a `function_call_output` item needs a string `output`")),
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": output}))
}

/// A message input item as a chat message.
fn input_message(item: &Value) -> Result<Value, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("input", m.to_string());
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
        ("tools", json!([])),
        ("tool_choice", json!("auto")),
        ("parallel_tool_calls", json!(true)),
    ] {
        let v = f.get(key).filter(|v| !v.is_null());
        m.insert(key.into(), v.cloned().unwrap_or(default));
    }
    m
}

/// A fresh id of a `function_call` output item.
fn fc_id() -> String {
    response_id("fc").replace('-', "_")
}

/// A `function_call` output item.
fn call_item(item_id: &str, c: &ToolCall, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": item_id,
        "call_id": c.id,
        "name": c.name,
        "arguments": c.arguments,
        "status": status,
    })
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

    fn response(&self, output: Vec<Value>, output_tokens: usize, status: &str) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            "model": self.model,
            "output": output,
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

    /// Keeps the response and its conversation (the reply as the assistant's message, with
    /// its calls) for `previous_response_id`, unless `store` is false.
    fn store_into(
        &self,
        state: &SharedState,
        content: Option<&str>,
        calls: &[ToolCall],
        response: &Value,
    ) {
        if !self.store {
            return;
        }
        let mut conversation = self.conversation.clone();
        let mut reply = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            reply["tool_calls"] = Value::Array(calls);
        }
        conversation.push(reply);
        state.responses.put(
            self.id.clone(),
            Stored {
                conversation,
                response: response.clone(),
            },
        );
    }
}

/// A call being streamed: its output item's id and index, and the call so far.
struct StreamedCall {
    item_id: String,
    output_index: usize,
    call: ToolCall,
}

/// The streamed events of one response.
struct Events {
    head: Head,
    state: SharedState,
    seq: u64,
    text: String,
    output_tokens: usize,
    /// The tool-call reader (with tools): splits the reply into text and calls.
    reader: Option<CallStream>,
    /// The message item's output index, once its first text came.
    message_index: Option<usize>,
    calls: Vec<StreamedCall>,
    /// The next output item's index.
    next_index: usize,
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
        let r = self.head.response(Vec::new(), 0, "in_progress");
        vec![
            self.frame("response.created", json!({"response": r})),
            self.frame("response.in_progress", json!({"response": r})),
        ]
    }

    /// The message item's index, starting the item (and its text part) the first time.
    fn message_index(&mut self, out: &mut Vec<Bytes>) -> usize {
        if let Some(i) = self.message_index {
            return i;
        }
        let i = self.next_index;
        self.next_index += 1;
        self.message_index = Some(i);
        let mut item = self.head.message("", "in_progress");
        item["content"] = json!([]);
        let id = self.head.msg_id.clone();
        out.push(self.frame(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        ));
        out.push(self.frame(
            "response.content_part.added",
            json!({"item_id": id, "output_index": i, "content_index": 0,
                "part": Self::part("")}),
        ));
        i
    }

    fn piece(&mut self, piece: Piece, out: &mut Vec<Bytes>) {
        match piece {
            Piece::Content(text) => {
                let i = self.message_index(out);
                self.text.push_str(&text);
                let id = self.head.msg_id.clone();
                out.push(self.frame(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": i, "content_index": 0,
                        "delta": text, "logprobs": []}),
                ));
            }
            Piece::CallStart { id, name, .. } => {
                let (item_id, output_index) = (fc_id(), self.next_index);
                self.next_index += 1;
                let call = ToolCall {
                    id,
                    name,
                    arguments: String::new(),
                };
                let item = call_item(&item_id, &call, "in_progress");
                out.push(self.frame(
                    "response.output_item.added",
                    json!({"output_index": output_index, "item": item}),
                ));
                self.calls.push(StreamedCall {
                    item_id,
                    output_index,
                    call,
                });
            }
            Piece::Arguments { index, delta } => {
                let Some(c) = self.calls.get_mut(index) else {
                    return;
                };
                c.call.arguments.push_str(&delta);
                let body = json!({"item_id": c.item_id, "output_index": c.output_index,
                    "delta": delta});
                out.push(self.frame("response.function_call_arguments.delta", body));
            }
        }
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
        let mut pieces = match &mut self.reader {
            Some(reader) => reader.push(&up.text),
            None if up.text.is_empty() => Vec::new(),
            None => vec![Piece::Content(up.text)],
        };
        if up.finish.is_some()
            && let Some(reader) = &mut self.reader
        {
            pieces.extend(reader.finish());
        }
        let mut out = Vec::new();
        for p in pieces {
            self.piece(p, &mut out);
        }
        if let Some(finish) = up.finish {
            let status = if finish.reason == FinishReason::Length {
                "incomplete"
            } else {
                "completed"
            };
            self.finish(status, &mut out);
        }
        out
    }

    /// Closes every item (the message first, empty if nothing else came) and the response.
    fn finish(&mut self, status: &str, out: &mut Vec<Bytes>) {
        if self.calls.is_empty() {
            self.message_index(out);
        }
        // Beside calls, only real text is the message (as a whole reply's parse says).
        let text = match self.calls.is_empty() {
            true => self.text.clone(),
            false => self.text.trim().to_string(),
        };
        let mut items: Vec<(usize, Value)> = Vec::new();
        if let Some(i) = self.message_index {
            let id = self.head.msg_id.clone();
            out.push(self.frame(
                "response.output_text.done",
                json!({"item_id": id, "output_index": i, "content_index": 0, "text": text,
                    "logprobs": []}),
            ));
            out.push(self.frame(
                "response.content_part.done",
                json!({"item_id": id, "output_index": i, "content_index": 0,
                    "part": Self::part(&text)}),
            ));
            let item = self.head.message(&text, status);
            out.push(self.frame(
                "response.output_item.done",
                json!({"output_index": i, "item": item}),
            ));
            items.push((i, item));
        }
        let calls = std::mem::take(&mut self.calls);
        for c in &calls {
            let body = json!({"item_id": c.item_id, "output_index": c.output_index,
                "name": c.call.name, "arguments": c.call.arguments});
            out.push(self.frame("response.function_call_arguments.done", body));
            let item = call_item(&c.item_id, &c.call, "completed");
            out.push(self.frame(
                "response.output_item.done",
                json!({"output_index": c.output_index, "item": item}),
            ));
            items.push((c.output_index, item));
        }
        items.sort_by_key(|(i, _)| *i);
        let output = items.into_iter().map(|(_, item)| item).collect();
        let response = self.head.response(output, self.output_tokens, status);
        let content = self.message_index.map(|_| text.as_str());
        let calls: Vec<ToolCall> = calls.into_iter().map(|c| c.call).collect();
        self.head
            .store_into(&self.state, content, &calls, &response);
        let ty = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        out.push(self.frame(ty, json!({"response": response})));
    }
}
