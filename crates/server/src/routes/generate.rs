//! `POST /generate`: vLLM's simple api_server shape. `{"prompt": ..., "stream": bool,
//! ...sampling}` → `{"text": [prompt + output, ...]}` (one entry per choice); streaming sends
//! newline-delimited JSON objects of the same shape with each choice's text so far.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ApiError;
use crate::generation;
use crate::json::JsonBody;
use crate::sse::{drive, ndjson_line, streaming_response};
use crate::state::SharedState;
use crate::validation::{Api, PromptInput, validate};

pub async fn generate(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    let mut v = validate(&state, &f, Api::Generate).await?;
    let prompt_text = match v.inputs.pop() {
        Some(PromptInput::Text(t)) => t,
        _ => {
            let ids = v.generation.prompts[0].clone();
            state.pool.decode(ids, false, "prompt").await?
        }
    };
    let stream = v.stream;
    let running = generation::submit(&state, v.generation)?;
    if stream {
        let mut texts = vec![prompt_text; running.len()];
        let body = drive(
            running.into_stream(),
            move |i, up| {
                if let Some(e) = up.error {
                    return vec![ndjson_line(&e.body())];
                }
                if up.text.is_empty() && up.finish.is_none() {
                    return Vec::new();
                }
                texts[i].push_str(&up.text);
                vec![ndjson_line(&json!({ "text": texts }))]
            },
            Vec::new,
        );
        return Ok(streaming_response(body, "application/x-ndjson"));
    }
    let results = running.collect().await?;
    let text: Vec<String> = results
        .into_iter()
        .map(|r| format!("{prompt_text}{}", r.text))
        .collect();
    Ok(Json(json!({ "text": text })).into_response())
}
