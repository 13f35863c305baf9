//! `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info` in vLLM's shapes.
//!
//! `/tokenize` takes `{"prompt", "add_special_tokens" = true}` or a chat
//! `{"messages", "add_generation_prompt" = true, "add_special_tokens" = false, ...}` and
//! answers `{"count", "max_model_len", "tokens", "token_strs"}` (`token_strs` only with
//! `return_token_strs`). `/detokenize` takes `{"tokens"}` and answers `{"prompt"}`.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::json::{JsonBody, as_i64};
use crate::state::SharedState;
use crate::validation::render_prompt;

pub async fn tokenize(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Json<Value>, ApiError> {
    state.check_model(f.str("model")?)?;
    let return_strs = f.bool_or("return_token_strs", false)?;
    let tokens = if f.has("messages") {
        let text = render_prompt(&state, &f).await?;
        let add = f.bool_or("add_special_tokens", false)?;
        state.pool.encode(text, add, "messages").await?
    } else {
        let Some(prompt) = f.str("prompt")? else {
            return Err(ApiError::invalid_param(
                "prompt",
                "`prompt` (a string) or `messages` is required",
            ));
        };
        let add = f.bool_or("add_special_tokens", true)?;
        state.pool.encode(prompt.to_string(), add, "prompt").await?
    };
    let token_strs = if return_strs {
        let ids = tokens.clone();
        let strs: Vec<String> = state
            .pool
            .run(move |t| {
                ids.iter()
                    .map(|&id| t.token_to_piece(id).unwrap_or_default())
                    .collect()
            })
            .await?;
        json!(strs)
    } else {
        Value::Null
    };
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": state.max_model_len(),
        "tokens": tokens,
        "token_strs": token_strs,
    })))
}

/// `GET /tokenizer_info` (vLLM's, behind its `--enable-tokenizer-info-endpoint`): the special
/// tokens, chat template and length limit. lm-eval's `remote` tokenizer backend reads it (and
/// then tokenizes through `/tokenize`), so lm-eval needs no copy of the tokenizer.
pub async fn tokenizer_info(State(state): State<SharedState>) -> Json<Value> {
    let t = state.pool.tokenizer();
    let piece = |id: Option<u32>| id.and_then(|id| t.token_to_piece(id));
    Json(json!({
        "tokenizer_class": "tokenmill",
        "bos_token": piece(t.bos_token_id()),
        "eos_token": piece(t.eos_token_id()),
        "pad_token": Value::Null,
        "add_bos_token": t.add_bos_token(),
        "chat_template": t.chat_template().map(|c| c.source()),
        "model_max_length": state.max_model_len(),
        "vocab_size": t.vocab_size(),
    }))
}

pub async fn detokenize(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Json<Value>, ApiError> {
    state.check_model(f.str("model")?)?;
    let vocab = state.pool.tokenizer().vocab_size();
    let Some(Value::Array(a)) = f.get("tokens") else {
        return Err(ApiError::invalid_param(
            "tokens",
            "`tokens` must be an array of token ids",
        ));
    };
    let ids = a
        .iter()
        .map(|v| match as_i64(v) {
            Some(id) if id >= 0 && (id as u64) < vocab as u64 => Ok(id as u32),
            _ => Err(ApiError::invalid_param(
                "tokens",
                format!("`tokens` must hold token ids in 0..{vocab}"),
            )),
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let skip = f.bool_or("skip_special_tokens", false)?;
    let prompt = state.pool.decode(ids, skip, "tokens").await?;
    Ok(Json(json!({ "prompt": prompt })))
}
