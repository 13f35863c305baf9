//! Shared helpers of the server's end-to-end tests: their engine and server settings, the
//! in-process test server (`tokenmill_testutil::server`), SSE parsing and `/metrics` scraping.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;
use tokenmill_engine::{EngineConfig, KvCacheMemory};
use tokenmill_server::ServerConfig;
#[allow(unused_imports)]
pub use tokenmill_testutil::server::{TestServer, load_default_model};

pub const MODEL: &str = "smollm2-test";

/// Small engine settings for tests: 64 MiB of KV (182 blocks of the default f16), 1024-token
/// context.
pub fn engine_options() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 16,
        max_num_batched_tokens: 512,
        max_model_len: Some(1024),
        kv_cache_memory: KvCacheMemory::Bytes(64 << 20),
        ..EngineConfig::default()
    }
}

pub fn server_config() -> ServerConfig {
    ServerConfig {
        served_model_names: vec![MODEL.into(), "alias".into()],
        model_path: tokenmill_testutil::model_path().display().to_string(),
        max_body_bytes: 1 << 20,
        ..ServerConfig::default()
    }
}

/// A client opening a fresh connection per request: the server closes a connection whose
/// request body it refused unread (a 413 over `json::DRAIN_MAX_BYTES`), and reusing it
/// would race that close.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// POSTs JSON; returns status and parsed body (`Value::Null` if not JSON).
pub async fn post(c: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = c.post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Parses an SSE body into its `data:` payloads (`[DONE]` kept as a string).
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|ev| ev.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// POSTs a streaming request and returns its JSON chunks; asserts it ends with `[DONE]`.
pub async fn post_stream(c: &reqwest::Client, url: &str, body: &Value) -> Vec<Value> {
    let r = c.post(url).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.unwrap();
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

pub use tokenmill_testutil::metric;

pub async fn metrics(c: &reqwest::Client, base: &str) -> String {
    c.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Polls `/metrics` until `pred` holds (panics after `timeout`).
pub async fn wait_metrics(
    c: &reqwest::Client,
    base: &str,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> String {
    let t = Instant::now();
    loop {
        let m = metrics(c, base).await;
        if pred(&m) {
            return m;
        }
        assert!(t.elapsed() < timeout, "timed out waiting for {what}:\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The engine is idle: nothing running or waiting, no KV block in use.
pub fn is_idle(m: &str) -> bool {
    metric(m, "vllm:num_requests_running") == Some(0.0)
        && metric(m, "vllm:num_requests_waiting") == Some(0.0)
        && metric(m, "vllm:kv_cache_usage_perc") == Some(0.0)
}
