//! From validated token ids to a stream of per-choice [`Update`]s: admission, submission of
//! one engine request per choice (`n` per prompt, sharing the prompt, so the prefix cache
//! serves the copies), the per-choice event loop, and request metrics.
//!
//! Each choice is a [`ChoiceRunner`] owning its [`RequestStream`]: it waits for engine
//! events, drains whatever else is already queued, and hands the batch to its
//! [`OutputProcessor`] on the tokenizer pool's output lane. Choices are merged with
//! `select_all`.
//!
//! Cancellation is ownership: the response body (streaming) or the handler future
//! (non-streaming) owns the runners; when the client goes away hyper drops it, each
//! `RequestStream` drops, and the engine aborts the request and frees its blocks at its next
//! step — whether it was queued or running. A choice ended by a stop string drops its stream
//! the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures_util::FutureExt;
use futures_util::stream::{self, BoxStream, StreamExt};
use tokenmill_engine::{FinishReason, RequestParams, RequestStream, StreamEvent};

use crate::admission::WaitingTicket;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::otel::{RequestAttrs, RequestSpan, Timings};
use crate::output::{Finish, OutputOptions, OutputProcessor, TokenLogprob, Update};
use crate::state::AppState;
use crate::tokenizer_pool::TokenizerPool;

/// A validated generation: prompts as ids, `n` choices each.
pub struct GenerationRequest {
    pub prompts: Vec<Vec<u32>>,
    /// Output limit per prompt (resolved against the context).
    pub max_tokens: Vec<usize>,
    pub n: usize,
    pub params: RequestParams,
    pub output: OutputOptions,
}

/// The running choices of one HTTP request.
pub struct Generation {
    runners: Vec<ChoiceRunner>,
    /// Prompt lengths, per prompt.
    pub prompt_lens: Vec<usize>,
    pub n: usize,
}

/// A finished choice, collected (non-streaming responses).
#[derive(Debug, Default)]
pub struct ChoiceResult {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    /// Prompt logprobs, one per prompt token from the second on.
    pub prompt_logprobs: Vec<TokenLogprob>,
    pub finish: Option<Finish>,
}

/// Admits and submits `req`: prompt `i`, choice `j` becomes choice index `i * n + j`.
/// With a seed, choice `j` samples with `seed + j` (reproducible, yet distinct choices).
pub fn submit(state: &AppState, req: GenerationRequest) -> Result<Generation, ApiError> {
    let lens: Vec<usize> = req
        .prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.len(), req.n))
        .collect();
    let tickets = state.admission.admit(&lens, &state.metrics)?;
    let mut tickets = tickets.into_iter();
    let mut runners = Vec::with_capacity(lens.len());
    for (i, (prompt, &max_tokens)) in req.prompts.iter().zip(&req.max_tokens).enumerate() {
        for j in 0..req.n {
            let mut params = req.params.clone();
            params.max_tokens = Some(max_tokens);
            params.sampling.seed = params.sampling.seed.map(|s| s.wrapping_add(j as u64));
            let Some(ticket) = tickets.next() else {
                return Err(ApiError::internal("admission ticket count mismatch"));
            };
            state.in_flight.fetch_add(1, Ordering::SeqCst);
            let span = RequestSpan::begin(
                state.otel.as_ref(),
                RequestAttrs {
                    model: state.model_name().to_string(),
                    prompt_tokens: prompt.len(),
                    max_tokens,
                    temperature: params.sampling.temperature,
                    top_p: params.sampling.top_p,
                    n: req.n,
                    choice: (req.n > 1).then_some(j),
                },
            );
            let stream = state.engine.submit(prompt.clone(), params);
            let processor = OutputProcessor::new(state.pool.tokenizer(), req.output.clone());
            runners.push(ChoiceRunner {
                index: i * req.n + j,
                stream: Some(stream),
                processor: Some(processor),
                pool: state.pool.clone(),
                ticket,
                metrics: state.metrics.clone(),
                prompt_len: prompt.len(),
                arrival: Instant::now(),
                last_token: None,
                num_tokens: 0,
                ended: false,
                in_flight: state.in_flight.clone(),
                span,
                queue_time: None,
                first_token: None,
                error: None,
            });
        }
    }
    Ok(Generation {
        runners,
        prompt_lens: req.prompts.iter().map(Vec::len).collect(),
        n: req.n,
    })
}

impl Generation {
    /// Number of choices.
    pub fn len(&self) -> usize {
        self.runners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runners.is_empty()
    }

