//! [`Scheduler`]: decides, each step, which requests run which tokens (vLLM v1 style).
//!
//! A step has one token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`).
//! Every request just catches up its `num_computed_tokens` to its known tokens; a new prompt,
//! a prompt chunk, a decode token and a recompute are the same thing, so chunked prefill and
//! prefix-cache hits fall out of it. One `schedule` call:
//!
//! 1. frees aborted requests;
//! 2. **running** requests first, in admission order: a decode costs 1 token; a request still
//!    catching up gets a chunk of what is left of the budget, minus 1 token reserved for each
//!    running request after it (so prefill never stalls decodes — Sarathi's stall-free rule;
//!    `max_num_batched_tokens ≥ max_num_seqs` is enforced, so every running request gets at
//!    least a token every step: nothing running starves). If the KV pool cannot hold the
//!    chunk, the lowest-priority running request (FCFS: the latest admitted; priority: highest
//!    `(priority, arrival)`) is preempted — blocks freed, cursor reset, output kept, requeued —
//!    until it fits or the request preempted itself;
//! 3. **waiting** requests in policy order (skipped if anything was preempted this step), each
//!    after a prefix-cache lookup, with its prompt chunked to the remaining budget, until the
//!    budget, `max_num_seqs` or the KV pool runs out — FCFS stops at the first that does not
//!    fit, so admission is in arrival order and nothing waiting starves. The full blocks a
//!    planned chunk fills are registered in the prefix cache as it is planned (vLLM does the
//!    same), so a request admitted later in the same step with the same prompt — an `n > 1`
//!    sibling — shares them at once instead of computing them twice.
//!
//! Speculative decoding (`config.speculative`, continuous batching): a running decode may
//! carry drafts — proposed by prompt lookup over its tokens, as many as `spec::adaptive`
//! finds worth a row this step, within the token budget (the reserve for later running
//! requests kept) and what `max_tokens` and the model length leave; drafts that find no KV
//! room are dropped rather than preempting anyone. The runner returns one token per accepted
//! draft plus one; `update_from_output` moves the cursor over the accepted drafts only.
//!
//! The caller runs the [`SchedulerOutput`], samples one token per `sample` chunk and calls
//! [`Scheduler::update_from_output`], which advances cursors, registers newly computed full
//! blocks in the prefix cache, appends tokens, applies stop conditions and frees finished
//! requests. `schedule` and `update_from_output` alternate.
//!
//! Never wedged: [`Scheduler::add_request`] rejects any request that could not run alone in
//! the whole cache, and a running request alone always fits (preemption can always free
//! everything else), so the oldest request always makes progress.
//!
//! SLA mode (`config.sla`): the step-time model (`sla.rs`) caps prefill so a step that
//! contains decodes is predicted within `target_tpot` (a step with none within
//! `target_ttft`), and stops admitting sequences once decoding one more would be predicted
//! over `target_tpot` — predictions at the 95th percentile of step time, not the mean — the largest batch that keeps the targets. Decodes themselves are never
//! dropped; an empty step always gets at least a block's worth of prefill (progress).
//!
//! Static batching (`Batching::Static`, for comparison only): when nothing runs, admit up to
//! `max_num_seqs` waiting requests (once that many wait, or the oldest waited `max_wait`),
//! reserving each one's worst-case blocks (the padding a static batch pays), and admit no one
//! else until the whole batch has finished. The batch also pays for padding in compute, as a
//! padded batch does: each prompt is padded to the batch's longest, and a member that has
//! finished keeps its slot until the slowest one is done, decoding at the batch's position
//! (attention over the whole padded length, and the LM head) as a padded row does —
//! `SchedulerOutput::pads` lists the pad rows the step runs on top of its chunks.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokenmill_model::LogitsWanted;

use crate::error::EngineError;
use crate::kv_manager::{CachedPrefix, KvCacheManager, PrefixCacheStats};
use crate::kv_occupancy::KvOccupancy;
use crate::pooling::Pooling;
use crate::request::{FinishReason, Request, RequestId, RequestStatus};
use crate::sampler::Sampled;
pub use crate::scheduler_config::{Batching, SchedulerConfig, SchedulingPolicy};
use crate::scheduler_output::{NewRequest, PadChunk, RequestOutput, SchedulerOutput, TokenOutput};
use crate::sla::{StepFeatures, StepTimeModel, StepTimeStats, max_chunk_within};
use crate::spec::{SpecDecodeStats, SpecMethod, adaptive, ngram};

