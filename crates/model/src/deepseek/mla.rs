//! Multi-head Latent Attention of a batch over the [`LatentKvCache`], weight-absorbed
//! (DeepSeek-V2, <https://arxiv.org/abs/2405.04434>, §2.1): K and V are never expanded.
//!
//! With `W_UK_h`, `W_UV_h` the rows of head `h` in `kv_b_proj` (`[nope, r]` and `[v, r]`), a
//! cached row `[c_j (r), k_pe_j (rope)]` and the token's query `[q_nope_h, q_pe_h]` (`q_pe_h`
//! already rotated):
//! ```text
//! q_cat_h = [W_UK_hᵀ · q_nope_h, q_pe_h]          [r + rope]
//! s_hj    = scale · q_cat_h · row_j                 j < n_keys
//! o_h     = Σ_j softmax_j(s_h)_j · c_j              [r]
//! out_h   = W_UV_h · o_h                            [v]
//! ```
//! [`attend_batch`] runs the batch a block of [`TOKEN_BLOCK`] tokens at a time: both
//! absorbed projections as one batched matmul over heads each (the kernels'
//! `matmul_per_head`, `[B, H, nope] → [B, H, r]` and `[B, H, r] → [B, H, v]`, every head its
//! own small weight in its stored type — a GGUF's quantized `attn_k_b` / `attn_v_b` — so a
//! block reads each head's weights once instead of once a token), and between them the
//! tokens' attention over the cache in parallel on the pool ([`attend`], a scratch per pool
//! thread).
//!
//! Every head reads the same latent rows (MQA with one key/value "head" of `r + rope`
//! dims), so [`attend`] sweeps the keys once per token in tiles of [`KEY_TILE`] positions,
//! scoring a tile for all heads while its rows are in cache, with the online softmax
//! (FlashAttention, <https://arxiv.org/abs/2205.14135>): a running max `m_h` and sum `l_h`
//! per head, `o_h` rescaled by `e^(m_old − m_new)` when the max grows, divided by `l_h` at the
//! end (the tier's `softmax_step`, in base 2). Each tile's rows are gathered from the paged
//! cache into one f32 matrix (an f16 cache's widened exactly; [`LatentKvCache::gather`]),
//! and both passes over it are small
//! products for all heads at once through the tier's register-blocked kernels: the scores
//! `S = Q_cat · tileᵀ` `[H, n]` by `dot_rows` (4 heads × 4 keys summed in registers along the
//! latent), and `O += P · C` `[H, r]` by `acc_rows` (4 heads × 2 vectors of `o` held in
//! registers over the tile's keys). The scratch is an [`MlaScratch`] of fixed size (no
//! allocation, whatever the context length).
//!
//! Prefill chunks take the expanded form instead ([`super::mla_expanded`]), where it costs
//! fewer multiply-adds ([`attend_batch`]).
//!
//! `attend_ref` is the reference twin (tests only): the plain loops — one head at a time,
//! two separate dots per score, an exact two-pass softmax over all scores, `kv_b` as one f32
//! matrix. The two agree within f32 rounding (a relative 1e-5 of the output,
//! `tests::attend_batch_matches_reference`).

use std::sync::{Mutex, MutexGuard, TryLockError};

use tokenmill_kernels::attention::{AccRows, DotRows};
use tokenmill_kernels::dispatch::kernels;
use tokenmill_kernels::grouped::matmul_per_head;
use tokenmill_kernels::matmul::QMatrix;
use tokenmill_kernels::ops::scale;
use tokenmill_kernels::pool::parallel_chunks_mut;

use super::config::DeepSeekConfig;
use super::latent_kv::LatentKvCache;
use super::mla_expanded::{self, ExpandedBuffers};
use crate::compute_pool;
use crate::workspace::resize;

/// Tokens per block of [`attend_batch`] (bounds its buffers whatever the batch).
pub(super) const TOKEN_BLOCK: usize = 64;

