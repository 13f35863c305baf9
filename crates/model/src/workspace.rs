//! [`Workspace`]: every activation buffer of a forward pass, reused across calls.
//!
//! Buffers only grow: a call resizes each to its batch within the capacity it already has,
//! so once a workspace has seen the largest batch it will run, a forward pass allocates
//! nothing (`tests/zero_alloc.rs` counts). [`Workspace::new`] reserves that capacity up front
//! from the model's configuration and the batch limits; `Workspace::default()` starts empty
//! and grows on the first large batches instead.
//!
//! Allocation-free also relies on the kernels' own grow-only per-thread scratch (activation
//! quantization, attention task tiles), which reaches its size on the first calls.
//!
//! One type serves every architecture (the engine holds one `Workspace` whatever the model):
//! the residual stream, the normalised rows, the sub-layer output, the RoPE angles, the
//! per-token bookkeeping and the LM head's rows and logits are shared (`embed_head.rs` fills
//! and reads them for both); the Llama path's Q/K/V, attention and FFN buffers are its own,
//! and DeepSeek's MLA + MoE buffers live in [`DeepSeekBuffers`] (`deepseek/workspace.rs`),
//! empty unless the workspace was made for a DeepSeek model or has run one.

use tokenmill_kernels::attention::{AttnScratch, BlockRun};

use crate::deepseek::DeepSeekBuffers;
use crate::{ModelConfig, OpProfile};

/// Activation buffers, reused across forward calls (grown on demand, never shrunk).
#[derive(Debug, Default)]
pub struct Workspace {
    /// Residual stream `[T, hidden]`.
    pub(crate) x: Vec<f32>,
    /// Normalised input of the next sub-layer `[T, hidden]`.
    pub(crate) xn: Vec<f32>,
    /// Q, K and V side by side `[T, q_dim + 2 · kv_dim]`.
    pub(crate) qkv: Vec<f32>,
    /// Attention output `[T, q_dim]`.
    pub(crate) attn: Vec<f32>,
    /// Sub-layer output `[T, hidden]`.
    pub(crate) proj: Vec<f32>,
    /// `silu(gate) ⊙ up` `[T, ffn_hidden]`.
    pub(crate) ffn: Vec<f32>,
    /// RoPE `[cos, sin]` pairs per token `[T, rope_dim]`, shared by every layer.
    pub(crate) rope_cs: Vec<f32>,
    /// Final hidden rows whose logits are wanted `[R, hidden]`.
    pub(crate) sel: Vec<f32>,
    /// `[R, vocab]`
    pub(crate) logits: Vec<f32>,
    /// Final hidden rows of `Hidden` chunks `[H, hidden]` (grown by the first such batch).
    pub(crate) hidden: Vec<f32>,
    /// Per token: (chunk index, position).
    pub(crate) tok_pos: Vec<(usize, usize)>,
    /// The batch's tokens by the cache block they write (`batch::block_runs`), and the block
    /// ids sorted (`PagedKvMut::par_runs`'s check that they are distinct).
    pub(crate) kv_runs: Vec<BlockRun>,
    pub(crate) kv_sort: Vec<u32>,
    /// Attention's task plan and split-decode partials.
    pub(crate) attn_scratch: AttnScratch,
    /// DeepSeek's MLA and MoE buffers (empty for the Llama family).
    pub(crate) deepseek: DeepSeekBuffers,
    /// Time per op kind, when set to `Some`.
    pub profile: Option<OpProfile>,
}

impl Workspace {
    /// A workspace that never allocates for batches of at most `max_batch_tokens` tokens in
    /// at most `max_seqs` chunks, each wanting the last token's logits (more logit rows —
    /// prompt logprobs — grow it once). Also starts the kernels' thread pool and waits until
    /// its workers run ([`ThreadPool::warm_up`](tokenmill_kernels::pool::ThreadPool::warm_up)),
    /// so no thread start-up lands in the first steps.
    pub fn new(cfg: &ModelConfig, max_batch_tokens: usize, max_seqs: usize) -> Workspace {
        let t = max_batch_tokens;
        let (q_dim, kv_dim) = (cfg.n_heads * cfg.head_dim, cfg.kv_dim());
        let buf = |len: usize| Vec::with_capacity(len);
        Workspace {
            qkv: buf(t * (q_dim + 2 * kv_dim)),
            attn: buf(t * q_dim),
            ffn: buf(t * cfg.ffn_hidden),
            attn_scratch: AttnScratch::new(&cfg.attn_shape(), max_seqs),
            ..Workspace::shared(t, max_seqs, cfg.hidden, cfg.rope_dim, cfg.vocab_size)
        }
    }

    /// A workspace whose shared buffers hold `max_batch_tokens` rows of `hidden` (and of
    /// `rope_dim` angles) and `max_seqs` logit rows of `vocab`; the architecture's own
    /// buffers empty. Starts and warms up the thread pool, as [`Self::new`] says.
    pub(crate) fn shared(
        max_batch_tokens: usize,
        max_seqs: usize,
        hidden: usize,
        rope_dim: usize,
        vocab: usize,
    ) -> Workspace {
        tokenmill_kernels::pool::global().warm_up();
        let t = max_batch_tokens;
        let buf = |len: usize| Vec::with_capacity(len);
        Workspace {
            x: buf(t * hidden),
            xn: buf(t * hidden),
            proj: buf(t * hidden),
            rope_cs: buf(t * rope_dim),
            sel: buf(max_seqs * hidden),
            logits: buf(max_seqs * vocab),
            tok_pos: Vec::with_capacity(t),
            kv_runs: Vec::with_capacity(t),
            kv_sort: Vec::with_capacity(t),
            ..Workspace::default()
        }
    }
}

impl Workspace {
    /// The final hidden states (after the final norm) of the last forward pass's
    /// [`LogitsWanted::Hidden`](crate::LogitsWanted::Hidden) chunks, every token of each in
    /// chunk order: `[Σ chunk.n_hidden(), hidden]`.
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }
}

/// `buf` resized to `len` (zero-filling growth; no allocation within its capacity).
pub(crate) fn resize(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}
