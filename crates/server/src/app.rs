//! The router, its middleware, and serving with a graceful drain.
//!
//! Connections (the cap, header and idle timeouts, header limits) are [`crate::conn`]'s.
//!
//! Layers, outermost first: CORS (only with `allowed_origins`), request log + rejection
//! counting + the `X-Request-Id` of every response (the client's, or a fresh one), the
//! OpenTelemetry context (the `traceparent`, with `--otlp-traces-endpoint`), the drain gate
//! (POSTs get 503 once draining), the API key (every route but
//! `/health`, and `/metrics` unless `api_key_metrics`), the body limit (413). Unknown routes
//! are 404 and wrong methods 405, both in OpenAI's error shape.
//!
//! Loading ([`serve_when_ready`]): the listener is up while the model loads and every route,
//! `/health` included, answers 503 until the state is ready.
//!
//! Drain ([`serve`]): when `shutdown` resolves, `/health` turns 503 and new work (POSTs) is
//! refused with 503 while in-flight requests — streams included — run to their end; once
//! none is left (or `drain_timeout` passed) the listener closes, open connections get a
//! moment to flush their last frames, and [`serve`] returns `Ok`. Whatever is still running
//! then is dropped, which aborts it in the engine.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

use crate::conn::{self, HttpLimits};
use crate::error::ApiError;
use crate::metrics::RejectReason;
use crate::routes::{
    chat, completions, dashboard, embeddings, generate, info, profile, responses, tokenize,
};
use crate::state::SharedState;

/// The full application router.
pub fn router(state: SharedState) -> Router {
    let mut protected = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(info::models))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route("/generate", post(generate::generate))
        .route("/server_info", get(info::server_info))
        .route("/version", get(info::version))
        .route("/start_profile", post(profile::start_profile))
        .route("/stop_profile", post(profile::stop_profile));
    let mut open = Router::new()
        .route("/health", get(info::health))
        .route("/dashboard", get(dashboard::dashboard));
    if state.config.api_key_metrics {
        protected = protected.route("/metrics", get(info::metrics));
    } else {
        open = open.route("/metrics", get(info::metrics));
    }
    let protected = protected.route_layer(middleware::from_fn_with_state(
        state.clone(),
        require_api_key,
    ));
    let mut app = open
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), drain_gate))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::otel::context_layer,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), log_and_count))
        .with_state(state.clone());
    if let Some(cors) = cors_layer(&state.config.allowed_origins) {
        app = app.layer(cors);
    }
    app
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let layer = CorsLayer::new().allow_methods(Any).allow_headers(Any);
    if origins.iter().any(|o| o == "*") {
        return Some(layer.allow_origin(Any));
    }
    let list: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    Some(layer.allow_origin(AllowOrigin::list(list)))
}

/// Whether `token` equals `key`, in time independent of where they differ.
pub fn key_matches(token: &str, key: &str) -> bool {
    token.len() == key.len() && bool::from(token.as_bytes().ct_eq(key.as_bytes()))
}

