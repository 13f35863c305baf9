//! The engine thread and its handle.
//!
//! The engine thread owns the [`Scheduler`], the [`ModelRunner`] (model, KV storage,
//! workspace, samplers) and the per-request output senders outright; nothing is shared but
//! a small stats snapshot. One command channel comes in ([`EngineHandle`] is a cloneable
//! sender), one channel per request goes out ([`RequestStream`]). Dropping a stream aborts
//! its request, as does a send that finds the receiver gone; the scheduler frees the blocks
//! at the next step.
//!
//! The loop (`EngineLoop::step`) reads like vLLM's `EngineCore.step()`:
//! schedule → execute → record step time → update from output → send events.
//!
//! While a trace session runs (`tokenmill-trace`), each step is a `step` event holding
//! `schedule`, `execute_model` (the runner's `prepare_batch`, `forward` with the model's
//! ops, `sample`) and `update`; counters track the batch, KV usage and the queues; each
//! request's queue wait is an async `queue` span.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::error::EngineError;
use crate::kv_events::KvEventBatch;
use crate::request::{Request, RequestId, RequestParams};
use crate::runner::{ModelRunner, PromptLogprob, StepResult};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerStats};
use crate::scheduler_output::{RequestOutput, SchedulerOutput, TokenOutput};

/// What a [`RequestStream`] yields.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// Logprobs of prompt tokens `start..` (only when asked for), before the first token.
    PromptLogprobs {
        start: usize,
        logprobs: Vec<PromptLogprob>,
    },
    Token(TokenOutput),
    /// An embedding request's pooled vector (`RequestParams::pooling`); nothing follows.
    Embedding(Vec<f32>),
    /// The request was rejected or failed; nothing follows.
    Error(EngineError),
}

/// Counters and gauges for metrics, refreshed after every step.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    pub scheduler: SchedulerStats,
    pub steps: u64,
    /// Sequences and tokens in the last step.
    pub last_batch_seqs: usize,
    pub last_batch_tokens: usize,
    pub last_step_predicted: Duration,
    pub last_step_measured: Duration,
    /// KV-cache bytes one token takes over all layers (the latent formula for MLA models).
    pub kv_bytes_per_token: usize,
}

enum Command {
    Add {
        req: Box<Request>,
        tx: UnboundedSender<StreamEvent>,
    },
    Abort(RequestId),
    /// From now on, every step's prefix-cache events go to this sender.
    SubscribeKvEvents(UnboundedSender<KvEventBatch>),
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
    stats: Arc<Mutex<EngineStats>>,
    config: Arc<SchedulerConfig>,
    embedding_dim: usize,
}

/// The outputs of one request; dropping it aborts the request.
pub struct RequestStream {
    pub id: RequestId,
    rx: UnboundedReceiver<StreamEvent>,
    abort: Option<Sender<Command>>,
}

impl RequestStream {
    /// Next event (async); `None` once the request finished.
    pub async fn next(&mut self) -> Option<StreamEvent> {
        let ev = self.rx.recv().await;
        self.note_end(&ev);
        ev
    }

    /// Next event, blocking the calling thread (not for async contexts).
    pub fn blocking_next(&mut self) -> Option<StreamEvent> {
        let ev = self.rx.blocking_recv();
        self.note_end(&ev);
        ev
    }

    /// After the final event there is nothing left to abort.
    fn note_end(&mut self, ev: &Option<StreamEvent>) {
        let done = match ev {
            None | Some(StreamEvent::Error(_) | StreamEvent::Embedding(_)) => true,
            Some(StreamEvent::Token(t)) => t.finish_reason.is_some(),
            Some(StreamEvent::PromptLogprobs { .. }) => false,
        };
        if done {
            self.abort = None;
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if let Some(tx) = self.abort.take() {
            let _ = tx.send(Command::Abort(self.id));
        }
    }
}

impl EngineHandle {
    /// Submits a prompt; events arrive on the returned stream. A request that can never run
    /// (too long for the model or the KV cache) yields one [`StreamEvent::Error`].
    pub fn submit(&self, prompt: Vec<u32>, params: RequestParams) -> RequestStream {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = unbounded_channel();
        let req = Box::new(Request::new(id, prompt, params));
        if let Err(mpsc::SendError(Command::Add { tx, .. })) =
            self.tx.send(Command::Add { req, tx })
        {
            let _ = tx.send(StreamEvent::Error(EngineError::EngineStopped));
        }
        RequestStream {
            id,
            rx,
            abort: Some(self.tx.clone()),
        }
    }

    /// The prefix cache's events from now on, one [`KvEventBatch`] per step that changed it
    /// (vLLM's KV-cache events; a later call replaces the subscriber). Subscribe before the
    /// first request for a complete picture.
    pub fn subscribe_kv_events(&self) -> UnboundedReceiver<KvEventBatch> {
        let (tx, rx) = unbounded_channel();
        let _ = self.tx.send(Command::SubscribeKvEvents(tx));
        rx
    }

