//! [`ServerConfig`] (what the operator decides) and [`AppState`] (what every handler
//! shares: the engine handle, the tokenizer pool, admission, metrics, the drain flag).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokenmill_engine::{EngineHandle, Pooling};
use tokenmill_structured::GrammarCompiler;

use crate::admission::Admission;
use crate::conn::HttpLimits;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tokenizer_pool::TokenizerPool;

/// Server settings (the `tokenmill serve` flags that are not the engine's).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Names clients may use in `model`; the first is reported by `/v1/models`.
    pub served_model_names: Vec<String>,
    /// Path of the model file (`/server_info`, `/v1/models` `root`).
    pub model_path: String,
    /// Required as `Authorization: Bearer <key>` on every route but `/health` (and
    /// `/metrics` unless `api_key_metrics`).
    pub api_key: Option<String>,
    pub api_key_metrics: bool,
    /// CORS origins; empty = CORS off. `*` allows any.
    pub allowed_origins: Vec<String>,
    pub max_waiting_requests: usize,
    pub max_waiting_tokens: usize,
    /// How long in-flight requests may run after SIGTERM/SIGINT.
    pub drain_timeout: Duration,
    pub max_body_bytes: usize,
    /// Concurrent tokenizer jobs on the blocking pool.
    pub tokenizer_workers: usize,
    /// What one client may hold: connections, header and body deadlines, header sizes.
    pub http: HttpLimits,
    /// How `/v1/embeddings` pools a prompt's hidden states (`--pooling`).
    pub pooling: Pooling,
    /// Which kernels run the model, in words (`/server_info`).
    pub kernels: String,
    /// Bits of the matmuls' activation quants, 12 or 8 (`--activation-bits`, as it took
    /// effect on this CPU; `/server_info`).
    pub activation_bits: u8,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            served_model_names: vec!["tokenmill".into()],
            model_path: String::new(),
            api_key: None,
            api_key_metrics: false,
            allowed_origins: Vec::new(),
            max_waiting_requests: 256,
            max_waiting_tokens: 256 * 1024,
            drain_timeout: Duration::from_secs(30),
            max_body_bytes: 16 << 20,
            tokenizer_workers: 2,
            http: HttpLimits::default(),
            // vLLM's default for a causal LM served as an embedding model.
            pooling: Pooling::Last,
            kernels: String::new(),
            activation_bits: 12,
        }
    }
}

/// Everything handlers share.
pub struct AppState {
    pub config: ServerConfig,
    pub engine: EngineHandle,
    pub pool: TokenizerPool,
    pub admission: Arc<Admission>,
    pub metrics: Arc<Metrics>,
    draining: AtomicBool,
    /// Engine requests in flight (choices not yet ended), for the drain.
    pub in_flight: Arc<AtomicUsize>,
    /// Unix seconds at startup (`created` of `/v1/models`).
    pub created: u64,
    /// Where `/stop_profile` writes traces; `None`: the profile routes answer 404.
    pub profile_dir: Option<std::path::PathBuf>,
    /// Structured outputs' grammar compiler for the served tokenizer, or why there is none.
    pub grammars: Result<Arc<GrammarCompiler>, String>,
    /// Past `/v1/responses` results, for `previous_response_id` (bounded).
    pub responses: crate::response_store::ResponseStore,
    /// OpenTelemetry traces of requests (`--otlp-traces-endpoint`), if exported.
    pub otel: Option<crate::otel::Tracing>,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    pub fn new(config: ServerConfig, engine: EngineHandle, pool: TokenizerPool) -> AppState {
        let name = config
            .served_model_names
            .first()
            .cloned()
            .unwrap_or_default();
        let grammars = GrammarCompiler::new(pool.tokenizer())
            .map(Arc::new)
            .map_err(|e| e.to_string());
        if let Err(e) = &grammars {
            tracing::warn!("structured outputs are unavailable: {e}");
        }
        AppState {
            grammars,
            admission: Arc::new(Admission::new(
                config.max_waiting_requests,
                config.max_waiting_tokens,
            )),
            metrics: Arc::new(Metrics::new(name)),
            config,
            engine,
            pool,
            draining: AtomicBool::new(false),
            in_flight: Arc::new(AtomicUsize::new(0)),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            profile_dir: None,
            responses: Default::default(),
            otel: None,
        }
    }

    /// Exports a span per generation request ([`crate::otel`]).
    pub fn with_otel(mut self, otel: Option<crate::otel::Tracing>) -> AppState {
        self.otel = otel;
        self
    }

    /// Enables `/start_profile` and `/stop_profile`, writing traces into `dir`.
    pub fn with_profile_dir(mut self, dir: Option<std::path::PathBuf>) -> AppState {
        self.profile_dir = dir;
        self
    }

    pub fn model_name(&self) -> &str {
        self.config
            .served_model_names
            .first()
            .map_or("", |s| s.as_str())
    }

    /// 404 unless `model` (if given) is one of the served names.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if !self.config.served_model_names.iter().any(|n| n == m) => {
                Err(ApiError::model_not_found(m))
            }
            _ => Ok(()),
        }
    }

    pub fn max_model_len(&self) -> usize {
        self.engine.config().max_model_len
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}