async fn require_api_key(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let Some(key) = &state.config.api_key else {
        return next.run(req).await;
    };
    let ok = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.strip_prefix("Bearer "))
        .is_some_and(|token| key_matches(token.trim(), key));
    if !ok {
        state.metrics.reject(RejectReason::Unauthorized);
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

/// Once draining, new work (POSTs) is refused with 503.
async fn drain_gate(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if state.is_draining() && req.method() == Method::POST {
        state.metrics.reject(RejectReason::Draining);
        return ApiError::draining().into_response();
    }
    next.run(req).await
}

/// Logs each request (method, path, status, time; never bodies) and counts client errors
/// other than 401/429, which are counted where they are decided.
/// The request's id: the client's `X-Request-Id` when it is 1 to 128 visible ASCII
/// characters, else a fresh 32-hex-digit one.
fn request_id(req: &Request) -> HeaderValue {
    req.headers()
        .get("x-request-id")
        .filter(|v| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(|| {
            let id = format!("{:032x}", rand::random::<u128>());
            HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("unknown"))
        })
}

async fn log_and_count(State(state): State<SharedState>, mut req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let id = request_id(&req);
    // Inner layers (the trace context) see the id the response will carry.
    req.headers_mut().insert("x-request-id", id.clone());
    let t = Instant::now();
    let mut resp = next.run(req).await;
    // Every answer, errors included, names its request (as OpenAI's and vLLM's do).
    resp.headers_mut().insert("x-request-id", id.clone());
    let request_id = id.to_str().unwrap_or("");
    let status = resp.status();
    if status.is_client_error()
        && status != StatusCode::TOO_MANY_REQUESTS
        && status != StatusCode::UNAUTHORIZED
    {
        state.metrics.reject(RejectReason::InvalidRequest);
    }
    if tokenmill_trace::enabled() {
        trace_http(&path, status, t);
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if path == "/health" || path == "/metrics" {
        tracing::debug!(%method, %path, status = status.as_u16(), ms, request_id, "request");
    } else {
        tracing::info!(%method, %path, status = status.as_u16(), ms, request_id, "request");
    }
    resp
}

/// Trace: one async `http` span per request, from receipt to the response head (validation,
/// tokenization and submission; a stream's frames are `stream_send` scopes).
fn trace_http(path: &str, status: StatusCode, start: Instant) {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 40);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let args = [
        ("path", tokenmill_trace::Arg::Text(path.to_string())),
        ("status", i64::from(status.as_u16()).into()),
    ];
    tokenmill_trace::async_span("http", "server", id, start, Instant::now(), &args);
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then drains (module doc); its
/// connections under `state.config.http`.
pub async fn serve(
    listener: TcpListener,
    state: SharedState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The state is ready now: fill the slot before the first connection is accepted, so no
    // request can see the loading answer (the ready future below is only polled alongside
    // the first connections).
    let slot: Slot = Arc::default();
    let _ = slot.set((state.clone(), router(state.clone())));
    let limits = state.config.http.clone();
    let ready = async move { Ok::<_, std::convert::Infallible>(state) };
    serve_with_slot(listener, limits, slot, ready, shutdown).await
}

/// The state and its router once loaded (empty while loading).
type Slot = Arc<OnceLock<(SharedState, Router)>>;

/// Like [`serve`], but the state arrives when `ready` resolves (the model loads meanwhile):
/// until then every route, `/health` included, answers 503. A failed `ready` ends the
/// server with its error; a `shutdown` while loading ends it at once. Connections are
/// accepted before the state exists, so their `limits` come separately.
pub async fn serve_when_ready<E: std::fmt::Display + 'static>(
    listener: TcpListener,
    limits: HttpLimits,
    ready: impl Future<Output = Result<SharedState, E>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_slot(listener, limits, Slot::default(), ready, shutdown).await
}

/// [`serve_when_ready`] with the slot the state goes into (already filled by [`serve`]).
async fn serve_with_slot<E: std::fmt::Display + 'static>(
    listener: TcpListener,
    limits: HttpLimits,
    slot: Slot,
    ready: impl Future<Output = Result<SharedState, E>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = loading_router(slot.clone());
    let drain = Drain::default();
    let address = listener.local_addr().ok();
    let drained = drain.clone().run(slot.clone(), address, ready, shutdown);
    let counted = slot.clone();
    let on_refused = move || {
        if let Some((state, _)) = counted.get() {
            state.metrics.reject(RejectReason::MaxConnections);
        }
    };
    let server = conn::serve(listener, app, limits, on_refused, drained);
    tokio::pin!(server);
    let failure = |r: std::io::Result<()>| match lock(&drain.failed).take() {
        Some(e) => Err(std::io::Error::other(e)),
        None => r,
    };
    tokio::select! {
        r = &mut server => return failure(r),
        _ = drain.closing.notified() => {}
    }
    // The listener is closed; let open connections flush their last frames.
    let until = lock(&drain.deadline).unwrap_or_else(Instant::now);
    let grace = until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    match tokio::time::timeout(grace, &mut server).await {
        Ok(r) => {
            tracing::info!("drained");
            r
        }
        Err(_) => {
            let in_flight = slot.get().map_or(0, |(s, _)| s.in_flight());
            tracing::warn!(
                in_flight,
                "drain timeout: dropping the requests still in flight"
            );
            Ok(())
        }
    }
}

/// Every request goes to the served router once the slot holds one; before, 503 "loading".
fn loading_router(slot: Slot) -> Router {
    Router::new().fallback(move |req: Request| {
        let slot = slot.clone();
        async move {
            match slot.get() {
                Some((_, router)) => match router.clone().oneshot(req).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                },
                None => {
                    let mut resp = ApiError::loading().into_response();
                    resp.headers_mut().insert("x-request-id", request_id(&req));
                    resp
                }
            }
        }
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the load-and-drain task tells the serving loop.
#[derive(Clone, Default)]
struct Drain {
    /// When the drain must end (set at shutdown).
    deadline: Arc<Mutex<Option<Instant>>>,
    /// Why loading failed, if it did.
    failed: Arc<Mutex<Option<String>>>,
    /// Notified once in-flight work is done (or the drain timed out).
    closing: Arc<Notify>,
}

impl Drain {
    /// Waits for the state (or a shutdown first), serves it, and on shutdown drains: still
    /// accepting, /health says 503, new work gets 503, running work finishes until the
    /// deadline. Returning closes the listener.
    async fn run<E: std::fmt::Display + 'static>(
        self,
        slot: Slot,
        address: Option<std::net::SocketAddr>,
        ready: impl Future<Output = Result<SharedState, E>>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let state = tokio::select! {
            _ = &mut shutdown => return,
            r = ready => match r {
                Ok(state) => state,
                Err(e) => {
                    *lock(&self.failed) = Some(e.to_string());
                    return;
                }
            },
        };
        if slot.get().is_none() {
            let _ = slot.set((state.clone(), router(state.clone())));
        }
        match address {
            Some(address) => tracing::info!(%address, model = state.model_name(), "serving"),
            None => tracing::info!(model = state.model_name(), "serving"),
        }
        shutdown.await;
        let timeout = state.config.drain_timeout;
        let until = Instant::now() + timeout;
        *lock(&self.deadline) = Some(until);
        state.start_draining();
        tracing::info!(
            timeout_s = timeout.as_secs_f64(),
            in_flight = state.in_flight(),
            "shutting down: draining in-flight requests"
        );
        while state.in_flight() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.closing.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_exactly() {
        assert!(key_matches("secret", "secret"));
        assert!(!key_matches("secreT", "secret"));
        assert!(!key_matches("secret2", "secret"));
        assert!(!key_matches("", "secret"));
    }
}
