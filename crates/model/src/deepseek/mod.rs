//! DeepSeek V2/V3: Multi-head Latent Attention with a latent-only KV cache, and
//! mixture-of-experts FFNs, from `DeepseekV2ForCausalLM` / `DeepseekV3ForCausalLM` HF folders
//! (`weights.rs`) or GGUF files of llama.cpp's `deepseek2` architecture (`gguf.rs`); both
//! loaders fill the same [`DeepSeekConfig`] and weight structs, so the forward is one.
//!
//! Per layer, for all `T` tokens of the batch (`xn = rms_norm(x) · attn_norm`):
//! ```text
//! q    = W_qb · rms_norm(W_qa · xn)  (or W_q · xn)   [T, H·(nope+rope)]
//! ckv  = W_kva · xn                                  [T, kv_lora_rank + rope]
//! c    = rms_norm(ckv[..r]);  k_pe = rope(ckv[r..])  → latent cache row [c, k_pe]
//! per head h (weight absorption; W_UK_h, W_UV_h: rows of kv_b_proj, [·, r]):
//!   q_lat  = W_UK_hᵀ · q_nope_h                      [r]
//!   s_j    = scale · (q_lat · c_j + rope(q_pe_h) · k_pe_j)   j ≤ pos, own sequence
//!   o_lat  = Σ softmax(s)_j · c_j                    [r]
//!   out_h  = W_UV_h · o_lat                          [v]
//! x  += W_o · out;  xn = rms_norm(x) · ffn_norm
//! x  += dense SwiGLU(xn)  |  Σ_top-k w_e · expert_e(xn) + shared(xn)
//! ```
//! Because K and V are never expanded, the cache holds `kv_lora_rank + qk_rope_head_dim`
//! values per token per layer ([`LatentKvCache`]) instead of `H·(nope + rope + v)`.
//! RoPE rotates adjacent pairs (transformers' complex `apply_rotary_emb`, the kernels'
//! `RopeStyle::Interleaved`), with YaRN's attention factor on cos and sin (the angles are
//! computed once per token per call, `rope_cos_sin(.., rope_mscale, ..)`, and shared by every
//! layer and head). The embedding lookup and the final norm + LM head of the wanted rows are
//! the Llama path's (`embed_head.rs`); attention is `mla.rs` (one sweep of the latent rows per
//! token for all heads, online softmax; the batch's tokens spread over the pool) and, for
//! prefill chunks, `mla_expanded.rs` (the latents expanded into per-head keys and values once
//! a chunk); the router and experts are `moe.rs`; the matmuls, dots, axpys, norms and
//! residual adds are the kernel crate's. The plain loops these replaced are
//! kept as reference twins with differential tests (`mla::attend_ref`,
//! `moe::matmul_f32_ref`).
//!
//! Every activation buffer lives in the [`Workspace`] (DeepSeek's own in
//! `workspace.rs`'s `DeepSeekBuffers`): with a workspace that has seen the batch shape, a
//! call allocates nothing (`tests/zero_alloc_deepseek.rs`). A token's result depends only on
//! its own sequence: batching and chunking do not change logits beyond f32 rounding (bit for
//! bit with Rows16 weights; float weights — the tiny fixtures are f32 — are summed in another
//! order by `matmul`'s gemm path from 16 rows up, and an expert's row count is the number of
//! tokens routed to it).

mod config;
mod gguf;
mod latent_kv;
mod mla;
mod mla_expanded;
mod moe;
mod weights;
mod workspace;

use std::path::Path;

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::glu::matmul_silu_mul;
use tokenmill_kernels::matmul::{QMatrix, matmul};
use tokenmill_kernels::ops::{RopeStyle, add_in_place, add_rms_norm, rms_norm, rope_with};

pub use config::{DeepSeekConfig, Routing};
pub use gguf::ARCH as GGUF_ARCH;
pub use latent_kv::{LATENT_INT8_GROUP, LatentKvCache, row_bytes as latent_row_bytes};
pub use moe::{RouteScratch, route};
pub(crate) use workspace::DeepSeekBuffers;

