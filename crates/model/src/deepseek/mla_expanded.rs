//! MLA of a prefill run in the expanded form: the cached latents are expanded into per-head
//! keys and values once per run, and the run's queries attend to them as plain multi-head
//! attention (DeepSeek-V2, <https://arxiv.org/abs/2405.04434>, §2.1, before absorption).
//!
//! With `kv_b` `[H·(nope + v), r]` (head `h`: `W_UK_h`, then `W_UV_h`) and a cached row
//! `[c_j (r), k_pe_j (rope)]`:
//! ```text
//! k_hj = [W_UK_h · c_j, k_pe_j]                     [nope + rope]
//! v_hj = W_UV_h · c_j                               [v]
//! out_h = Σ_j softmax_j(scale · [q_nope_h, q_pe_h] · k_hj) · v_hj
//! ```
//! The absorbed form ([`super::mla`]) scores a key with `H·(2r + rope)` multiply-adds a query
//! token and expands nothing; this form costs `H·(nope + rope + v)` a (query, key) pair — 3.4×
//! fewer at V2-Lite's widths — plus `H·(nope + v)·r` a key to expand it, once for the whole
//! run. [`DeepSeekConfig::mla_expanded_pays`] compares the two counts: a prefill chunk of
//! many tokens runs expanded, a decode token or a few speculative tokens over a long context
//! run absorbed.
//!
//! [`attend_run`] sweeps the keys in blocks of [`KEY_BLOCK`] (so its buffers are bounded
//! whatever the context): the block's latents are gathered from the paged cache, expanded by
//! one matmul (`kv_b` on the pool), each head's keys transposed, and then every (head, tile
//! of [`QUERY_TILE`] queries) task takes one online-softmax step (FlashAttention,
//! <https://arxiv.org/abs/2205.14135>) over the block: the scores `S = Q · Kᵀ` and then
//! `O += P · V` both by the tier's register-blocked `acc_rows` (an element of the left
//! operand broadcast against vectors of the right one's rows), with a causal mask for the
//! keys past each query's position between them. Each head's queries, keys and values are
//! copied out contiguous first: in the interleaved layouts a head's rows lie `H·(…)` floats
//! apart, a power-of-two stride that maps them onto a few cache sets. The running max, sum
//! and output of every (head, query) live in one state buffer, a task's tile side by side,
//! so the tasks split it without sharing.

use std::sync::Mutex;

use tokenmill_kernels::attention::AccRows;
use tokenmill_kernels::dispatch::kernels;
use tokenmill_kernels::matmul::{QMatrix, matmul};
use tokenmill_kernels::pool::parallel_chunks_mut;

use super::config::DeepSeekConfig;
use super::mla::{Keys, free_scratch};
use crate::compute_pool;
use crate::workspace::resize;

/// Key positions expanded and attended per step.
pub(super) const KEY_BLOCK: usize = 256;

/// Query tokens of one head per task.
pub(super) const QUERY_TILE: usize = 64;

/// The buffers of [`attend_run`] (grow-only).
#[derive(Debug, Default)]
pub(crate) struct ExpandedBuffers {
    /// A block of cached rows as f32 `[KEY_BLOCK, r + rope]`.
    lat: Vec<f32>,
    /// Their latents, contiguous `[KEY_BLOCK, r]` (the expansion's input).
    c: Vec<f32>,
    /// The expanded block `[KEY_BLOCK, H·(nope + v)]`.
    kvx: Vec<f32>,
    /// The run's queries, each head's together `[H, T, nope + rope]`.
    q_heads: Vec<f32>,
    /// Each head's keys, transposed `[nope + rope, n]`, then its values `[n, v]`, for the
    /// `n ≤ KEY_BLOCK` keys of a block.
    heads: Vec<f32>,
    /// Per (head, query tile): outputs `[QUERY_TILE, v]`, then max and sum `[QUERY_TILE]` each.
    state: Vec<f32>,
    /// A task's scores `[QUERY_TILE, ≤ KEY_BLOCK]`, one per pool thread.
    scores: Vec<Mutex<Vec<f32>>>,
}

