//! Behaviour under load and across a request's life, each test on its own server so its
//! gauges are its own: cancellation (a client that goes away while queued or running frees
//! everything), admission (a burst over the queue bound gets 429s, the admitted complete),
//! the API key and CORS, and an in-process drain.

mod common;

use std::time::Duration;

use common::{TestServer, client, is_idle, metric, post, wait_metrics};
use futures_util::StreamExt;
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn disconnects_mid_stream_and_mid_queue_free_everything() {
    // One sequence at a time, so a second request waits in the queue.
    let s = TestServer::start(
        tokenmill_engine::EngineConfig {
            max_num_seqs: 1,
            ..common::engine_options()
        },
        common::server_config(),
    );
    let c = client();
    let long = json!({"prompt": "Tell me a long story.", "max_tokens": 900, "ignore_eos": true,
                      "temperature": 0});

    // A: streaming and running; read its first chunk.
    let mut a_body = long.clone();
    a_body["stream"] = json!(true);
    let a = c
        .post(s.url("/v1/completions"))
        .json(&a_body)
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    let mut a_stream = a.bytes_stream();
    let first = a_stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));

    // B: non-streaming, queued behind A.
    let b = tokio::spawn({
        let (c, url, body) = (c.clone(), s.url("/v1/completions"), long.clone());
        async move { c.post(url).json(&body).send().await }
    });
    wait_metrics(&c, &s.base, LONG, "B queued", |m| {
        metric(m, "vllm:num_requests_waiting") == Some(1.0)
            && metric(m, "vllm:num_requests_running") == Some(1.0)
    })
    .await;
    // B's client goes away while queued.
    b.abort();
    let _ = b.await;
    wait_metrics(&c, &s.base, LONG, "B aborted", |m| {
        metric(m, "vllm:num_requests_waiting") == Some(0.0)
            && metric(m, "vllm:num_requests_running") == Some(1.0)
    })
    .await;

    // A's client goes away mid-stream.
    drop(a_stream);
    let m = wait_metrics(&c, &s.base, LONG, "idle after A", is_idle).await;
    assert!(metric(&m, "tokenmill_kv_cache_free_blocks").unwrap() > 0.0);
    // SmolLM2-135M: 30 layers × (K + V of 3 heads × 64) f16 values (the default cache).
    assert_eq!(
        metric(&m, "tokenmill_kv_cache_bytes_per_token"),
        Some((30 * 2 * 3 * 64 * 2) as f64)
    );

    // C: non-streaming and running when its client goes away.
    let cc = tokio::spawn({
        let (c, url, body) = (c.clone(), s.url("/v1/completions"), long.clone());
        async move { c.post(url).json(&body).send().await }
    });
    wait_metrics(&c, &s.base, LONG, "C running", |m| {
        metric(m, "vllm:num_requests_running") == Some(1.0)
            && metric(m, "vllm:kv_cache_usage_perc").unwrap_or(0.0) > 0.0
    })
    .await;
    cc.abort();
    let _ = cc.await;
    let m = wait_metrics(&c, &s.base, LONG, "idle after C", is_idle).await;
    let aborted = m
        .lines()
        .find(|l| l.starts_with("vllm:request_success_total{finished_reason=\"abort\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap();
    assert_eq!(aborted, 3.0, "{m}");

    // And the server still answers.
    let (status, r) = post(
        &c,
        &s.url("/v1/completions"),
        &json!({"prompt": "Hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
}

#[tokio::test]
async fn overload_burst_gets_429_and_admitted_requests_complete() {
    let s = TestServer::start(
        tokenmill_engine::EngineConfig {
            max_num_seqs: 1,
            ..common::engine_options()
        },
        tokenmill_server::ServerConfig {
            max_waiting_requests: 2,
            ..common::server_config()
        },
    );
    let c = client();
    let body = json!({"prompt": "Count to ten:", "max_tokens": 8, "ignore_eos": true});
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (c, url, body) = (c.clone(), s.url("/v1/completions"), body.clone());
            tokio::spawn(async move {
                let t = std::time::Instant::now();
                let r = c.post(url).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                let retry = r.headers().get("retry-after").cloned();
                let v: Value = r.json().await.unwrap();
                (status, retry, v, t.elapsed())
            })
        })
        .collect();
    let (mut ok, mut rejected) = (0, 0);
    for t in tasks {
        let (status, retry, v, elapsed) = t.await.unwrap();
        match status {
            200 => {
                ok += 1;
                assert_eq!(v["usage"]["completion_tokens"], 8, "{v}");
                assert_eq!(v["choices"][0]["finish_reason"], "length");
            }
            429 => {
                rejected += 1;
                assert_eq!(retry.unwrap(), "1");
                assert_eq!(v["error"]["code"], "rate_limit_exceeded");
                // Rejections do not wait for the engine (loose bound: no timing claims).
                assert!(elapsed < Duration::from_secs(10));
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert!(ok >= 1 && rejected >= 1, "ok {ok}, rejected {rejected}");
    assert_eq!(ok + rejected, 16);
    let m = wait_metrics(&c, &s.base, LONG, "idle", is_idle).await;
    let line = m
        .lines()
        .find(|l| {
            l.starts_with("tokenmill_rejected_requests_total{reason=\"max_waiting_requests\"")
        })
        .unwrap();
    assert!(line.ends_with(&format!(" {rejected}.0")), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_prompt_tokenizer_does_not_stall_running_streams() {
    // One tokenizer worker, held by a job that ends only when the test says so: every new
    // prompt waits for it, and the stream already running must still get all its text.
    let s = TestServer::start(
        common::engine_options(),
        tokenmill_server::ServerConfig {
            tokenizer_workers: 1,
            ..common::server_config()
        },
    );
    let c = client();
    let body = json!({"prompt": "Count to twenty:", "max_tokens": 40, "ignore_eos": true,
                      "temperature": 0, "stream": true});
    let r = c
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());

    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let pool = s.state.pool.clone();
    let blocker = tokio::spawn(async move {
        pool.run(move |_| {
            let _ = held_tx.send(());
            let _ = release_rx.recv();
        })
        .await
        .unwrap();
    });
    held_rx.await.unwrap();
    // A new prompt now queues behind the blocker...
    let queued = {
        let (c, url) = (c.clone(), s.url("/v1/completions"));
        tokio::spawn(async move { post(&c, &url, &json!({"prompt": "Hi", "max_tokens": 2})).await })
    };
    // ...while the running stream finishes (a liveness bound, not a speed assertion).
    let rest = tokio::time::timeout(LONG, async {
        let mut text = String::from_utf8_lossy(&first).into_owned();
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
        text
    })
    .await
    .expect("the running stream stalled behind the blocked prompt tokenizer");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    let chunks = common::sse_data(&rest);
    let finish = chunks
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["finish_reason"].as_str().map(String::from))
        .collect::<Vec<_>>();
    assert_eq!(finish, vec!["length".to_string()]);
    assert!(
        !queued.is_finished(),
        "the new prompt waits for the prompt tokenizer"
    );
    release_tx.send(()).unwrap();
    blocker.await.unwrap();
    let (status, r) = queued.await.unwrap();
    assert_eq!(status, 200, "{r}");
}

#[tokio::test]
async fn api_key_guards_everything_but_health_and_metrics_and_cors_when_asked() {
    let s = TestServer::start(
        common::engine_options(),
        tokenmill_server::ServerConfig {
            api_key: Some("s3cret".into()),
            allowed_origins: vec!["http://app.test".into()],
            ..common::server_config()
        },
    );
    let c = client();
    let models = s.url("/v1/models");
    assert_eq!(c.get(&models).send().await.unwrap().status(), 401);
    let r = c.get(&models).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "invalid_api_key");
    assert_eq!(
        c.get(&models)
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (status, _) = post(&c, &s.url("/v1/completions"), &json!({"prompt": "x"})).await;
    assert_eq!(status, 401);
    for open in ["/health", "/metrics"] {
        assert_eq!(c.get(s.url(open)).send().await.unwrap().status(), 200);
    }
    // CORS: the allowed origin gets the header (preflight included), others do not.
    let r = c
        .request(reqwest::Method::OPTIONS, &models)
        .header("Origin", "http://app.test")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.test"
    );
    let r = c
        .get(s.url("/health"))
        .header("Origin", "http://evil.test")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn drain_finishes_in_flight_streams_and_refuses_new_work() {
    let s = TestServer::start(common::engine_options(), common::server_config());
    let c = client();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": true,
                      "stream": true});
    let r = c
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    assert_eq!(c.get(s.url("/health")).send().await.unwrap().status(), 200);

    let (state, health, completions) =
        (s.state.clone(), s.url("/health"), s.url("/v1/completions"));
    let stopper = std::thread::spawn(move || s.stop());
    let t = std::time::Instant::now();
    while !state.is_draining() {
        assert!(t.elapsed() < LONG);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Draining: health is 503 and new work is refused, on a fresh connection too.
    let fresh = reqwest::Client::new();
    assert_eq!(fresh.get(&health).send().await.unwrap().status(), 503);
    let (status, e) = post(&fresh, &completions, &json!({"prompt": "x"})).await;
    assert_eq!(status, 503, "{e}");
    let mut rest = first.to_vec();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(rest).unwrap();
    let data = common::sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
    let finish: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["finish_reason"].clone())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![json!("length")]);
    stopper.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_loading_and_a_failed_load_ends_the_server() {
    use std::sync::Arc;
    use tokenmill_server::{AppState, TokenizerPool, serve_when_ready};
    use tokio::sync::oneshot;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (ready_tx, ready_rx) = oneshot::channel::<tokenmill_server::SharedState>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(serve_when_ready(
        listener,
        tokenmill_server::HttpLimits::default(),
        async move { ready_rx.await.map_err(|e| e.to_string()) },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let c = client();
    let r = c.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(
        r.headers()["x-request-id"].len(),
        32,
        "the loading answer names its request"
    );
    let (status, e) = post(
        &c,
        &format!("{base}/v1/completions"),
        &json!({"prompt": "x"}),
    )
    .await;
    assert_eq!(status, 503, "{e}");
    assert_eq!(e["error"]["message"], "the model is loading");

    let loaded = common::load_default_model(&common::engine_options());
    let pool = TokenizerPool::new(loaded.tokenizer.clone(), 2);
    let state = AppState::new(common::server_config(), loaded.engine, pool);
    assert!(ready_tx.send(Arc::new(state)).is_ok());
    let t = std::time::Instant::now();
    while c
        .get(format!("{base}/health"))
        .send()
        .await
        .unwrap()
        .status()
        != 200
    {
        assert!(t.elapsed() < LONG);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, r) = post(
        &c,
        &format!("{base}/v1/completions"),
        &json!({"prompt": "Hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();

    // A load that fails ends the server with its error.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = serve_when_ready(
        listener,
        tokenmill_server::HttpLimits::default(),
        async { Err::<tokenmill_server::SharedState, _>("no such model") },
        std::future::pending(),
    )
    .await;
    assert!(r.unwrap_err().to_string().contains("no such model"));
}
