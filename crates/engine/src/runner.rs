//! [`ModelRunner`]: executes a [`SchedulerOutput`] — one forward pass over its chunks, then one
//! sampled token per chunk that asks for it (and prompt logprobs where requested).
//!
//! Owns the model, the KV storage, the activation workspace and its own per-request state:
//! the prompt and parameters a [`NewRequest`] brought, and the request's [`Sampler`] — kept
//! until the request's id comes back finished (`finished_req_ids`, or
//! [`ModelRunner::drop_request`]). It outlives preemption, so a seeded request continues
//! its random stream unchanged. Everything it reads comes from the [`SchedulerOutput`]: the
//! runner knows nothing of the scheduler.
//!
//! Speculative decoding: a chunk that carries drafts wants every row's logits; row `i` is
//! sampled as a plain decode would be, and sampling moves to row `i + 1` only while the
//! sampled token equals draft `i` (`verify`; see `spec`). With a draft model, the runner then
//! has it ingest what was verified and guess the next tokens ([`DraftModel`]), returned in
//! [`StepResult::drafts`].
//!
//! A request with an output constraint also keeps its [`ConstraintState`] and a token mask.
//! Before the forward pass of a step in which such requests sample, their masks are filled
//! in parallel, one request per task on the compute pool — the forward's own threads: a
//! helper thread beside the forward would oversubscribe the cores, and a pool worker it
//! preempts holds up the whole step (single-stream TPOT +4% to +15% on 2 cores; see
//! BENCHMARKS.md).
//! The mask then cuts the logits before sampling, and the sampled token advances the state.
//! A state that fails, or allows no token, fails that request alone ([`StepResult::failed`]).
//!
//! The KV storage has one block more than the scheduler hands out: the scratch block that
//! static batching's pad rows write to. A pad row (`PadChunk`) runs at its padded position
//! over a block table that repeats the scratch block, so it costs what a padded slot costs —
//! the matmuls, attention over the padded length and, for a finished member's slot, the LM
//! head — and its outputs are discarded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokenmill_model::{KvDtype, LogitsWanted, Model, ModelKv, SeqChunk, Workspace, compute_pool};

use crate::constraint::{ConstraintState, TokenMask};
use crate::error::EngineError;
use crate::pooling::Pooler;
use crate::request::{RequestId, RequestParams};
use crate::sampler::{MAX_LOGPROBS, Sampled, Sampler, top_logprobs};
use crate::scheduler_config::SchedulerConfig;
use crate::scheduler_output::{NewRequest, ScheduledChunk, SchedulerOutput};
use crate::spec::draft::DraftModel;

/// Logprob of one prompt token given the tokens before it, with the top alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What one step produced, in chunk order.
#[derive(Default)]
pub struct StepResult {
    pub sampled: Vec<(RequestId, Sampled)>,
    /// Per request with prompt logprobs: those of prompt tokens `start..start + n`.
    pub prompt_logprobs: Vec<(RequestId, usize, Vec<PromptLogprob>)>,
    /// Requests whose output constraint failed this step (they sampled nothing).
    pub failed: Vec<(RequestId, EngineError)>,
    /// The draft model's proposals for the next step (speculative decoding with one).
    pub drafts: Vec<(RequestId, Vec<u32>)>,
    /// Embedding requests whose prompt this step completed: their pooled vectors.
    pub pooled: Vec<(RequestId, Vec<f32>)>,
}

/// What the runner keeps of a request between its first step and its end.
struct RunnerRequest {
    /// Shared with the `NewRequest` that brought it (no copy).
    prompt: Arc<[u32]>,
    params: RequestParams,
    sampler: Sampler,
    constraint: Option<ConstrainedOutput>,
    pooler: Option<Pooler>,
}

/// A request's place in its output constraint and the mask of its next token.
struct ConstrainedOutput {
    state: Box<dyn ConstraintState>,
    mask: TokenMask,
    /// How filling `mask` for this step went.
    filled: Result<(), String>,
}

