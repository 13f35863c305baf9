//! OpenTelemetry traces (`serve --otlp-traces-endpoint URL`): one `llm_request` span per
//! generation request, with `queue`, `prefill` and `decode` children, exported by the SDK's
//! batch span processor over OTLP — gRPC (`http://host:4317`) or HTTP protobuf
//! (`http://host:4318/v1/traces`), chosen as vLLM chooses it, by
//! `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (`grpc` by default, or `http/protobuf`).
//!
//! An incoming W3C `traceparent` (and `tracestate`) makes the request span its child, so a
//! gateway's or a client's trace continues through the worker; its sampled flag is honoured
//! (the SDK's parent-based sampler). The attributes are vLLM's `gen_ai.*` names: the request
//! id (the `X-Request-Id` the response carries), the model, the sampling parameters, prompt
//! and completion token counts, and the latencies (time in queue, to first token, prefill,
//! decode, end to end) in seconds.
//!
//! How a span gets its parent: [`context_layer`] (an axum middleware) extracts the context
//! from the headers, adds the request id, and runs the handler inside it;
//! [`RequestSpan::begin`] (at submission) picks it up as the current context; the choice's
//! runner ends the span when the choice ends, with the timings it observed. Spans are built
//! with explicit timestamps at the end, so nothing is held open across the engine's steps.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::context::FutureExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::state::SharedState;
use tokenmill_engine::FinishReason;

/// How spans travel to the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// From `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`, else
    /// gRPC (vLLM's default).
    pub fn from_env() -> Result<Protocol, String> {
        let var = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"));
        match var.as_deref() {
            Err(_) | Ok("grpc") => Ok(Protocol::Grpc),
            Ok("http/protobuf") => Ok(Protocol::HttpProtobuf),
            Ok(other) => Err(format!(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={other:?} is not supported \
                 (grpc or http/protobuf)"
            )),
        }
    }
}

/// Where spans go and how: checked when the flags are read, before the model loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    pub endpoint: String,
    pub protocol: Protocol,
}