/// Key positions scored per tile, for all heads at once.
pub(super) const KEY_TILE: usize = 32;

/// The buffers of [`attend_batch`], for a block of `B ≤ TOKEN_BLOCK` tokens (grow-only).
#[derive(Debug, Default)]
pub(crate) struct MlaBuffers {
    /// The queries' nope parts `[B, H, nope]`.
    q_nope: Vec<f32>,
    /// Absorbed queries `[B, H, r]`.
    q_lat: Vec<f32>,
    /// Normalised latent outputs `[B, H, r]`.
    o_lat: Vec<f32>,
    /// One token's attention state per pool thread (tokens attend in parallel, each task
    /// locking a free one).
    scratch: Vec<Mutex<MlaScratch>>,
    /// The expanded form's buffers.
    expanded: ExpandedBuffers,
}

impl MlaBuffers {
    /// Capacity for batches of up to `max_tokens` tokens of `cfg` on a pool of `threads`.
    pub(super) fn new(cfg: &DeepSeekConfig, max_tokens: usize, threads: usize) -> MlaBuffers {
        let (b, nh, r) = (TOKEN_BLOCK, cfg.n_heads, cfg.kv_lora_rank);
        MlaBuffers {
            q_nope: Vec::with_capacity(b * nh * cfg.qk_nope_head_dim),
            q_lat: Vec::with_capacity(b * nh * r),
            o_lat: Vec::with_capacity(b * nh * r),
            scratch: (0..threads)
                .map(|_| Mutex::new(MlaScratch::new(cfg)))
                .collect(),
            expanded: ExpandedBuffers::new(cfg, max_tokens, threads),
        }
    }
}

/// `out` `[T, H·v]` = MLA of the batch's tokens, with queries `q` `[T, H·(nope + rope)]`
/// (rope parts rotated), token `t`'s keys `keys(t)`, the layer's per-head matrices
/// `heads(h) = (W_UK_hᵀ, W_UV_h)` (module docs) and its whole `kv_b` `[H·(nope + v), r]`.
///
/// A run of one sequence's tokens (consecutive positions, one `Keys::seq`) for which the
/// expanded form costs fewer multiply-adds ([`DeepSeekConfig::mla_expanded_pays`]: a prefill
/// chunk) runs there; every other token (decodes, a few speculative tokens over a long
/// context) runs absorbed, the tokens between two expanded runs together.
pub(super) fn attend_batch<'k, 'w>(
    cfg: &DeepSeekConfig,
    heads: impl Fn(usize) -> (QMatrix<'w>, QMatrix<'w>) + Sync,
    kv_b: &QMatrix<'_>,
    q: &[f32],
    keys: impl Fn(usize) -> Keys<'k> + Sync,
    b: &mut MlaBuffers,
    out: &mut [f32],
) {
    let (nh, vd) = (cfg.n_heads, cfg.v_head_dim);
    let qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim;
    let n_tok = q.len() / (nh * qk);
    let mut absorbed_from = 0;
    let mut t = 0;
    while t < n_tok {
        let first = keys(t);
        let mut end = t + 1;
        while end < n_tok && keys(end).seq == first.seq {
            debug_assert_eq!(
                keys(end).n_keys,
                first.n_keys + end - t,
                "a run is consecutive"
            );
            end += 1;
        }
        if cfg.mla_expanded_pays(end - t, first.n_keys - 1) {
            let (q_a, out_a) = (&q[..t * nh * qk], &mut out[..t * nh * vd]);
            absorbed(cfg, &heads, q_a, &keys, absorbed_from, b, out_a);
            let run_q = &q[t * nh * qk..end * nh * qk];
            let run_out = &mut out[t * nh * vd..end * nh * vd];
            mla_expanded::attend_run(cfg, kv_b, run_q, first, &mut b.expanded, run_out);
            absorbed_from = end;
        }
        t = end;
    }
    absorbed(cfg, &heads, q, &keys, absorbed_from, b, out);
}

