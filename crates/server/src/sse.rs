//! Streaming responses: server-sent events in OpenAI's framing (`data: {json}\n\n`, ending
//! with `data: [DONE]\n\n`) and vLLM `/generate`'s newline-delimited JSON.
//!
//! [`drive`] turns a generation's update stream into framed chunks: `on_update` formats
//! each update, `on_end` the tail (the usage chunk) once every choice has finished. After an
//! error chunk nothing else is pulled from the generation (dropping it aborts the other
//! choices), but the tail still runs, so an SSE stream always ends with `[DONE]`.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::Value;

use crate::output::Update;

/// One SSE `data:` frame.
pub fn sse_frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The final SSE frame.
pub fn sse_done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// One NDJSON line.
pub fn ndjson_line(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

/// Drives `updates` through the formatters; see the module doc.
pub fn drive<F, E>(
    updates: BoxStream<'static, (usize, Update)>,
    on_update: F,
    on_end: E,
) -> BoxStream<'static, Bytes>
where
    F: FnMut(usize, Update) -> Vec<Bytes> + Send + 'static,
    E: FnOnce() -> Vec<Bytes> + Send + 'static,
{
    struct St<F, E> {
        updates: Option<BoxStream<'static, (usize, Update)>>,
        on_update: F,
        on_end: Option<E>,
    }
    let st = St {
        updates: Some(updates),
        on_update,
        on_end: Some(on_end),
    };
    stream::unfold(st, |mut st| async move {
        if let Some(u) = st.updates.as_mut() {
            if let Some((i, up)) = u.next().await {
                if up.error.is_some() {
                    st.updates = None; // stop (aborts the other choices)
                }
                let frames = {
                    let _send = tokenmill_trace::scope("stream_send", "server");
                    (st.on_update)(i, up)
                };
                return Some((frames, st));
            }
            st.updates = None;
        }
        let end = st.on_end.take()?;
        Some((end(), st))
    })
    .flat_map(stream::iter)
    .boxed()
}

/// A streaming response of `content_type`.
pub fn streaming_response(body: BoxStream<'static, Bytes>, content_type: &'static str) -> Response {
    let mut resp = Response::new(Body::from_stream(body.map(Ok::<_, Infallible>)));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// An SSE response.
pub fn sse_response(body: BoxStream<'static, Bytes>) -> Response {
    streaming_response(body, "text/event-stream; charset=utf-8")
}