    /// Cancels a request; its blocks are freed at the next step.
    pub fn abort(&self, id: RequestId) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// The latest stats snapshot.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Length of the vectors embedding requests return (the model's hidden size).
    pub fn embedding_dim(&self) -> usize {
        self.embedding_dim
    }
}

/// Starts the engine thread. It runs until every handle (and stream) is dropped and no
/// request is left.
pub fn start(
    runner: ModelRunner,
    config: SchedulerConfig,
) -> Result<(EngineHandle, JoinHandle<()>), EngineError> {
    let scheduler = Scheduler::new(config.clone())?;
    let (tx, rx) = mpsc::channel();
    let stats = Arc::new(Mutex::new(EngineStats {
        kv_bytes_per_token: runner.kv_bytes_per_token(),
        ..EngineStats::default()
    }));
    let handle = EngineHandle {
        tx,
        next_id: Arc::new(AtomicU64::new(0)),
        stats: stats.clone(),
        config: Arc::new(config),
        embedding_dim: runner.model().hidden_size(),
    };
    let mut engine = EngineLoop {
        scheduler,
        runner,
        rx,
        senders: HashMap::new(),
        out: SchedulerOutput::new(),
        stats,
        steps: 0,
        kv_events: None,
    };
    let thread = std::thread::Builder::new()
        .name("tokenmill-engine".into())
        .spawn(move || engine.run())
        .map_err(|e| EngineError::Model(format!("spawning the engine thread: {e}")))?;
    Ok((handle, thread))
}

struct EngineLoop {
    scheduler: Scheduler,
    runner: ModelRunner,
    rx: Receiver<Command>,
    senders: HashMap<RequestId, UnboundedSender<StreamEvent>>,
    out: SchedulerOutput,
    stats: Arc<Mutex<EngineStats>>,
    steps: u64,
    /// The subscriber to the prefix cache's events, if any.
    kv_events: Option<UnboundedSender<KvEventBatch>>,
}

/// How long an engine with requests but nothing runnable waits before scheduling again
/// (static batching waiting for its batch to fill).
const IDLE_POLL: Duration = Duration::from_millis(2);

impl EngineLoop {
    fn run(&mut self) {
        loop {
            if !self.scheduler.has_unfinished_requests() {
                match self.rx.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return, // every handle is gone and nothing is left
                }
            }
            while let Ok(cmd) = self.rx.try_recv() {
                self.handle(cmd);
            }
            if !self.step() {
                match self.rx.recv_timeout(IDLE_POLL) {
                    Ok(cmd) => self.handle(cmd),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected)
                        if self.scheduler.has_unfinished_requests() => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add { req, tx } => {
                let id = req.id;
                match self.scheduler.add_request(*req) {
                    Ok(()) => {
                        self.senders.insert(id, tx);
                    }
                    Err(e) => {
                        let _ = tx.send(StreamEvent::Error(e));
                    }
                }
            }
            Command::Abort(id) => {
                self.scheduler.abort(id);
                self.senders.remove(&id);
            }
            Command::SubscribeKvEvents(tx) => {
                self.scheduler.enable_kv_events();
                self.kv_events = Some(tx);
            }
        }
    }

    /// One engine step; `false` if there was nothing to run.
    fn step(&mut self) -> bool {
        let t0 = Instant::now();
        let mut step = tokenmill_trace::scope("step", "engine");
        let schedule = tokenmill_trace::scope("schedule", "engine");
        self.scheduler.schedule_into(&mut self.out);
        drop(schedule);
        if self.out.is_empty() {
            // No step runs: the runner forgets what finished without one.
            for id in &self.out.finished_req_ids {
                self.runner.drop_request(*id);
            }
            step.cancel();
            // Aborts may have freed requests and blocks without a step: keep gauges true.
            self.refresh_idle_stats();
            return false;
        }
        if tokenmill_trace::enabled() {
            self.trace_queue_waits(t0);
        }
        let t = Instant::now();
        let StepResult {
            sampled,
            prompt_logprobs,
            failed,
            drafts,
            pooled,
        } = match self.runner.execute(&self.out) {
            Ok(r) => r,
            Err(e) => {
                self.fail_step(e);
                return true;
            }
        };
        let executed = t.elapsed();
        let update = tokenmill_trace::scope("update", "engine");
        let outputs = self.scheduler.update_from_output(&self.out, sampled);
        for (id, d) in &drafts {
            self.scheduler.set_drafts(*id, d);
        }
        // The cost model learns the whole iteration (schedule + execute + update): that is the
        // time between a sequence's tokens, which the TPOT target is about.
        self.scheduler.record_step(&self.out, t0.elapsed());
        // Stats first, so a client that sees its last token also sees its blocks freed.
        self.publish_stats(executed);
        self.send(prompt_logprobs, outputs);
        self.send_embeddings(pooled);
        self.fail_requests(failed);
        self.publish_kv_events();
        drop(update);
        if step.is_recording() {
            self.trace_step(&mut step);
        }
        true
    }