impl ConstrainedOutput {
    /// Applies the mask to `logits` and drops from `banned` the tokens it must keep: when the
    /// constraint allows only banned tokens (EOS before `min_tokens`, say), the constraint
    /// wins. `Err` when the mask could not be filled or allows nothing.
    fn cut(&mut self, logits: &mut [f32], banned: &mut Vec<u32>) -> Result<(), String> {
        std::mem::replace(&mut self.filled, Ok(()))?;
        let allowed = self.mask.count();
        if allowed == 0 {
            return Err("no token is allowed at this point".into());
        }
        // `banned` may name a token twice (EOS is often a stop token too): count each once.
        let banned_allowed = banned
            .iter()
            .enumerate()
            .filter(|&(i, t)| self.mask.is_allowed(*t) && !banned[..i].contains(t))
            .count();
        if banned_allowed == allowed {
            banned.clear();
        }
        self.mask.apply(logits);
        Ok(())
    }
}

pub struct ModelRunner {
    model: Model,
    kv: ModelKv,
    ws: Workspace,
    requests: HashMap<RequestId, RunnerRequest>,
    /// Scratch: tokens banned for the request being sampled.
    banned: Vec<u32>,
    /// Block table of pad rows: the scratch block, once per block a sequence can span.
    pad_table: Vec<u32>,
    /// Token ids of pad rows (zeros; grown to the longest pad row seen).
    pad_tokens: Vec<u32>,
    /// Speculative decoding's draft model, when it has one.
    draft: Option<DraftModel>,
}

impl ModelRunner {
    /// A runner whose f32 KV storage holds `config.num_blocks` blocks (plus the pad scratch
    /// block) and whose workspace is sized for the step limits up front, so steps within them
    /// never allocate activation memory.
    pub fn new(model: impl Into<Model>, config: &SchedulerConfig) -> ModelRunner {
        ModelRunner::with_kv_dtype(model, config, KvDtype::F32)
    }

    /// [`ModelRunner::new`] with K/V stored as `kv_dtype` (`--kv-cache-dtype`; size
    /// `config.num_blocks` with [`KvDtype::bytes`] of it).
    pub fn with_kv_dtype(
        model: impl Into<Model>,
        config: &SchedulerConfig,
        kv_dtype: KvDtype,
    ) -> ModelRunner {
        let model = model.into();
        let num_blocks = config.num_blocks;
        let kv = model.kv_cache_with_dtype(num_blocks + 1, config.block_size, kv_dtype);
        // A verification chunk wants the logits of each of its drafts too.
        let drafts = config.speculative.map_or(0, |s| s.num_speculative_tokens);
        let logit_rows = (config.max_num_seqs * (1 + drafts))
            .min(config.max_num_batched_tokens)
            .max(config.max_num_seqs);
        let ws = model.workspace(config.max_num_batched_tokens, logit_rows);
        ModelRunner {
            model,
            kv,
            ws,
            requests: HashMap::new(),
            banned: Vec::new(),
            pad_table: vec![num_blocks as u32; config.max_model_len.div_ceil(config.block_size)],
            pad_tokens: Vec::new(),
            draft: None,
        }
    }

    /// The runner with `draft` proposing speculative tokens after every step (its KV storage
    /// parallel to the target's, of `kv_dtype`). Refused unless it shares the target's
    /// vocabulary.
    pub fn with_draft(
        mut self,
        draft: Model,
        config: &SchedulerConfig,
        kv_dtype: KvDtype,
    ) -> Result<ModelRunner, EngineError> {
        let vocab = self.model.vocab_size();
        self.draft = Some(DraftModel::new(draft, vocab, config, kv_dtype)?);
        Ok(self)
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Bytes the KV storage holds per token, all layers (latent rows for DeepSeek MLA).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.kv.bytes_per_token()
    }

    /// Forgets a finished or aborted request (its prompt, parameters and sampler).
    pub fn drop_request(&mut self, id: RequestId) {
        self.requests.remove(&id);
    }

    /// Requests the runner holds state for.
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    fn add_request(&mut self, r: &NewRequest) {
        let sampler = Sampler::with_prompt(r.params.sampling.clone(), &r.prompt);
        let constraint = r.params.constraint.as_ref().map(|c| ConstrainedOutput {
            state: c.start(),
            mask: TokenMask::new(self.model.vocab_size()),
            filled: Ok(()),
        });
        let state = RunnerRequest {
            prompt: Arc::clone(&r.prompt),
            params: r.params.clone(),
            sampler,
            constraint,
            pooler: r.params.pooling.map(Pooler::new),
        };
        self.requests.insert(r.req_id, state);
    }

