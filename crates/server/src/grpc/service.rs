//! The tokenizer service: serves a local tokenizer over gRPC, its jobs on a tokenizer pool.

use std::future::Future;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokenmill_tokenizer::Tokenizer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::MAX_MESSAGE_BYTES;
use super::pb;
use super::pb::tokenizer_server::{Tokenizer as TokenizerRpc, TokenizerServer};
use crate::error::ApiError;
use crate::tokenizer_pool::{TokenizerPool, render_chat_local};

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
