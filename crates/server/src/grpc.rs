//! The gRPC tokenizer service (`proto/tokenizer.proto`): [`serve_tokenizer`] serves a local
//! tokenizer (what `tokenmill tokenizer-server` runs); [`RemoteTokenizer`] is the client that
//! `tokenmill serve --tokenizer-endpoint URL` uses instead of its local pool.
//!
//! Errors keep their meaning across the wire: a request the tokenizer rejects (unknown ids, a
//! conversation the template refuses) is `INVALID_ARGUMENT` and becomes a 400 on the HTTP
//! side; a service that cannot be reached is a 503.

use std::future::Future;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokenmill_tokenizer::Tokenizer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use crate::error::ApiError;
use crate::tokenizer_pool::{TokenizerPool, render_chat_local};

/// Generated protobuf types and service stubs.
pub mod pb {
    tonic::include_proto!("tokenmill.tokenizer.v1");
}

use pb::tokenizer_client::TokenizerClient;
use pb::tokenizer_server::{Tokenizer as TokenizerRpc, TokenizerServer};

/// Largest message either side accepts (long prompts as JSON or token ids).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

fn to_status(e: ApiError) -> Status {
    if e.status.is_client_error() {
        Status::invalid_argument(e.message)
    } else {
        Status::internal(e.message)
    }
}

/// The service over a local tokenizer (work runs on the blocking pool).
pub struct TokenizerService {
    pool: TokenizerPool,
}

impl TokenizerService {
    pub fn new(tokenizer: Arc<Tokenizer>, workers: usize) -> TokenizerService {
        TokenizerService {
            pool: TokenizerPool::new(tokenizer, workers),
        }
    }
}

#[tonic::async_trait]
impl TokenizerRpc for TokenizerService {
    async fn tokenize(
        &self,
        req: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let r = req.into_inner();
        let ids = self
            .pool
            .encode(r.text, r.add_special_tokens, "text")
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::TokenizeResponse { ids }))
    }

    async fn detokenize(
        &self,
        req: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let r = req.into_inner();
        let text = self
            .pool
            .decode(r.ids, r.skip_special_tokens, "ids")
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::DetokenizeResponse { text }))
    }

    async fn render_chat(
        &self,
        req: Request<pb::RenderChatRequest>,
    ) -> Result<Response<pb::RenderChatResponse>, Status> {
        let r = req.into_inner();
        let messages: Value = serde_json::from_str(&r.messages_json)
            .map_err(|e| Status::invalid_argument(format!("messages_json: {e}")))?;
        let extra: Map<String, Value> = if r.extra_json.trim().is_empty() {
            Map::new()
        } else {
            serde_json::from_str(&r.extra_json)
                .map_err(|e| Status::invalid_argument(format!("extra_json: {e}")))?
        };
        let add = r.add_generation_prompt;
        let text = self
            .pool
            .run(move |t| render_chat_local(t, &messages, add, &extra))
            .await
            .and_then(|r| r)
            .map_err(to_status)?;
        Ok(Response::new(pb::RenderChatResponse { text }))
    }

    async fn info(
        &self,
        _req: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let t = self.pool.tokenizer();
        Ok(Response::new(pb::InfoResponse {
            vocab_size: t.vocab_size() as u32,
            bos_token_id: t.bos_token_id(),
            eos_token_id: t.eos_token_id(),
            has_chat_template: t.chat_template().is_some(),
        }))
    }
}

/// Serves the tokenizer service on `listener` until `shutdown` resolves.
pub async fn serve_tokenizer(
    listener: TcpListener,
    tokenizer: Arc<Tokenizer>,
    workers: usize,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let svc = TokenizerServer::new(TokenizerService::new(tokenizer, workers))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(svc)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await
}

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