    /// All choices' updates as they come, tagged with the choice index. Dropping the stream
    /// aborts every unfinished choice.
    pub fn into_stream(self) -> BoxStream<'static, (usize, Update)> {
        let streams = self.runners.into_iter().map(|r| {
            stream::unfold(r, |mut r| async move {
                let up = r.next_update().await?;
                Some(((r.index, up), r))
            })
            .boxed()
        });
        stream::select_all(streams).boxed()
    }

    /// Runs every choice to the end; the first error fails the whole request (and aborts
    /// the other choices).
    pub async fn collect(self) -> Result<Vec<ChoiceResult>, ApiError> {
        let mut results: Vec<ChoiceResult> = (0..self.runners.len())
            .map(|_| ChoiceResult::default())
            .collect();
        let mut s = self.into_stream();
        while let Some((i, up)) = s.next().await {
            if let Some(e) = up.error {
                return Err(e);
            }
            let r = &mut results[i];
            r.text.push_str(&up.text);
            r.token_ids.extend(up.token_ids);
            r.logprobs.extend(up.logprobs);
            r.prompt_logprobs.extend(up.prompt_logprobs);
            if up.finish.is_some() {
                r.finish = up.finish;
            }
        }
        Ok(results)
    }
}

/// One choice: its engine stream, its output processor, its timing.
struct ChoiceRunner {
    index: usize,
    /// `None` once the choice has ended (dropping it aborts an unfinished engine request).
    stream: Option<RequestStream>,
    processor: Option<OutputProcessor>,
    pool: TokenizerPool,
    ticket: WaitingTicket,
    metrics: Arc<Metrics>,
    prompt_len: usize,
    arrival: Instant,
    last_token: Option<Instant>,
    num_tokens: usize,
    /// Whether the end was recorded in the metrics.
    ended: bool,
    /// The server's count of live choices (decremented on drop).
    in_flight: Arc<AtomicUsize>,
    /// The OpenTelemetry span, when traces are exported; ended with the choice.
    span: Option<RequestSpan>,
    queue_time: Option<std::time::Duration>,
    first_token: Option<Instant>,
    /// The engine's error, if the choice failed.
    error: Option<String>,
}

fn is_terminal(ev: &StreamEvent) -> bool {
    match ev {
        StreamEvent::Token(t) => t.finish_reason.is_some(),
        StreamEvent::Error(_) | StreamEvent::Embedding(_) => true,
        StreamEvent::PromptLogprobs { .. } => false,
    }
}

impl ChoiceRunner {
    /// The next update, or `None` once the choice has ended.
    async fn next_update(&mut self) -> Option<Update> {
        let stream = self.stream.as_mut()?;
        let Some(first) = stream.next().await else {
            self.end(None);
            return Some(Update::error(ApiError::internal(
                "the engine dropped the request",
            )));
        };
        let mut events = vec![first];
        // Drain what is already there: one trip to the tokenizer pool per batch.
        while !events.last().is_some_and(is_terminal) {
            match stream.next().now_or_never() {
                Some(Some(ev)) => events.push(ev),
                _ => break,
            }
        }
        self.observe(&events);
        let mut processor = self.processor.take()?;
        let result = self
            .pool
            .run_output(move |tok| {
                let _s = tokenmill_trace::scope("detokenize", "server");
                let up = processor.process(tok, events);
                (processor, up)
            })
            .await;
        let up = match result {
            Ok((p, up)) => {
                self.processor = Some(p);
                up
            }
            Err(e) => Update::error(e),
        };
        self.num_tokens += up.token_ids.len();
        if up.is_last() {
            self.end(up.finish.as_ref().map(|f| f.reason));
        }
        Some(up)
    }

    /// Timing metrics for a batch of events just received.
    fn observe(&mut self, events: &[StreamEvent]) {
        let now = Instant::now();
        for ev in events {
            if let StreamEvent::Error(e) = ev {
                self.error = Some(e.to_string());
                continue;
            }
            self.ticket.release();
            let StreamEvent::Token(token) = ev else {
                continue;
            };
            match self.last_token {
                None => {
                    let queue = token.queue_time.unwrap_or_default();
                    self.metrics
                        .first_token(self.prompt_len, now - self.arrival, queue);
                    (self.queue_time, self.first_token) = (token.queue_time, Some(now));
                }
                Some(prev) => self.metrics.inter_token(now - prev),
            }
            self.last_token = Some(now);
        }
    }

    /// The choice is over: drop the engine stream (aborting it if unfinished) and record.
    fn end(&mut self, reason: Option<FinishReason>) {
        self.stream = None;
        if !self.ended {
            self.ended = true;
            self.metrics
                .finished(reason, self.num_tokens, self.arrival.elapsed());
            if let Some(span) = self.span.take() {
                span.end(Timings {
                    queue: self.queue_time,
                    first_token: self.first_token,
                    end: Instant::now(),
                    completion_tokens: self.num_tokens,
                    finish_reason: reason,
                    error: self.error.take(),
                });
            }
        }
    }
}

impl Drop for ChoiceRunner {
    fn drop(&mut self) {
        // Dropped before its end: the client went away.
        self.end(None);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