use crate::Workspace;
use crate::batch::SeqChunk;
use crate::embed_head::{self, embed_batch};
use crate::profile::{OpKind, set_layer, start, stop};
use crate::store::WeightStore;
use crate::workspace::resize;
use crate::{KvDtype, ModelError};
use weights::{Ffn, Layer, Mlp, QProj, Weights};

pub struct DeepSeekModel {
    store: WeightStore,
    cfg: DeepSeekConfig,
    weights: Weights,
}

impl DeepSeekModel {
    /// The model of a Hugging Face folder (`config.json` + safetensors).
    pub fn load_hf_dir(dir: &Path) -> Result<DeepSeekModel, ModelError> {
        let cfg = DeepSeekConfig::from_hf_config(&crate::read_config_json(dir)?)?;
        let store = WeightStore::open_hf_dir(dir)?;
        let weights = Weights::load(&store, &cfg)?;
        Ok(DeepSeekModel {
            store,
            cfg,
            weights,
        })
    }

    /// The model of a GGUF file of llama.cpp's `deepseek2` architecture ([`GGUF_ARCH`]).
    pub fn from_gguf(file: GgufFile) -> Result<DeepSeekModel, ModelError> {
        let cfg = DeepSeekConfig::from_gguf(&file)?;
        let store = WeightStore::Gguf(file);
        let weights = gguf::load_weights(&store, &cfg)?;
        Ok(DeepSeekModel {
            store,
            cfg,
            weights,
        })
    }

    /// [`Self::from_gguf`] of the file at `path`.
    pub fn load_gguf(path: &Path) -> Result<DeepSeekModel, ModelError> {
        Self::from_gguf(GgufFile::open(path)?)
    }

    pub fn config(&self) -> &DeepSeekConfig {
        &self.cfg
    }

    /// Where the weights live (the mapped folder or file).
    pub fn store(&self) -> &WeightStore {
        &self.store
    }

    /// An f32 latent KV cache of `num_blocks` blocks of `block_size` positions for this model.
    pub fn kv_cache(&self, num_blocks: usize, block_size: usize) -> LatentKvCache {
        self.kv_cache_with_dtype(num_blocks, block_size, KvDtype::F32)
    }