/// The absorbed form for tokens `from..` of the batch (`q` and `out` end where they do),
/// [`TOKEN_BLOCK`] tokens at a time.
fn absorbed<'k, 'w>(
    cfg: &DeepSeekConfig,
    heads: &(impl Fn(usize) -> (QMatrix<'w>, QMatrix<'w>) + Sync),
    q: &[f32],
    keys: &(impl Fn(usize) -> Keys<'k> + Sync),
    from: usize,
    b: &mut MlaBuffers,
    out: &mut [f32],
) {
    let (nh, nope, r, vd) = (
        cfg.n_heads,
        cfg.qk_nope_head_dim,
        cfg.kv_lora_rank,
        cfg.v_head_dim,
    );
    let qk = nope + cfg.qk_rope_head_dim;
    let pool = compute_pool();
    if b.scratch.len() < pool.num_threads() {
        b.scratch.resize_with(pool.num_threads(), Default::default);
    }
    let n_tok = q.len() / (nh * qk);
    for t0 in (from..n_tok).step_by(TOKEN_BLOCK) {
        let n = TOKEN_BLOCK.min(n_tok - t0);
        let q = &q[t0 * nh * qk..(t0 + n) * nh * qk];
        let q_nope = resize(&mut b.q_nope, n * nh * nope); // [B, H, nope]
        for (dst, src) in q_nope.chunks_exact_mut(nope).zip(q.chunks_exact(qk)) {
            dst.copy_from_slice(&src[..nope]);
        }
        let q_lat = resize(&mut b.q_lat, n * nh * r); // [B, H, r]
        matmul_per_head(q_nope, q_lat, nh, |h| heads(h).0);
        let o_lat = resize(&mut b.o_lat, n * nh * r); // [B, H, r]
        let (q_lat, scratch) = (&*q_lat, &b.scratch);
        // One task per token: a token's result depends only on its own row and keys.
        parallel_chunks_mut(pool, o_lat, nh * r, |t, ot| {
            let mut s = free_scratch(scratch);
            let (ql, qt) = (&q_lat[t * nh * r..][..nh * r], &q[t * nh * qk..][..nh * qk]);
            attend(cfg, ql, qt, keys(t0 + t), &mut s, ot);
        });
        let out = &mut out[t0 * nh * vd..(t0 + n) * nh * vd];
        matmul_per_head(o_lat, out, nh, |h| heads(h).1);
    }
}

/// The per-token state of [`attend`], reused for every token and layer.
#[derive(Debug, Default)]
pub(crate) struct MlaScratch {
    heads: HeadState,
    /// A tile of key rows gathered from the cache as f32 `[KEY_TILE, r + rope]`.
    tile: Vec<f32>,
}

/// The online-softmax state of every head.
#[derive(Debug, Default)]
struct HeadState {
    /// Absorbed queries `[H, r + rope]`.
    q_cat: Vec<f32>,
    /// Scores of the tile, then their `e^(s − m)` `[H, KEY_TILE]`.
    scores: Vec<f32>,
    /// Running max and sum per head `[H]`.
    m: Vec<f32>,
    l: Vec<f32>,
    /// Latent outputs `[H, r]`.
    o_lat: Vec<f32>,
}

impl MlaScratch {
    /// Sized for `cfg` (the buffers never grow after this; [`attend`] resizes a scratch made
    /// for another shape, e.g. a `Default` one, on its first call).
    pub(super) fn new(cfg: &DeepSeekConfig) -> MlaScratch {
        let nh = cfg.n_heads;
        MlaScratch {
            heads: HeadState {
                q_cat: vec![0.0; nh * cfg.latent_dim()],
                scores: vec![0.0; nh * KEY_TILE],
                m: vec![0.0; nh],
                l: vec![0.0; nh],
                o_lat: vec![0.0; nh * cfg.kv_lora_rank],
            },
            tile: vec![0.0; KEY_TILE * cfg.latent_dim()],
        }
    }
}

/// A scratch of `scratches` that no other task holds (the caller keeps one per pool thread,
/// so one is always free; the loop only covers a lock released a moment late). A scratch
/// left by a panicked task is handed out as it is: every user overwrites or resets it.
pub(super) fn free_scratch<T>(scratches: &[Mutex<T>]) -> MutexGuard<'_, T> {
    loop {
        let free = scratches.iter().find_map(|m| match m.try_lock() {
            Ok(s) => Some(s),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        });
        if let Some(s) = free {
            return s;
        }
        std::hint::spin_loop();
    }
}