/// Gauges and counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Fraction of KV blocks in use, 0..=1.
    pub kv_usage: f64,
    pub num_blocks: usize,
    pub num_free_blocks: usize,
    /// The running requests' blocks against the positions they fill, sampled every step.
    pub kv_occupancy: KvOccupancy,
    pub prefix_cache: PrefixCacheStats,
    pub num_preemptions: u64,
    pub step_time: StepTimeStats,
    pub spec_decode: SpecDecodeStats,
    /// The step-time model's 95th-percentile time of a step in which every running and
    /// waiting request decodes together (what the TPOT target is about): the load on the SLA.
    pub decode_step_p95: Duration,
}

/// Waiting-queue order: `(priority or 0, arrival_seq, id)`.
type WaitKey = (i64, u64, RequestId);

/// What is left of this step while it is being planned.
struct StepBudget {
    tokens: usize,
    /// Decodes of all running requests (assumed scheduled) plus prefill chunks so far.
    features: StepFeatures,
    /// Step-time cap in ms, when SLA targets apply.
    cap_ms: Option<f64>,
    /// Speculative decoding: the acceptance chance a draft must clear to be verified this step
    /// (see `spec::adaptive`).
    draft_threshold: f64,
}

pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<RequestId, Request>,
    waiting: BTreeSet<WaitKey>,
    /// Admission order.
    running: Vec<RequestId>,
    /// Aborted since the last step; freed at the next `schedule`.
    aborted: Vec<RequestId>,
    /// Finished since the last step (reported in the next output).
    finished: Vec<RequestId>,
    /// This step's decisions: `(request, tokens)`; materialised once final.
    plan: Vec<(RequestId, usize)>,
    next_seq: u64,
    num_preemptions: u64,
    kv_occupancy: KvOccupancy,
    step_model: StepTimeModel,
    /// Static batching: (members, longest prompt) of the batch now running.
    static_batch: Option<(usize, usize)>,
    spec_stats: SpecDecodeStats,
    /// The draft threshold of the step being planned (see `spec::adaptive`).
    draft_threshold: f64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Scheduler, EngineError> {
        config.validate()?;
        Ok(Scheduler {
            kv: KvCacheManager::new(
                config.num_blocks,
                config.block_size,
                config.enable_prefix_caching,
            ),
            config,
            requests: HashMap::new(),
            waiting: BTreeSet::new(),
            running: Vec::new(),
            aborted: Vec::new(),
            finished: Vec::new(),
            plan: Vec::new(),
            next_seq: 0,
            num_preemptions: 0,
            kv_occupancy: KvOccupancy::default(),
            step_model: StepTimeModel::default(),
            static_batch: None,
            spec_stats: SpecDecodeStats::default(),
            draft_threshold: 1.0,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Starts recording what enters and leaves the prefix cache ([`take_kv_events`](Self::take_kv_events)).
    pub fn enable_kv_events(&mut self) {
        self.kv.enable_events();
    }

    /// The prefix cache's events since the last call, in order.
    pub fn take_kv_events(&mut self) -> Vec<crate::KvEvent> {
        self.kv.take_events()
    }

    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    pub fn step_model(&self) -> &StepTimeModel {
        &self.step_model
    }

    /// A live (not yet finished) request.
    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.requests.get(&id)
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            kv_usage: self.kv.usage(),
            num_blocks: self.kv.num_blocks(),
            num_free_blocks: self.kv.num_free_blocks(),
            kv_occupancy: self.kv_occupancy,
            prefix_cache: self.kv.prefix_cache_stats(),
            num_preemptions: self.num_preemptions,
            step_time: self.step_model.stats(),
            spec_decode: self.spec_stats,
            decode_step_p95: self.decode_step_p95(),
        }
    }

    /// See [`SchedulerStats::decode_step_p95`]; zero when nothing is running or waiting.
    fn decode_step_p95(&self) -> Duration {
        let mut all = StepFeatures::default();
        let waiting = self.waiting.iter().map(|k| &k.2);
        for id in self.running.iter().chain(waiting) {
            all.add_chunk(self.requests[id].num_tokens(), 1, true);
        }
        if all == StepFeatures::default() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(self.step_model.predict_tail_ms(&all).max(0.0) / 1e3)
    }

    /// Queues a request, or rejects one that could never run.
    pub fn add_request(&mut self, mut req: Request) -> Result<(), EngineError> {
        let (id, cfg) = (req.id, &self.config);
        if self.requests.contains_key(&id) {
            return Err(EngineError::DuplicateRequest(id));
        }
        let prompt_tokens = req.num_prompt_tokens();
        if prompt_tokens == 0 {
            return Err(EngineError::EmptyPrompt(id));
        }
        let max_tokens = match req.params.max_tokens {
            _ if req.params.pooling.is_some() => 0,
            Some(0) => return Err(EngineError::ZeroMaxTokens(id)),
            Some(n) => n,
            None => cfg.max_model_len.saturating_sub(prompt_tokens),
        };
        let generates = req.params.pooling.is_none();
        if (generates && max_tokens == 0) || prompt_tokens + max_tokens > cfg.max_model_len {
            return Err(EngineError::ExceedsMaxModelLen {
                id,
                prompt_tokens,
                max_tokens,
                max_model_len: cfg.max_model_len,
            });
        }
        req.max_tokens = max_tokens;
        let needed_blocks = self.kv.blocks_for(req.max_kv_tokens());
        if needed_blocks > cfg.num_blocks {
            return Err(EngineError::ExceedsKvCache {
                id,
                needed_blocks,
                num_blocks: cfg.num_blocks,
            });
        }
        req.rehash(cfg.block_size);
        req.arrival_seq = self.next_seq;
        self.next_seq += 1;
        req.status = RequestStatus::Waiting;
        req.num_computed_tokens = 0;
        self.waiting.insert(self.wait_key(&req));
        self.requests.insert(id, req);
        Ok(())
    }

    /// Cancels a request; its blocks are freed at the next `schedule`. False if unknown or
    /// already finished.
    pub fn abort(&mut self, id: RequestId) -> bool {
        match self.requests.get_mut(&id) {
            Some(r) if !r.is_finished() => {
                r.status = RequestStatus::Finished(FinishReason::Abort);
                self.aborted.push(id);
                true
            }
            _ => false,
        }
    }

    /// Plans the next step (allocating a fresh output).
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::new();
        self.schedule_into(&mut out);
        out
    }

    /// Plans the next step into `out` (cleared first; its buffers are reused).
    pub fn schedule_into(&mut self, out: &mut SchedulerOutput) {
        out.clear();
        self.free_aborted(out);
        out.finished_req_ids.append(&mut self.finished);
        self.plan.clear();
        match self.config.batching {
            Batching::Continuous => {
                let mut budget = self.step_budget(true);
                self.draft_threshold = budget.draft_threshold;
                let preempted = self.schedule_running(&mut budget, out);
                // No preemption follows: the running chunks will be computed this step.
                self.cache_planned();
                if !preempted {
                    self.schedule_waiting(&mut budget);
                }
            }
            Batching::Static { max_wait } => {
                if self.running.is_empty() {
                    self.static_batch = None;
                    self.admit_static_batch(max_wait);
                }
                let mut budget = self.step_budget(false);
                self.schedule_running(&mut budget, out);
                self.static_pads(&mut out.pads);
            }
        }
        self.materialize(out);
    }

    /// Applies a finished step: `sampled` holds the runner's token (with its logprobs) for
    /// each `sample` chunk (extra or stale entries are ignored). Returns one complete output
    /// per delivered token, in `sampled` order. An embedding request whose prompt is now
    /// computed finishes here (the runner returned its vector).
    pub fn update_from_output(
        &mut self,
        out: &SchedulerOutput,
        sampled: Vec<(RequestId, Sampled)>,
    ) -> Vec<RequestOutput> {
        let mut any_finished = false;
        for c in &out.chunks {
            let Some(req) = self.requests.get_mut(&c.req_id) else {
                continue;
            };
            if req.status != RequestStatus::Running || req.num_computed_tokens != c.start_pos {
                continue; // aborted meanwhile, or a stale output
            }
            // Drafts count as computed once accepted (below).
            req.num_computed_tokens += c.num_tokens - c.num_draft_tokens;
            self.kv.cache_blocks(
                req.id,
                &req.block_hashes,
                req.token_ids(),
                req.num_computed_tokens,
            );
            if req.params.pooling.is_some() && req.num_uncomputed_tokens() == 0 {
                req.status = RequestStatus::Finished(FinishReason::Stop);
                any_finished = true;
            }
            if c.num_draft_tokens > 0 {
                req.draft_record.verified(c.num_draft_tokens);
                self.spec_stats.num_drafts += 1;
                self.spec_stats.num_draft_tokens += c.num_draft_tokens as u64;
            }
        }
        let (bs, max_len) = (self.config.block_size, self.config.max_model_len);
        let held = self.running.iter().map(|id| {
            let filled = self.requests.get(id).map_or(0, |r| r.num_computed_tokens);
            (self.kv.block_table(*id).len(), filled)
        });
        self.kv_occupancy.record(bs, held);
        let mut outputs = Vec::with_capacity(sampled.len());
        let mut previous = None;
        for (id, s) in sampled {
            let follows_draft = previous.replace(id) == Some(id);
            let Some(req) = self.requests.get_mut(&id) else {
                continue;
            };
            if req.status != RequestStatus::Running {
                continue;
            }
            if follows_draft && accept_draft(out, req) {
                self.spec_stats.num_accepted_tokens += 1;
                self.kv.cache_blocks(
                    id,
                    &req.block_hashes,
                    req.token_ids(),
                    req.num_computed_tokens,
                );
            }
            if req.num_uncomputed_tokens() != 0 {
                continue;
            }
            req.draft_record.generated(req.num_tokens(), s.token);
            let finish_reason = req.append_output(s.token, s.complete, bs, max_len);
            if let Some(reason) = finish_reason {
                req.status = RequestStatus::Finished(reason);
                any_finished = true;
            }
            let output = TokenOutput {
                token: s.token,
                logprob: s.logprob,
                top_logprobs: s.top,
                finish_reason,
                num_cached_tokens: req.num_cached_tokens,
                queue_time: (req.num_output_tokens() == 1)
                    .then(|| req.first_scheduled_at.map(|t| t - req.arrival_time))
                    .flatten(),
            };
            outputs.push(RequestOutput { req_id: id, output });
        }
        if any_finished {
            let is_pooled = |r: &Request| {
                r.params.pooling.is_some()
                    && r.status == RequestStatus::Finished(FinishReason::Stop)
            };
            let pooled = out.chunks.iter().map(|c| c.req_id);
            let pooled = pooled.filter(|id| self.requests.get(id).is_some_and(is_pooled));
            let pooled: Vec<RequestId> = pooled.collect();
            let generated = outputs.iter().filter(|o| o.output.finish_reason.is_some());
            for id in generated.map(|o| o.req_id).chain(pooled) {
                self.kv.free(id);
                self.requests.remove(&id);
                self.finished.push(id);
            }
            let requests = &self.requests;
            self.running.retain(|id| requests.contains_key(id));
        }
        outputs
    }

    /// The engine-wide draft acceptance rate, with an optimistic prior before the first
    /// drafts (so speculation gets tried).
    fn global_acceptance(&self) -> f64 {
        const PRIOR: f64 = 0.7;
        let s = &self.spec_stats;
        adaptive::acceptance(s.num_accepted_tokens, s.num_draft_tokens, PRIOR)
    }

    /// Proposes drafts for the decode of running request `id` and keeps those worth
    /// verifying this step (at most `room`); returns how many.
    fn plan_drafts(&mut self, id: RequestId, budget: &StepBudget, room: usize) -> usize {
        let Some(spec) = self.config.speculative else {
            return 0;
        };
        let global = self.global_acceptance();
        let max_len = self.config.max_model_len;
        let req = self.requests.get_mut(&id).expect("running request exists");
        if req.params.constraint.is_some() {
            req.drafts.clear();
            return 0;
        }
        let k = spec
            .num_speculative_tokens
            .min(req.max_drafts(max_len))
            .min(room);
        let looks_up = matches!(spec.method, SpecMethod::Ngram { .. });
        if spec.adaptive
            && !looks_up
            && !req
                .draft_record
                .worth_proposing(k, global, budget.draft_threshold)
        {
            // Under load nothing the draft model proposed would be verified: its proposal was
            // not asked for. (Prompt lookup is cheap: its proposal is kept as a guess.)
            req.drafts.clear();
            return 0;
        }
        match spec.method {
            SpecMethod::Ngram {
                prompt_lookup_min,
                prompt_lookup_max,
            } => {
                let (tokens, drafts) = req.tokens_and_drafts();
                ngram::propose(tokens, prompt_lookup_min, prompt_lookup_max, k, drafts);
            }
            // The draft model proposed after the last step (`set_drafts`), if it could.
            SpecMethod::DraftModel if req.drafts_for == req.num_tokens() => req.drafts.truncate(k),
            SpecMethod::DraftModel => req.drafts.clear(),
        }
        if spec.adaptive {
            let pos = req.num_tokens();
            let record = &mut req.draft_record;
            let keep = record.drafts_to_take(&req.drafts, pos, global, budget.draft_threshold);
            req.drafts.truncate(keep);
        }
        req.drafts.len()
    }

    /// Whether a draft model should propose for `req` after this step: not for a constrained
    /// request, nor, adaptively, where this step's threshold says nothing it proposed would
    /// be verified (a full batch) — the draft's guesses cost forward passes.
    fn wants_proposal(&self, req: &Request) -> bool {
        let Some(spec) = self.config.speculative else {
            return false;
        };
        let k = spec.num_speculative_tokens;
        spec.method == SpecMethod::DraftModel
            && req.params.constraint.is_none()
            && (!spec.adaptive
                || req.draft_record.worth_proposing(
                    k,
                    self.global_acceptance(),
                    self.draft_threshold,
                ))
    }

    /// A draft model's proposal for running request `id`, for its next step (ignored if the
    /// request is gone or not running).
    pub fn set_drafts(&mut self, id: RequestId, drafts: &[u32]) {
        if let Some(req) = self.requests.get_mut(&id)
            && req.status == RequestStatus::Running
        {
            req.drafts.clear();
            req.drafts.extend_from_slice(drafts);
            req.drafts_for = req.num_tokens();
        }
    }

    /// KV slots to reserve past a chunk of `n` tokens from `start` for the proposer's guesses:
    /// only a chunk that samples (it ends at or past its request's `left` uncomputed tokens),
    /// and never past the model length.
    fn lookahead(&self, start: usize, n: usize, left: usize) -> usize {
        match self.config.speculative {
            Some(spec) if n >= left => spec
                .lookahead()
                .min(self.config.max_model_len.saturating_sub(start + n)),
            _ => 0,
        }
    }

    /// Feeds the measured duration of the step `out` described to the step-time model (an
    /// output whose `features` are empty is ignored). The model has not changed since the
    /// step was scheduled, so its prediction now is the one `out.predicted` holds.
    pub fn record_step(&mut self, out: &SchedulerOutput, measured: Duration) {
        if out.features != StepFeatures::default() {
            let predicted = self.step_model.predict(&out.features);
            self.step_model
                .observe(&out.features, Some(predicted), measured);
        }
    }

    fn wait_key(&self, r: &Request) -> WaitKey {
        let p = match self.config.policy {
            SchedulingPolicy::Fcfs => 0,
            SchedulingPolicy::Priority => r.params.priority as i64,
        };
        (p, r.arrival_seq, r.id)
    }

    fn free_aborted(&mut self, out: &mut SchedulerOutput) {
        if self.aborted.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.aborted) {
            if let Some(req) = self.requests.remove(&id) {
                self.waiting.remove(&self.wait_key(&req));
                self.kv.free(id);
                out.finished_req_ids.push(id);
            }
        }
        let requests = &self.requests;
        self.running.retain(|id| requests.contains_key(id));
    }

    /// The budget of a step: decodes of running requests are counted up front so that the SLA
    /// cap for prefill knows what they will cost.
    fn step_budget(&self, sla: bool) -> StepBudget {
        let mut features = StepFeatures::default();
        let mut context = 0;
        for id in &self.running {
            let r = &self.requests[id];
            if is_decode(r, r.num_uncomputed_tokens()) {
                features.add_chunk(r.num_computed_tokens, 1, true);
                context += r.num_computed_tokens;
            }
        }
        let draft_threshold = if self.config.speculative.is_some() {
            let mean_context = context / features.decode_seqs.max(1);
            adaptive::threshold(&self.step_model, &features, mean_context)
        } else {
            1.0
        };
        let t = self.config.sla;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut cap_ms = None;
        if sla {
            if features.decode_seqs > 0 {
                cap_ms = t.tpot.map(ms);
            }
            if let Some(ttft) = t.ttft.map(ms) {
                cap_ms = Some(cap_ms.map_or(ttft, |c: f64| c.min(ttft)));
            }
        }
        StepBudget {
            tokens: self.config.max_num_batched_tokens,
            features,
            cap_ms,
            draft_threshold,
        }
    }

    /// Schedules running requests; returns whether any request was preempted.
    fn schedule_running(&mut self, budget: &mut StepBudget, out: &mut SchedulerOutput) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget.tokens > 0 {
            let id = self.running[i];
            let req = &self.requests[&id];
            let (start, left) = (req.num_computed_tokens, req.num_uncomputed_tokens());
            debug_assert!(left > 0, "request {id} was not given its sampled token");
            let reserve = self.running.len() - i - 1;
            let mut n = if is_decode(req, left) {
                let room = budget.tokens.saturating_sub(1 + reserve);
                1 + self.plan_drafts(id, budget, room)
            } else {
                self.prefill_chunk(budget, start, left, reserve)
            };
            if n == 0 {
                i += 1;
                continue;
            }
            if let Some(w) = self.config.sliding_window {
                self.kv.free_out_of_window(id, start, w);
            }
            let mut ahead = self.lookahead(start, n, left);
            loop {
                if self.kv.allocate_slots(id, start, n + ahead, &[]).is_some() {
                    self.take(budget, id, start, n, left);
                    i += 1;
                    break;
                }
                if ahead > 0 {
                    // No room for the proposer's guesses: it proposes fewer.
                    ahead = 0;
                    continue;
                }
                if n > left {
                    // No room for the drafts: decode without them rather than preempt.
                    n = left;
                    continue;
                }
                let victim = self.pick_victim();
                let victim_id = self.running[victim];
                self.preempt(victim, budget, out);
                preempted = true;
                if victim_id == id {
                    break; // `running[i]` is now the next request
                }
                if victim < i {
                    i -= 1;
                }
            }
        }
        preempted
    }

    /// Admits waiting requests in policy order.
    fn schedule_waiting(&mut self, budget: &mut StepBudget) {
        // Decode cost if every running sequence (and each admitted one) decodes together.
        let mut decode_all = StepFeatures::default();
        for id in &self.running {
            decode_all.add_chunk(self.requests[id].num_tokens(), 1, true);
        }
        let tpot_ms = self.config.sla.tpot.map(|d| d.as_secs_f64() * 1e3);
        while budget.tokens > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&key) = self.waiting.first() else {
                break;
            };
            let id = key.2;
            let req = &self.requests[&id];
            if let Some(tpot) = tpot_ms {
                // The largest batch that keeps TPOT: stop once one more sequence would break it
                // (but always run something).
                let with_one_more = decode_all.with_chunk(req.num_tokens(), 1, true);
                if !self.running.is_empty()
                    && self.step_model.predict_tail_ms(&with_one_more) > tpot
                {
                    break;
                }
            }
            let prefix = self.lookup_prefix(req);
            let start = prefix.num_tokens;
            let left = req.num_tokens() - start;
            let n = self.prefill_chunk(budget, start, left, 0);
            let ahead = self.lookahead(start, n, left);
            if n == 0
                || (self
                    .kv
                    .allocate_slots(id, start, n + ahead, &prefix.blocks)
                    .is_none()
                    && self
                        .kv
                        .allocate_slots(id, start, n, &prefix.blocks)
                        .is_none())
            {
                break;
            }
            self.admit(key, start);
            decode_all.add_chunk(self.requests[&id].num_tokens(), 1, true);
            self.take(budget, id, start, n, left);
            let req = &self.requests[&id];
            self.kv
                .cache_blocks(id, &req.block_hashes, req.token_ids(), start + n);
        }
    }

    /// Registers the full blocks the planned chunks will fill this step in the prefix cache,
    /// as vLLM does at allocation: a request admitted later in the same step (a sibling of an
    /// `n > 1` request, or the same prompt arriving together) then shares them instead of
    /// computing them again. Sound because the step is atomic and the forward writes every
    /// chunk's K/V of a layer before any chunk's attention reads that layer; only requests
    /// that can no longer be preempted this step are registered.
    fn cache_planned(&mut self) {
        for &(id, n) in &self.plan {
            let req = &self.requests[&id];
            self.kv.cache_blocks(
                id,
                &req.block_hashes,
                req.token_ids(),
                req.num_computed_tokens + n,
            );
        }
    }

    /// The longest cached prefix usable by `req` (none for prompt-logprobs requests, nor
    /// for mean-pooled embeddings: cached tokens have no hidden states to pool).
    fn lookup_prefix(&self, req: &Request) -> CachedPrefix {
        if req.params.prompt_logprobs || req.params.pooling == Some(Pooling::Mean) {
            return CachedPrefix::default();
        }
        self.kv
            .find_cached_prefix(&req.block_hashes, req.num_tokens())
    }

    /// Moves a waiting request whose blocks are allocated to `running`, its first
    /// `num_computed_tokens` served by the prefix cache.
    fn admit(&mut self, key: WaitKey, num_computed_tokens: usize) {
        let id = key.2;
        self.waiting.remove(&key);
        self.running.push(id);
        let req = self.requests.get_mut(&id).expect("waiting request exists");
        req.status = RequestStatus::Running;
        req.num_computed_tokens = num_computed_tokens;
        if !req.admitted_once {
            req.admitted_once = true;
            req.first_scheduled_at = Some(Instant::now());
            req.num_cached_tokens = num_computed_tokens;
            let total = req.num_tokens();
            self.kv.record_prefix_query(total, num_computed_tokens);
        }
    }

    /// Tokens a catching-up request may run this step: its `left` tokens capped by the budget
    /// (minus `reserve` for later running requests), the long-prefill threshold and the SLA
    /// cap. 0 = none this step. Without chunked prefill it is all or nothing.
    fn prefill_chunk(
        &self,
        budget: &StepBudget,
        start: usize,
        left: usize,
        reserve: usize,
    ) -> usize {
        let cfg = &self.config;
        let mut n = left.min(budget.tokens.saturating_sub(reserve));
        if cfg.enable_chunked_prefill {
            if let Some(t) = cfg.long_prefill_token_threshold {
                n = n.min(t);
            }
        } else if n < left {
            return 0;
        }
        if let Some(cap) = budget.cap_ms {
            let step_empty = self.plan.is_empty() && budget.features.decode_seqs == 0;
            let fit = max_chunk_within(&self.step_model, &budget.features, start, n, cap);
            let floor = if step_empty { n.min(cfg.block_size) } else { 0 };
            let capped = fit.max(floor);
            n = if cfg.enable_chunked_prefill || capped == n {
                capped
            } else if step_empty {
                n
            } else {
                0
            };
        }
        n
    }

    fn take(
        &mut self,
        budget: &mut StepBudget,
        id: RequestId,
        start: usize,
        n: usize,
        left: usize,
    ) {
        budget.tokens -= n;
        if !is_decode(&self.requests[&id], left) {
            budget.features.add_chunk(start, n, false);
        } else if n > 1 {
            // The decode row is counted already; add its drafts' rows and attention.
            let mut drafts = StepFeatures::default().with_chunk(start, n, true);
            drafts.decode_seqs -= 1;
            drafts.context_tokens -= StepFeatures::attention_pairs(start, 1);
            budget.features.decode_seqs += drafts.decode_seqs;
            budget.features.context_tokens += drafts.context_tokens;
        }
        self.plan.push((id, n));
    }

    /// Index in `running` of the request to preempt.
    fn pick_victim(&self) -> usize {
        match self.config.policy {
            SchedulingPolicy::Fcfs => self.running.len() - 1,
            SchedulingPolicy::Priority => {
                let key = |i: usize| {
                    let r = &self.requests[&self.running[i]];
                    (r.params.priority, r.arrival_seq)
                };
                (0..self.running.len()).max_by_key(|&i| key(i)).unwrap_or(0)
            }
        }
    }

    /// Evicts `running[idx]`: frees its blocks (unplanning it if planned), resets its cursor
    /// and requeues it; its output so far is kept and will be recomputed.
    fn preempt(&mut self, idx: usize, budget: &mut StepBudget, out: &mut SchedulerOutput) {
        let id = self.running.remove(idx);
        if let Some(p) = self.plan.iter().position(|&(r, _)| r == id) {
            budget.tokens += self.plan.remove(p).1;
        }
        self.kv.free(id);
        let req = self.requests.get_mut(&id).expect("running request exists");
        req.num_computed_tokens = 0;
        req.status = RequestStatus::Preempted;
        req.num_preemptions += 1;
        self.num_preemptions += 1;
        let key = self.wait_key(&self.requests[&id]);
        self.waiting.insert(key);
        out.preempted.push(id);
    }

    /// Static batching: admit a batch if one is due, reserving worst-case blocks for each.
    fn admit_static_batch(&mut self, max_wait: Duration) {
        let Some(&(_, _, oldest)) = self.waiting.first() else {
            return;
        };
        let due = self.waiting.len() >= self.config.max_num_seqs
            || self.requests[&oldest].arrival_time.elapsed() >= max_wait;
        if !due {
            return;
        }
        let mut free = self.kv.num_free_blocks();
        while self.running.len() < self.config.max_num_seqs {
            let Some(&key) = self.waiting.first() else {
                break;
            };
            let id = key.2;
            let req = &self.requests[&id];
            let reserve = self.kv.blocks_for(req.max_kv_tokens());
            if reserve > free {
                break;
            }
            free -= reserve;
            let prefix = self.lookup_prefix(req);
            if self
                .kv
                .allocate_slots(id, prefix.num_tokens, 0, &prefix.blocks)
                .is_none()
            {
                break;
            }
            self.admit(key, prefix.num_tokens);
        }
        let longest = self
            .running
            .iter()
            .map(|id| self.requests[id].num_prompt_tokens())
            .max();
        self.static_batch = longest.map(|l| (self.running.len(), l));
    }

    /// Pad rows of this static-batching step: a prompt starting its prefill is padded to the
    /// batch's longest (the pad tokens follow it, attending over it), and each finished member
    /// still occupies its slot: one token at the batch's current position, with logits.
    fn static_pads(&self, pads: &mut Vec<PadChunk>) {
        let Some((members, longest)) = self.static_batch else {
            return;
        };
        for r in self.plan.iter().map(|(id, _)| &self.requests[id]) {
            let len = r.num_prompt_tokens();
            if r.num_computed_tokens == 0 && len < longest {
                pads.push(PadChunk {
                    num_tokens: longest - len,
                    start_pos: len,
                    logits: false,
                });
            }
        }
        let position = self
            .plan
            .iter()
            .map(|(id, _)| self.requests[id].num_computed_tokens)
            .max();
        if let Some(start_pos) = position {
            let idle = members.saturating_sub(self.running.len());
            pads.extend((0..idle).map(|_| PadChunk {
                num_tokens: 1,
                start_pos,
                logits: true,
            }));
        }
    }

    /// Writes the final plan into `out`, announcing requests the runner has not seen.
    fn materialize(&mut self, out: &mut SchedulerOutput) {
        for &(id, n) in &self.plan {
            let req = self.requests.get_mut(&id).expect("planned request exists");
            if !req.announced {
                req.announced = true;
                out.new_requests.push(NewRequest {
                    req_id: id,
                    prompt: req.prompt().into(),
                    params: req.params.clone(),
                });
            }
            let req = &self.requests[&id];
            let start = req.num_computed_tokens;
            let end = (start + n).min(req.num_tokens());
            let drafts = &req.drafts[..start + n - end];
            let pooled = req.params.pooling.is_some();
            let sample = end == req.num_tokens() && !pooled;
            let echo = req.params.prompt_logprobs
                && start < req.num_prompt_tokens()
                && req.num_output_tokens() == 0;
            let logits = if pooled {
                LogitsWanted::Hidden
            } else if echo || !drafts.is_empty() {
                LogitsWanted::All
            } else if sample {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            out.push_chunk(
                id,
                &req.token_ids()[start..end],
                drafts,
                start,
                self.kv.block_table(id),
                logits,
                sample,
                is_decode(req, req.num_uncomputed_tokens()) && end - start == 1,
                req.num_output_tokens(),
            );
            if sample && let Some(c) = out.chunks.last_mut() {
                c.propose = self.wants_proposal(req);
            }
        }
        out.predicted = self.step_model.predict(&out.features);
    }

    /// Consistency of queues, statuses and KV ownership (for tests and debug assertions).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.kv.check_invariants()?;
        if self.running.len() > self.config.max_num_seqs {
            return Err(format!("{} running > max_num_seqs", self.running.len()));
        }
        let mut seen = std::collections::HashSet::new();
        for id in &self.running {
            let r = self
                .requests
                .get(id)
                .ok_or(format!("running {id} unknown"))?;
            if !seen.insert(*id) {
                return Err(format!("{id} is running twice"));
            }
            let ok = matches!(
                r.status,
                RequestStatus::Running | RequestStatus::Finished(_)
            );
            let covered = self.kv.block_table(*id).len() * self.config.block_size;
            if !ok || covered < r.num_computed_tokens {
                return Err(format!("running {id}: {:?}, KV covers {covered}", r.status));
            }
        }
        for &(_, _, id) in &self.waiting {
            let r = self
                .requests
                .get(&id)
                .ok_or(format!("waiting {id} unknown"))?;
            if !seen.insert(id) {
                return Err(format!("{id} is both waiting and running"));
            }
            if !self.kv.block_table(id).is_empty() || r.num_computed_tokens != 0 {
                return Err(format!("waiting {id} holds KV"));
            }
        }
        if seen.len() != self.requests.len() {
            return Err(format!(
                "{} requests but {} queued",
                self.requests.len(),
                seen.len()
            ));
        }
        Ok(())
    }
}

/// Whether the token `req` just received follows a draft the target accepted, as the
/// runner reports it: the draft sits at the request's first uncomputed position, inside the
/// chunk that verified it, with the token the chunk carried there. Then its KV is valid, and
/// the cursor moves over it.
fn accept_draft(out: &SchedulerOutput, req: &mut Request) -> bool {
    let pos = req.num_computed_tokens;
    let Some(c) = out.chunks.iter().find(|c| c.req_id == req.id) else {
        return false;
    };
    let verified = c.num_draft_tokens > 0
        && pos > c.start_pos
        && pos < c.start_pos + c.num_tokens
        && req.num_uncomputed_tokens() == 1
        && out.tokens(c)[pos - c.start_pos] == req.token_ids()[pos];
    if verified {
        req.num_computed_tokens += 1;
        req.draft_record.accepted();
    }
    verified
}

/// A running request whose only uncomputed token is its last sampled one.
fn is_decode(r: &Request, left: usize) -> bool {
    left == 1 && r.num_computed_tokens >= r.num_prompt_tokens()
}
