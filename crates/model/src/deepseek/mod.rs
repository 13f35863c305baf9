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
//! RoPE rotates adjacent pairs (transformers' complex `apply_rotary_emb`), with YaRN's
//! attention factor on cos and sin. Attention and routing here are plain f32 loops (the
//! reference form); the matmuls are the kernel crate's. A token's result depends only on its
//! own sequence, so batching and chunking do not change logits.

mod config;
mod gguf;
mod latent_kv;
mod moe;
mod weights;

use std::path::Path;

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::glu::matmul_silu_mul;
use tokenmill_kernels::matmul::matmul;
use tokenmill_kernels::ops::rms_norm;

pub use config::{DeepSeekConfig, Routing};
pub use gguf::ARCH as GGUF_ARCH;
pub use latent_kv::LatentKvCache;
pub use moe::route;

use crate::ModelError;
use crate::batch::SeqChunk;
use crate::store::WeightStore;
use weights::{Ffn, Layer, Mlp, Moe, QProj, Weights};

pub struct DeepSeekModel {
    store: WeightStore,
    cfg: DeepSeekConfig,
    weights: Weights,
}

/// Per-call token bookkeeping: (chunk index, position) per token.
type TokPos = Vec<(usize, usize)>;

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

    /// A latent KV cache of `num_blocks` blocks of `block_size` positions for this model.
    pub fn kv_cache(&self, num_blocks: usize, block_size: usize) -> LatentKvCache {
        LatentKvCache::new(
            self.cfg.n_layers,
            self.cfg.latent_dim(),
            num_blocks,
            block_size,
        )
    }

    fn validate(&self, chunks: &[SeqChunk<'_>], kv: &LatentKvCache) -> Result<(), ModelError> {
        let (vocab, blocks, bs) = (self.cfg.vocab_size, kv.num_blocks(), kv.block_size());
        crate::batch::validate_chunks(chunks, vocab, blocks, bs)
    }

    /// Runs the batch; returns the wanted logits, `[Σ chunk.n_logits(), vocab]`, in chunk order.
    pub fn forward(
        &self,
        chunks: &[SeqChunk<'_>],
        kv: &mut LatentKvCache,
    ) -> Result<Vec<f32>, ModelError> {
        self.validate(chunks, kv)?;
        let h = self.cfg.hidden;
        let tok_pos: TokPos = chunks
            .iter()
            .enumerate()
            .flat_map(|(ci, c)| (0..c.tokens.len()).map(move |i| (ci, c.start_pos + i)))
            .collect();
        let n_tok = tok_pos.len();
        let embed = self.weights.embed.view(&self.store);
        let mut x = vec![0f32; n_tok * h];
        for (row, &id) in x
            .chunks_exact_mut(h)
            .zip(chunks.iter().flat_map(|c| c.tokens))
        {
            embed.dequantize_row_into(id as usize, row);
        }
        let mut xn = vec![0f32; n_tok * h];
        let mut proj = vec![0f32; n_tok * h];
        for (l, lw) in self.weights.layers.iter().enumerate() {
            rms_norm(&x, &lw.attn_norm, self.cfg.rms_eps, &mut xn);
            self.attention(l, lw, chunks, &tok_pos, kv, &xn, &mut proj);
            add(&mut x, &proj);
            rms_norm(&x, &lw.ffn_norm, self.cfg.rms_eps, &mut xn);
            match &lw.ffn {
                Ffn::Dense(m) => self.mlp(m, &xn, &mut proj),
                Ffn::Moe(m) => self.moe(m, &xn, &mut proj),
            }
            add(&mut x, &proj);
        }
        Ok(self.lm_head(chunks, &x))
    }

    /// `proj = W_o · MLA(xn)`, writing the batch's latent rows into the cache first.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        l: usize,
        lw: &Layer,
        chunks: &[SeqChunk<'_>],
        tok_pos: &TokPos,
        kv: &mut LatentKvCache,
        xn: &[f32],
        proj: &mut [f32],
    ) {
        let c = &self.cfg;
        let (nh, nope, rope, vd) = (
            c.n_heads,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
        );
        let (r, qk) = (c.kv_lora_rank, nope + rope);
        let n_tok = tok_pos.len();
        let s = &self.store;
        let mut q = vec![0f32; n_tok * nh * qk]; // [T, H·(nope+rope)]
        match &lw.q {
            QProj::Full(w) => matmul(xn, &w.view(s), &mut q),
            QProj::Lora { a, norm, b } => {
                let mut qa = vec![0f32; n_tok * a.rows]; // [T, q_lora_rank]
                matmul(xn, &a.view(s), &mut qa);
                let mut qan = vec![0f32; qa.len()];
                rms_norm(&qa, norm, c.rms_eps, &mut qan);
                matmul(&qan, &b.view(s), &mut q);
            }
        }
        let mut ckv = vec![0f32; n_tok * c.latent_dim()]; // [T, r + rope]
        matmul(xn, &lw.kv_a.view(s), &mut ckv);
        for (row, &(ci, pos)) in ckv.chunks_exact(c.latent_dim()).zip(tok_pos) {
            let dst = kv.row_mut(l, chunks[ci].block_table, pos);
            rms_norm(&row[..r], &lw.kv_a_norm, c.rms_eps, &mut dst[..r]);
            dst[r..].copy_from_slice(&row[r..]);
            rope_pairs(&mut dst[r..], pos, &c.inv_freq, c.rope_mscale);
        }
        let mut out = vec![0f32; n_tok * nh * vd]; // [T, H·v]
        let (mut q_lat, mut o_lat, mut scores) = (vec![0f32; r], vec![0f32; r], Vec::new());
        for (t, &(ci, pos)) in tok_pos.iter().enumerate() {
            let table = chunks[ci].block_table;
            for hd in 0..nh {
                let qh = &mut q[(t * nh + hd) * qk..(t * nh + hd + 1) * qk];
                rope_pairs(&mut qh[nope..], pos, &c.inv_freq, c.rope_mscale);
                let w_uk = &lw.kv_b[hd * (nope + vd) * r..(hd * (nope + vd) + nope) * r];
                q_lat.fill(0.0);
                for (qd, wrow) in qh[..nope].iter().zip(w_uk.chunks_exact(r)) {
                    q_lat.iter_mut().zip(wrow).for_each(|(a, w)| *a += qd * w);
                }
                scores.clear();
                scores.extend((0..=pos).map(|j| {
                    let row = kv.row(l, table, j);
                    c.attn_scale * (dot(&q_lat, &row[..r]) + dot(&qh[nope..], &row[r..]))
                }));
                softmax(&mut scores);
                o_lat.fill(0.0);
                for (j, p) in scores.iter().enumerate() {
                    let row = &kv.row(l, table, j)[..r];
                    o_lat.iter_mut().zip(row).for_each(|(o, cv)| *o += p * cv);
                }
                let w_uv = &lw.kv_b[(hd * (nope + vd) + nope) * r..(hd + 1) * (nope + vd) * r];
                let oh = &mut out[(t * nh + hd) * vd..(t * nh + hd + 1) * vd];
                for (ov, wrow) in oh.iter_mut().zip(w_uv.chunks_exact(r)) {
                    *ov = dot(wrow, &o_lat);
                }
            }
        }
        matmul(&out, &lw.o.view(s), proj);
    }

    /// `out = W_down · (silu(W_gate · x) ⊙ W_up · x)` for every row of `x`.
    fn mlp(&self, m: &Mlp, x: &[f32], out: &mut [f32]) {
        let n_tok = x.len() / self.cfg.hidden;
        let mut f = vec![0f32; n_tok * m.gate.rows];
        matmul_silu_mul(
            x,
            &m.gate.view(&self.store),
            &m.up.view(&self.store),
            &mut f,
        );
        matmul(&f, &m.down.view(&self.store), out);
    }

    /// Routed experts (grouped per expert over the tokens routed to it) plus shared experts.
    fn moe(&self, m: &Moe, xn: &[f32], out: &mut [f32]) {
        let (h, e) = (self.cfg.hidden, self.cfg.n_routed_experts);
        let n_tok = xn.len() / h;
        let mut logits = vec![0f32; n_tok * e];
        moe::matmul_f32_ref(xn, &m.router, h, &mut logits);
        let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
        let mut picks = Vec::new();
        for (t, lrow) in logits.chunks_exact(e).enumerate() {
            route(&self.cfg, lrow, m.bias.as_deref(), &mut picks);
            for &(ex, w) in &picks {
                by_expert[ex].push((t, w));
            }
        }
        out.fill(0.0);
        let (mut xe, mut ye) = (Vec::new(), Vec::new());
        for (ex, toks) in by_expert.iter().enumerate().filter(|(_, t)| !t.is_empty()) {
            xe.clear();
            for &(t, _) in toks {
                xe.extend_from_slice(&xn[t * h..(t + 1) * h]);
            }
            ye.resize(toks.len() * h, 0.0);
            self.mlp(&m.experts[ex], &xe, &mut ye);
            for (&(t, w), y) in toks.iter().zip(ye.chunks_exact(h)) {
                out[t * h..(t + 1) * h]
                    .iter_mut()
                    .zip(y)
                    .for_each(|(o, v)| *o += w * v);
            }
        }
        if let Some(shared) = &m.shared {
            let mut ys = vec![0f32; n_tok * h];
            self.mlp(shared, xn, &mut ys);
            add(out, &ys);
        }
    }

    /// Final norm and LM head for the rows the chunks ask for: `[rows, vocab]`.
    fn lm_head(&self, chunks: &[SeqChunk<'_>], x: &[f32]) -> Vec<f32> {
        let h = self.cfg.hidden;
        let mut sel = Vec::new();
        let mut t0 = 0;
        for c in chunks {
            let len = c.tokens.len();
            for i in t0 + len - c.n_logits()..t0 + len {
                let start = sel.len();
                sel.resize(start + h, 0.0);
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    &self.weights.norm,
                    self.cfg.rms_eps,
                    &mut sel[start..],
                );
            }
            t0 += len;
        }
        let mut logits = vec![0f32; sel.len() / h * self.cfg.vocab_size];
        matmul(&sel, &self.weights.lm_head.view(&self.store), &mut logits);
        logits
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn softmax(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in s.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    s.iter_mut().for_each(|v| *v /= sum);
}

/// Rotates adjacent pairs `(2i, 2i+1)` by `pos · inv_freq[i]`, cos and sin scaled by `m`.
fn rope_pairs(x: &mut [f32], pos: usize, inv_freq: &[f32], m: f32) {
    for (pair, &f) in x.chunks_exact_mut(2).zip(inv_freq) {
        let (sin, cos) = (pos as f32 * f).sin_cos();
        let (c, s) = (cos * m, sin * m);
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}
