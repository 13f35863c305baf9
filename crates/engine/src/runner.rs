//! [`ModelRunner`]: executes a [`SchedulerOutput`] — one forward pass over its chunks, then one
//! sampled token per chunk that asks for it (and prompt logprobs where requested).
//!
//! Owns the model, the KV storage, the activation workspace and each request's [`Sampler`]
//! (created on the request's first sample, dropped when the scheduler says it finished). A
//! sampler outlives preemption, so a seeded request continues its random stream unchanged.
//!
//! The KV storage has one block more than the scheduler hands out: the scratch block that
//! static batching's pad tokens write to (each pad is a one-token chunk at position 0 whose
//! output is discarded — it costs what a padded slot costs, the matmuls).

use std::collections::HashMap;

use tokenmill_model::{KvCache, LlamaModel, LogitsWanted, SeqChunk, Workspace};

use crate::error::EngineError;
use crate::request::RequestId;
use crate::sampler::{MAX_LOGPROBS, Sampled, Sampler, top_logprobs};
use crate::scheduler::Scheduler;
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
    model: LlamaModel,
    kv: KvCache,
    ws: Workspace,
    samplers: HashMap<RequestId, Sampler>,
    /// Scratch: tokens banned for the request being sampled.
    banned: Vec<u32>,
    /// Block table of the pad scratch block.
    pad_table: [u32; 1],
}

/// The token a pad slot runs.
const PAD: [u32; 1] = [0];

impl ModelRunner {
    pub fn new(model: LlamaModel, num_blocks: usize, block_size: usize) -> ModelRunner {
        let kv = KvCache::new(model.config(), num_blocks + 1, block_size);
        ModelRunner {
            model,
            kv,
            ws: Workspace::default(),
            samplers: HashMap::new(),
            banned: Vec::new(),
            pad_table: [num_blocks as u32],
        }
    }

    pub fn model(&self) -> &LlamaModel {
        &self.model
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
        let mut chunks: Vec<SeqChunk<'_>> = out.seq_chunks().collect();
        chunks.extend((0..out.num_pad_tokens).map(|_| SeqChunk {
            tokens: &PAD,
            start_pos: 0,
            block_table: &self.pad_table,
            logits: LogitsWanted::None,
        }));
        let vocab = self.model.config().vocab_size;
        let logits = self
            .model
            .forward(&chunks, &mut self.kv, &mut self.ws)
            .map_err(|e| EngineError::Model(e.to_string()))?;
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

fn log_softmax_at(row: &[f32], token: u32) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + row.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    row[token as usize] - lse
}
