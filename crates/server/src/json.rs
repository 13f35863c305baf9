//! Request bodies: [`JsonBody`] reads a body that must be one JSON object, and [`Fields`]
//! reads typed, range-checked fields out of it.
//!
//! Every failure is a 4xx [`ApiError`]: a body over the limit is 413, one that does not
//! arrive whole within the body timeout 408, invalid UTF-8 and malformed JSON are 400, a
//! field of the wrong type or out of range is 400 naming the field.
//! Fields are read by name rather than through `#[derive(Deserialize)]` structs so that each
//! error can say exactly which parameter is wrong and why, and so that unknown fields are
//! ignored (as OpenAI's and vLLM's servers do). `null` reads as absent everywhere.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::state::SharedState;

/// How much of a body over the limit is still read (and dropped) before the 413 goes out.
pub const DRAIN_MAX_BYTES: usize = 64 << 20;
/// How long that draining may take.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A request body that is a JSON object.
pub struct JsonBody(pub Fields);

impl FromRequest<SharedState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &SharedState) -> Result<Self, Self::Rejection> {
        let http = &state.config.http;
        let read = read_limited(req, state.config.max_body_bytes);
        let bytes = tokio::time::timeout(http.body_timeout, read)
            .await
            .map_err(|_| ApiError::body_timeout(http.body_timeout))??;
        parse_object(&bytes).map(|m| JsonBody(Fields(m)))
    }
}

fn too_large() -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        ..ApiError::bad_request("the request body is larger than the server's limit")
    }
}

/// The body of `req`, at most `limit` bytes. A larger body is read on and dropped — up to
/// [`DRAIN_MAX_BYTES`] within [`DRAIN_TIMEOUT`] — before the 413, so a client that writes
/// its whole body before reading the answer (Python's `urllib`, most SDKs) gets the 413
/// instead of a connection reset. A body that declares more than that is refused at once.
pub async fn read_limited(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > DRAIN_MAX_BYTES) {
        return Err(too_large());
    }
    let mut stream = Body::into_data_stream(req.into_body());
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            let mut seen = buf.len() + chunk.len();
            let drain = async {
                while let Some(Ok(c)) = stream.next().await {
                    seen += c.len();
                    if seen > DRAIN_MAX_BYTES {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Parses a body that must be a JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::bad_request(format!("malformed JSON: {e}"))),
    }
}

/// Typed access to the fields of a JSON object.
#[derive(Clone, Debug, Default)]
pub struct Fields(pub Map<String, Value>);

fn type_error(name: &str, expected: &str) -> ApiError {
    ApiError::invalid_param(name, format!("`{name}` must be {expected}"))
}

impl Fields {
    /// The field, or `None` if absent or `null`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(type_error(name, "a boolean")),
        }
    }

    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, ApiError> {
        Ok(self.bool(name)?.unwrap_or(default))
    }

    pub fn str(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(type_error(name, "a string")),
        }
    }

    /// A finite number.
    pub fn f64(&self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(type_error(name, "a finite number")),
            },
            Some(_) => Err(type_error(name, "a number")),
        }
    }

    /// A number in `[lo, hi]`, or `default` when absent.
    pub fn f64_in(&self, name: &str, default: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
        let x = self.f64(name)?.unwrap_or(default);
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::invalid_param(
                name,
                format!("`{name}` must be between {lo} and {hi}, got {x}"),
            ));
        }
        Ok(x)
    }

    /// An integer (a number with no fractional part).
    pub fn i64(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => as_i64(v)
                .map(Some)
                .ok_or_else(|| type_error(name, "an integer")),
        }
    }

    /// An integer in `[lo, hi]`, or `None` when absent.
    pub fn i64_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.i64(name)? {
            Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid_param(
                name,
                format!("`{name}` must be between {lo} and {hi}, got {x}"),
            )),
            x => Ok(x),
        }
    }
}

/// An integer JSON value (`3`, `3.0`; not `3.5`, not `"3"`).
pub fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            let f = n.as_f64()?;
            (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Fields {
        Fields(v.as_object().unwrap().clone())
    }

    #[test]
    fn parses_only_objects() {
        assert!(parse_object(b"{\"a\": 1}").is_ok());
        for bad in [&b"[1]"[..], b"", b"{", b"\xff\xfe", b"   "] {
            let e = parse_object(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
        assert!(
            parse_object(b"\"\xff\"")
                .unwrap_err()
                .message
                .contains("UTF-8")
        );
    }

    #[test]
    fn typed_fields_name_the_param() {
        let f = fields(json!({"t": "hot", "n": 2.0, "x": 2.5, "b": 1, "z": null}));
        assert_eq!(f.f64("t").unwrap_err().param.as_deref(), Some("t"));
        assert_eq!(f.i64("n").unwrap(), Some(2));
        assert_eq!(f.i64("x").unwrap_err().param.as_deref(), Some("x"));
        assert_eq!(f.bool("b").unwrap_err().param.as_deref(), Some("b"));
        assert_eq!(f.i64("z").unwrap(), None);
        assert_eq!(f.i64_in("n", 3, 5).unwrap_err().param.as_deref(), Some("n"));
        assert_eq!(f.f64_in("missing", 1.0, 0.0, 2.0).unwrap(), 1.0);
    }
}