impl ExpandedBuffers {
    /// Capacity for runs of up to `max_tokens` tokens of `cfg` on a pool of `threads`.
    pub(super) fn new(cfg: &DeepSeekConfig, max_tokens: usize, threads: usize) -> Self {
        let (nh, nope, v) = (cfg.n_heads, cfg.qk_nope_head_dim, cfg.v_head_dim);
        let kb = KEY_BLOCK;
        ExpandedBuffers {
            lat: Vec::with_capacity(kb * cfg.latent_dim()),
            c: Vec::with_capacity(kb * cfg.kv_lora_rank),
            kvx: Vec::with_capacity(kb * nh * (nope + v)),
            q_heads: Vec::with_capacity(max_tokens * nh * (nope + cfg.qk_rope_head_dim)),
            heads: Vec::with_capacity(nh * kb * (nope + cfg.qk_rope_head_dim + v)),
            state: Vec::with_capacity(nh * state_len(max_tokens, v)),
            scores: (0..threads)
                .map(|_| Mutex::new(vec![0.0; QUERY_TILE * kb]))
                .collect(),
        }
    }
}

/// One head's state for `t` query tokens: whole tiles of `[QUERY_TILE, v + 2]`.
fn state_len(t: usize, v: usize) -> usize {
    t.div_ceil(QUERY_TILE) * QUERY_TILE * (v + 2)
}

