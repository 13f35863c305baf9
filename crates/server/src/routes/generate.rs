//! `POST /generate`: vLLM's simple api_server shape. `{"prompt": ..., "stream": bool,
//! ...sampling}` → `{"text": [prompt + output, ...]}` (one entry per choice); streaming sends
//! newline-delimited JSON objects of the same shape with each choice's text so far.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::common::{PromptInput, parse_prompts, tokenize_prompts};
use crate::error::ApiError;
use crate::generation::{self, GenerationRequest};
use crate::json::JsonBody;
use crate::sampling::{self, Api, resolve_max_tokens};
use crate::sse::{drive, ndjson_line, streaming_response};
use crate::state::SharedState;

pub async fn generate(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Response, ApiError> {
    let tok = state.pool.tokenizer().clone();
    let s = sampling::parse(&f, Api::Generate, &tok)?;
    let mut inputs = parse_prompts(f.get("prompt"), tok.vocab_size())?;
    if inputs.len() != 1 {
        return Err(ApiError::invalid_param(
            "prompt",
            "/generate takes a single prompt",
        ));
    }
    state.admission.precheck(s.n, &state.metrics)?;
    let add_special_tokens = f.bool_or("add_special_tokens", true)?;
    let prompts = tokenize_prompts(&state, &inputs, add_special_tokens).await?;
    let cfg = state.engine.config();
    let max_tokens = resolve_max_tokens(
        s.max_tokens,
        prompts[0].len(),
        cfg.max_model_len,
        cfg.block_size,
        cfg.num_blocks,
        "prompt",
    )?;
    let prompt_text = match inputs.pop() {
        Some(PromptInput::Text(t)) => t,
        _ => {
            let ids = prompts[0].clone();
            state.pool.decode(ids, false, "prompt").await?
        }
    };
    let running = generation::submit(
        &state,
        GenerationRequest {
            prompts,
            max_tokens: vec![max_tokens],
            n: s.n,
            params: s.params.clone(),
            output: s.output.clone(),
        },
    )?;
    if s.stream {
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