    /// Trace: the queue wait of every request first scheduled in this step (an async span
    /// from its arrival to its first scheduling, on the `request` category).
    fn trace_queue_waits(&self, step_start: Instant) {
        for c in &self.out.chunks {
            if let Some(req) = self.scheduler.request(c.req_id)
                && let Some(first) = req.first_scheduled_at
                && first >= step_start
            {
                let args = [("prompt_tokens", req.num_prompt_tokens().into())];
                let id = c.req_id.0;
                tokenmill_trace::async_span("queue", "request", id, req.arrival_time, first, &args);
            }
        }
    }

    /// Trace: the step's arguments; `reqs` lists each chunk as
    /// `id:start_pos:num_tokens:sampled` (the profiler's critical path reads it).
    fn trace_step(&self, step: &mut tokenmill_trace::Scope) {
        use std::fmt::Write;
        let mut reqs = String::new();
        for c in &self.out.chunks {
            let sep = if reqs.is_empty() { "" } else { "," };
            let _ = write!(
                reqs,
                "{sep}{}:{}:{}:{}",
                c.req_id.0, c.start_pos, c.num_tokens, c.sample as u8
            );
        }
        step.arg("step", self.steps);
        step.arg("tokens", self.out.num_scheduled_tokens);
        step.arg("seqs", self.out.chunks.len());
        step.arg("reqs", reqs);
    }

    fn send(
        &mut self,
        prompt_logprobs: Vec<(RequestId, usize, Vec<PromptLogprob>)>,
        outputs: Vec<RequestOutput>,
    ) {
        for (id, start, logprobs) in prompt_logprobs {
            if let Some(tx) = self.senders.get(&id) {
                let _ = tx.send(StreamEvent::PromptLogprobs { start, logprobs });
            }
        }
        for RequestOutput { req_id, output } in outputs {
            let finished = output.finish_reason.is_some();
            let delivered = self
                .senders
                .get(&req_id)
                .is_some_and(|tx| tx.send(StreamEvent::Token(output)).is_ok());
            if finished {
                self.senders.remove(&req_id);
                self.runner.drop_request(req_id);
            } else if !delivered {
                // The client went away: cancel.
                self.scheduler.abort(req_id);
                self.senders.remove(&req_id);
            }
        }
    }

    /// The step's prefix-cache events, to the subscriber (dropped if it went away).
    fn publish_kv_events(&mut self) {
        let Some(tx) = &self.kv_events else {
            return;
        };
        let events = self.scheduler.take_kv_events();
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if tx.send(KvEventBatch { ts, events }).is_err() {
            self.kv_events = None;
        }
    }

    /// Each finished embedding request's vector, its last event.
    fn send_embeddings(&mut self, pooled: Vec<(RequestId, Vec<f32>)>) {
        for (id, v) in pooled {
            if let Some(tx) = self.senders.remove(&id) {
                let _ = tx.send(StreamEvent::Embedding(v));
            }
            self.runner.drop_request(id);
        }
    }

    /// Requests the runner could not sample for (their output constraint failed): abort
    /// them and tell their clients why.
    fn fail_requests(&mut self, failed: Vec<(RequestId, EngineError)>) {
        for (id, e) in failed {
            self.scheduler.abort(id);
            if let Some(tx) = self.senders.remove(&id) {
                let _ = tx.send(StreamEvent::Error(e));
            }
        }
    }

    /// A forward pass failed: fail the step's requests rather than the engine.
    fn fail_step(&mut self, e: EngineError) {
        let ids: Vec<RequestId> = self.out.chunks.iter().map(|c| c.req_id).collect();
        for id in ids {
            self.scheduler.abort(id);
            if let Some(tx) = self.senders.remove(&id) {
                let _ = tx.send(StreamEvent::Error(e.clone()));
            }
        }
    }

    /// Refreshes the scheduler gauges after a step that ran nothing (no step is counted).
    fn refresh_idle_stats(&mut self) {
        let scheduler = self.scheduler.stats();
        if let Ok(mut s) = self.stats.lock()
            && (s.scheduler != scheduler || s.last_batch_seqs != 0)
        {
            s.scheduler = scheduler;
            s.last_batch_seqs = 0;
            s.last_batch_tokens = 0;
        }
    }

    fn publish_stats(&mut self, measured: Duration) {
        self.steps += 1;
        let snapshot = EngineStats {
            scheduler: self.scheduler.stats(),
            steps: self.steps,
            last_batch_seqs: self.out.chunks.len(),
            last_batch_tokens: self.out.num_scheduled_tokens,
            last_step_predicted: self.out.predicted,
            last_step_measured: measured,
            kv_bytes_per_token: self.runner.kv_bytes_per_token(),
        };
        if tokenmill_trace::enabled() {
            let sched = &snapshot.scheduler;
            tokenmill_trace::counter(
                "batch",
                &[
                    ("seqs", snapshot.last_batch_seqs as f64),
                    ("tokens", snapshot.last_batch_tokens as f64),
                ],
            );
            tokenmill_trace::counter("kv_usage", &[("fraction", sched.kv_usage)]);
            tokenmill_trace::counter(
                "requests",
                &[
                    ("waiting", sched.num_waiting as f64),
                    ("running", sched.num_running as f64),
                ],
            );
        }
        if let Ok(mut s) = self.stats.lock() {
            *s = snapshot;
        }
    }
}
