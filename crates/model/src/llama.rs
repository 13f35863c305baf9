//! The Llama-family forward pass (Llama 2/3, SmolLM2, Mistral, Qwen2) over a batch of
//! sequence chunks with a paged KV cache.
//!
//! Per layer, for all `T` tokens of the batch at once (`xn` arrives normalised):
//! ```text
//! qkv = xn·[Wq; Wk; Wv]ᵀ (+ [bq; bk; bv])            [T, q_dim + 2·kv_dim]  one pass
//! rope(q); rope(k) → cache, v → cache                  one pass over K
//! a = attention(q, cache of the token's sequence)      [T, q_dim]
//! x += a·Woᵀ;  xn = rms_norm(x) · ffn_norm             one pass
//! f = silu(xn·Wgᵀ) ⊙ xn·Wuᵀ                            [T, ffn_hidden]  one pass
//! x += f·Wdᵀ;  xn = rms_norm(x) · next attn_norm       one pass
//! ```
//! then `logits = rms_norm(x) · output_norm · Woutᵀ` for the rows the chunks ask for.
//! Each chunk's K/V are written to the cache before attention, so a token at position `p`
//! attends to positions `0..=p` of its own sequence (causal, chunk-size independent).
//!
//! Every op is row-wise, and attention's result for a row depends only on that row's
//! sequence (see `tokenmill_kernels::attention`), so a token's logits are bit-identical
//! however the batch was formed: alone, batched, in prefill chunks or as a decode step.
//! The RoPE angles are computed once per token per call (`Workspace::rope_cs`) and shared by
//! every layer and head. With a workspace that has seen the batch shape, a call allocates
//! nothing (for stored weights; AWQ / GPTQ int4 layers run through `int4_linear`, whose
//! kernel allocates its scratch per call).

use std::path::Path;

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::attention::{AttnSeq, AttnSeqs, KvElem, PagedKvMut, RopeAt, attention};
use tokenmill_kernels::ops::{
    RopeStyle, add_bias, add_in_place, add_rms_norm, rms_norm, rope_with,
};
use tokenmill_kernels::pool::global;

use crate::batch::{SeqChunk, block_runs};
use crate::embed_head::{self, embed_batch};
use crate::int4_linear::{matmul_multi, matmul_silu_mul};
use crate::kv_cache::LayerKvMut;
use crate::profile::{OpKind, start, stop};
use crate::store::WeightStore;
use crate::weights::{LayerWeights, Weights};
use crate::workspace::{Workspace, resize};
use crate::{KvCache, ModelConfig, ModelError};

/// RoPE on the queries of one token's `[q | k | v]` row (`q_dim` values first); returns its
/// K and V and the RoPE the cache write applies to K.
fn rope_row<'a>(
    row: &'a mut [f32],
    q_dim: usize,
    head_dim: usize,
    cos_sin: &'a [f32],
    style: RopeStyle,
) -> (&'a [f32], &'a [f32], RopeAt<'a>) {
    let (q, kv_row) = row.split_at_mut(q_dim);
    rope_with(q, head_dim, cos_sin, style);
    let (k, v) = kv_row.split_at(kv_row.len() / 2);
    (k, v, RopeAt { cos_sin, style })
}

/// Batches of at least this many tokens (in more than one cache block) write their K/V on
/// the thread pool, a task per block; smaller ones on the caller, where a pool job's hand-off
/// costs more than it saves.
const PAR_WRITE_TOKENS: usize = 8;

pub struct LlamaModel {
    store: WeightStore,
    cfg: ModelConfig,
    weights: Weights,
    inv_freq: Vec<f32>,
}

/// The batch's chunks as attention sees them.
struct Chunks<'a, 'b>(&'b [SeqChunk<'a>]);

impl AttnSeqs for Chunks<'_, '_> {
    fn num_seqs(&self) -> usize {
        self.0.len()
    }

    fn seq(&self, i: usize) -> AttnSeq<'_> {
        let c = &self.0[i];
        AttnSeq {
            n_q: c.tokens.len(),
            start_pos: c.start_pos,
            block_table: c.block_table,
        }
    }
}

impl LlamaModel {
    /// The model of a GGUF file.
    pub fn load(file: GgufFile) -> Result<LlamaModel, ModelError> {
        let cfg = ModelConfig::from_gguf(&file)?;
        Self::from_store(WeightStore::Gguf(file), cfg)
    }

    /// The model of a Hugging Face folder: `config.json` and safetensors weights.
    pub fn load_hf_dir(dir: &Path) -> Result<LlamaModel, ModelError> {
        let cfg = ModelConfig::from_hf_config(&crate::read_config_json(dir)?)?;
        Self::from_store(WeightStore::open_hf_dir(dir)?, cfg)
    }

