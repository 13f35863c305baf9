//! Shared scheduler test harness: a fake model runner (no weights) over a fake paged KV
//! store, a reference generator, and a driver that checks every step.
//!
//! The fake "KV" of position `p` is `H(kv[p-1], token_p)`, read from and written to slots
//! through the chunk's block table, so a wrong table, a block shared by mistake or a bad
//! prefix hit changes the numbers. The sampled token is a hash of every KV value the model may
//! attend to (the last `window` positions, or all), so it is a pure function of the token
//! sequence — exactly like greedy decoding — and any scheduling must reproduce the
//! [`reference`] output token for token.
//!
//! With a copy period `P` (speculative decoding tests) the model mostly repeats itself: where
//! the visible KV's hash is not a multiple of 4 (of `copy_miss_one_in`; 0: always) it emits
//! the token `P` positions back (read through the block table too; only when that is inside
//! the window), so prompt lookup proposes drafts that are usually but not always right. A chunk with drafts is verified as the real runner does: a token after each
//! of its positions from the last known one, continuing while the draft matches. Rejected
//! drafts leave their KV and tokens in the slots; a cursor that moved over one would read
//! them and diverge from the reference.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use tokenmill_engine::{
    BlockId, FinishReason, Request, RequestId, RequestOutput, RequestParams, RequestStatus,
    Sampled, Scheduler, SchedulerConfig, SchedulerOutput,
};
use tokenmill_model::LogitsWanted;

pub const EOS: u32 = 0;
pub const VOCAB: u64 = 1000;
const SEED: u64 = 0x1234_5678_9abc_def0;