    /// Runs one step: forgets `out.finished_req_ids`, takes in `out.new_requests`, runs the
    /// forward pass over the chunks (and static batching's pad rows) and samples.
    pub fn execute(&mut self, out: &SchedulerOutput) -> Result<StepResult, EngineError> {
        let mut exec = tokenmill_trace::scope("execute_model", "engine");
        let prepare = tokenmill_trace::scope("prepare_batch", "engine");
        for id in &out.finished_req_ids {
            self.requests.remove(id);
        }
        for r in &out.new_requests {
            self.add_request(r);
        }
        let longest_pad = out.pads.iter().map(|p| p.num_tokens).max().unwrap_or(0);
        if self.pad_tokens.len() < longest_pad {
            self.pad_tokens.resize(longest_pad, 0);
        }
        let mut chunks: Vec<SeqChunk<'_>> = out.seq_chunks().collect();
        chunks.extend(out.pads.iter().map(|p| SeqChunk {
            tokens: &self.pad_tokens[..p.num_tokens],
            start_pos: p.start_pos,
            block_table: &self.pad_table,
            logits: if p.logits {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            },
        }));
        if exec.is_recording() {
            trace_batch_shape(&mut exec, &chunks);
        }
        // Part of preparing the batch (the profiler's `prepare_batch` stage).
        fill_masks(&mut self.requests, out);
        drop(prepare);
        let vocab = self.model.vocab_size();
        let forward = tokenmill_trace::scope("forward", "engine");
        let logits = self
            .model
            .forward(&chunks, &mut self.kv, &mut self.ws)
            .map_err(|e| EngineError::Model(e.to_string()))?;
        drop(forward);
        let sample = tokenmill_trace::scope("sample", "engine");
        let mut result = StepResult::default();
        let mut row = 0;
        for (c, sc) in out.chunks.iter().zip(&chunks) {
            let n_rows = sc.n_logits();
            let rows = &mut logits[row * vocab..(row + n_rows) * vocab];
            row += n_rows;
            let Some(req) = self.requests.get_mut(&c.req_id) else {
                return Err(EngineError::Model(format!(
                    "request {} was scheduled but never announced to the runner",
                    c.req_id
                )));
            };
            if sc.logits == LogitsWanted::All && c.num_draft_tokens == 0 {
                let entries = prompt_logprobs(req, c, rows, vocab);
                result
                    .prompt_logprobs
                    .push((c.req_id, c.start_pos + 1, entries));
            }
            if c.sample {
                let drafts = &sc.tokens[sc.tokens.len() - c.num_draft_tokens..];
                let first = n_rows - 1 - drafts.len();
                let rows = &mut rows[first * vocab..];
                verify(req, c, drafts, rows, vocab, &mut self.banned, &mut result);
            }
        }
        drop(sample);
        pool_hidden(
            &mut self.requests,
            out,
            &chunks,
            self.ws.hidden(),
            &mut result,
        );
        if let Some(draft) = &mut self.draft {
            let _s = tokenmill_trace::scope("draft", "engine");
            result.drafts = draft.propose(out, &result.sampled)?;
        }
        Ok(result)
    }
}

