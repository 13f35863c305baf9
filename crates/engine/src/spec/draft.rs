//! The draft-model proposer: a smaller model with the target's vocabulary guesses the next
//! tokens, greedily, a few steps ahead.
//!
//! It keeps its own KV storage, block for block parallel to the target's (same block count and
//! size), and reads the target's block tables: position `p` of a request is in the same slot
//! of the same block in both. After each target step it ingests what the target verified —
//! every chunk's known tokens and accepted drafts, then the token just sampled — so its KV
//! holds exactly the verified tokens at every position the target has computed (prefix-cache
//! hits included: a cached block was computed by a chunk the draft ingested too). Then, for
//! each request that sampled, it runs `k − 1` more single-token steps (batched across
//! requests) on its own argmax, writing its guesses' KV at the positions past the sampled
//! token; the scheduler allocates those lookahead slots with the step's own
//! ([`SpeculativeConfig::lookahead`](super::SpeculativeConfig::lookahead)). A guess the target
//! rejects is overwritten when the draft ingests the right token there.
//!
//! It guesses only for the requests the scheduler marks (`ScheduledChunk::propose`): not
//! where nothing would be verified (a full batch, a constrained request) — but it always
//! ingests, so its KV stays whole for later.
//!
//! The proposal is a point mass (argmax), so verification by sample-and-compare keeps the
//! target's distribution exactly (see `spec`).

use tokenmill_model::{KvDtype, LogitsWanted, Model, ModelKv, SeqChunk, Workspace};

use crate::error::EngineError;
use crate::request::RequestId;
use crate::sampler::{Sampled, argmax};
use crate::scheduler_config::SchedulerConfig;
use crate::scheduler_output::SchedulerOutput;

pub struct DraftModel {
    model: Model,
    kv: ModelKv,
    ws: Workspace,
    /// Drafts proposed per request at most.
    k: usize,
    block_size: usize,
    max_model_len: usize,
    /// Scratch: the tokens each chunk ingests, back to back, and per chunk
    /// `(offset, len, wants logits)`.
    tokens: Vec<u32>,
    spans: Vec<(usize, usize, bool)>,
}

/// A request being drafted for: its chunk, the position of its next token, how many more
/// guesses it may write, and its guesses so far.
struct Drafting {
    chunk: usize,
    pos: usize,
    left: usize,
    drafts: Vec<u32>,
}

impl DraftModel {
    /// A draft model for a target of `target_vocab` tokens, sized like the target's runner.
    pub fn new(
        model: Model,
        target_vocab: usize,
        config: &SchedulerConfig,
        kv_dtype: KvDtype,
    ) -> Result<DraftModel, EngineError> {
        if model.vocab_size() != target_vocab {
            return Err(EngineError::InvalidConfig(format!(
                "the speculative model's vocabulary has {} tokens, the target's {target_vocab}: \
                 a draft model must share the target's tokenizer",
                model.vocab_size()
            )));
        }
        let k = config.speculative.map_or(0, |s| s.num_speculative_tokens);
        // Each chunk ingests at most its tokens plus the one sampled after them.
        let tokens = config.max_num_batched_tokens + config.max_num_seqs;
        Ok(DraftModel {
            kv: model.kv_cache_with_dtype(config.num_blocks + 1, config.block_size, kv_dtype),
            ws: model.workspace(tokens, config.max_num_seqs),
            model,
            k,
            block_size: config.block_size,
            max_model_len: config.max_model_len,
            tokens: Vec::with_capacity(tokens),
            spans: Vec::with_capacity(config.max_num_seqs),
        })
    }

