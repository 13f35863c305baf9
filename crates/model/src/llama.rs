//! The Llama-family forward pass (Llama 2/3, SmolLM2, Mistral, Qwen2) over a batch of
//! sequence chunks with a paged KV cache.
//!
//! Per layer, for all `T` tokens of the batch at once:
//! ```text
//! xn = rms_norm(x) · attn_norm                      [T, hidden]
//! q, k, v = xn·Wqᵀ (+bq), xn·Wkᵀ (+bk), xn·Wvᵀ (+bv)   [T, q_dim], [T, kv_dim] ×2
//! rope(q, k) at each token's position; k, v → cache
//! a = attention(q, cache of the token's sequence)   [T, q_dim]
//! x += a·Woᵀ
//! xn = rms_norm(x) · ffn_norm
//! x += (silu(xn·Wgᵀ) ⊙ xn·Wuᵀ)·Wdᵀ
//! ```
//! then `logits = rms_norm(x) · output_norm · Woutᵀ` for the rows the chunks ask for.
//! Each chunk's K/V are written to the cache before attention, so a token at position `p`
//! attends to positions `0..=p` of its own sequence (causal, chunk-size independent).

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::attention::{AttnShape, attend};
use tokenmill_kernels::matmul::matmul;
use tokenmill_kernels::ops::{add_bias, add_in_place, rms_norm, rope, silu_mul};

use crate::batch::SeqChunk;
use crate::profile::{OpKind, OpProfile, start, stop};
use crate::weights::{LayerWeights, Weights};
use crate::{KvCache, ModelConfig, ModelError};

pub struct LlamaModel {
    file: GgufFile,
    cfg: ModelConfig,
    weights: Weights,
    inv_freq: Vec<f32>,
}

/// Activation buffers, reused across forward calls (grown on demand, never shrunk).
#[derive(Default)]
pub struct Workspace {
    /// Residual stream `[T, hidden]`.
    x: Vec<f32>,
    /// Normalised input of a sub-layer `[T, hidden]`.
    xn: Vec<f32>,
    /// `[T, q_dim]`
    q: Vec<f32>,
    /// `[T, kv_dim]`
    k: Vec<f32>,
    /// `[T, kv_dim]`
    v: Vec<f32>,
    /// Attention output `[T, q_dim]`.
    attn: Vec<f32>,
    /// Sub-layer output `[T, hidden]`.
    proj: Vec<f32>,
    /// `[T, ffn_hidden]`
    gate: Vec<f32>,
    /// `[T, ffn_hidden]`
    up: Vec<f32>,
    /// Final hidden rows whose logits are wanted `[R, hidden]`.
    sel: Vec<f32>,
    /// `[R, vocab]`
    logits: Vec<f32>,
    /// Per token: (chunk index, position).
    tok_pos: Vec<(usize, usize)>,
    /// Time per op kind, when set to `Some`.
    pub profile: Option<OpProfile>,
}