/// Folds each embedding request's hidden rows of this step into its pooler, and returns the
/// vectors of those whose prompt is now complete.
fn pool_hidden(
    requests: &mut HashMap<RequestId, RunnerRequest>,
    out: &SchedulerOutput,
    chunks: &[SeqChunk<'_>],
    hidden: &[f32],
    result: &mut StepResult,
) {
    let n_rows: usize = chunks.iter().map(|c| c.n_hidden()).sum();
    if n_rows == 0 {
        return;
    }
    let h = hidden.len() / n_rows;
    let mut row = 0;
    for (c, sc) in out.chunks.iter().zip(chunks) {
        let n = sc.n_hidden();
        let rows = &hidden[row * h..(row + n) * h];
        row += n;
        let Some(req) = requests.get_mut(&c.req_id) else {
            continue;
        };
        let Some(pooler) = req.pooler.as_mut().filter(|_| n > 0) else {
            continue;
        };
        pooler.add(c.start_pos, rows, h);
        let len = req.prompt.len();
        if c.start_pos + c.num_tokens == len {
            result.pooled.push((c.req_id, pooler.finish(len)));
        }
    }
}

/// Samples the tokens of a chunk that samples: `rows` holds the logits of its last token and
/// of each of its `drafts` (none without speculation). Row `i` is sampled as a plain decode
/// would be; the draft at `i` is accepted iff the sampled token equals it, and sampling goes
/// on to the next row only then (see `spec`). Each sampled token goes into `result`, in
/// order; a failing constraint fails the request instead.
fn verify(
    req: &mut RunnerRequest,
    c: &ScheduledChunk,
    drafts: &[u32],
    rows: &mut [f32],
    vocab: usize,
    banned: &mut Vec<u32>,
    result: &mut StepResult,
) {
    for (i, row) in rows.chunks_exact_mut(vocab).enumerate() {
        match sample_next(req, c.num_output_tokens + i, row, banned) {
            Ok(sampled) => {
                let accepted = drafts.get(i) == Some(&sampled.token);
                result.sampled.push((c.req_id, sampled));
                if !accepted {
                    return;
                }
            }
            Err(message) => {
                let id = c.req_id;
                result
                    .failed
                    .push((id, EngineError::Constraint { id, message }));
                return;
            }
        }
    }
}

/// Samples the next token of `req` from its row of logits, the request having
/// `num_output_tokens` outputs before it: EOS and stop tokens banned before `min_tokens`
/// (into the `banned` scratch), the constraint's mask applied and its state advanced.
/// `Err`: the constraint failed.
fn sample_next(
    req: &mut RunnerRequest,
    num_output_tokens: usize,
    logits: &mut [f32],
    banned: &mut Vec<u32>,
) -> Result<Sampled, String> {
    let p = &req.params;
    banned.clear();
    if num_output_tokens < p.min_tokens && !p.ignore_eos {
        banned.extend(p.stop_token_ids.iter().chain(&p.eos_token_id));
    }
    if let Some(con) = &mut req.constraint {
        con.cut(logits, banned)?;
    }
    let mut sampled = req.sampler.sample(logits, banned);
    if let Some(con) = &mut req.constraint {
        sampled.complete = con.state.accept(sampled.token)?;
    }
    Ok(sampled)
}

/// Fills the token mask of every constrained request that samples in this step, one
/// request per task on the compute pool. Nothing happens (and nothing is allocated) in a
/// step without such requests.
fn fill_masks(requests: &mut HashMap<RequestId, RunnerRequest>, out: &SchedulerOutput) {
    let sampled = |id: &RequestId| out.chunks.iter().any(|c| c.sample && c.req_id == *id);
    if !requests
        .iter()
        .any(|(id, r)| r.constraint.is_some() && sampled(id))
    {
        return;
    }
    let _s = tokenmill_trace::scope("constraint_masks", "engine");
    let jobs: Vec<Mutex<&mut ConstrainedOutput>> = requests
        .iter_mut()
        .filter(|(id, _)| sampled(id))
        .filter_map(|(_, r)| r.constraint.as_mut().map(Mutex::new))
        .collect();
    compute_pool().parallel_for(jobs.len(), |i| {
        let mut guard = jobs[i].lock().unwrap_or_else(|p| p.into_inner());
        let con: &mut ConstrainedOutput = &mut guard;
        con.mask.clear();
        con.filled = con.state.fill_mask(&mut con.mask);
    });
}

/// Logprobs of the prompt tokens a chunk's rows predict: row `i` predicts the token at
/// position `start_pos + i + 1`.
fn prompt_logprobs(
    req: &RunnerRequest,
    c: &ScheduledChunk,
    rows: &[f32],
    vocab: usize,
) -> Vec<PromptLogprob> {
    let n = req.params.sampling.logprobs.unwrap_or(0).min(MAX_LOGPROBS);
    let prompt = &req.prompt;
    (0..c.num_tokens)
        .filter(|i| c.start_pos + i + 1 < prompt.len())
        .map(|i| {
            let r = &rows[i * vocab..(i + 1) * vocab];
            let token = prompt[c.start_pos + i + 1];
            let top = top_logprobs(r, n.max(1));
            let logprob = log_softmax_at(r, token);
            PromptLogprob {
                token,
                logprob,
                top: if n == 0 { Vec::new() } else { top },
            }
        })
        .collect()
}

/// The batch's shape as `execute_model` arguments, for the profiler's FLOP and byte counts:
/// tokens, logit rows, Σ over tokens of the context each attends to, and Σ over chunks of
/// the context each chunk's attention reads.
fn trace_batch_shape(exec: &mut tokenmill_trace::Scope, chunks: &[SeqChunk<'_>]) {
    let tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
    let rows: usize = chunks.iter().map(|c| c.n_logits()).sum();
    let attn_ctx: usize = chunks
        .iter()
        .map(|c| {
            let (s, n) = (c.start_pos, c.tokens.len());
            n * s + n * (n + 1) / 2
        })
        .sum();
    let kv_read: usize = chunks.iter().map(|c| c.start_pos + c.tokens.len()).sum();
    exec.arg("tokens", tokens);
    exec.arg("logit_rows", rows);
    exec.arg("attn_ctx", attn_ctx);
    exec.arg("kv_read", kv_read);
}

fn log_softmax_at(row: &[f32], token: u32) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + row.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    row[token as usize] - lse
}

#[cfg(test)]
mod tests {
    //! The runner driven from plain data: hand-made `SchedulerOutput`s, no scheduler.

    use tokenmill_model::{LogitsWanted, Model};

    use super::*;
    use crate::block_pool::BlockId;
    use crate::sampler::{SamplingParams, argmax};

    const PROMPT: [u32; 6] = [1, 504, 3458, 282, 4649, 314];

    fn config() -> SchedulerConfig {
        SchedulerConfig {
            num_blocks: 8,
            block_size: 16,
            max_num_batched_tokens: 64,
            max_num_seqs: 4,
            max_model_len: 128,
            ..SchedulerConfig::default()
        }
    }

    fn runner() -> ModelRunner {
        let model = Model::open(&tokenmill_testutil::model_path()).unwrap();
        ModelRunner::new(model, &config())
    }

    fn new_request(id: u64, params: RequestParams) -> NewRequest {
        NewRequest {
            req_id: RequestId(id),
            prompt: PROMPT.as_slice().into(),
            params,
        }
    }

    fn greedy(min_tokens: usize, eos: Option<u32>) -> RequestParams {
        RequestParams {
            min_tokens,
            eos_token_id: eos,
            sampling: SamplingParams::greedy(),
            ..RequestParams::default()
        }
    }

    /// The prompt of request `id` as one chunk on blocks `[2 id]`, sampled.
    fn prompt_step(id: u64, logits: LogitsWanted, num_output_tokens: usize) -> SchedulerOutput {
        let mut out = SchedulerOutput::new();
        let blocks = [BlockId(2 * id as u32)];
        out.push_chunk(
            RequestId(id),
            &PROMPT,
            &[],
            0,
            &blocks,
            logits,
            true,
            false,
            num_output_tokens,
        );
        out
    }

    /// The greedy next token of the prompt, straight from the model.
    fn model_greedy() -> u32 {
        let model = Model::open(&tokenmill_testutil::model_path()).unwrap();
        let mut kv = model.kv_cache(1, 16);
        let mut ws = model.workspace(16, 1);
        let chunk = SeqChunk {
            tokens: &PROMPT,
            start_pos: 0,
            block_table: &[0],
            logits: LogitsWanted::Last,
        };
        argmax(model.forward(&[chunk], &mut kv, &mut ws).unwrap())
    }

    #[test]
    fn a_new_request_samples_what_the_model_predicts_and_is_forgotten_when_finished() {
        let mut r = runner();
        let mut out = prompt_step(1, LogitsWanted::Last, 0);
        out.new_requests.push(new_request(1, greedy(0, None)));
        let res = r.execute(&out).unwrap();
        assert_eq!(res.sampled.len(), 1);
        assert_eq!(res.sampled[0].0, RequestId(1));
        assert_eq!(res.sampled[0].1.token, model_greedy());
        assert!(res.prompt_logprobs.is_empty());
        assert_eq!(r.num_requests(), 1);
        let mut done = SchedulerOutput::new();
        done.finished_req_ids.push(RequestId(1));
        r.execute(&done).unwrap();
        assert_eq!(r.num_requests(), 0);
    }

    #[test]
    fn min_tokens_bans_eos_by_the_chunks_output_count() {
        let best = model_greedy();
        let mut r = runner();
        // EOS is the greedy token: banned while the request has fewer than 3 outputs.
        let mut out = prompt_step(1, LogitsWanted::Last, 2);
        out.new_requests.push(new_request(1, greedy(3, Some(best))));
        assert_ne!(r.execute(&out).unwrap().sampled[0].1.token, best);
        let out = prompt_step(1, LogitsWanted::Last, 3);
        assert_eq!(r.execute(&out).unwrap().sampled[0].1.token, best);
    }

    #[test]
    fn prompt_logprobs_come_from_the_runners_own_copy_of_the_prompt() {
        let mut r = runner();
        let mut out = prompt_step(1, LogitsWanted::All, 0);
        let params = RequestParams {
            prompt_logprobs: true,
            ..greedy(0, None)
        };
        out.new_requests.push(new_request(1, params));
        let res = r.execute(&out).unwrap();
        let (id, start, entries) = &res.prompt_logprobs[0];
        assert_eq!((*id, *start), (RequestId(1), 1));
        let tokens: Vec<u32> = entries.iter().map(|e| e.token).collect();
        assert_eq!(tokens, PROMPT[1..]);
        assert!(entries.iter().all(|e| e.logprob < 0.0 && e.top.is_empty()));
    }

    /// The accept/reject rule on a small distribution: the prompt's next token sampled at
    /// temperature 1 among its 4 likeliest, with the likeliest proposed as a draft. Over 2000
    /// seeds the first token out follows the model's distribution (chi-square), the draft is
    /// accepted as often as its probability says, and a bonus token follows exactly then.
    #[test]
    fn verifying_a_draft_keeps_the_target_distribution() {
        let model = Model::open(&tokenmill_testutil::model_path()).unwrap();
        let vocab = model.vocab_size();
        let draft = model_greedy();
        let tokens: Vec<u32> = PROMPT.iter().copied().chain([draft]).collect();
        let (mut kv, mut ws) = (model.kv_cache(1, 16), model.workspace(16, 8));
        let chunk = SeqChunk {
            tokens: &tokens,
            start_pos: 0,
            block_table: &[0],
            logits: LogitsWanted::All,
        };
        let all = model.forward(&[chunk], &mut kv, &mut ws).unwrap();
        let rows = all[(tokens.len() - 2) * vocab..].to_vec();
        // The top-4 distribution of the first row.
        let top = top_logprobs(&rows[..vocab], 4);
        let z: f64 = top.iter().map(|t| (t.1 as f64).exp()).sum();
        let p: Vec<f64> = top.iter().map(|t| (t.1 as f64).exp() / z).collect();
        assert_eq!(top[0].0, draft);
        let mut out = SchedulerOutput::new();
        let blocks = [BlockId(0)];
        out.push_chunk(
            RequestId(1),
            &PROMPT,
            &[draft],
            0,
            &blocks,
            LogitsWanted::All,
            true,
            true,
            0,
        );
        let c = &out.chunks[0];
        let n = 2000;
        let (mut counts, mut accepted) = (vec![0usize; 4], 0);
        let mut banned = Vec::new();
        for seed in 0..n as u64 {
            let sampling = SamplingParams {
                temperature: 1.0,
                top_k: 4,
                seed: Some(seed),
                ..SamplingParams::default()
            };
            let mut req = RunnerRequest {
                prompt: PROMPT.as_slice().into(),
                params: RequestParams::default(),
                sampler: Sampler::new(sampling),
                constraint: None,
                pooler: None,
            };
            let mut result = StepResult::default();
            let mut r = rows.clone();
            verify(
                &mut req,
                c,
                &[draft],
                &mut r,
                vocab,
                &mut banned,
                &mut result,
            );
            let first = result.sampled[0].1.token;
            let i = top
                .iter()
                .position(|t| t.0 == first)
                .expect("a top-4 token");
            counts[i] += 1;
            let took = first == draft;
            accepted += usize::from(took);
            assert_eq!(result.sampled.len(), if took { 2 } else { 1 });
        }
        let chi2: f64 = counts
            .iter()
            .zip(&p)
            .map(|(&o, &q)| (o as f64 - n as f64 * q).powi(2) / (n as f64 * q))
            .sum();
        // 3 degrees of freedom: P(χ² > 16.27) = 0.001.
        assert!(chi2 < 16.27, "χ² {chi2:.2}: counts {counts:?} vs p {p:?}");
        let (rate, sd) = (
            accepted as f64 / n as f64,
            (p[0] * (1.0 - p[0]) / n as f64).sqrt(),
        );
        assert!(
            (rate - p[0]).abs() < 4.0 * sd,
            "accepted {rate:.3}, p(draft) {:.3}",
            p[0]
        );
    }

    #[test]
    fn a_chunk_of_a_request_never_announced_is_an_error() {
        let mut r = runner();
        let out = prompt_step(3, LogitsWanted::Last, 0);
        let err = r.execute(&out).err().unwrap();
        assert!(err.to_string().contains("never announced"), "{err}");
    }
}