    /// Ingests what the target verified in the step `out` described (`sampled`: its tokens,
    /// in chunk order) and proposes up to `k` drafts for each request that sampled.
    pub fn propose(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(RequestId, Sampled)],
    ) -> Result<Vec<(RequestId, Vec<u32>)>, EngineError> {
        let mut drafting = self.ingest(out, sampled)?;
        // Each further step feeds every request still drafting its last guess, one position on.
        let vocab = self.model.vocab_size();
        loop {
            let active: Vec<usize> = (0..drafting.len())
                .filter(|&i| drafting[i].left > 0)
                .collect();
            if active.is_empty() {
                return Ok(hand_over(out, drafting));
            }
            let last: Vec<u32> = active
                .iter()
                .map(|&i| *drafting[i].drafts.last().expect("a first guess"))
                .collect();
            let chunks: Vec<SeqChunk<'_>> = active
                .iter()
                .zip(&last)
                .map(|(&i, t)| SeqChunk {
                    tokens: std::slice::from_ref(t),
                    start_pos: drafting[i].pos,
                    block_table: out.block_table(&out.chunks[drafting[i].chunk]),
                    logits: LogitsWanted::Last,
                })
                .collect();
            let logits = self
                .model
                .forward(&chunks, &mut self.kv, &mut self.ws)
                .map_err(|e| EngineError::Model(format!("draft model: {e}")))?;
            for (row, &i) in active.iter().enumerate() {
                let d = &mut drafting[i];
                d.drafts
                    .push(argmax(&logits[row * vocab..(row + 1) * vocab]));
                d.pos += 1;
                d.left -= 1;
            }
        }
    }

    /// The first forward: every chunk's verified tokens (and the token sampled after them),
    /// whose last logits give each sampling request its first guess.
    fn ingest(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(RequestId, Sampled)],
    ) -> Result<Vec<Drafting>, EngineError> {
        self.tokens.clear();
        self.spans.clear();
        let mut firsts = Vec::new();
        for (i, c) in out.chunks.iter().enumerate() {
            let chunk_tokens = out.tokens(c);
            let known = c.num_tokens - c.num_draft_tokens;
            let mine = sampled.iter().filter(|(id, _)| *id == c.req_id);
            let new: Vec<u32> = if c.sample {
                mine.map(|(_, s)| s.token).collect()
            } else {
                Vec::new()
            };
            // Accepted drafts are the chunk's next tokens; the last sampled token follows.
            let accepted = new.len().saturating_sub(1);
            let offset = self.tokens.len();
            self.tokens
                .extend_from_slice(&chunk_tokens[..known + accepted]);
            let next_pos = c.start_pos + known + accepted;
            let covered = out.block_table(c).len() * self.block_size;
            let room = covered.min(self.max_model_len).saturating_sub(next_pos);
            let wants = c.propose && !new.is_empty() && room > 0;
            if wants {
                self.tokens.push(*new.last().unwrap());
                firsts.push(Drafting {
                    chunk: i,
                    pos: next_pos + 1,
                    left: self.k.min(room) - 1,
                    drafts: Vec::with_capacity(self.k),
                });
            }
            self.spans.push((offset, self.tokens.len() - offset, wants));
        }
        let chunks: Vec<SeqChunk<'_>> = out
            .chunks
            .iter()
            .zip(&self.spans)
            .map(|(c, &(offset, len, wants))| SeqChunk {
                tokens: &self.tokens[offset..offset + len],
                start_pos: c.start_pos,
                block_table: out.block_table(c),
                logits: if wants {
                    LogitsWanted::Last
                } else {
                    LogitsWanted::None
                },
            })
            .collect();
        let vocab = self.model.vocab_size();
        let logits = self
            .model
            .forward(&chunks, &mut self.kv, &mut self.ws)
            .map_err(|e| EngineError::Model(format!("draft model: {e}")))?;
        for (row, d) in firsts.iter_mut().enumerate() {
            d.drafts
                .push(argmax(&logits[row * vocab..(row + 1) * vocab]));
        }
        Ok(firsts)
    }
}

fn hand_over(out: &SchedulerOutput, drafting: Vec<Drafting>) -> Vec<(RequestId, Vec<u32>)> {
    drafting
        .into_iter()
        .map(|d| (out.chunks[d.chunk].req_id, d.drafts))
        .collect()
}
