//! The tokenizer service's client: what `serve --tokenizer-endpoint URL` tokenizes with.

use serde_json::{Map, Value};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::MAX_MESSAGE_BYTES;
use super::pb;
use super::pb::tokenizer_client::TokenizerClient;
use crate::error::ApiError;

/// A failed remote call.
#[derive(Debug)]
pub struct RemoteError(pub Status);

impl RemoteError {
    /// `INVALID_ARGUMENT` is the client's fault (400 naming `param`); an unreachable
    /// service is 503; anything else 500.
    pub fn to_api(&self, param: &str) -> ApiError {
        let msg = self.0.message().to_string();
        match self.0.code() {
            Code::InvalidArgument => ApiError::invalid_param(param, msg),
            Code::Unavailable | Code::DeadlineExceeded => {
                let mut e = ApiError::internal(format!("tokenizer service unavailable: {msg}"));
                e.status = axum::http::StatusCode::SERVICE_UNAVAILABLE;
                e.kind = "service_unavailable";
                e.retry_after = Some(1);
                e
            }
            _ => ApiError::internal(format!("tokenizer service: {msg}")),
        }
    }
}

/// Client of a remote tokenizer service (cheap to clone; one HTTP/2 channel).
#[derive(Clone, Debug)]
pub struct RemoteTokenizer {
    client: TokenizerClient<Channel>,
}

impl RemoteTokenizer {
    /// Connects to `url` (`http://host:port`).
    pub async fn connect(url: &str) -> Result<RemoteTokenizer, tonic::transport::Error> {
        let channel = Endpoint::from_shared(url.to_string())?.connect().await?;
        let client = TokenizerClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(RemoteTokenizer { client })
    }

    pub async fn encode(
        &self,
        text: String,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, RemoteError> {
        let req = pb::TokenizeRequest {
            text,
            add_special_tokens,
        };
        let resp = self
            .client
            .clone()
            .tokenize(req)
            .await
            .map_err(RemoteError)?;
        Ok(resp.into_inner().ids)
    }

    pub async fn decode(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, RemoteError> {
        let req = pb::DetokenizeRequest {
            ids,
            skip_special_tokens,
        };
        let resp = self
            .client
            .clone()
            .detokenize(req)
            .await
            .map_err(RemoteError)?;
        Ok(resp.into_inner().text)
    }

    pub async fn render_chat(
        &self,
        messages: &Value,
        add_generation_prompt: bool,
        extra: &Map<String, Value>,
    ) -> Result<String, RemoteError> {
        let req = pb::RenderChatRequest {
            messages_json: messages.to_string(),
            add_generation_prompt,
            extra_json: if extra.is_empty() {
                String::new()
            } else {
                Value::Object(extra.clone()).to_string()
            },
        };
        let resp = self
            .client
            .clone()
            .render_chat(req)
            .await
            .map_err(RemoteError)?;
        Ok(resp.into_inner().text)
    }

    pub async fn info(&self) -> Result<pb::InfoResponse, RemoteError> {
        let resp = self
            .client
            .clone()
            .info(pb::InfoRequest {})
            .await
            .map_err(RemoteError)?;
        Ok(resp.into_inner())
    }
}
