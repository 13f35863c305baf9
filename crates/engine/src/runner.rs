//! [`ModelRunner`]: executes a [`SchedulerOutput`] — one forward pass over its chunks, then one
//! sampled token per chunk that asks for it (and prompt logprobs where requested).
//!
//! Owns the model, the KV storage, the activation workspace and each request's [`Sampler`]
//! (created on the request's first sample, dropped when the scheduler says it finished). A
//! sampler outlives preemption, so a seeded request continues its random stream unchanged.
//!
//! The KV storage has one block more than the scheduler hands out: the scratch block that
//! static batching's pad rows write to. A pad row (`PadChunk`) runs at its padded position
//! over a block table that repeats the scratch block, so it costs what a padded slot costs —
//! the matmuls, attention over the padded length and, for a finished member's slot, the LM
//! head — and its outputs are discarded.

use std::collections::HashMap;

use tokenmill_model::{KvDtype, LogitsWanted, Model, ModelKv, SeqChunk, Workspace};

use crate::error::EngineError;
use crate::request::RequestId;
use crate::sampler::{MAX_LOGPROBS, Sampled, Sampler, top_logprobs};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::scheduler_output::SchedulerOutput;

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
}

pub struct ModelRunner {
    model: Model,
    kv: ModelKv,
    ws: Workspace,
    samplers: HashMap<RequestId, Sampler>,
    /// Scratch: tokens banned for the request being sampled.
    banned: Vec<u32>,
    /// Block table of pad rows: the scratch block, once per block a sequence can span.
    pad_table: Vec<u32>,
    /// Token ids of pad rows (zeros; grown to the longest pad row seen).
    pad_tokens: Vec<u32>,
}

impl ModelRunner {
    /// A runner whose f32 KV storage holds `config.num_blocks` blocks (plus the pad scratch
    /// block) and whose workspace is sized for the step limits up front, so steps within them
    /// never allocate activation memory.
    pub fn new(model: impl Into<Model>, config: &SchedulerConfig) -> ModelRunner {
        ModelRunner::with_kv_dtype(model, config, KvDtype::F32)
    }

    /// [`ModelRunner::new`] with K/V stored as `kv_dtype` (`--kv-cache-dtype`; size
    /// `config.num_blocks` with [`Model::kv_elem_bytes`] of it).
    pub fn with_kv_dtype(
        model: impl Into<Model>,
        config: &SchedulerConfig,
        kv_dtype: KvDtype,
    ) -> ModelRunner {
        let model = model.into();
        let num_blocks = config.num_blocks;
        let kv = model.kv_cache_with_dtype(num_blocks + 1, config.block_size, kv_dtype);
        let ws = model.workspace(config.max_num_batched_tokens, config.max_num_seqs);
        ModelRunner {
            model,
            kv,
            ws,
            samplers: HashMap::new(),
            banned: Vec::new(),
            pad_table: vec![num_blocks as u32; config.max_model_len.div_ceil(config.block_size)],
            pad_tokens: Vec::new(),
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Bytes the KV storage holds per token, all layers (latent rows for DeepSeek MLA).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.kv.bytes_per_token()
    }

    /// Forgets a finished or aborted request's sampler.
    pub fn drop_request(&mut self, id: RequestId) {
        self.samplers.remove(&id);
    }

    /// Runs one step. `sched` supplies each request's parameters and tokens so far.
    pub fn execute(
        &mut self,
        out: &SchedulerOutput,
        sched: &Scheduler,
    ) -> Result<StepResult, EngineError> {
        let mut exec = tokenmill_trace::scope("execute_model", "engine");
        let prepare = tokenmill_trace::scope("prepare_batch", "engine");
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
        drop(prepare);
        let vocab = self.model.vocab_size();
        let forward = tokenmill_trace::scope("forward", "engine");
        let logits = self
            .model
            .forward(&chunks, &mut self.kv, &mut self.ws)
            .map_err(|e| EngineError::Model(e.to_string()))?;
        drop(forward);
        let _sample = tokenmill_trace::scope("sample", "engine");
        let mut result = StepResult::default();
        let mut row = 0;
        for (c, sc) in out.chunks.iter().zip(&chunks) {
            let n_rows = sc.n_logits();
            let rows = &mut logits[row * vocab..(row + n_rows) * vocab];
            row += n_rows;
            let Some(req) = sched.request(c.req_id) else {
                continue;
            };
            if sc.logits == LogitsWanted::All {
                let n = req.params.sampling.logprobs.unwrap_or(0).min(MAX_LOGPROBS);
                let prompt = req.prompt();
                // Row i predicts the token at position start_pos + i + 1.
                let entries = (0..sc.tokens.len())
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
                    .collect();
                result
                    .prompt_logprobs
                    .push((c.req_id, c.start_pos + 1, entries));
            }
            if c.sample {
                let last = &mut rows[(n_rows - 1) * vocab..];
                let p = &req.params;
                let sampler = self
                    .samplers
                    .entry(c.req_id)
                    .or_insert_with(|| Sampler::with_prompt(p.sampling.clone(), req.prompt()));
                // Stop tokens and EOS may not end the output before min_tokens.
                self.banned.clear();
                if req.num_output_tokens() < p.min_tokens && !p.ignore_eos {
                    self.banned
                        .extend(p.stop_token_ids.iter().chain(&p.eos_token_id));
                }
                let sampled = sampler.sample(last, &self.banned);
                result.sampled.push((c.req_id, sampled));
            }
        }
        Ok(result)
    }
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
