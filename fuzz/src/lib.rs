//! Shared helpers of the fuzz targets: the real model's tokenizer and an in-process server
//! state, each loaded once per fuzzing process.
//!
//! The model is `models/SmolLM2-135M-Instruct.Q4_1.gguf` (fetched by `scripts/fetch-model.sh`),
//! or the file named by `TOKENMILL_FUZZ_MODEL`.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tokenmill_engine::{EngineConfig, KvCacheMemory};
use tokenmill_server::{AppState, ServerConfig, SharedState, TokenizerPool};
use tokenmill_tokenizer::Tokenizer;

/// The name requests may use in `model` (any other name is a 404).
pub const SERVED_MODEL_NAME: &str = "tokenmill";

/// The model the server targets load.
pub fn model_path() -> PathBuf {
    match std::env::var_os("TOKENMILL_FUZZ_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// The real model's tokenizer (a 49152-token byte-level BPE vocabulary with special tokens
/// and a chat template), loaded once.
pub fn real_tokenizer() -> &'static Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = model_path();
        let tok = Tokenizer::from_gguf_path(&path).unwrap_or_else(|e| {
            panic!(
                "loading the tokenizer of {} (run scripts/fetch-model.sh or set \
                 TOKENMILL_FUZZ_MODEL): {e}",
                path.display()
            )
        });
        Arc::new(tok)
    })
}

/// A server state over the real model, as `tokenmill serve` builds it (engine launched with a
/// small KV cache; nothing is ever submitted to it), and a runtime to run the async
/// validation on. Loaded once.
pub fn server() -> &'static (tokio::runtime::Runtime, SharedState) {
    static STATE: OnceLock<(tokio::runtime::Runtime, SharedState)> = OnceLock::new();
    STATE.get_or_init(|| {
        let engine = EngineConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 256,
            max_model_len: Some(1024),
            kv_cache_memory: KvCacheMemory::Bytes(64 << 20),
            ..EngineConfig::default()
        };
        let path = model_path();
        let loaded = tokenmill_server::load(&path, &engine).unwrap_or_else(|e| {
            panic!(
                "loading {} (run scripts/fetch-model.sh or set TOKENMILL_FUZZ_MODEL): {e}",
                path.display()
            )
        });
        let config = ServerConfig {
            served_model_names: vec![SERVED_MODEL_NAME.into()],
            model_path: path.display().to_string(),
            ..ServerConfig::default()
        };
        let pool = TokenizerPool::new(loaded.tokenizer.clone(), config.tokenizer_workers);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        // The engine thread runs for the life of the process.
        std::mem::forget(loaded.engine_thread);
        let state = Arc::new(AppState::new(config, loaded.engine, pool));
        (runtime, state)
    })
}

/// Reads a little-endian `u16` from the front of `data` (0 when too short) and returns the
/// rest.
pub fn take_u16(data: &[u8]) -> (u16, &[u8]) {
    match data {
        [a, b, rest @ ..] => (u16::from_le_bytes([*a, *b]), rest),
        _ => (0, &[]),
    }
}

/// Reads `body` as a request body the way every JSON route does (`JsonBody`: the size limit,
/// UTF-8, one JSON object). `Err` is the route's 4xx.
pub fn read_body(
    body: &[u8],
) -> Result<tokenmill_server::json::Fields, tokenmill_server::ApiError> {
    use axum::extract::FromRequest;
    let (rt, state) = server();
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_vec()))
        .expect("a request");
    rt.block_on(tokenmill_server::json::JsonBody::from_request(req, state))
        .map(|b| b.0)
}

/// Client input never yields a 5xx (the server crate's invariant).
pub fn assert_client_error(e: &tokenmill_server::ApiError, body: &[u8]) {
    assert!(
        e.status.is_client_error(),
        "status {} ({}: {}) for body {:?}",
        e.status,
        e.param.as_deref().unwrap_or("-"),
        e.message,
        String::from_utf8_lossy(body)
    );
}

/// What a request every validation step accepted must satisfy: prompts non-empty and in the
/// vocabulary, each prompt + its output limit within the context, `n` and the stop strings
/// within the documented limits.
pub fn check_valid(v: &tokenmill_server::validation::ValidRequest) {
    use tokenmill_server::validation::{MAX_N, MAX_STOP, MAX_STOP_BYTES};
    let (_, state) = server();
    let vocab = state.pool.tokenizer().vocab_size();
    let ctx = state.max_model_len();
    let g = &v.generation;
    assert!(!g.prompts.is_empty());
    assert_eq!(g.prompts.len(), g.max_tokens.len());
    assert!((1..=MAX_N as usize).contains(&g.n));
    for (p, &m) in g.prompts.iter().zip(&g.max_tokens) {
        assert!(!p.is_empty(), "an empty prompt passed");
        assert!(p.iter().all(|&id| (id as usize) < vocab));
        assert!(m >= 1 && p.len() + m <= ctx, "{} + {m} > {ctx}", p.len());
        assert!(g.params.min_tokens <= m || g.params.max_tokens.is_none());
    }
    assert!(g.output.stop.len() <= MAX_STOP);
    assert!(
        g.output
            .stop
            .iter()
            .all(|s| !s.is_empty() && s.len() <= MAX_STOP_BYTES)
    );
    assert!(
        g.params
            .stop_token_ids
            .iter()
            .all(|&id| (id as usize) < vocab)
    );
    assert!(
        g.params
            .sampling
            .logit_bias
            .iter()
            .all(|&(id, _)| (id as usize) < vocab)
    );
    let s = &g.params.sampling;
    assert!(s.temperature >= 0.0 && s.top_p > 0.0 && s.top_p <= 1.0);
    assert!(s.top_k <= vocab);
}
