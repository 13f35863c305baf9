//! `POST /start_profile` and `/stop_profile` on the real default model: 404 without
//! `--profile-dir`, 400 for a stop without a start or a second start, and a session around a
//! streamed completion writes a trace with the server's and the engine's scopes.
//!
//! One test function: a profiling session is process-wide.

mod common;

use common::*;
use serde_json::json;
use tokenmill_server::{AppState, TokenizerPool};
use tokenmill_trace::Trace;

#[tokio::test]
async fn profile_routes_record_a_session_into_the_profile_dir() {
    let c = client();
    let off = TestServer::start(engine_options(), server_config());
    let (status, body) = post(&c, &off.url("/start_profile"), &json!({})).await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--profile-dir")
    );
    off.stop();

    let dir = std::env::temp_dir().join(format!("tm-profile-{}", std::process::id()));
    let loaded = load_default_model(&engine_options());
    let config = server_config();
    let pool = TokenizerPool::new(loaded.tokenizer.clone(), config.tokenizer_workers);
    let state = AppState::new(config, loaded.engine, pool).with_profile_dir(Some(dir.clone()));
    let on = TestServer::start_with(state);

    let (status, body) = post(&c, &on.url("/stop_profile"), &json!({})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(post(&c, &on.url("/start_profile"), &json!({})).await.0, 200);
    assert_eq!(post(&c, &on.url("/start_profile"), &json!({})).await.0, 400);
    let frames = post_stream(
        &c,
        &on.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4,
                "stream": true}),
    )
    .await;
    assert!(!frames.is_empty());
    let (status, body) = post(&c, &on.url("/stop_profile"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let path = std::path::PathBuf::from(body["trace"].as_str().unwrap());
    assert!(path.starts_with(&dir));
    let trace = Trace::read_file(&path).unwrap();
    assert_eq!(body["num_events"].as_u64(), Some(trace.events.len() as u64));
    for name in [
        "http",
        "tokenize",
        "queue",
        "step",
        "execute_model",
        "qkv_matmul",
        "detokenize",
        "stream_send",
    ] {
        assert!(
            trace.events.iter().any(|e| e.name == name),
            "{name} missing from the trace"
        );
    }
    assert!(
        trace
            .thread_names()
            .values()
            .any(|n| n == "tokenmill-engine")
    );
    on.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}
