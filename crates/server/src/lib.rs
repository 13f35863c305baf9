//! tokenmill-server: an OpenAI- and vLLM-compatible HTTP server over the engine.
//!
//! Data path of a generation request (one owner per step):
//!
//! ```text
//! axum handler ─ JsonBody/Fields (400/413) ─ validation::validate: model (404), sampling
//!   fields (400 naming the param), prompt or messages (400), admission precheck (429),
//!   TokenizerPool (blocking pool or gRPC), context check (400)
//!   ─ generation::submit (admit: 429) ─► EngineHandle::submit × n
//!   ◄─ RequestStream events ─ ChoiceRunner ─ OutputProcessor on the pool's output lane
//!      (detokenize, stop strings with holdback, logprobs) ─ JSON or SSE/NDJSON frames
//! ```
//!
//! Modules: [`app`] (router, middleware, drain), [`conn`] (accept loop, connection limits), [`routes`] (handlers: formatters over
//! [`validation`]'s one `validate`), [`json`] (body fields), [`generation`] and [`output`] (running choices), [`admission`],
//! [`metrics`], [`tokenizer_pool`] and [`grpc`] (tokenization, local or remote), [`launch`]
//! (model + engine start-up), [`error`] (OpenAI error shape).
//!
//! Invariants: client input never yields a 5xx or a panic; nothing tokenizes or
//! detokenizes on the async runtime or the engine thread; a dropped response (client gone,
//! queued or running) aborts its engine requests; every admitted request completes.

pub mod admission;
pub mod app;
pub mod conn;
pub mod error;
pub mod generation;
pub mod grpc;
pub mod json;
pub mod kv_events;
pub mod launch;
pub mod metrics;
pub mod otel;
pub mod output;
pub mod response_store;
pub mod routes;
pub mod sse;
pub mod state;
pub mod tokenizer_pool;
pub mod tools;
pub mod validation;

pub use app::{router, serve, serve_when_ready, shutdown_signal};
pub use conn::HttpLimits;
pub use error::ApiError;
pub use launch::{Loaded, load};
pub use state::{AppState, ServerConfig, SharedState};
pub use tokenizer_pool::TokenizerPool;
