//! `POST /v1/embeddings`: OpenAI's embeddings (and vLLM's extensions) from the served model's
//! final hidden states, pooled as the server was started with (`--pooling last|mean`).
//!
//! `input` is a string, strings, token ids or lists of token ids (as completions' `prompt`);
//! each becomes one engine request that runs its prompt through the model — batched with
//! everything else the engine runs — and returns one vector, L2-normalised unless
//! `normalize` is false (vLLM's extension). `encoding_format` `float` gives numbers and
//! `base64` the little-endian f32 bytes (what the `openai` client asks for by default).
//! `dimensions` is accepted only as the model's own width: this model was not trained to
//! be truncated (vLLM refuses it the same way). `truncate_prompt_tokens` keeps each
//! prompt's last `k` tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use base64::Engine as _;
use serde_json::{Value, json};
use tokenmill_engine::{EngineError, RequestParams, StreamEvent};

use super::common::{now_secs, response_id};
use crate::error::ApiError;
use crate::json::{Fields, JsonBody, as_i64};
use crate::state::SharedState;
use crate::validation::prompt::{parse_prompts, tokenize_prompts};

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Float,
    Base64,
}

pub async fn embeddings(
    State(state): State<SharedState>,
    JsonBody(f): JsonBody,
) -> Result<Json<Value>, ApiError> {
    state.check_model(f.str("model")?)?;
    let vocab = state.pool.tokenizer().vocab_size();
    let inputs = parse_prompts(f.get("input"), vocab, "input")?;
    let encoding = match f.str("encoding_format")? {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("`encoding_format` must be \"float\" or \"base64\", not {other:?}"),
            ));
        }
    };
    let dim = state.engine.embedding_dim();
    check_dimensions(&f, dim)?;
    let normalize = f.bool_or("normalize", true)?;
    let truncate = truncate_prompt_tokens(&f)?;
    let add_special_tokens = f.bool_or("add_special_tokens", true)?;
    state.admission.precheck(inputs.len(), &state.metrics)?;
    let mut prompts = tokenize_prompts(&state, &inputs, add_special_tokens, "input").await?;
    for p in &mut prompts {
        if let Some(k) = truncate {
            p.drain(..p.len().saturating_sub(k));
        }
        check_length(&state, p.len())?;
    }
    let vectors = embed(&state, prompts.clone()).await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            if normalize {
                l2_normalize(&mut v);
            }
            let embedding = match encoding {
                Encoding::Float => json!(v),
                Encoding::Base64 => json!(base64_f32(&v)),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    Ok(Json(json!({
        "id": response_id("embd"),
        "object": "list",
        "created": now_secs(),
        "model": state.model_name(),
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })))
}

fn check_dimensions(f: &Fields, dim: usize) -> Result<(), ApiError> {
    match f.get("dimensions") {
        None | Some(Value::Null) => Ok(()),
        Some(v) if as_i64(v) == Some(dim as i64) => Ok(()),
        Some(_) => Err(ApiError::invalid_param(
            "dimensions",
            format!(
                "this model's embeddings have {dim} dimensions and cannot be shortened \
                 (it was not trained for it); omit `dimensions` or pass {dim}"
            ),
        )),
    }
}

/// vLLM's `truncate_prompt_tokens`: keep the last `k ≥ 1` tokens (`-1`: the model length).
fn truncate_prompt_tokens(f: &Fields) -> Result<Option<usize>, ApiError> {
    match f.get("truncate_prompt_tokens") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match as_i64(v) {
            Some(-1) => Ok(Some(usize::MAX)),
            Some(k) if k >= 1 => Ok(Some(k as usize)),
            _ => Err(ApiError::invalid_param(
                "truncate_prompt_tokens",
                "`truncate_prompt_tokens` must be a positive integer or -1",
            )),
        },
    }
}

/// An input the engine could run alone: not empty, within the model length and the KV cache.
fn check_length(state: &SharedState, len: usize) -> Result<(), ApiError> {
    let cfg = state.engine.config();
    let limit = cfg.max_model_len.min(cfg.num_blocks * cfg.block_size);
    if len == 0 {
        return Err(ApiError::invalid_param("input", "an input has no tokens"));
    }
    if len > limit {
        return Err(ApiError::invalid_param(
            "input",
            format!(
                "an input has {len} tokens, over this server's limit of {limit} \
                 (truncate_prompt_tokens keeps the last ones)"
            ),
        ));
    }
    Ok(())
}

/// Runs every prompt as an embedding request at once and waits for all vectors, in order.
/// Dropping the future (the client left) drops the streams, which aborts the requests.
async fn embed(state: &SharedState, prompts: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let tickets = state.admission.admit(&lens, &state.metrics)?;
    let params = RequestParams {
        pooling: Some(state.config.pooling),
        max_tokens: None,
        ..RequestParams::default()
    };
    let arrival = Instant::now();
    let running: Vec<_> = prompts
        .into_iter()
        .zip(tickets)
        .map(|(prompt, ticket)| {
            let in_flight = InFlight::new(&state.in_flight);
            (
                state.engine.submit(prompt, params.clone()),
                ticket,
                in_flight,
            )
        })
        .collect();
    let mut vectors = Vec::with_capacity(running.len());
    for ((mut stream, mut ticket, _in_flight), len) in running.into_iter().zip(lens) {
        let v = match stream.next().await {
            Some(StreamEvent::Embedding(v)) => v,
            Some(StreamEvent::Error(e)) => return Err(engine_error(&e)),
            Some(_) | None => return Err(ApiError::internal("the engine dropped the request")),
        };
        ticket.release();
        state.metrics.embedded(len, arrival.elapsed());
        vectors.push(v);
    }
    Ok(vectors)
}

fn engine_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::ExceedsMaxModelLen { .. } | EngineError::ExceedsKvCache { .. } => {
            ApiError::invalid_param("input", e.to_string())
        }
        _ => ApiError::from_engine(e),
    }
}

/// One engine request in flight, for the drain (which waits for the count to reach 0).
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: &Arc<AtomicUsize>) -> InFlight {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// The vector as OpenAI's base64: little-endian f32 bytes.
fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
    }

    #[test]
    fn normalizes_to_unit_length_and_leaves_zero_alone() {
        let mut v = [3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0, 0.0];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0, 0.0]);
    }
}
