//! Structured outputs and tool calls over HTTP on the real default model: constrained
//! replies parse, each of `n` choices runs its own constraint, streamed tool-call deltas add
//! up to the non-streamed call, and every bad constraint is a 400 naming its field. (The
//! official `openai` client's view, with schema validation, is `tests/openai_client/
//! test_structured.py`.)

mod common;

use std::sync::OnceLock;

use common::{MODEL, TestServer, client, post, post_stream};
use serde_json::{Value, json};

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| TestServer::start(common::engine_options(), common::server_config()))
}

fn url(path: &str) -> String {
    server().url(path)
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 20},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                       "required": ["city", "days"], "additionalProperties": false}
    }})
}

#[tokio::test]
async fn a_json_schema_reply_parses_and_keeps_the_schemas_key_order() {
    let schema = json!({"type": "object",
        "properties": {"zeta": {"type": "integer", "minimum": 0, "maximum": 9},
                       "alpha": {"enum": ["x", "y"]}},
        "required": ["zeta", "alpha"], "additionalProperties": false});
    let body = json!({"model": MODEL, "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": "Give me JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}});
    let (status, r) = post(&client(), &url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    let v: Value = serde_json::from_str(text).unwrap();
    assert!(
        v["zeta"].as_i64().is_some_and(|z| (0..=9).contains(&z)),
        "{text}"
    );
    assert!(v["alpha"] == "x" || v["alpha"] == "y", "{text}");
    // Properties come in the order the schema lists them, not sorted.
    assert!(text.find("zeta") < text.find("alpha"), "{text}");
}

#[tokio::test]
async fn every_choice_of_n_follows_its_own_constraint() {
    let body = json!({"model": MODEL, "prompt": "A date:", "max_tokens": 16, "n": 4,
        "temperature": 1.0, "seed": 11, "guided_regex": "[0-9]{4}-[0-9]{2}"});
    let (status, r) = post(&client(), &url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    let texts: Vec<&str> = r["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), 4);
    for t in &texts {
        let b = t.as_bytes();
        assert!(b.len() == 7 && b[4] == b'-', "{t}");
        assert!(
            b.iter()
                .enumerate()
                .all(|(i, c)| i == 4 || c.is_ascii_digit()),
            "{t}"
        );
    }
    assert!(
        texts.iter().any(|t| t != &texts[0]),
        "sampling should vary: {texts:?}"
    );
}

#[tokio::test]
async fn streamed_tool_call_deltas_add_up_to_the_whole_call() {
    let body = json!({"model": MODEL, "max_tokens": 120, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Lyon for 3 days?"}],
        "tools": [weather_tool()], "tool_choice": "required",
        "parallel_tool_calls": false});
    let (status, r) = post(&client(), &url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null(), "{choice}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string() && args["days"].is_i64(), "{args}");

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let chunks = post_stream(&client(), &url("/v1/chat/completions"), &sbody).await;
    let (mut name, mut arguments, mut id, mut finish) = (None, String::new(), None, None);
    for ch in chunks.iter().flat_map(|c| c["choices"].as_array().unwrap()) {
        for tc in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(tc["index"], 0);
            if let Some(i) = tc["id"].as_str() {
                id = Some(i.to_string());
                name = tc["function"]["name"].as_str().map(str::to_string);
            }
            arguments.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert!(id.is_some_and(|i| i.starts_with("call_")));
    assert_eq!(name.as_deref(), Some("get_weather"));
    assert_eq!(arguments, call["function"]["arguments"].as_str().unwrap());
}

#[tokio::test]
async fn bad_constraints_are_400s_naming_their_field() {
    let chat = |extra: Value| {
        let mut b = json!({"model": MODEL, "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hi"}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let huge = "a".repeat(300 * 1024);
    for (body, param) in [
        (chat(json!({"guided_regex": "(unclosed"})), "guided_regex"),
        (chat(json!({"guided_regex": huge})), "guided_regex"),
        (
            chat(
                json!({"guided_json": {"type": "object", "required": ["a"], "properties": {"a": false}}}),
            ),
            "guided_json",
        ),
        (chat(json!({"guided_choice": []})), "guided_choice"),
        (
            chat(json!({"structured_outputs": {"grammar": "start: nope"}})),
            "structured_outputs",
        ),
        (
            chat(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}})),
            "response_format",
        ),
        (
            chat(
                json!({"tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "x"}}}),
            ),
            "tool_choice",
        ),
        (
            chat(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]})),
            "tools",
        ),
    ] {
        let (status, r) = post(&client(), &url("/v1/chat/completions"), &body).await;
        assert_eq!(status, 400, "{param}: {r}");
        assert_eq!(r["error"]["param"], param, "{r}");
        assert_eq!(r["error"]["type"], "invalid_request_error", "{r}");
    }
    // A regex past llguidance's lexer limits. It compiles (its first mask fits), then the
    // engine's first step exceeds the limits: the request fails with a 400 — an error body,
    // or an error event in the stream — and no parser dump in the message.
    let explosive = chat(json!({"guided_regex": "(a|aa|aaa){200}(b|bb){300}c{1,5000}"}));
    let (status, r) = post(&client(), &url("/v1/chat/completions"), &explosive).await;
    assert_eq!(status, 400, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("too many") && !message.contains("non-verbose"),
        "{message}"
    );
    let mut streamed = explosive.clone();
    streamed["stream"] = json!(true);
    let chunks = post_stream(&client(), &url("/v1/chat/completions"), &streamed).await;
    assert!(
        chunks
            .iter()
            .any(|c| c["error"]["type"] == "invalid_request_error"),
        "{chunks:?}"
    );
    // The server is fine afterwards.
    let (status, _) = post(&client(), &url("/v1/chat/completions"), &chat(json!({}))).await;
    assert_eq!(status, 200);
}