fn mix(a: u64, b: u64) -> u64 {
    let mut h = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The token a model emits after attending to `kv` (the visible KV values, oldest first);
/// `copied`: the token `P` positions back, under a copy period, emitted unless the hash is a
/// multiple of `miss_one_in` (0: always).
fn emit(kv: impl Iterator<Item = u64>, copied: Option<u32>, miss_one_in: u64) -> u32 {
    let acc = kv.fold(SEED, mix);
    match copied {
        Some(t) if miss_one_in == 0 || !acc.is_multiple_of(miss_one_in) => t,
        _ if acc.is_multiple_of(17) => EOS,
        _ => 1 + (acc % (VOCAB - 1)) as u32,
    }
}

pub struct FakeRunner {
    block_size: usize,
    window: Option<usize>,
    /// `[num_blocks · block_size]` fake KV values, and the token written with each.
    slots: Vec<u64>,
    slot_tokens: Vec<u32>,
    /// The fake model mostly repeats the token this many positions back...
    pub copy_period: Option<usize>,
    /// ...missing about one time in this many (0: never).
    pub copy_miss_one_in: u64,
}

impl FakeRunner {
    pub fn new(cfg: &SchedulerConfig) -> FakeRunner {
        FakeRunner {
            block_size: cfg.block_size,
            window: cfg.sliding_window,
            slots: vec![0; cfg.num_blocks * cfg.block_size],
            slot_tokens: vec![0; cfg.num_blocks * cfg.block_size],
            copy_period: None,
            copy_miss_one_in: 4,
        }
    }

    fn slot(&self, table: &[u32], pos: usize) -> usize {
        let b = table[pos / self.block_size];
        assert_ne!(
            b,
            BlockId::NULL.0,
            "read of a freed (out-of-window) block at {pos}"
        );
        b as usize * self.block_size + pos % self.block_size
    }

    /// Runs one step: writes every chunk's KV, returns a token for each `sample` chunk (and
    /// one more per accepted draft).
    pub fn run(&mut self, out: &SchedulerOutput) -> Vec<(RequestId, Sampled)> {
        let mut sampled = Vec::new();
        for (c, seq) in out.chunks.iter().zip(out.seq_chunks()) {
            for (i, &tok) in seq.tokens.iter().enumerate() {
                let p = seq.start_pos + i;
                let prev = if p == 0 {
                    SEED
                } else {
                    self.slots[self.slot(seq.block_table, p - 1)]
                };
                let s = self.slot(seq.block_table, p);
                self.slots[s] = mix(prev, tok as u64);
                self.slot_tokens[s] = tok;
            }
            if !c.sample {
                continue;
            }
            let known_end = seq.start_pos + seq.tokens.len() - c.num_draft_tokens;
            let drafts = &seq.tokens[seq.tokens.len() - c.num_draft_tokens..];
            for i in 0..=drafts.len() {
                let tok = self.emit_after(seq.block_table, known_end + i);
                sampled.push((
                    c.req_id,
                    Sampled {
                        token: tok,
                        logprob: 0.0,
                        top: Vec::new(),
                        complete: false,
                    },
                ));
                if drafts.get(i) != Some(&tok) {
                    break;
                }
            }
        }
        sampled
    }

    /// The token the fake model emits after the `end` positions before it.
    fn emit_after(&self, table: &[u32], end: usize) -> u32 {
        let lo = self.window.map_or(0, |w| end.saturating_sub(w));
        let copied = self
            .copy_period
            .filter(|&p| end >= p && self.window.is_none_or(|w| p <= w))
            .map(|p| self.slot_tokens[self.slot(table, end - p)]);
        let kv = (lo..end).map(|p| self.slots[self.slot(table, p)]);
        emit(kv, copied, self.copy_miss_one_in)
    }
}

/// What a request generates alone, computed without any scheduler or paging.
pub fn reference(
    prompt: &[u32],
    params: &RequestParams,
    max_tokens: usize,
    max_model_len: usize,
    window: Option<usize>,
    copy_period: Option<usize>,
    copy_miss_one_in: u64,
) -> (Vec<u32>, FinishReason) {
    let mut seq = prompt.to_vec();
    let mut kv: Vec<u64> = Vec::new();
    let mut out = Vec::new();
    loop {
        while kv.len() < seq.len() {
            let prev = kv.last().copied().unwrap_or(SEED);
            kv.push(mix(prev, seq[kv.len()] as u64));
        }
        let lo = window.map_or(0, |w| kv.len().saturating_sub(w));
        let copied = copy_period
            .filter(|&p| seq.len() >= p && window.is_none_or(|w| p <= w))
            .map(|p| seq[seq.len() - p]);
        let t = emit(kv[lo..].iter().copied(), copied, copy_miss_one_in);
        seq.push(t);
        out.push(t);
        let stop = (!params.ignore_eos && params.eos_token_id == Some(t))
            || params.stop_token_ids.contains(&t);
        if out.len() >= params.min_tokens && stop {
            return (out, FinishReason::Stop);
        }
        if out.len() >= max_tokens || seq.len() >= max_model_len {
            return (out, FinishReason::Length);
        }
    }
}

/// Per-request record kept by the driver.
#[derive(Clone, Debug, Default)]
pub struct Track {
    pub prompt: Vec<u32>,
    pub params: RequestParams,
    pub output: Vec<u32>,
    pub finish: Option<FinishReason>,
    pub aborted: bool,
    /// Submission order (the scheduler's arrival order).
    pub seq: u64,
    pub first_step: Option<usize>,
    pub num_cached_tokens: usize,
}

/// Drives `schedule → fake run → update_from_output`, checking every step.
pub struct Driver {
    pub sched: Scheduler,
    pub runner: FakeRunner,
    pub out: SchedulerOutput,
    pub tracks: HashMap<RequestId, Track>,
    pub step: usize,
    pub next_seq: u64,
    /// Check that every running request gets a token each step (off under SLA caps).
    pub check_running_progress: bool,
    pub log: Vec<SchedulerOutput>,
    pub keep_log: bool,
}

impl Driver {
    pub fn new(cfg: SchedulerConfig) -> Driver {
        Driver {
            runner: FakeRunner::new(&cfg),
            sched: Scheduler::new(cfg).expect("valid config"),
            out: SchedulerOutput::new(),
            tracks: HashMap::new(),
            step: 0,
            next_seq: 0,
            check_running_progress: true,
            log: Vec::new(),
            keep_log: false,
        }
    }

    pub fn cfg(&self) -> &SchedulerConfig {
        self.sched.config()
    }

    pub fn submit(&mut self, id: u64, prompt: Vec<u32>, params: RequestParams) -> bool {
        let id = RequestId(id);
        let req = Request::new(id, prompt.clone(), params.clone());
        match self.sched.add_request(req) {
            Ok(()) => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.tracks.insert(
                    id,
                    Track {
                        prompt,
                        params,
                        seq,
                        ..Default::default()
                    },
                );
                true
            }
            Err(_) => false,
        }
    }

    pub fn abort(&mut self, id: RequestId) {
        if self.sched.abort(id) {
            let t = self.tracks.get_mut(&id).unwrap();
            t.aborted = true;
        }
    }

    fn key(&self, id: RequestId) -> (i64, u64) {
        let t = &self.tracks[&id];
        match self.cfg().policy {
            tokenmill_engine::SchedulingPolicy::Fcfs => (0, t.seq),
            tokenmill_engine::SchedulingPolicy::Priority => (t.params.priority as i64, t.seq),
        }
    }

    /// One step with all checks; returns the events.
    pub fn step(&mut self) -> Vec<RequestOutput> {
        // Snapshot before scheduling.
        let mut was_waiting = Vec::new();
        let mut was_running = Vec::new();
        let mut computed = HashMap::new();
        for (&id, t) in &self.tracks {
            if t.finish.is_some() || t.aborted {
                continue;
            }
            let r = self.sched.request(id).expect("live request");
            match r.status {
                RequestStatus::Waiting | RequestStatus::Preempted => was_waiting.push(id),
                RequestStatus::Running => was_running.push(id),
                RequestStatus::Finished(_) => {}
            }
            computed.insert(id, (r.num_computed_tokens, r.token_ids().to_vec()));
        }

        self.sched.schedule_into(&mut self.out);
        self.sched.check_invariants().unwrap();
        self.check_output(&was_waiting, &was_running, &computed);

        let sampled = self.runner.run(&self.out);
        let drafts: usize = self.out.chunks.iter().map(|c| c.num_draft_tokens).sum();
        assert!(sampled.len() >= self.out.num_sampled());
        assert!(sampled.len() <= self.out.num_sampled() + drafts);
        let events = self.sched.update_from_output(&self.out, sampled);
        self.sched.check_invariants().unwrap();
        for e in &events {
            let t = self.tracks.get_mut(&e.req_id).unwrap();
            assert!(!t.aborted, "event for aborted request {}", e.req_id);
            assert!(t.finish.is_none(), "event after finish for {}", e.req_id);
            t.output.push(e.output.token);
            t.finish = e.output.finish_reason;
            t.num_cached_tokens = e.output.num_cached_tokens;
        }
        if self.keep_log {
            self.log.push(self.out.clone());
        }
        self.step += 1;
        events
    }

    fn check_output(
        &mut self,
        was_waiting: &[RequestId],
        was_running: &[RequestId],
        computed: &HashMap<RequestId, (usize, Vec<u32>)>,
    ) {
        let cfg = self.sched.config().clone();
        let out = &self.out;
        assert!(out.num_scheduled_tokens <= cfg.max_num_batched_tokens);
        assert!(out.chunks.len() <= cfg.max_num_seqs);
        assert!(self.sched.num_running() <= cfg.max_num_seqs);
        let mut ids = HashSet::new();
        let mut total = 0;
        for (i, c) in out.chunks.iter().enumerate() {
            assert!(ids.insert(c.req_id), "{} scheduled twice", c.req_id);
            let (num_computed, tokens) = &computed[&c.req_id];
            let req = self.sched.request(c.req_id).unwrap();
            // Admission may have found a prefix hit: the chunk starts where the hit ends.
            if was_running.contains(&c.req_id) {
                assert_eq!(c.start_pos, *num_computed, "chunk not contiguous");
            } else {
                assert_eq!(c.start_pos, req.num_computed_tokens);
                assert_eq!(c.start_pos % cfg.block_size, 0, "hit not block aligned");
            }
            assert!(c.num_tokens > 0);
            // Known tokens, then the drafts (never more than the request could accept).
            let end = c.start_pos + c.num_tokens - c.num_draft_tokens;
            assert_eq!(
                &out.tokens(c)[..end - c.start_pos],
                &tokens[c.start_pos..end]
            );
            if c.num_draft_tokens > 0 {
                let spec = cfg.speculative.expect("drafts only with speculation");
                assert!(c.num_draft_tokens <= spec.num_speculative_tokens);
                assert!(c.is_decode && c.sample && c.logits == LogitsWanted::All);
                let t = &self.tracks[&c.req_id];
                let max_tokens = t.params.max_tokens.unwrap_or(cfg.max_model_len);
                let outputs = tokens.len() - t.prompt.len();
                assert!(
                    outputs + c.num_draft_tokens < max_tokens,
                    "drafts past max_tokens"
                );
                assert!(tokens.len() + c.num_draft_tokens < cfg.max_model_len);
            }
            let table = out.block_table(c);
            // Blocks of drafts rejected earlier stay with the request, and a draft model's
            // lookahead slots lie past the chunk.
            let need = (c.start_pos + c.num_tokens).div_ceil(cfg.block_size);
            let spare = cfg
                .speculative
                .map_or(0, |s| s.num_speculative_tokens + s.lookahead());
            let most = (c.start_pos + c.num_tokens + spare).div_ceil(cfg.block_size);
            assert!(table.len() >= need && table.len() <= most, "table size");
            let live: Vec<_> = table.iter().filter(|&&b| b != BlockId::NULL.0).collect();
            assert_eq!(live.len(), live.iter().collect::<HashSet<_>>().len());
            if cfg.sliding_window.is_none() {
                assert_eq!(live.len(), table.len());
            }
            assert_eq!(c.sample, end == tokens.len());
            let want = if c.sample {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            if !self.tracks[&c.req_id].params.prompt_logprobs && c.num_draft_tokens == 0 {
                assert_eq!(c.logits, want);
            }
            assert_eq!(out.seq_chunk(i).tokens, out.tokens(c));
            total += c.num_tokens;
            if self.tracks[&c.req_id].first_step.is_none() {
                self.tracks.get_mut(&c.req_id).unwrap().first_step = Some(self.step);
            }
        }
        assert_eq!(total, out.num_scheduled_tokens);

        // Admission order: everything admitted this step precedes everything left waiting.
        let running_now = |id: &RequestId| {
            self.sched
                .request(*id)
                .is_some_and(|r| r.status == RequestStatus::Running)
        };
        let admitted: Vec<_> = was_waiting.iter().filter(|id| running_now(id)).collect();
        let left: Vec<_> = was_waiting
            .iter()
            .filter(|id| !running_now(id) && !self.tracks[id].aborted)
            .collect();
        if let (Some(a), Some(l)) = (
            admitted.iter().map(|&&id| self.key(id)).max(),
            left.iter().map(|&&id| self.key(id)).min(),
        ) {
            assert!(
                a < l,
                "admitted {a:?} ahead of waiting {l:?} at step {}",
                self.step
            );
        }
        // Nothing running starves: each gets a token or is preempted.
        if self.check_running_progress {
            for id in was_running {
                let (num_computed, tokens) = &computed[id];
                let catching_up = tokens.len() - num_computed > 1;
                if self.tracks[id].aborted || (catching_up && !cfg.enable_chunked_prefill) {
                    continue;
                }
                assert!(
                    ids.contains(id) || out.preempted.contains(id),
                    "running {id} got nothing at step {}",
                    self.step
                );
            }
        }
    }

    /// A stand-in for a draft model: each running decode is handed, as its next proposal,
    /// up to `k` of the tokens `period` positions back (what the copying model usually emits).
    pub fn propose_copied_drafts(&mut self, period: usize, k: usize) {
        let ids: Vec<RequestId> = self.tracks.keys().copied().collect();
        for id in ids {
            let Some(r) = self.sched.request(id) else {
                continue;
            };
            if r.status != RequestStatus::Running || r.num_uncomputed_tokens() != 1 {
                continue;
            }
            let t = r.token_ids();
            let from = t.len().saturating_sub(period);
            let drafts: Vec<u32> = t[from..].iter().copied().take(k).collect();
            self.sched.set_drafts(id, &drafts);
        }
    }

    pub fn live(&self) -> bool {
        self.sched.has_unfinished_requests()
    }

    /// Steps until nothing is left; panics past `max_steps`.
    pub fn run_to_completion(&mut self, max_steps: usize) {
        while self.live() {
            assert!(
                self.step < max_steps,
                "not finished after {max_steps} steps"
            );
            self.step();
        }
        // One more schedule frees pending aborts.
        self.sched.schedule_into(&mut self.out);
        assert!(self.out.is_empty());
    }

    /// Every finished request matches its reference; aborted ones are a prefix of it.
    pub fn check_against_reference(&self) {
        let cfg = self.cfg();
        for (id, t) in &self.tracks {
            let max_tokens = t
                .params
                .max_tokens
                .unwrap_or(cfg.max_model_len - t.prompt.len());
            let (want, reason) = reference(
                &t.prompt,
                &t.params,
                max_tokens,
                cfg.max_model_len,
                cfg.sliding_window,
                self.runner.copy_period,
                self.runner.copy_miss_one_in,
            );
            if t.aborted {
                assert!(want.starts_with(&t.output), "aborted {id} diverged");
            } else {
                assert_eq!(t.output, want, "request {id} output differs from reference");
                assert_eq!(t.finish, Some(reason), "request {id} finish reason");
            }
        }
    }
}

/// Greedy params with EOS on and `max_tokens`.
pub fn params(max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        eos_token_id: Some(EOS),
        ..Default::default()
    }
}

/// Params that never stop early.
pub fn params_exact(max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        eos_token_id: Some(EOS),
        ignore_eos: true,
        ..Default::default()
    }
}

pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| 1 + (mix(seed, i) % (VOCAB - 1)) as u32)
        .collect()
}
