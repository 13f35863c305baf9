//! `tokenmill serve`: the OpenAI/vLLM-compatible HTTP server (see `tokenmill-server`), and
//! `tokenmill tokenizer-server`: the gRPC tokenizer service it can delegate to.
//!
//! With no arguments `serve` loads the default model and listens on 127.0.0.1:8080. The
//! model is loaded and the engine started before the async runtime, then the server runs
//! until SIGTERM/SIGINT and drains (up to `--drain-timeout`) before exiting 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokenmill_engine::Pooling;
use tokenmill_server::grpc::RemoteTokenizer;
use tokenmill_server::kv_events::KvEventsConfig;
use tokenmill_server::launch;
use tokenmill_server::otel;
use tokenmill_server::{AppState, HttpLimits, ServerConfig, TokenizerPool};

use crate::engine_args::EngineArgs;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Model, KV cache, scheduler and thread flags (shared with `bench-engine`).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to bind. Use 0.0.0.0 to accept connections from other machines.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Model names clients may send in `model` (default: the model file's stem).
    #[arg(long, num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Require `Authorization: Bearer KEY` on every route but /health (and /metrics).
    #[arg(long, env = "TOKENMILL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Protect /metrics with the API key too.
    #[arg(long)]
    pub api_key_metrics: bool,
    /// Prefix caching is on by default; this flag only spells that out.
    #[arg(long, conflicts_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Requests waiting for the engine at most; beyond, 429.
    #[arg(long, default_value_t = 256)]
    pub max_waiting_requests: usize,
    /// Prompt tokens waiting for the engine at most; beyond, 429.
    #[arg(long, default_value_t = 262_144)]
    pub max_waiting_tokens: usize,
    /// Seconds in-flight requests may take to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// Open HTTP connections at most; one more is answered 503 and closed.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds a client has to send a whole request head, and that a keep-alive connection
    /// may sit idle (a slow-loris client is closed after it).
    #[arg(long, default_value_t = 30.0)]
    pub http_header_timeout: f64,
    /// Seconds a client has to send a whole request body (beyond, 408).
    #[arg(long, default_value_t = 60.0)]
    pub http_body_timeout: f64,
    /// Largest request body in bytes (beyond, 413).
    #[arg(long, default_value_t = 16 << 20)]
    pub max_body_bytes: usize,
    /// Concurrent tokenizer jobs.
    #[arg(long, default_value_t = 2)]
    pub tokenizer_workers: usize,
    /// CORS origins allowed (comma-separated, or *); CORS is off without it.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Tokenize via a `tokenmill tokenizer-server` at this URL (http://host:port).
    #[arg(long)]
    pub tokenizer_endpoint: Option<String>,
    /// Enable `POST /start_profile` and `/stop_profile`, writing traces into this folder.
    #[arg(long)]
    pub profile_dir: Option<PathBuf>,
    /// How /v1/embeddings pools a prompt's final hidden states: the last token's (vLLM's
    /// default for a causal LM) or the mean over every token.
    #[arg(long, value_enum, default_value_t = PoolingArg::Last)]
    pub pooling: PoolingArg,
    /// Publish the prefix cache's changes as vLLM's KV-cache events over ZMQ, for a
    /// prefix-aware router: vLLM's JSON, e.g. '{"enable_kv_cache_events": true,
    /// "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv@HOST:PORT@MODEL"}'.
    #[arg(long, value_name = "JSON")]
    pub kv_events_config: Option<String>,
    /// Export an OpenTelemetry span per request (queue, prefill, decode) to this OTLP
    /// collector: gRPC (http://host:4317) unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is
    /// http/protobuf (then the full URL, http://host:4318/v1/traces). An incoming W3C
    /// `traceparent` is the span's parent.
    #[arg(long, value_name = "URL")]
    pub otlp_traces_endpoint: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PoolingArg {
    Last,
    Mean,
}

impl From<PoolingArg> for Pooling {
    fn from(p: PoolingArg) -> Pooling {
        match p {
            PoolingArg::Last => Pooling::Last,
            PoolingArg::Mean => Pooling::Mean,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct TokenizerServerArgs {
    /// GGUF model file whose tokenizer to serve (default: the default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 50051)]
    pub port: u16,
    /// Concurrent tokenizer jobs.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn addr(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} resolves to no address"))
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_tracing();
    if !(args.drain_timeout.is_finite() && args.drain_timeout >= 0.0) {
        bail!("--drain-timeout must be a non-negative number of seconds");
    }
    let http = http_limits(&args)?;
    let otlp = match &args.otlp_traces_endpoint {
        Some(url) => {
            let protocol = otel::Protocol::from_env().map_err(anyhow::Error::msg)?;
            Some(otel::ExportConfig::new(url, protocol).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    let kv_events = match &args.kv_events_config {
        Some(json) => {
            KvEventsConfig::parse(json).map_err(|e| anyhow::anyhow!("--kv-events-config: {e}"))?
        }
        None => None,
    };
    crate::init_threads(args.engine.threads, args.engine.activation_bits);
    let model = crate::model_path::resolve(args.engine.model.clone())?;
    let id = args
        .engine
        .model
        .as_deref()
        .and_then(crate::model_path::hf_id);
    let names = if let (true, Some(id)) = (args.served_model_name.is_empty(), &id) {
        // As vLLM: the id the model was asked for by (and the bare repository, as an alias).
        let arg = args.engine.model.as_deref().unwrap_or(&model);
        let mut names = vec![arg.display().to_string()];
        if names[0] != id.repo {
            names.push(id.repo.clone());
        }
        names
    } else if args.served_model_name.is_empty() {
        let stem = model.file_stem().map_or_else(
            || "tokenmill".to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        vec![stem]
    } else {
        args.served_model_name.clone()
    };
    let config = ServerConfig {
        served_model_names: names,
        model_path: model.display().to_string(),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        api_key_metrics: args.api_key_metrics,
        allowed_origins: args.allowed_origins.clone(),
        max_waiting_requests: args.max_waiting_requests,
        max_waiting_tokens: args.max_waiting_tokens,
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
        max_body_bytes: args.max_body_bytes,
        tokenizer_workers: args.tokenizer_workers,
        http: http.clone(),
        pooling: args.pooling.into(),
        kernels: crate::kernels_summary(),
        activation_bits: if tokenmill_kernels::dispatch::kernels().runs_a8() {
            8
        } else {
            12
        },
    };
    let rt = runtime()?;
    rt.block_on(async move {
        let bind = addr(&args.host, args.port)?;
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding {bind}"))?;
        let address = listener.local_addr()?;
        tracing::info!(%address, "listening (503 until the model is loaded)");
        let ready = async move {
            load_state(args, model, config, kv_events, otlp)
                .await
                .map_err(|e| format!("{e:#}"))
        };
        let stop = tokenmill_server::shutdown_signal();
        tokenmill_server::serve_when_ready(listener, http, ready, stop).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    // The spans of the last requests are still queued: send them before exiting.
    otel::shutdown();
    tracing::info!("bye");
    Ok(())
}

/// The connection limits of the flags (each timeout a positive number of seconds).
fn http_limits(args: &ServeArgs) -> anyhow::Result<HttpLimits> {
    let seconds = |flag: &str, s: f64| {
        if s.is_finite() && s > 0.0 && s < 1e9 {
            Ok(Duration::from_secs_f64(s))
        } else {
            Err(anyhow::anyhow!(
                "{flag} must be a positive number of seconds"
            ))
        }
    };
    if args.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    Ok(HttpLimits {
        max_connections: args.max_connections,
        header_timeout: seconds("--http-header-timeout", args.http_header_timeout)?,
        body_timeout: seconds("--http-body-timeout", args.http_body_timeout)?,
        ..HttpLimits::default()
    })
}

/// Loads the model (on a blocking thread), connects the remote tokenizer if asked, and
/// builds the server state.
async fn load_state(
    args: ServeArgs,
    model: PathBuf,
    config: ServerConfig,
    kv_events: Option<KvEventsConfig>,
    otlp: Option<otel::ExportConfig>,
) -> anyhow::Result<tokenmill_server::SharedState> {
    let engine_config = args.engine.config()?;
    let path = model.clone();
    let loaded = tokio::task::spawn_blocking(move || launch::load(&path, &engine_config)).await??;
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    tracing::info!(kernels = %crate::kernels_summary(), "kernel tier");
    let mut pool = TokenizerPool::new(loaded.tokenizer.clone(), config.tokenizer_workers);
    if let Some(url) = &args.tokenizer_endpoint {
        let remote = RemoteTokenizer::connect(url)
            .await
            .with_context(|| format!("connecting to the tokenizer service at {url}"))?;
        let info = remote
            .info()
            .await
            .map_err(|e| anyhow::anyhow!("tokenizer service at {url}: {}", e.0))?;
        if info.vocab_size as usize != loaded.tokenizer.vocab_size() {
            bail!(
                "the tokenizer service at {url} has a vocabulary of {} tokens, the model {}",
                info.vocab_size,
                loaded.tokenizer.vocab_size()
            );
        }
        pool = pool.with_remote(remote);
    }
    let c = &loaded.config;
    tracing::info!(
        model = %model.display(),
        num_blocks = c.num_blocks,
        block_size = c.block_size,
        kv_bytes_per_token = loaded.kv_bytes_per_token,
        max_model_len = c.max_model_len,
        max_num_seqs = c.max_num_seqs,
        api_key = config.api_key.is_some(),
        "loaded"
    );
    if let Some(cfg) = kv_events {
        // Before the first request, so the events cover everything the cache ever held.
        let rx = loaded.engine.subscribe_kv_events();
        let (endpoint, replay) = tokenmill_server::kv_events::start(cfg, rx)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        tracing::info!(%endpoint, replay = replay.as_deref().unwrap_or("off"), "kv events: publishing");
    }
    if args.profile_dir.is_some()
        && let Some(shape) = crate::profile::model_shape(&model, args.engine.kv_cache_dtype.into())
    {
        tokenmill_trace::set_metadata("model_shape", serde_json::to_value(shape)?);
    }
    let otel = match &otlp {
        Some(c) => {
            let t = otel::start(c).map_err(anyhow::Error::msg)?;
            tracing::info!(endpoint = %c.endpoint, protocol = ?c.protocol, "otlp traces: exporting");
            Some(t)
        }
        None => None,
    };
    let state = AppState::new(config, loaded.engine, pool)
        .with_profile_dir(args.profile_dir)
        .with_otel(otel);
    Ok(Arc::new(state))
}

pub fn run_tokenizer_server(args: TokenizerServerArgs) -> anyhow::Result<()> {
    init_tracing();
    let model = crate::model_path::resolve(args.model)?;
    let tokenizer = Arc::new(launch::load_tokenizer(&model)?);
    let rt = runtime()?;
    rt.block_on(async move {
        let bind = addr(&args.host, args.port)?;
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding {bind}"))?;
        tracing::info!(address = %listener.local_addr()?, model = %model.display(), "tokenizer service");
        tokenmill_server::grpc::serve_tokenizer(
            listener,
            tokenizer,
            args.workers,
            tokenmill_server::shutdown_signal(),
        )
        .await?;
        Ok(())
    })
}