fn resize(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

impl LlamaModel {
    pub fn load(file: GgufFile) -> Result<LlamaModel, ModelError> {
        let cfg = ModelConfig::from_gguf(&file)?;
        let weights = Weights::load(&file, &cfg)?;
        let inv_freq = cfg.rope_inv_freq();
        Ok(LlamaModel {
            file,
            cfg,
            weights,
            inv_freq,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Checks a batch against the vocabulary and the cache before running it.
    fn validate(&self, chunks: &[SeqChunk<'_>], kv: &KvCache) -> Result<(), ModelError> {
        for c in chunks {
            if let Some(&t) = c
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(ModelError::TokenOutOfRange {
                    token: t,
                    vocab_size: self.cfg.vocab_size,
                });
            }
            let end = c.start_pos + c.tokens.len();
            if kv.blocks_for(end) > c.block_table.len()
                || c.block_table.iter().any(|&b| b as usize >= kv.num_blocks())
            {
                return Err(ModelError::BadBlockTable { positions: end });
            }
        }
        Ok(())
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
        ws.tok_pos.clear();
        for (ci, c) in chunks.iter().enumerate() {
            ws.tok_pos
                .extend((0..c.tokens.len()).map(|i| (ci, c.start_pos + i)));
        }
        let n_tok = ws.tok_pos.len();

        // Embedding lookup.
        let t = start(&ws.profile);
        let embd = self.weights.token_embd.view(&self.file);
        let x = resize(&mut ws.x, n_tok * h);
        for (row, &id) in x
            .chunks_exact_mut(h)
            .zip(chunks.iter().flat_map(|c| c.tokens))
        {
            embd.dequantize_row_into(id as usize, row);
        }
        stop(&mut ws.profile, OpKind::Embed, t);

        for (l, lw) in self.weights.layers.iter().enumerate() {
            self.attention_block(l, lw, chunks, kv, ws);
            self.ffn_block(lw, ws);
        }
        Ok(self.lm_head(chunks, ws))
    }

    /// `x += attention(rms_norm(x))` for layer `l`, writing the batch's K/V into the cache.
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
        let n_tok = ws.tok_pos.len();
        let t = start(&ws.profile);
        let xn = resize(&mut ws.xn, n_tok * h);
        rms_norm(&ws.x, &lw.attn_norm, cfg.rms_eps, xn);
        stop(&mut ws.profile, OpKind::Norm, t);

        let t = start(&ws.profile);
        let q = resize(&mut ws.q, n_tok * q_dim);
        let k = resize(&mut ws.k, n_tok * kv_dim);
        let v = resize(&mut ws.v, n_tok * kv_dim);
        matmul(xn, &lw.wq.view(&self.file), q);
        matmul(xn, &lw.wk.view(&self.file), k);
        matmul(xn, &lw.wv.view(&self.file), v);
        for (b, out) in [(&lw.bq, &mut *q), (&lw.bk, &mut *k), (&lw.bv, &mut *v)] {
            if let Some(b) = b {
                add_bias(out, b);
            }
        }
        stop(&mut ws.profile, OpKind::QkvMatmul, t);

        let t = start(&ws.profile);
        let style = cfg.arch.rope_style();
        for (i, &(ci, pos)) in ws.tok_pos.iter().enumerate() {
            rope(
                &mut q[i * q_dim..(i + 1) * q_dim],
                cfg.head_dim,
                pos,
                &self.inv_freq,
                style,
            );
            let ki = &mut k[i * kv_dim..(i + 1) * kv_dim];
            rope(ki, cfg.head_dim, pos, &self.inv_freq, style);
            kv.write(
                l,
                chunks[ci].block_table,
                pos,
                ki,
                &v[i * kv_dim..(i + 1) * kv_dim],
            );
        }
        stop(&mut ws.profile, OpKind::RopeKvWrite, t);

        let t = start(&ws.profile);
        let shape = AttnShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            scale: 1.0 / (cfg.head_dim as f32).sqrt(),
        };
        let attn = resize(&mut ws.attn, n_tok * q_dim);
        let layer_kv = kv.layer(l);
        for (i, &(ci, pos)) in ws.tok_pos.iter().enumerate() {
            let range = i * q_dim..(i + 1) * q_dim;
            let table = chunks[ci].block_table;
            attend(
                &q[range.clone()],
                &layer_kv,
                table,
                pos + 1,
                &shape,
                &mut attn[range],
            );
        }
        stop(&mut ws.profile, OpKind::Attention, t);

        let t = start(&ws.profile);
        let proj = resize(&mut ws.proj, n_tok * h);
        matmul(attn, &lw.wo.view(&self.file), proj);
        stop(&mut ws.profile, OpKind::OutProj, t);
        let t = start(&ws.profile);
        add_in_place(&mut ws.x, proj);
        stop(&mut ws.profile, OpKind::Norm, t);
    }

    /// `x += W_down · (silu(W_gate · xn) ⊙ W_up · xn)` with `xn = rms_norm(x)`.
    fn ffn_block(&self, lw: &LayerWeights, ws: &mut Workspace) {
        let cfg = &self.cfg;
        let (h, f) = (cfg.hidden, cfg.ffn_hidden);
        let n_tok = ws.tok_pos.len();
        let t = start(&ws.profile);
        let xn = resize(&mut ws.xn, n_tok * h);
        rms_norm(&ws.x, &lw.ffn_norm, cfg.rms_eps, xn);
        stop(&mut ws.profile, OpKind::Norm, t);

        let t = start(&ws.profile);
        let gate = resize(&mut ws.gate, n_tok * f);
        let up = resize(&mut ws.up, n_tok * f);
        matmul(xn, &lw.w_gate.view(&self.file), gate);
        matmul(xn, &lw.w_up.view(&self.file), up);
        stop(&mut ws.profile, OpKind::FfnMatmul, t);
        let t = start(&ws.profile);
        silu_mul(gate, up);
        stop(&mut ws.profile, OpKind::Activation, t);
        let t = start(&ws.profile);
        let proj = resize(&mut ws.proj, n_tok * h);
        matmul(gate, &lw.w_down.view(&self.file), proj);
        stop(&mut ws.profile, OpKind::FfnMatmul, t);
        let t = start(&ws.profile);
        add_in_place(&mut ws.x, proj);
        stop(&mut ws.profile, OpKind::Norm, t);
    }

    /// Final norm and LM head, only for the rows the chunks ask for: `[rows, vocab]`.
    fn lm_head<'w>(&self, chunks: &[SeqChunk<'_>], ws: &'w mut Workspace) -> &'w mut [f32] {
        let (h, vocab) = (self.cfg.hidden, self.cfg.vocab_size);
        let t = start(&ws.profile);
        let n_rows: usize = chunks.iter().map(|c| c.n_logits()).sum();
        let sel = resize(&mut ws.sel, n_rows * h);
        let (mut r, mut t0) = (0, 0);
        for c in chunks {
            let len = c.tokens.len();
            for i in t0 + len - c.n_logits()..t0 + len {
                let out = &mut sel[r * h..(r + 1) * h];
                rms_norm(
                    &ws.x[i * h..(i + 1) * h],
                    &self.weights.output_norm,
                    self.cfg.rms_eps,
                    out,
                );
                r += 1;
            }
            t0 += len;
        }
        let logits = resize(&mut ws.logits, n_rows * vocab);
        matmul(sel, &self.weights.output.view(&self.file), logits);
        stop(&mut ws.profile, OpKind::LmHead, t);
        logits
    }
}