/// `out` `[T, H·v]` = MLA of a run of `T` consecutive tokens of one sequence with queries `q`
/// `[T, H·(nope + rope)]` (rope parts rotated), the first token's keys `first` (the run's
/// rows already in the cache) and the layer's `kv_b` ([`super::weights::expansion_matrix`]).
pub(super) fn attend_run(
    cfg: &DeepSeekConfig,
    kv_b: &QMatrix<'_>,
    q: &[f32],
    first: Keys<'_>,
    b: &mut ExpandedBuffers,
    out: &mut [f32],
) {
    let (nh, nope, rope, vd, r) = (
        cfg.n_heads,
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.v_head_dim,
        cfg.kv_lora_rank,
    );
    let (qk, w, d) = (nope + rope, nope + vd, cfg.latent_dim());
    let n_tok = q.len() / (nh * qk);
    let p0 = first.n_keys - 1; // the first token's position
    let pool = compute_pool();
    if b.scores.len() < pool.num_threads() {
        let blank = || Mutex::new(vec![0.0; QUERY_TILE * KEY_BLOCK]);
        b.scores.resize_with(pool.num_threads(), blank);
    }
    let n_tiles = n_tok.div_ceil(QUERY_TILE);
    let tile_len = QUERY_TILE * (vd + 2);
    let state = resize(&mut b.state, nh * state_len(n_tok, vd));
    for st in state.chunks_exact_mut(tile_len) {
        let (o, ml) = st.split_at_mut(QUERY_TILE * vd);
        o.fill(0.0);
        ml[..QUERY_TILE].fill(f32::NEG_INFINITY);
        ml[QUERY_TILE..].fill(0.0);
    }
    // Each head's queries contiguous (rows of one head are `H·(nope + rope)` apart in `q`,
    // a stride that maps a tile's rows onto few cache sets).
    let q_heads = resize(&mut b.q_heads, nh * n_tok * qk);
    parallel_chunks_mut(pool, q_heads, n_tok * qk, |h, qh| {
        for (dst, src) in qh.chunks_exact_mut(qk).zip(q.chunks_exact(nh * qk)) {
            dst.copy_from_slice(&src[h * qk..][..qk]);
        }
    });
    let q_heads = &*q_heads;
    let total = p0 + n_tok;
    let log2_scale = cfg.attn_scale * std::f32::consts::LOG2_E; // weights as powers of 2
    for j0 in (0..total).step_by(KEY_BLOCK) {
        let n = KEY_BLOCK.min(total - j0);
        let lat = resize(&mut b.lat, n * d);
        first.kv.gather(first.layer, first.table, j0, lat);
        let c = resize(&mut b.c, n * r);
        for (dst, row) in c.chunks_exact_mut(r).zip(lat.chunks_exact(d)) {
            dst.copy_from_slice(&row[..r]);
        }
        let kvx = resize(&mut b.kvx, n * nh * w);
        matmul(c, kv_b, kvx);
        // Head h's keys transposed, `[nope + rope, n]` (the scores are then `S = Q · Kᵀ` as
        // an `acc_rows` product: query elements broadcast against rows of keys, no sums
        // across lanes), then its values `[n, v]` (contiguous, like the queries).
        let heads = resize(&mut b.heads, nh * n * (qk + vd));
        let (kvx, lat) = (&*kvx, &*lat);
        parallel_chunks_mut(pool, heads, n * (qk + vd), |h, kv_h| {
            let (kt, v) = kv_h.split_at_mut(n * qk);
            let rows = kvx.chunks_exact(nh * w).zip(lat.chunks_exact(d));
            for ((j, (x, row)), vj) in rows.enumerate().zip(v.chunks_exact_mut(vd)) {
                let k = x[h * w..][..nope].iter().chain(&row[r..]);
                for (c, &val) in k.enumerate() {
                    kt[c * n + j] = val;
                }
                vj.copy_from_slice(&x[h * w + nope..][..vd]);
            }
        });
        let (heads, scores) = (&*heads, &b.scores);
        parallel_chunks_mut(pool, state, tile_len, |i, st| {
            let (h, tile) = (i / n_tiles, i % n_tiles);
            let t0 = tile * QUERY_TILE;
            let rows = QUERY_TILE.min(n_tok - t0);
            let last = p0 + t0 + rows - 1; // the tile's last query position
            if j0 > last {
                return; // the whole block is in the tile's future
            }
            let n_eff = n.min(last + 1 - j0);
            let mut s = free_scratch(scores);
            let s = &mut s[..rows * n_eff]; // [rows, n_eff]
            s.fill(0.0);
            let qk_t = AccRows {
                rows,
                cols: n_eff,
                n: qk,
                p_stride: qk,
                x_stride: n,
            };
            let qh = &q_heads[(h * n_tok + t0) * qk..][..rows * qk];
            let (kt, v) = heads[h * n * (qk + vd)..][..n * (qk + vd)].split_at(n * qk);
            kernels().acc_rows(&qk_t, s, qh, kt);
            let (o, ml) = st.split_at_mut(QUERY_TILE * vd);
            let (m, l) = ml.split_at_mut(QUERY_TILE);
            for (i, (srow, orow)) in s
                .chunks_exact_mut(n_eff)
                .zip(o.chunks_exact_mut(vd))
                .enumerate()
            {
                // Keys j0.. up to this query's own position.
                let valid = (p0 + t0 + i + 1).saturating_sub(j0).min(n_eff);
                let corr = kernels().softmax_step(srow, valid, log2_scale, &mut m[i], &mut l[i]);
                if corr != 1.0 {
                    orow.iter_mut().for_each(|x| *x *= corr);
                }
            }
            let pv = AccRows {
                rows,
                cols: vd,
                n: n_eff,
                p_stride: n_eff,
                x_stride: vd,
            };
            kernels().acc_rows(&pv, &mut o[..rows * vd], s, v);
        });
    }
    for (t, ot) in out.chunks_exact_mut(nh * vd).enumerate().take(n_tok) {
        let (tile, i) = (t / QUERY_TILE, t % QUERY_TILE);
        for (h, oh) in ot.chunks_exact_mut(vd).enumerate() {
            let st = &state[(h * n_tiles + tile) * tile_len..][..tile_len];
            let inv = 1.0 / st[QUERY_TILE * vd + QUERY_TILE + i];
            for (dst, &acc) in oh.iter_mut().zip(&st[i * vd..][..vd]) {
                *dst = acc * inv;
            }
        }
    }
}