impl ExportConfig {
    /// `endpoint` must be an `http(s)://host[:port][/path]` URL.
    pub fn new(endpoint: &str, protocol: Protocol) -> Result<ExportConfig, String> {
        let bad = |why: String| format!("--otlp-traces-endpoint {endpoint:?}: {why}");
        let uri: axum::http::Uri = endpoint.parse().map_err(|e| bad(format!("{e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(bad("expected http://host:port[/path]".into()));
        }
        Ok(ExportConfig {
            endpoint: endpoint.to_string(),
            protocol,
        })
    }
}

/// The exporter: a tracer whose spans go to the collector in batches.
pub struct Tracing {
    tracer: SdkTracer,
}

/// The provider, kept for [`shutdown`] (which flushes what is still queued).
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Starts exporting to `endpoint`. Call inside the Tokio runtime (the gRPC channel lives on
/// it); the batches are sent from the SDK's own thread. The service name is `tokenmill`
/// unless `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`) says otherwise.
pub fn start(config: &ExportConfig) -> Result<Tracing, String> {
    let endpoint = config.endpoint.as_str();
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match config.protocol {
        Protocol::Grpc => builder.with_tonic().with_endpoint(endpoint).build(),
        Protocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build(),
    }
    .map_err(|e| format!("--otlp-traces-endpoint {endpoint:?}: {e}"))?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("tokenmill");
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("tokenmill");
    let _ = PROVIDER.set(provider);
    Ok(Tracing { tracer })
}

/// Exports what is still queued and stops the exporter (blocks up to the SDK's timeout).
pub fn shutdown() {
    if let Some(p) = PROVIDER.get()
        && let Err(e) = p.shutdown()
    {
        tracing::warn!("otlp traces: {e}");
    }
}

/// The request id, carried in the request's context for its spans.
#[derive(Clone, Debug)]
struct RequestId(String);

/// Middleware: runs the handler inside the context of the request's `traceparent` (if any)
/// and its `X-Request-Id` (the id the response carries; put there by the outer layer).
pub async fn context_layer(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if state.otel.is_none() {
        return next.run(req).await;
    }
    let headers = opentelemetry_http::HeaderExtractor(req.headers());
    let mut cx = TraceContextPropagator::new().extract(&headers);
    if let Some(id) = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
    {
        cx = cx.with_value(RequestId(id.to_string()));
    }
    next.run(req).with_context(cx).await
}

/// What a request span records besides its timings.
#[derive(Clone, Debug, Default)]
pub struct RequestAttrs {
    pub model: String,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub n: usize,
    /// The choice's index when `n` > 1.
    pub choice: Option<usize>,
}

/// One choice's span, begun at submission and ended (exported) with the choice.
pub struct RequestSpan {
    tracer: SdkTracer,
    parent: Context,
    attrs: RequestAttrs,
    arrival: (Instant, SystemTime),
}

/// How a choice went, as its runner saw it.
pub struct Timings {
    /// Time in the engine's queue (from the first token's event).
    pub queue: Option<Duration>,
    pub first_token: Option<Instant>,
    pub end: Instant,
    pub completion_tokens: usize,
    /// The finish reason; `None` (or `Abort`) when the request was aborted or failed.
    pub finish_reason: Option<FinishReason>,
    pub error: Option<String>,
}

impl RequestSpan {
    /// In the handler (inside [`context_layer`]): the current context is the request's.
    pub fn begin(tracing: Option<&Tracing>, attrs: RequestAttrs) -> Option<RequestSpan> {
        let t = tracing?;
        Some(RequestSpan {
            tracer: t.tracer.clone(),
            parent: Context::current(),
            attrs,
            arrival: (Instant::now(), SystemTime::now()),
        })
    }

    /// Builds and ends the spans: `llm_request` over the whole choice, `queue` until the
    /// engine scheduled it, `prefill` until its first token, `decode` until the end.
    pub fn end(self, t: Timings) {
        let (t0, wall0) = self.arrival;
        let wall = |i: Instant| wall0 + i.saturating_duration_since(t0);
        let end = wall(t.end);
        let e2e = t.end.saturating_duration_since(t0);
        let a = &self.attrs;
        let id = self
            .parent
            .get::<RequestId>()
            .map_or_else(String::new, |r| r.0.clone());
        let mut attrs = vec![
            KeyValue::new("gen_ai.request.id", id),
            KeyValue::new("gen_ai.response.model", a.model.clone()),
            KeyValue::new("gen_ai.request.max_tokens", a.max_tokens as i64),
            KeyValue::new("gen_ai.request.temperature", f64::from(a.temperature)),
            KeyValue::new("gen_ai.request.top_p", f64::from(a.top_p)),
            KeyValue::new("gen_ai.request.n", a.n as i64),
            KeyValue::new("gen_ai.usage.prompt_tokens", a.prompt_tokens as i64),
            KeyValue::new("gen_ai.usage.completion_tokens", t.completion_tokens as i64),
            KeyValue::new("gen_ai.latency.e2e", e2e.as_secs_f64()),
        ];
        if let Some(c) = a.choice {
            attrs.push(KeyValue::new("tokenmill.choice_index", c as i64));
        }
        let finished = t.finish_reason.filter(|&r| r != FinishReason::Abort);
        if let Some(r) = finished {
            let name = crate::output::finish_reason_str(r);
            attrs.push(KeyValue::new("gen_ai.response.finish_reasons", name));
        }
        // The engine's queue time runs from its own arrival, a moment after ours.
        let first = t.first_token.map(|f| f.max(t0));
        let scheduled = match (first, t.queue) {
            (Some(f), Some(q)) => (t0 + q).min(f),
            (Some(f), None) => f,
            (None, _) => t.end,
        };
        let queue = scheduled.saturating_duration_since(t0);
        attrs.push(KeyValue::new(
            "gen_ai.latency.time_in_queue",
            queue.as_secs_f64(),
        ));
        if let Some(f) = first {
            let ttft = f.saturating_duration_since(t0).as_secs_f64();
            let prefill = f.saturating_duration_since(scheduled).as_secs_f64();
            let decode = t.end.saturating_duration_since(f).as_secs_f64();
            attrs.extend([
                KeyValue::new("gen_ai.latency.time_to_first_token", ttft),
                KeyValue::new("gen_ai.latency.time_in_model_prefill", prefill),
                KeyValue::new("gen_ai.latency.time_in_model_decode", decode),
            ]);
        }
        let mut span = self
            .tracer
            .span_builder("llm_request")
            .with_kind(SpanKind::Server)
            .with_start_time(wall0)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, &self.parent);
        match (&t.error, finished) {
            (Some(e), _) => span.set_status(Status::error(e.clone())),
            (None, None) => span.set_status(Status::error("aborted")),
            (None, Some(_)) => span.set_status(Status::Ok),
        }
        let cx = self.parent.with_span(span);
        let child = |name: &'static str, from: Instant, to: Instant, attrs: Vec<KeyValue>| {
            self.tracer
                .span_builder(name)
                .with_kind(SpanKind::Internal)
                .with_start_time(wall(from))
                .with_attributes(attrs)
                .start_with_context(&self.tracer, &cx)
                .end_with_timestamp(wall(to));
        };
        child("queue", t0, scheduled, Vec::new());
        if let Some(f) = first {
            let prompt = KeyValue::new("gen_ai.usage.prompt_tokens", a.prompt_tokens as i64);
            child("prefill", scheduled, f, vec![prompt]);
            let out = t.completion_tokens as i64;
            child(
                "decode",
                f,
                t.end,
                vec![KeyValue::new("gen_ai.usage.completion_tokens", out)],
            );
        }
        cx.span().end_with_timestamp(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_http_urls() {
        for bad in ["", "localhost:4317", "ftp://h:1", "http://", "not a url"] {
            let e = ExportConfig::new(bad, Protocol::Grpc).expect_err(bad);
            assert!(e.contains("--otlp-traces-endpoint"), "{bad}: {e}");
        }
        for good in ["http://127.0.0.1:4317", "https://collector/v1/traces"] {
            assert!(
                ExportConfig::new(good, Protocol::HttpProtobuf).is_ok(),
                "{good}"
            );
        }
    }
}
