//! `tokenmill-bench` against the real tokenmill server on the real default model: a short
//! closed-loop run (6 prompts, 16 in / 8 out, concurrency 2) completes with no failure and
//! exact lengths, its JSON parses back, and the plots are real PNG/SVG files. A text-prompt
//! run on `/v1/chat/completions` completes too. The server runs in-process on an ephemeral
//! loopback port (`tokenmill_testutil::server`, as in `crates/server/tests`).

use serde_json::Value;
use tokenmill_bench::arrival::Arrival;
use tokenmill_bench::client::{Endpoint, RequestOptions, Target, served_model};
use tokenmill_bench::dataset::{OutputLenDist, PromptFormat, RandomSpec, random_prompts};
use tokenmill_bench::memory::MemorySource;
use tokenmill_bench::plot::sweep_plots;
use tokenmill_bench::report::{Sla, best_under_sla};
use tokenmill_bench::runner::{RunSpec, run};
use tokenmill_bench::stats::Slo;
use tokenmill_engine::{EngineConfig, KvCacheMemory};
use tokenmill_server::ServerConfig;
use tokenmill_testutil::server::TestServer;
use tokenmill_tokenizer::Tokenizer;

const MODEL: &str = "smollm2-bench";

/// The real server on the default model, small limits.
fn start_server() -> TestServer {
    let engine = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        max_model_len: Some(512),
        kv_cache_memory: KvCacheMemory::Bytes(64 << 20),
        ..EngineConfig::default()
    };
    let config = ServerConfig {
        served_model_names: vec![MODEL.into()],
        model_path: tokenmill_testutil::model_path().display().to_string(),
        ..ServerConfig::default()
    };
    TestServer::start(engine, config)
}

fn spec(concurrency: usize) -> RunSpec {
    RunSpec {
        arrival: Arrival::Closed { concurrency },
        options: RequestOptions::default(),
        percentiles: vec![50.0, 95.0, 99.0],
        slo: Slo::parse(&["ttft:600000".into()]).unwrap(),
        memory: MemorySource {
            pid: Some(std::process::id()),
            metrics_url: None,
        },
        seed: 1,
        progress: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_runs_against_tokenmill_serve() {
    let server = start_server();
    let base = server.base.clone();
    let tok = Tokenizer::from_gguf_path(tokenmill_testutil::model_path()).unwrap();
    let client = reqwest::Client::new();
    let model = served_model(&client, &base, None).await.unwrap();
    assert_eq!(model, MODEL);
    let mut target = Target {
        base_url: base.clone(),
        endpoint: Endpoint::Completions,
        api_key: None,
        model,
    };
    let rs = RandomSpec {
        num_prompts: 7,
        input_len: 16,
        output_len: 8,
        range_ratio: 0.0,
        output_dist: OutputLenDist::Uniform,
        prefix_len: 0,
        seed: 3,
    };
    let mut prompts = random_prompts(&rs, &tok, PromptFormat::Tokens).unwrap();
    let warm = prompts.split_off(6);
    let r = run(&client, &target, &warm, &prompts, &spec(2))
        .await
        .unwrap();
    let s = &r.summary;
    assert_eq!((s.completed, s.failed), (6, 0), "{:?}", r.records);
    assert_eq!(s.output_tokens, 6 * 8);
    assert_eq!(s.input_tokens, 6 * 16);
    assert_eq!(s.good_requests, Some(6));
    // Streamed chunks with text: at most one a token, and the server's usage (checked above)
    // counts the tokens. Not exactly 8: a choice's runner sends everything queued when it
    // wakes (`generation.rs`), so on a loaded machine two tokens can share a chunk (2 of 65
    // runs here); a token ending inside a UTF-8 character also waits for the next one.
    // `crates/server/tests/api.rs` checks that the streamed text equals the non-streamed.
    assert!(
        r.records
            .iter()
            .all(|r| (1..=8).contains(&r.token_times.len())),
        "{:?}",
        r.records
    );
    assert!(s.memory.peak_bytes().is_some());

    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("run.json");
    std::fs::write(&json_path, serde_json::to_string(&r.to_json()).unwrap()).unwrap();
    let back: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(back["completed"], 6.0);
    assert_eq!(back["requests"].as_array().unwrap().len(), 6);
    assert!(back["p95_ttft_ms"].as_f64().unwrap() > 0.0);

    // Chat endpoint with text prompts built by the tokenizer.
    target.endpoint = Endpoint::ChatCompletions;
    let rs = RandomSpec {
        num_prompts: 2,
        ..rs
    };
    let text = random_prompts(&rs, &tok, PromptFormat::Text).unwrap();
    let chat = run(&client, &target, &[], &text, &spec(2)).await.unwrap();
    assert_eq!(
        (chat.summary.completed, chat.summary.failed),
        (2, 0),
        "{:?}",
        chat.records
    );
    assert_eq!(chat.summary.output_tokens, 2 * 8);

    // Plots of a two-point "sweep" made of these runs.
    let sla = Sla {
        ttft_ms: Some(600_000.0),
        tpot_ms: None,
    };
    let files = sweep_plots(
        dir.path(),
        "concurrency",
        &[2.0, 2.0],
        &[r.clone(), chat],
        &sla,
    )
    .unwrap();
    assert_eq!(files.len(), 8);
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        match f.extension().and_then(|e| e.to_str()) {
            Some("png") => assert_eq!(&bytes[..4], b"\x89PNG"),
            _ => assert!(bytes.starts_with(b"<svg") && bytes.len() > 1000),
        }
    }
    assert_eq!(
        best_under_sla(std::slice::from_ref(&r.summary), &sla),
        Some(0)
    );
    server.stop();
}