/// Where one token's keys are: rows `0..n_keys` of `layer` of the sequence with `table`.
#[derive(Clone, Copy)]
pub(super) struct Keys<'a> {
    /// Which sequence of the batch (a chunk's tokens are consecutive positions).
    pub seq: usize,
    pub kv: &'a LatentKvCache,
    pub layer: usize,
    pub table: &'a [u32],
    pub n_keys: usize,
}

impl<'a> Keys<'a> {
    /// Key `j` as f32 (`buf`: room for one row, used by an f16 cache).
    #[cfg(test)]
    fn row<'b>(&self, j: usize, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        self.kv.row(self.layer, self.table, j, buf)
    }
}

/// `o_lat` `[H, r]` = the normalised latent outputs of one token's MLA over `keys`, with
/// absorbed queries `q_lat` `[H, r]` and its queries `q` `[H, nope + rope]` (only the rotated
/// rope parts are read here).
fn attend(
    cfg: &DeepSeekConfig,
    q_lat: &[f32],
    q: &[f32],
    keys: Keys<'_>,
    s: &mut MlaScratch,
    o_lat: &mut [f32],
) {
    let (nh, r) = (cfg.n_heads, cfg.kv_lora_rank);
    let (nope, qk) = (
        cfg.qk_nope_head_dim,
        cfg.qk_nope_head_dim + cfg.qk_rope_head_dim,
    );
    debug_assert!(keys.n_keys > 0, "a token attends at least to itself");
    if s.heads.q_cat.len() != nh * cfg.latent_dim() || s.heads.o_lat.len() != nh * r {
        *s = MlaScratch::new(cfg);
    }
    let MlaScratch { heads: s, tile } = s;
    let d = cfg.latent_dim();
    for ((qc, ql), qh) in s
        .q_cat
        .chunks_exact_mut(d)
        .zip(q_lat.chunks_exact(r))
        .zip(q.chunks_exact(qk))
    {
        qc[..r].copy_from_slice(ql);
        qc[r..].copy_from_slice(&qh[nope..]);
    }
    s.m.fill(f32::NEG_INFINITY);
    s.l.fill(0.0);
    s.o_lat.fill(0.0);
    for j0 in (0..keys.n_keys).step_by(KEY_TILE) {
        let n = KEY_TILE.min(keys.n_keys - j0);
        let tile = &mut tile[..n * d];
        keys.kv.gather(keys.layer, keys.table, j0, tile);
        attend_tile(cfg, tile, s);
    }
    for (hd, (oh, acc)) in o_lat
        .chunks_exact_mut(r)
        .zip(s.o_lat.chunks_exact(r))
        .enumerate()
    {
        oh.copy_from_slice(acc);
        scale(oh, 1.0 / s.l[hd]);
    }
}

