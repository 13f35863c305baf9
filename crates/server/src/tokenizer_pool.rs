//! [`TokenizerPool`]: where tokenization, chat rendering and detokenization run.
//!
//! Never on the async runtime (a long prompt would stall every connection on that worker)
//! and never on the engine thread: jobs run on tokio's blocking pool, at most `workers` at a
//! time (a semaphore), so a burst of huge prompts cannot take every core from the engine.
//! The streaming detokenization of outputs has a lane of its own ([`TokenizerPool::run_output`],
//! its own `workers` permits): its jobs are a few tokens each, and a burst of long prompts
//! waiting for the prompt lane cannot stall the text of the streams already running.
//!
//! With a remote tokenizer (`serve --tokenizer-endpoint`), prompt tokenization, chat
//! rendering and `/tokenize` / `/detokenize` go to the gRPC tokenizer service instead;
//! the per-token streaming detokenization of outputs stays local (a network round trip per
//! token would cost more than the work), which is exact because both sides load the same
//! tokenizer from the same model file.

use std::sync::Arc;

use serde_json::{Map, Value};
use tokenmill_tokenizer::Tokenizer;
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::grpc::client::RemoteTokenizer;

#[derive(Clone)]
pub struct TokenizerPool {
    local: Arc<Tokenizer>,
    /// The prompt lane: tokenization, chat rendering, `/detokenize`.
    permits: Arc<Semaphore>,
    /// The output lane: per-token detokenization of running streams.
    output_permits: Arc<Semaphore>,
    remote: Option<RemoteTokenizer>,
}

impl TokenizerPool {
    pub fn new(tokenizer: Arc<Tokenizer>, workers: usize) -> TokenizerPool {
        TokenizerPool {
            local: tokenizer,
            permits: Arc::new(Semaphore::new(workers.max(1))),
            output_permits: Arc::new(Semaphore::new(workers.max(1))),
            remote: None,
        }
    }

    /// Sends tokenize / detokenize / chat-render requests to a remote tokenizer service.
    pub fn with_remote(mut self, remote: RemoteTokenizer) -> TokenizerPool {
        self.remote = Some(remote);
        self
    }

    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The local tokenizer (special token ids, vocabulary size, ...: cheap lookups only).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.local
    }

    /// Runs `f` on the blocking pool with the local tokenizer, in the prompt lane.
    pub async fn run<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Tokenizer) -> T + Send + 'static,
    {
        self.run_in(&self.permits, f).await
    }

    /// Runs `f` like [`Self::run`], in the output lane (running streams' detokenization).
    pub async fn run_output<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Tokenizer) -> T + Send + 'static,
    {
        self.run_in(&self.output_permits, f).await
    }

    async fn run_in<T, F>(&self, lane: &Arc<Semaphore>, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Tokenizer) -> T + Send + 'static,
    {
        // The permit moves into the job: a caller that goes away (client disconnect) does
        // not free its slot while the job still runs.
        let permit = lane
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("tokenizer pool closed"))?;
        let tok = self.local.clone();
        tokio::task::spawn_blocking(move || {
            let out = f(&tok);
            drop(permit);
            out
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))
    }

    /// Token ids of `text`; errors name `param`.
    pub async fn encode(
        &self,
        text: String,
        add_special_tokens: bool,
        param: &'static str,
    ) -> Result<Vec<u32>, ApiError> {
        if let Some(r) = &self.remote {
            return r
                .encode(text, add_special_tokens)
                .await
                .map_err(|e| e.to_api(param));
        }
        self.run(move |t| {
            let _s = tokenmill_trace::scope("tokenize", "server");
            t.encode(&text, add_special_tokens)
        })
        .await?
        .map_err(|e| ApiError::from_tokenizer(&e, param))
    }

    /// Text of `ids`; errors name `param`.
    pub async fn decode(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
        param: &'static str,
    ) -> Result<String, ApiError> {
        if let Some(r) = &self.remote {
            return r
                .decode(ids, skip_special_tokens)
                .await
                .map_err(|e| e.to_api(param));
        }
        self.run(move |t| t.decode(&ids, skip_special_tokens))
            .await?
            .map_err(|e| ApiError::from_tokenizer(&e, param))
    }

    /// Renders chat `messages` (OpenAI JSON) with the model's template; `extra` adds template
    /// variables (`tools`, `chat_template_kwargs`).
    pub async fn render_chat(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        extra: Map<String, Value>,
    ) -> Result<String, ApiError> {
        if let Some(r) = &self.remote {
            return r
                .render_chat(&messages, add_generation_prompt, &extra)
                .await
                .map_err(|e| e.to_api("messages"));
        }
        self.run(move |t| render_chat_local(t, &messages, add_generation_prompt, &extra))
            .await?
    }
}

/// Chat rendering against a local tokenizer (also what the gRPC service runs).
pub fn render_chat_local(
    tok: &Tokenizer,
    messages: &Value,
    add_generation_prompt: bool,
    extra: &Map<String, Value>,
) -> Result<String, ApiError> {
    let template = tok.chat_template().ok_or_else(|| {
        ApiError::invalid_param(
            "messages",
            "the model has no chat template; use /v1/completions",
        )
    })?;
    template
        .render_json(messages, add_generation_prompt, extra)
        .map_err(|e| ApiError::from_tokenizer(&e, "messages"))
}
