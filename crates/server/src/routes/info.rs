//! Read-only routes: `GET /v1/models`, `/health`, `/metrics`, `/server_info`, `/version`.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::SharedState;

pub async fn models(State(state): State<SharedState>) -> Json<Value> {
    let data: Vec<Value> = state
        .config
        .served_model_names
        .iter()
        .map(|name| {
            json!({
                "id": name,
                "object": "model",
                "created": state.created,
                "owned_by": "tokenmill",
                "root": state.config.model_path,
                "parent": null,
                "max_model_len": state.max_model_len(),
                "permission": [],
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// 200 while serving, 503 once draining.
pub async fn health(State(state): State<SharedState>) -> Response {
    if state.is_draining() {
        return ApiError::draining().into_response();
    }
    StatusCode::OK.into_response()
}

pub async fn metrics(State(state): State<SharedState>) -> Response {
    let stats = state.engine.stats();
    let text = state.metrics.render(&stats, state.engine.config(), 0);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn server_info(State(state): State<SharedState>) -> Json<Value> {
    let cfg = state.engine.config();
    let (waiting_requests, waiting_tokens) = state.admission.waiting();
    Json(json!({
        "model_path": state.config.model_path,
        "served_model_name": state.model_name(),
        "served_model_names": state.config.served_model_names,
        "version": env!("CARGO_PKG_VERSION"),
        "kernels": state.config.kernels,
        "activation_bits": state.config.activation_bits,
        "max_model_len": cfg.max_model_len,
        "block_size": cfg.block_size,
        "num_blocks": cfg.num_blocks,
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "max_waiting_requests": state.config.max_waiting_requests,
        "max_waiting_tokens": state.config.max_waiting_tokens,
        "waiting_requests": waiting_requests,
        "waiting_tokens": waiting_tokens,
        "remote_tokenizer": state.pool.is_remote(),
        "draining": state.is_draining(),
        "target_ttft_ms": cfg.sla.ttft.map(|d| d.as_secs_f64() * 1e3),
        "target_tpot_ms": cfg.sla.tpot.map(|d| d.as_secs_f64() * 1e3),
    }))
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
