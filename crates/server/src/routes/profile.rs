//! `POST /start_profile` and `POST /stop_profile` (vLLM's convention): record a trace of
//! everything the server and engine do between the two calls.
//!
//! Enabled only with `serve --profile-dir DIR` (otherwise both answer 404 in OpenAI's error
//! shape). Starting while a session runs, or stopping when none does, is a 400. Stopping
//! writes the session as Chrome Trace Event JSON to `DIR/tokenmill-trace-<unix ms>.json`
//! (on a blocking thread) and answers `{"trace": path, "num_events": n}`. The file opens in
//! Perfetto; `tokenmill profile report FILE` analyses it.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use tokenmill_trace::TraceError;

use crate::error::ApiError;
use crate::state::SharedState;

fn profile_dir(state: &SharedState) -> Result<std::path::PathBuf, ApiError> {
    state.profile_dir.clone().ok_or_else(|| {
        ApiError::not_found("profiling is not enabled: start the server with --profile-dir DIR")
    })
}

fn session_error(e: TraceError) -> ApiError {
    match e {
        TraceError::AlreadyRunning | TraceError::NotRunning => ApiError::bad_request(e.to_string()),
        other => ApiError::internal(other.to_string()),
    }
}

pub async fn start_profile(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    profile_dir(&state)?;
    tokenmill_trace::start().map_err(session_error)?;
    tracing::info!("profiling started");
    Ok(Json(json!({ "status": "started" })))
}

pub async fn stop_profile(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    let dir = profile_dir(&state)?;
    let trace = tokenmill_trace::stop().map_err(session_error)?;
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let path = dir.join(format!("tokenmill-trace-{ms}.json"));
    let num_events = trace.events.len();
    let out = path.clone();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir).map_err(|source| TraceError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        trace.write_file(&out)
    })
    .await
    .map_err(|e| ApiError::internal(format!("writing the trace: {e}")))?
    .map_err(|e| ApiError::internal(e.to_string()))?;
    tracing::info!(path = %path.display(), num_events, "profiling stopped");
    Ok(Json(
        json!({ "trace": path.display().to_string(), "num_events": num_events }),
    ))
}
