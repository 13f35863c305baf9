//! [`ApiError`]: every error the server answers with, in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}`.
//!
//! Client mistakes are 4xx and name the offending `param` where there is one; only failures of
//! the server itself (a crashed engine, a bug) are 5xx. Conversions from the engine's and the
//! tokenizer's typed errors decide which is which ([`ApiError::from_engine`],
//! [`ApiError::from_tokenizer`]), so no handler has to.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokenmill_engine::EngineError;
use tokenmill_tokenizer::TokenizerError;

/// One error response.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `rate_limit_exceeded`, ...
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 without a specific parameter.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the parameter at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::bad_request(message).with_param(param)
    }

    pub fn model_not_found(model: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist."),
        )
        .with_param("model");
        e.code = Some("model_not_found");
        e
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed",
        )
    }

    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body larger than {limit} bytes"),
        )
    }

    pub fn unauthorized() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect or missing API key (expected `Authorization: Bearer <key>`).",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 429: the waiting queue is full.
    pub fn overloaded(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            message,
        );
        e.code = Some("rate_limit_exceeded");
        e.retry_after = Some(1);
        e
    }

    /// 503: the server is shutting down.
    pub fn draining() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "the server is shutting down",
        );
        e.retry_after = Some(1);
        e
    }

    /// 503: the server holds as many connections as it may (`--max-connections`).
    pub fn too_many_connections(max: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            format!("the server has its maximum of {max} open connections; retry later"),
        );
        e.retry_after = Some(1);
        e
    }

    /// 408: the request body did not arrive within `--http-body-timeout`.
    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s",
                limit.as_secs_f64()
            ),
        )
    }

    /// 503: the model is still loading.
    pub fn loading() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "the model is loading",
        );
        e.retry_after = Some(1);
        e
    }

    /// 500: a failure of the server, not of the request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    /// Engine errors: a request that can never run is the client's (400); a stopped engine or
    /// a failed forward pass is ours (503 / 500).
    pub fn from_engine(e: &EngineError) -> ApiError {
        match e {
            EngineError::ExceedsMaxModelLen { .. } | EngineError::ExceedsKvCache { .. } => {
                ApiError::invalid_param("max_tokens", e.to_string())
            }
            EngineError::EmptyPrompt(_) => ApiError::invalid_param("prompt", "the prompt is empty"),
            // A grammar that compiled but failed mid-generation (its step limits).
            EngineError::Constraint { message, .. } => {
                let reason = message.trim_end_matches("<non-verbose/>").trim_end();
                ApiError::bad_request(format!("the output constraint failed: {reason}"))
            }
            EngineError::ZeroMaxTokens(_) => {
                ApiError::invalid_param("max_tokens", "max_tokens must be at least 1")
            }
            EngineError::EngineStopped => {
                let mut err = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "service_unavailable",
                    e.to_string(),
                );
                err.retry_after = Some(1);
                err
            }
            EngineError::DuplicateRequest(_)
            | EngineError::InvalidConfig(_)
            | EngineError::InvalidKvCacheMemory(_)
            | EngineError::Model(_) => ApiError::internal(e.to_string()),
        }
    }

    /// Tokenizer errors at request time: unknown ids and templates that reject (or choke on)
    /// the conversation are the client's; anything else is ours.
    pub fn from_tokenizer(e: &TokenizerError, param: &str) -> ApiError {
        match e {
            TokenizerError::TokenOutOfRange(_)
            | TokenizerError::TemplateRaised(_)
            | TokenizerError::TemplateLimit(_)
            | TokenizerError::Template(_)
            | TokenizerError::Tokenizers(_) => ApiError::invalid_param(param, e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_engine::RequestId;

    #[test]
    fn shape_and_status() {
        let e = ApiError::invalid_param("temperature", "bad");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let b = e.body();
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "bad");
        assert!(b["error"]["code"].is_null());
    }

    #[test]
    fn engine_errors_that_never_fit_are_400() {
        let e = EngineError::ExceedsKvCache {
            id: RequestId(1),
            needed_blocks: 10,
            num_blocks: 5,
        };
        assert_eq!(ApiError::from_engine(&e).status, StatusCode::BAD_REQUEST);
        let e = EngineError::EmptyPrompt(RequestId(1));
        assert_eq!(ApiError::from_engine(&e).status, StatusCode::BAD_REQUEST);
        let e = EngineError::EngineStopped;
        assert_eq!(
            ApiError::from_engine(&e).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn overload_has_retry_after() {
        let r = ApiError::overloaded("full").into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