    /// [`Self::load_hf_dir`] for a folder, else [`Self::load`] of the GGUF file at `path`.
    pub fn open(path: &Path) -> Result<LlamaModel, ModelError> {
        if path.is_dir() {
            Self::load_hf_dir(path)
        } else {
            Self::load(GgufFile::open(path)?)
        }
    }

    /// The model whose weights are in `store`, shaped by `cfg`.
    pub fn from_store(store: WeightStore, cfg: ModelConfig) -> Result<LlamaModel, ModelError> {
        let weights = Weights::load(&store, &cfg)?;
        let inv_freq = cfg.rope_inv_freq();
        Ok(LlamaModel {
            store,
            cfg,
            weights,
            inv_freq,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn store(&self) -> &WeightStore {
        &self.store
    }

    /// Bytes of every matmul weight (what one forward step streams from memory).
    pub fn matmul_weight_bytes(&self) -> usize {
        self.weights.matmul_bytes()
    }

    /// Checks a batch against the vocabulary and the cache before running it.
    fn validate(&self, chunks: &[SeqChunk<'_>], kv: &KvCache) -> Result<(), ModelError> {
        let (vocab, blocks, bs) = (self.cfg.vocab_size, kv.num_blocks(), kv.block_size());
        crate::batch::validate_chunks(chunks, vocab, blocks, bs)
    }

    /// A workspace that never allocates for batches of up to `max_batch_tokens` tokens in up
    /// to `max_seqs` chunks (see [`Workspace::new`]).
    pub fn workspace(&self, max_batch_tokens: usize, max_seqs: usize) -> Workspace {
        Workspace::new(&self.cfg, max_batch_tokens, max_seqs)
    }

    /// Runs the batch; returns the wanted logits, `[Σ chunk.n_logits(), vocab]`, in chunk order.
    pub fn forward<'w>(
        &self,
        chunks: &[SeqChunk<'_>],
        kv: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w mut [f32], ModelError> {
        self.validate(chunks, kv)?;
        let h = self.cfg.hidden;
        // Embedding lookup, RoPE angles, the first attention norm.
        let embd = self.weights.token_embd.view(&self.store);
        let n_tok = embed_batch(chunks, &embd, &self.inv_freq, 1.0, ws);
        let t = start(&ws.profile);
        let xn = resize(&mut ws.xn, n_tok * h);
        rms_norm(
            &ws.x,
            &self.weights.layers[0].attn_norm,
            self.cfg.rms_eps,
            xn,
        );
        stop(&mut ws.profile, OpKind::Norm, t);

        let layers = &self.weights.layers;
        for (l, lw) in layers.iter().enumerate() {
            crate::profile::set_layer(l);
            self.attention_block(l, lw, chunks, kv, ws);
            self.ffn_block(lw, layers.get(l + 1), ws);
        }
        Ok(self.lm_head(chunks, ws))
    }

    /// `x += attention(xn)·Woᵀ`, `xn = rms_norm(x) · ffn_norm`, for layer `l`, writing the
    /// batch's K/V into the cache.
    fn attention_block(
        &self,
        l: usize,
        lw: &LayerWeights,
        chunks: &[SeqChunk<'_>],
        kv: &mut KvCache,
        ws: &mut Workspace,
    ) {
        let cfg = &self.cfg;
        let (h, q_dim, kv_dim) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.kv_dim());
        let qkv_dim = q_dim + 2 * kv_dim;
        let n_tok = ws.tok_pos.len();
        let t = start(&ws.profile);
        let qkv = resize(&mut ws.qkv, n_tok * qkv_dim);
        let f = &self.store;
        matmul_multi(f, &ws.xn, [&lw.wq, &lw.wk, &lw.wv], qkv);
        if let Some(b) = &lw.qkv_bias {
            add_bias(qkv, b);
        }
        stop(&mut ws.profile, OpKind::QkvMatmul, t);

        match kv.layer_mut(l) {
            LayerKvMut::F32(layer_kv) => self.rope_write_attend(chunks, layer_kv, ws),
            LayerKvMut::F16(layer_kv) => self.rope_write_attend(chunks, layer_kv, ws),
            LayerKvMut::BF16(layer_kv) => self.rope_write_attend(chunks, layer_kv, ws),
            LayerKvMut::I8(layer_kv) => self.rope_write_attend(chunks, layer_kv, ws),
        }

        let t = start(&ws.profile);
        let proj = resize(&mut ws.proj, n_tok * h);
        lw.wo.matmul(f, &ws.attn[..n_tok * q_dim], proj);
        stop(&mut ws.profile, OpKind::OutProj, t);
        let t = start(&ws.profile);
        add_rms_norm(&mut ws.x, proj, &lw.ffn_norm, cfg.rms_eps, &mut ws.xn);
        stop(&mut ws.profile, OpKind::Norm, t);
    }

    /// RoPE on the batch's queries and keys, K/V written into the layer's cache (rounded to its
    /// element type `T`), then `ws.attn = attention(q, cache)` `[T, q_dim]`.
    fn rope_write_attend<T: KvElem>(
        &self,
        chunks: &[SeqChunk<'_>],
        mut layer_kv: PagedKvMut<'_, T>,
        ws: &mut Workspace,
    ) {
        let cfg = &self.cfg;
        let (q_dim, kv_dim) = (cfg.n_heads * cfg.head_dim, cfg.kv_dim());
        let qkv_dim = q_dim + 2 * kv_dim;
        let n_tok = ws.tok_pos.len();
        // [T, q_dim + 2 · kv_dim], filled by the Q/K/V matmul.
        let qkv = &mut ws.qkv[..n_tok * qkv_dim];
        let t = start(&ws.profile);
        let style = cfg.rope_style;
        let (rope_cs, rope_dim, head_dim) = (&ws.rope_cs, cfg.rope_dim, cfg.head_dim);
        let cs = |t: usize| &rope_cs[t * rope_dim..(t + 1) * rope_dim];
        let bs = layer_kv.layout.block_size;
        block_runs(chunks, &ws.tok_pos, bs, &mut ws.kv_runs);
        if n_tok >= PAR_WRITE_TOKENS && ws.kv_runs.len() > 1 {
            // A task per cache block (`PagedKvMut::par_runs`): the same bits as in order.
            let tok_pos = &ws.tok_pos;
            let pool = global();
            layer_kv.par_runs(
                pool,
                qkv,
                qkv_dim,
                &ws.kv_runs,
                &mut ws.kv_sort,
                |r, rows, mut blk| {
                    for (i, row) in rows.chunks_exact_mut(qkv_dim).enumerate() {
                        let t = r.t0 as usize + i;
                        let (k, v, rope) = rope_row(row, q_dim, head_dim, cs(t), style);
                        blk.write(tok_pos[t].1 % bs, k, v, Some(rope));
                    }
                },
            );
        } else {
            for (t, (row, &(ci, pos))) in qkv.chunks_exact_mut(qkv_dim).zip(&ws.tok_pos).enumerate()
            {
                let (k, v, rope) = rope_row(row, q_dim, head_dim, cs(t), style);
                layer_kv.write(chunks[ci].block_table, pos, k, v, Some(rope));
            }
        }
        stop(&mut ws.profile, OpKind::RopeKvWrite, t);

        let t = start(&ws.profile);
        let attn = resize(&mut ws.attn, n_tok * q_dim);
        let shape = cfg.attn_shape();
        let seqs = Chunks(chunks);
        attention(
            qkv,
            qkv_dim,
            &layer_kv.as_ref(),
            &seqs,
            &shape,
            &mut ws.attn_scratch,
            attn,
        );
        stop(&mut ws.profile, OpKind::Attention, t);
    }

    /// `x += W_down · (silu(W_gate · xn) ⊙ W_up · xn)`, then `xn = rms_norm(x)` with the next
    /// layer's attention norm (the final norm is the LM head's, on the wanted rows only).
    fn ffn_block(&self, lw: &LayerWeights, next: Option<&LayerWeights>, ws: &mut Workspace) {
        let cfg = &self.cfg;
        let (h, f) = (cfg.hidden, cfg.ffn_hidden);
        let n_tok = ws.tok_pos.len();
        let t = start(&ws.profile);
        let ffn = resize(&mut ws.ffn, n_tok * f);
        let file = &self.store;
        matmul_silu_mul(file, &ws.xn, &lw.w_gate, &lw.w_up, ffn);
        stop(&mut ws.profile, OpKind::FfnGateUp, t);
        let t = start(&ws.profile);
        let proj = resize(&mut ws.proj, n_tok * h);
        lw.w_down.matmul(file, ffn, proj);
        stop(&mut ws.profile, OpKind::FfnDown, t);
        let t = start(&ws.profile);
        match next {
            Some(next) => add_rms_norm(&mut ws.x, proj, &next.attn_norm, cfg.rms_eps, &mut ws.xn),
            None => add_in_place(&mut ws.x, proj),
        }
        stop(&mut ws.profile, OpKind::Norm, t);
    }

    /// Final norm and LM head, only for the rows the chunks ask for: `[rows, vocab]`.
    fn lm_head<'w>(&self, chunks: &[SeqChunk<'_>], ws: &'w mut Workspace) -> &'w mut [f32] {
        let (norm, eps) = (&self.weights.output_norm, self.cfg.rms_eps);
        let vocab = self.cfg.vocab_size;
        embed_head::lm_head(chunks, norm, eps, vocab, ws, |sel, logits| {
            self.weights.output.matmul(&self.store, sel, logits)
        })
    }
}
