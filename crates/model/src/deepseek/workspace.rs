//! [`DeepSeekBuffers`]: DeepSeek's own activation buffers inside the shared
//! [`Workspace`](crate::Workspace) (which also holds the residual stream, the normalised rows,
//! the sub-layer output, the RoPE angles and the LM head's rows and logits for it).
//!
//! Grow-only like the rest of the workspace: [`DeepSeekBuffers::new`] reserves the capacity of
//! the batch limits up front, `Default` starts empty and grows on the first batches; either
//! way a forward pass allocates nothing once the workspace has seen the batch shape
//! (`tests/zero_alloc_deepseek.rs` counts).

use super::config::DeepSeekConfig;
use super::mla::MlaBuffers;
use super::moe::MoeScratch;
use crate::compute_pool;

/// Buffers of the MLA and MoE sub-layers, `T` tokens per call.
#[derive(Debug, Default)]
pub(crate) struct DeepSeekBuffers {
    /// Queries `[T, H·(nope + rope)]`, the rope part rotated in place.
    pub(super) q: Vec<f32>,
    /// The q LoRA down-projection and its norm `[T, q_lora_rank]` each.
    pub(super) qa: Vec<f32>,
    pub(super) qa_norm: Vec<f32>,
    /// `W_kva · xn` `[T, kv_lora_rank + rope]` (normalised and rotated into the cache).
    pub(super) ckv: Vec<f32>,
    /// One cache row `[rms_norm(c), rope(k_pe)]` on its way into the cache `[r + rope]`.
    pub(super) latent: Vec<f32>,
    /// Attention output `[T, H·v]`.
    pub(super) attn: Vec<f32>,
    /// The dense FFN's `silu(gate) ⊙ up` `[T, ffn_hidden]`.
    pub(super) ffn: Vec<f32>,
    /// MLA's per-block buffers and per-thread attention states.
    pub(super) mla: MlaBuffers,
    /// Routing and the grouped expert pass.
    pub(super) moe: MoeScratch,
}

impl DeepSeekBuffers {
    /// Capacity for batches of up to `max_batch_tokens` tokens of `cfg`.
    pub(super) fn new(cfg: &DeepSeekConfig, max_batch_tokens: usize) -> DeepSeekBuffers {
        let t = max_batch_tokens;
        let (nh, qk) = (cfg.n_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim);
        let q_lora = cfg.q_lora_rank.unwrap_or(0);
        let buf = |len: usize| Vec::with_capacity(len);
        DeepSeekBuffers {
            q: buf(t * nh * qk),
            qa: buf(t * q_lora),
            qa_norm: buf(t * q_lora),
            ckv: buf(t * cfg.latent_dim()),
            latent: buf(cfg.latent_dim()),
            attn: buf(t * nh * cfg.v_head_dim),
            ffn: buf(t * cfg.ffn_hidden),
            mla: MlaBuffers::new(cfg, t, compute_pool().num_threads()),
            moe: MoeScratch::new(cfg, t),
        }
    }
}