/// One online-softmax step of every head over a `tile` of key rows `[n, r + rope]`
/// (`n ≤ KEY_TILE`): the scores of all heads as one product `Q_cat · tileᵀ`, then the
/// latent outputs as `o += P · tile[.., ..r]`.
fn attend_tile(cfg: &DeepSeekConfig, tile: &[f32], s: &mut HeadState) {
    let (nh, d, r) = (cfg.n_heads, cfg.latent_dim(), cfg.kv_lora_rank);
    let n = tile.len() / d;
    // scores[h][j] = q_cat[h] · tile[j] (the tier's register-blocked kernel)
    let scores = DotRows {
        rows: nh,
        n,
        cols: d,
        q_stride: d,
        k_stride: d,
        s_stride: KEY_TILE,
    };
    kernels().dot_rows(&scores, &mut s.scores, &s.q_cat, tile);
    let log2_scale = cfg.attn_scale * std::f32::consts::LOG2_E; // weights as powers of 2
    for (hd, (sh, o_lat)) in s
        .scores
        .chunks_exact_mut(KEY_TILE)
        .zip(s.o_lat.chunks_exact_mut(r))
        .enumerate()
    {
        let corr = kernels().softmax_step(&mut sh[..n], n, log2_scale, &mut s.m[hd], &mut s.l[hd]);
        if corr != 1.0 {
            scale(o_lat, corr);
        }
    }
    // o_lat[h] += Σ_j p[h][j] · c_j (the tier's register-blocked kernel)
    let shape = AccRows {
        rows: nh,
        cols: r,
        n,
        p_stride: KEY_TILE,
        x_stride: d,
    };
    kernels().acc_rows(&shape, &mut s.o_lat, &s.scores, tile);
}