    /// A latent KV cache of `dtype` rows (f16: half the bytes per token).
    pub fn kv_cache_with_dtype(
        &self,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> LatentKvCache {
        LatentKvCache::with_dtype(
            self.cfg.n_layers,
            self.cfg.latent_dim(),
            num_blocks,
            block_size,
            dtype,
        )
    }

    fn validate(&self, chunks: &[SeqChunk<'_>], kv: &LatentKvCache) -> Result<(), ModelError> {
        let (vocab, blocks, bs) = (self.cfg.vocab_size, kv.num_blocks(), kv.block_size());
        crate::batch::validate_chunks(chunks, vocab, blocks, bs)
    }

    /// A workspace that never allocates for batches of up to `max_batch_tokens` tokens in up
    /// to `max_seqs` chunks (as [`Workspace::new`] for the Llama family).
    pub fn workspace(&self, max_batch_tokens: usize, max_seqs: usize) -> Workspace {
        let c = &self.cfg;
        let rope_dim = c.qk_rope_head_dim;
        Workspace {
            deepseek: DeepSeekBuffers::new(c, max_batch_tokens),
            ..Workspace::shared(max_batch_tokens, max_seqs, c.hidden, rope_dim, c.vocab_size)
        }
    }

    /// Runs the batch; returns the wanted logits, `[Σ chunk.n_logits(), vocab]`, in chunk order.
    pub fn forward<'w>(
        &self,
        chunks: &[SeqChunk<'_>],
        kv: &mut LatentKvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w mut [f32], ModelError> {
        self.validate(chunks, kv)?;
        let c = &self.cfg;
        let embed = self.weights.embed.view(&self.store);
        let n_tok = embed_batch(chunks, &embed, &c.inv_freq, c.rope_mscale, ws);
        let layers = &self.weights.layers;
        let t = start(&ws.profile);
        let xn = resize(&mut ws.xn, n_tok * c.hidden);
        rms_norm(&ws.x, &layers[0].attn_norm, c.rms_eps, xn);
        stop(&mut ws.profile, OpKind::Norm, t);
        for (l, lw) in layers.iter().enumerate() {
            set_layer(l);
            self.attention(l, lw, chunks, kv, ws);
            self.ffn(lw, layers.get(l + 1), ws);
        }
        let (norm, vocab) = (&self.weights.norm, c.vocab_size);
        let head = self.weights.lm_head.view(&self.store);
        Ok(embed_head::lm_head(
            chunks,
            norm,
            c.rms_eps,
            vocab,
            ws,
            |sel, logits| matmul(sel, &head, logits),
        ))
    }

    /// `x += W_o · MLA(xn)`, `xn = rms_norm(x) · ffn_norm`, for layer `l`, writing the batch's
    /// latent rows into the cache first.
    fn attention(
        &self,
        l: usize,
        lw: &Layer,
        chunks: &[SeqChunk<'_>],
        kv: &mut LatentKvCache,
        ws: &mut Workspace,
    ) {
        let c = &self.cfg;
        let nh = c.n_heads;
        let n_tok = ws.tok_pos.len();
        let (d, prof) = (&mut ws.deepseek, &mut ws.profile);
        let t = start(prof);
        self.queries(lw, &ws.xn, d);
        let ckv = resize(&mut d.ckv, n_tok * c.latent_dim()); // [T, r + rope]
        matmul(&ws.xn, &lw.kv_a.view(&self.store), ckv);
        stop(prof, OpKind::QkvMatmul, t);
        let t = start(prof);
        self.write_latents(l, lw, chunks, kv, &ws.rope_cs, &ws.tok_pos, d);
        stop(prof, OpKind::RopeKvWrite, t);
        let t = start(prof);
        let out = resize(&mut d.attn, n_tok * nh * c.v_head_dim); // [T, H·v]
        let (tok_pos, kv, store) = (&ws.tok_pos, &*kv, &self.store);
        let keys = |t: usize| {
            let (ci, pos) = tok_pos[t];
            mla::Keys {
                seq: ci,
                kv,
                layer: l,
                table: chunks[ci].block_table,
                n_keys: pos + 1,
            }
        };
        let heads = |h| (lw.k_b.view(h, store), lw.v_b.view(h, store));
        let kv_b = QMatrix::from_f32(
            nh * (c.qk_nope_head_dim + c.v_head_dim),
            c.kv_lora_rank,
            &lw.kv_b,
        );
        mla::attend_batch(c, heads, &kv_b, &d.q, keys, &mut d.mla, out);
        stop(prof, OpKind::Attention, t);
        let t = start(prof);
        let proj = resize(&mut ws.proj, n_tok * c.hidden);
        matmul(out, &lw.o.view(&self.store), proj);
        stop(prof, OpKind::OutProj, t);
        let t = start(prof);
        add_rms_norm(&mut ws.x, proj, &lw.ffn_norm, c.rms_eps, &mut ws.xn);
        stop(prof, OpKind::Norm, t);
    }

    /// `d.q = W_qb · rms_norm(W_qa · xn)` (or `W_q · xn`) `[T, H·(nope + rope)]` (RoPE on
    /// each head's rope part follows in [`Self::write_latents`]).
    fn queries(&self, lw: &Layer, xn: &[f32], d: &mut DeepSeekBuffers) {
        let c = &self.cfg;
        let n_tok = xn.len() / c.hidden;
        let s = &self.store;
        let q = resize(
            &mut d.q,
            n_tok * c.n_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim),
        );
        match &lw.q {
            QProj::Full(w) => matmul(xn, &w.view(s), q),
            QProj::Lora { a, norm, b } => {
                let qa = resize(&mut d.qa, n_tok * a.rows); // [T, q_lora_rank]
                matmul(xn, &a.view(s), qa);
                let qan = resize(&mut d.qa_norm, n_tok * a.rows);
                rms_norm(qa, norm, c.rms_eps, qan);
                matmul(qan, &b.view(s), q);
            }
        }
    }

    /// The batch's latent cache rows `[rms_norm(c) · kv_a_norm, rope(k_pe)]` of
    /// `d.ckv = W_kva · xn`, and RoPE on the rope part of every query head in `d.q`.
    #[allow(clippy::too_many_arguments)]
    fn write_latents(
        &self,
        l: usize,
        lw: &Layer,
        chunks: &[SeqChunk<'_>],
        kv: &mut LatentKvCache,
        rope_cs: &[f32],
        tok_pos: &[(usize, usize)],
        d: &mut DeepSeekBuffers,
    ) {
        let c = &self.cfg;
        let (r, nope, rope) = (c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim);
        let style = RopeStyle::Interleaved;
        let dst = resize(&mut d.latent, c.latent_dim());
        for ((row, cs), &(ci, pos)) in d
            .ckv
            .chunks_exact(c.latent_dim())
            .zip(rope_cs.chunks_exact(rope))
            .zip(tok_pos)
        {
            rms_norm(&row[..r], &lw.kv_a_norm, c.rms_eps, &mut dst[..r]);
            dst[r..].copy_from_slice(&row[r..]);
            rope_with(&mut dst[r..], rope, cs, style);
            kv.write(l, chunks[ci].block_table, pos, dst);
        }
        let q_row = c.n_heads * (nope + rope);
        for (qt, cs) in d.q.chunks_exact_mut(q_row).zip(rope_cs.chunks_exact(rope)) {
            for head in qt.chunks_exact_mut(nope + rope) {
                rope_with(&mut head[nope..], rope, cs, style);
            }
        }
    }

    /// `x += ffn(xn)` (dense SwiGLU or MoE), then `xn = rms_norm(x)` with the next layer's
    /// attention norm (the final norm is the LM head's, on the wanted rows only).
    fn ffn(&self, lw: &Layer, next: Option<&Layer>, ws: &mut Workspace) {
        let c = &self.cfg;
        let proj = resize(&mut ws.proj, ws.xn.len());
        let (d, prof) = (&mut ws.deepseek, &mut ws.profile);
        match &lw.ffn {
            Ffn::Dense(m) => {
                let t = start(prof);
                let f = gate_up(&self.store, m, &ws.xn, &mut d.ffn);
                stop(prof, OpKind::FfnGateUp, t);
                let t = start(prof);
                matmul(f, &m.down.view(&self.store), proj);
                stop(prof, OpKind::FfnDown, t);
            }
            Ffn::Moe(m) => moe::moe(&self.store, c, m, &ws.xn, &mut d.moe, proj, prof),
        }
        let t = start(prof);
        match next {
            Some(next) => add_rms_norm(&mut ws.x, proj, &next.attn_norm, c.rms_eps, &mut ws.xn),
            None => add_in_place(&mut ws.x, proj),
        }
        stop(prof, OpKind::Norm, t);
    }
}

/// `f = silu(W_gate · x) ⊙ W_up · x` `[rows, gate.rows]` for every row of `x`, in `f`'s
/// buffer.
fn gate_up<'f>(store: &WeightStore, m: &Mlp, x: &[f32], f: &'f mut Vec<f32>) -> &'f mut [f32] {
    let n_tok = x.len() / m.gate.cols;
    let f = resize(f, n_tok * m.gate.rows);
    matmul_silu_mul(x, &m.gate.view(store), &m.up.view(store), f);
    f
}

/// `out = W_down · (silu(W_gate · x) ⊙ W_up · x)` for every row of `x`, through `f`
/// `[rows, gate.rows]`.
fn mlp(store: &WeightStore, m: &Mlp, x: &[f32], f: &mut Vec<f32>, out: &mut [f32]) {
    let f = gate_up(store, m, x, f);
    matmul(f, &m.down.view(store), out);
}