/// Reference twin of [`attend`]: per head, `q_lat = W_UK_hᵀ · q_nope_h`, every score as
/// `scale · (q_lat · c_j + q_pe_h · k_pe_j)` with sequential sums, an exact softmax over all
/// of them, `o = Σ p_j c_j`, `out_h = W_UV_h · o`.
#[cfg(test)]
pub(super) fn attend_ref(
    cfg: &DeepSeekConfig,
    kv_b: &[f32],
    q: &[f32],
    keys: Keys<'_>,
    out: &mut [f32],
) {
    let dot_ref = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| x * y).sum() };
    let (nh, nope, vd, r) = (
        cfg.n_heads,
        cfg.qk_nope_head_dim,
        cfg.v_head_dim,
        cfg.kv_lora_rank,
    );
    let qk = nope + cfg.qk_rope_head_dim;
    let (mut q_lat, mut o_lat) = (vec![0f32; r], vec![0f32; r]);
    let mut buf = vec![0f32; cfg.latent_dim()];
    for hd in 0..nh {
        let qh = &q[hd * qk..(hd + 1) * qk];
        let w_uk = &kv_b[hd * (nope + vd) * r..(hd * (nope + vd) + nope) * r];
        q_lat.fill(0.0);
        for (qd, wrow) in qh[..nope].iter().zip(w_uk.chunks_exact(r)) {
            q_lat.iter_mut().zip(wrow).for_each(|(a, w)| *a += qd * w);
        }
        let mut scores: Vec<f32> = (0..keys.n_keys)
            .map(|j| {
                let row = keys.row(j, &mut buf);
                cfg.attn_scale * (dot_ref(&q_lat, &row[..r]) + dot_ref(&qh[nope..], &row[r..]))
            })
            .collect();
        tokenmill_kernels::ops::softmax(&mut scores);
        o_lat.fill(0.0);
        for (j, p) in scores.iter().enumerate() {
            let row = &keys.row(j, &mut buf)[..r];
            o_lat.iter_mut().zip(row).for_each(|(o, cv)| *o += p * cv);
        }
        let w_uv = &kv_b[(hd * (nope + vd) + nope) * r..(hd + 1) * (nope + vd) * r];
        let oh = &mut out[hd * vd..(hd + 1) * vd];
        for (ov, wrow) in oh.iter_mut().zip(w_uv.chunks_exact(r)) {
            *ov = dot_ref(wrow, &o_lat);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deepseek::weights::HeadMatrices;
    use tokenmill_kernels::attention::KvDtype;

    /// A DeepSeek config of `n_heads` heads, `r` latent, nope 8, rope 4, v 6.
    fn cfg(n_heads: usize, r: usize) -> DeepSeekConfig {
        let json = serde_json::json!({
            "architectures": ["DeepseekV2ForCausalLM"], "num_hidden_layers": 2,
            "num_attention_heads": n_heads, "hidden_size": 16, "vocab_size": 8,
            "kv_lora_rank": r, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
            "v_head_dim": 6, "intermediate_size": 4,
        });
        DeepSeekConfig::from_hf_config(&json.to_string()).unwrap()
    }

    /// Head `h` of matrices made at load (no store needed).
    fn owned(m: &HeadMatrices, h: usize) -> QMatrix<'_> {
        match m {
            HeadMatrices::Owned { data, rows, cols } => {
                QMatrix::from_f32(*rows, *cols, &data[h * rows * cols..][..rows * cols])
            }
            HeadMatrices::Stored(_) => unreachable!("made from kv_b"),
        }
    }

    /// Deterministic values in about [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 2001)
            .map(|v| v as f32 / 1000.0 - 1.0)
            .collect()
    }

    #[test]
    fn attend_batch_matches_reference() {
        let shapes = [(1, 16), (3, 16), (4, 40)];
        for ((nh, r), dtype) in shapes
            .into_iter()
            .flat_map(|s| KvDtype::ALL.map(|d| (s, d)))
        {
            let c = cfg(nh, r);
            let (qk, vd) = (c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim);
            let kv_b = values(nh * (c.qk_nope_head_dim + vd) * r, 1);
            // 6 blocks of 20 positions, scattered; layer 1 of 2.
            let mut kv = LatentKvCache::with_dtype(2, c.latent_dim(), 6, 20, dtype);
            let table = [4u32, 1, 5, 0, 3, 2];
            for pos in 0..120 {
                let row: Vec<f32> = values(c.latent_dim(), 100 + pos as u32)
                    .iter()
                    .map(|v| 3.0 * v)
                    .collect();
                kv.write(1, &table, pos, &row);
            }
            let (k_b, v_b) = HeadMatrices::from_kv_b(&c, &kv_b);
            let heads = |h| (owned(&k_b, h), owned(&v_b, h));
            let mut bufs = MlaBuffers::default();
            // A token per key count, in one batch of more than a block.
            let n_keys: Vec<usize> = [1, 2, 31, 32, 33, 64, 65, 120]
                .into_iter()
                .cycle()
                .take(TOKEN_BLOCK + 9)
                .collect();
            let q = values(n_keys.len() * nh * qk, 7);
            let keys = |t: usize| Keys {
                seq: t,
                kv: &kv,
                layer: 1,
                table: &table,
                n_keys: n_keys[t],
            };
            let mut got = vec![0f32; n_keys.len() * nh * vd];
            let kv_b_m = QMatrix::from_f32(kv_b.len() / r, r, &kv_b);
            attend_batch(&c, heads, &kv_b_m, &q, keys, &mut bufs, &mut got);
            for (t, &nk) in n_keys.iter().enumerate() {
                let mut want = vec![0f32; nh * vd];
                attend_ref(&c, &kv_b, &q[t * nh * qk..][..nh * qk], keys(t), &mut want);
                let got = &got[t * nh * vd..][..nh * vd];
                let peak = want.iter().fold(0f32, |a, v| a.max(v.abs()));
                let worst = got
                    .iter()
                    .zip(&want)
                    .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
                assert!(
                    worst <= 1e-5 * peak,
                    "{nh} heads, r {r}, {dtype}, {nk} keys: {worst} of {peak}"
                );
            }
        }
    }

    /// The largest `|got − want|` of two outputs, and the largest `|want|`.
    fn worst_and_peak(got: &[f32], want: &[f32]) -> (f32, f32) {
        let peak = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let worst = got
            .iter()
            .zip(want)
            .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        (worst, peak)
    }

    #[test]
    fn runs_take_the_cheaper_form_and_match_reference() {
        // (sequence, first key count, tokens): a decode, a prefill chunk over a long prefix
        // (two key blocks, three query tiles, the last partial), a few speculative tokens, a
        // first chunk, a decode at the end of the cache.
        let runs = [
            (0, 300, 1, false),
            (1, 201, 150, true),
            (2, 296, 5, false),
            (3, 1, 70, true),
            (4, 384, 1, false),
        ];
        for ((nh, r), dtype) in [(3, 16), (2, 40)]
            .into_iter()
            .flat_map(|s| KvDtype::ALL.map(|d| (s, d)))
        {
            let c = cfg(nh, r);
            let (qk, vd) = (c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim);
            let kv_b = values(nh * (c.qk_nope_head_dim + vd) * r, 3);
            let mut kv = LatentKvCache::with_dtype(2, c.latent_dim(), 6, 64, dtype);
            let table = [2u32, 5, 0, 4, 1, 3];
            for pos in 0..384 {
                let row: Vec<f32> = values(c.latent_dim(), 500 + pos as u32)
                    .iter()
                    .map(|v| 4.0 * v)
                    .collect();
                kv.write(1, &table, pos, &row);
            }
            let toks: Vec<(usize, usize)> = runs
                .iter()
                .flat_map(|&(seq, k0, n, expanded)| {
                    assert_eq!(c.mla_expanded_pays(n, k0 - 1), expanded, "{seq}");
                    (0..n).map(move |i| (seq, k0 + i))
                })
                .collect();
            let (k_b, v_b) = HeadMatrices::from_kv_b(&c, &kv_b);
            let heads = |h| (owned(&k_b, h), owned(&v_b, h));
            let kv_b_m = QMatrix::from_f32(kv_b.len() / r, r, &kv_b);
            let q = values(toks.len() * nh * qk, 11);
            let keys = |t: usize| Keys {
                seq: toks[t].0,
                kv: &kv,
                layer: 1,
                table: &table,
                n_keys: toks[t].1,
            };
            let mut got = vec![0f32; toks.len() * nh * vd];
            let mut bufs = MlaBuffers::default();
            attend_batch(&c, heads, &kv_b_m, &q, keys, &mut bufs, &mut got);
            for (t, &(seq, nk)) in toks.iter().enumerate() {
                let mut want = vec![0f32; nh * vd];
                attend_ref(&c, &kv_b, &q[t * nh * qk..][..nh * qk], keys(t), &mut want);
                let (worst, peak) = worst_and_peak(&got[t * nh * vd..][..nh * vd], &want);
                assert!(
                    worst <= 1e-5 * peak,
                    "{nh} heads, r {r}, {dtype}, sequence {seq}, {nk} keys: {worst} of {peak}"
                );
            }
        }
    }

    #[test]
    fn the_expanded_form_pays_for_prefill_chunks_only() {
        // DeepSeek-V2-Lite's widths: 16 heads, r 512, nope 128, rope 64, v 128.
        let json = serde_json::json!({
            "architectures": ["DeepseekV2ForCausalLM"], "num_hidden_layers": 2,
            "num_attention_heads": 16, "hidden_size": 2048, "vocab_size": 8,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "intermediate_size": 4,
        });
        let c = DeepSeekConfig::from_hf_config(&json.to_string()).unwrap();
        assert!(c.mla_expanded_pays(2048, 0));
        assert!(c.mla_expanded_pays(2048, 30_000));
        assert!(c.mla_expanded_pays(512, 4096));
        assert!(!c.mla_expanded_pays(1, 400), "a decode");
        assert!(
            !c.mla_expanded_pays(6, 400),
            "a decode and 5 speculative tokens"
        );
        assert!(
            !c.mla_expanded_pays(64, 32_000),
            "a short chunk over a long prefix"
        );
    }
}
