//! The raw kernels of attention and the SiLU gate, and their scalar tier (the reference twins
//! the SIMD tiers of [`super::x86::attn`] are tested against).
//!
//! One [`AttnTileFn`] call is one step of the online softmax (FlashAttention,
//! <https://arxiv.org/abs/2205.14135>, Algorithm 1, inner loop) for `n_rows` query rows
//! against one tile of up to [`KEY_TILE`] keys; [`AttnMergeFn`] folds two partial states
//! `(m, l, acc)` into one (Flash-Decoding's combine,
//! <https://crfm.stanford.edu/2023/10/12/flashdecoding.html>). Scores are kept in base 2: the
//! caller pre-multiplies the queries by `scale · log2(e)`, so `p = 2^(s - m)`.
//!
//! **The canonical order.** Every tier defines, for one query row, one exact sequence of f32
//! operations, which depends only on that row's own query, keys, values and key count:
//! * a score is four partial dot products, chain `c` summing `d` in
//!   `[c·hd/4, (c+1)·hd/4)` in increasing order, then `(c0 + c1) + (c2 + c3)` (so `head_dim`
//!   is a multiple of 4, and the query is stored chain-interleaved: element `c·hd/4 + i` at
//!   `4·i + c`, so the four chains' query elements sit side by side);
//! * lanes at or past the row's `n_valid` are masked to `-inf` (their keys are never read by
//!   the value update), `m' = max(m, max of the tile)`, `corr = 2^(m - m')`,
//!   `p = 2^(s - m')`, `l' = l·corr + Σ p` (the tier's fixed lane-sum tree), where `2^x` is
//!   flushed to 0 below `2^-64` ([`EXP2_FLUSH`]: no denormals);
//! * `acc` is scaled by `corr` unless `corr == 1`, then `acc += p_j · v_j` for
//!   `j = 0..n_valid` in order;
//! * over an int8 store ([`KvElem::SCALED`]) each chain is multiplied by its key's scale
//!   of that quarter before the sum, `(c0·s0 + c1·s1) + (c2·s2 + c3·s3)`, and `p_j` in the
//!   value update is `p_j · vscale_j` (`l` sums the unscaled `p`);
//! * merge: `M = max(m1, m2)`, `a = 2^(m1 - M)`, `b = 2^(m2 - M)`, `L = l1·a + l2·b`,
//!   `acc = acc1·a + acc2·b` (one fused multiply-add in the SIMD tiers).
//!
//! So a row's result never depends on which other rows share a call, how rows are blocked
//! inside the kernel, or which thread runs it — the property that lets the prefill and
//! decode paths of [`crate::attention`] agree bit for bit.

use crate::kv_elem::KvElem;

/// Keys per attention tile: one AVX-512 register (two AVX2 registers) of scores.
pub const KEY_TILE: usize = 16;

/// One attention tile step (see the module docs). Raw pointers, as [`super::Tile`]. Keys and
/// values are elements of `E` (f32, f16, bf16 or i8, [`crate::kv_elem::KvElem`]), widened to
/// f32 exactly as they are loaded; everything else is f32.
#[derive(Clone, Copy, Debug)]
pub struct AttnTile<E = f32> {
    pub head_dim: usize,
    pub n_rows: usize,
    /// Queries `[n_rows, head_dim]`, pre-multiplied by `scale · log2(e)`, each row
    /// chain-interleaved (element `c · head_dim / 4 + i` at `4 · i + c`).
    pub q: *const f32,
    /// Keys, transposed: element `d` of key `j` at `kt[d * kt_stride + j]`, `j < KEY_TILE`
    /// (all `KEY_TILE` lanes readable; lanes at or past a row's `n_valid` are ignored).
    pub kt: *const E,
    pub kt_stride: usize,
    /// Values: value `j` at `v[j * v_stride..][..head_dim]`, for `j` below the largest
    /// `n_valid`.
    pub v: *const E,
    pub v_stride: usize,
    /// The scales of keys and values `0..KEY_TILE` (all readable) when `E::SCALED` (int8):
    /// quarter `c` of `head_dim` of key `j` at `k_scale[c * kt_stride + j]`, value `j` at
    /// `v_scale[j]`; unused (may be null) otherwise.
    pub k_scale: *const f32,
    pub v_scale: *const f32,
    /// Keys of the tile visible to each row, `[n_rows]`, each in `1..=KEY_TILE`.
    pub n_valid: *const u32,
    /// Running state per row: max `m` and sum `l` `[n_rows]`, accumulator `[n_rows, head_dim]`.
    pub m: *mut f32,
    pub l: *mut f32,
    pub acc: *mut f32,
}

/// Runs one [`AttnTile`] step.
///
/// # Safety
///
/// Every pointer of the tile valid as documented there, the state not accessed by anyone else
/// during the call, `head_dim` supported by the tier (a multiple of its lane count), and the
/// CPU supports the tier's features.
pub type AttnTileFn<E = f32> = unsafe fn(t: &AttnTile<E>);

/// Folds the partial state `src` into `dst` (see the module docs); `acc`s are `head_dim`
/// long.
///
/// # Safety
///
/// `dst_acc.len() == src_acc.len()`, a length the tier supports, and the CPU supports the
/// tier's features.
pub type AttnMergeFn =
    unsafe fn(dst_m: &mut f32, dst_l: &mut f32, dst_acc: &mut [f32], m: f32, l: f32, acc: &[f32]);

/// `out = silu(gate) · up = gate / (1 + e^-gate) · up`, element-wise.
///
/// # Safety
///
/// All three slices have the same length, and the CPU supports the tier's features.
pub type SiluMulFn = unsafe fn(gate: &[f32], up: &[f32], out: &mut [f32]);

/// The shape of an [`AccRowsFn`] call: `o[h][c] += Σ_{j<n} p[h·p_stride + j] · x[j·x_stride + c]`
/// for `h < rows`, `c < cols` (`o` row-major `[rows, cols]`): a small product `O += P · X`
/// whose `X` rows are strided (MLA's latent accumulation over a tile of cached rows).
#[derive(Clone, Copy, Debug)]
pub struct AccRows {
    pub rows: usize,
    pub cols: usize,
    pub n: usize,
    pub p_stride: usize,
    pub x_stride: usize,
}

/// `O += P · X` of an [`AccRows`] shape.
///
/// # Safety
///
/// `o` holds `rows · cols` values, `p` reaches `(rows − 1) · p_stride + n`, `x` reaches
/// `(n − 1) · x_stride + cols`, and the CPU supports the tier's features.
pub type AccRowsFn = unsafe fn(s: &AccRows, o: &mut [f32], p: &[f32], x: &[f32]);

/// Scalar tier of [`AccRowsFn`] (the reference): for each output row, key by key in order,
/// multiply then add.
///
/// # Safety
///
/// As [`AccRowsFn`].
pub unsafe fn acc_rows(s: &AccRows, o: &mut [f32], p: &[f32], x: &[f32]) {
    for (h, oh) in o.chunks_exact_mut(s.cols).take(s.rows).enumerate() {
        for j in 0..s.n {
            let pj = p[h * s.p_stride + j];
            let xj = &x[j * s.x_stride..][..s.cols];
            for (ov, &xv) in oh.iter_mut().zip(xj) {
                *ov += pj * xv;
            }
        }
    }
}

/// The shape of a small `S = Q · Kᵀ` over strided rows ([`DotRowsFn`]): `s[i·s_stride + j]
/// = Σ_{c < cols} q[i·q_stride + c] · k[j·k_stride + c]` for every row `i < rows` and key
/// `j < n` (MLA's scores: every head's absorbed query against a tile of latent rows).
#[derive(Clone, Copy, Debug)]
pub struct DotRows {
    pub rows: usize,
    pub n: usize,
    pub cols: usize,
    pub q_stride: usize,
    pub k_stride: usize,
    pub s_stride: usize,
}

/// `S = Q · Kᵀ` of a [`DotRows`] shape (the outputs are overwritten).
///
/// # Safety
///
/// `s` reaches `(rows − 1) · s_stride + n`, `q` reaches `(rows − 1) · q_stride + cols`, `k`
/// reaches `(n − 1) · k_stride + cols`, and the CPU supports the tier's features.
pub type DotRowsFn = unsafe fn(d: &DotRows, s: &mut [f32], q: &[f32], k: &[f32]);

/// Scalar tier of [`DotRowsFn`] (the reference): each output one dot, column by column in
/// order, multiply then add.
///
/// # Safety
///
/// As [`DotRowsFn`].
pub unsafe fn dot_rows(d: &DotRows, s: &mut [f32], q: &[f32], k: &[f32]) {
    for i in 0..d.rows {
        let qi = &q[i * d.q_stride..][..d.cols];
        for j in 0..d.n {
            let kj = &k[j * d.k_stride..][..d.cols];
            s[i * d.s_stride + j] = qi.iter().zip(kj).fold(0.0, |a, (x, y)| a + x * y);
        }
    }
}

/// One online-softmax step over a row of raw scores ([`SoftmaxStepFn`]), in base 2:
/// `x_j = scale · s_j` for the row's `valid` keys, `m' = max(m, max_j x_j)`,
/// `s_j = 2^(x_j − m')` ([`exp2`], flushed below [`EXP2_FLUSH`]), `s_j = 0` past `valid`,
/// `l' = l · 2^(m − m') + Σ_j s_j`; returns the correction `2^(m − m')` the caller scales its
/// output by (`1` when `valid == 0`, which changes nothing but the zeroed scores). The caller
/// passes `scale` pre-multiplied by `log2(e)`, so the weights are those of `e^(scale·s)`.
///
/// # Safety
///
/// `valid <= s.len()`, and the CPU supports the tier's features.
pub type SoftmaxStepFn =
    unsafe fn(s: &mut [f32], valid: usize, scale: f32, m: &mut f32, l: &mut f32) -> f32;

/// Scalar tier of [`SoftmaxStepFn`] (the reference): in order, one key at a time.
///
/// # Safety
///
/// As [`SoftmaxStepFn`].
pub unsafe fn softmax_step(
    s: &mut [f32],
    valid: usize,
    scale: f32,
    m: &mut f32,
    l: &mut f32,
) -> f32 {
    let (keys, future) = s.split_at_mut(valid);
    future.fill(0.0);
    if keys.is_empty() {
        return 1.0;
    }
    keys.iter_mut().for_each(|v| *v *= scale);
    let m_new = keys.iter().copied().fold(*m, f32::max);
    let mut sum = 0.0;
    for v in keys.iter_mut() {
        *v = exp2(*v - m_new);
        sum += *v;
    }
    let corr = exp2(*m - m_new);
    *l = *l * corr + sum;
    *m = m_new;
    corr
}

/// Scalar tier of [`AttnTileFn`]: the canonical order in plain f32 (multiply, then add), keys
/// and values widened from `E` as they are read.
///
/// # Safety
///
/// As [`AttnTileFn`] (any `head_dim` that is a multiple of 4).
pub unsafe fn attn_tile<E: KvElem>(t: &AttnTile<E>) {
    let hd = t.head_dim;
    let quarter = hd / 4;
    for r in 0..t.n_rows {
        // SAFETY: the caller guarantees the tile's pointers (module docs of `AttnTile`).
        unsafe {
            let q = std::slice::from_raw_parts(t.q.add(r * hd), hd);
            let n_valid = *t.n_valid.add(r) as usize;
            let mut s = [f32::NEG_INFINITY; KEY_TILE];
            for (j, s) in s.iter_mut().enumerate().take(n_valid) {
                let mut c = [0f32; 4];
                for (ci, c) in c.iter_mut().enumerate() {
                    for i in 0..quarter {
                        let d = ci * quarter + i;
                        *c += q[4 * i + ci] * (*t.kt.add(d * t.kt_stride + j)).to_f32();
                    }
                }
                if E::SCALED {
                    let ks = |ci: usize| *t.k_scale.add(ci * t.kt_stride + j);
                    for (ci, c) in c.iter_mut().enumerate() {
                        *c *= ks(ci);
                    }
                }
                *s = (c[0] + c[1]) + (c[2] + c[3]);
            }
            let tmax = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m = &mut *t.m.add(r);
            let l = &mut *t.l.add(r);
            let m_new = m.max(tmax);
            let corr = exp2(*m - m_new);
            let mut p = [0f32; KEY_TILE];
            let mut sum = 0f32;
            for (p, &s) in p.iter_mut().zip(&s) {
                *p = exp2(s - m_new);
                sum += *p;
            }
            *l = *l * corr + sum;
            *m = m_new;
            let acc = std::slice::from_raw_parts_mut(t.acc.add(r * hd), hd);
            if corr != 1.0 {
                for a in acc.iter_mut() {
                    *a *= corr;
                }
            }
            for (j, &pj) in p.iter().enumerate().take(n_valid) {
                let pj = if E::SCALED {
                    pj * *t.v_scale.add(j)
                } else {
                    pj
                };
                let v = std::slice::from_raw_parts(t.v.add(j * t.v_stride), hd);
                for (a, &vd) in acc.iter_mut().zip(v) {
                    *a += pj * vd.to_f32();
                }
            }
        }
    }
}

/// Below `2^EXP2_FLUSH`, [`exp2`] (every tier's) is exactly 0.
///
/// A guard against denormals: real attention is peaked (an "attention sink" scores far above
/// most keys), and with weights down to `2^-126`, `p · v` or `acc · corr` could fall into
/// f32's denormal range, where each FMA takes a microcode assist on x86. A weight below
/// `2^-64` of the running maximum changes no f32 result over any realistic context
/// (`2^-64 · 10^6 ≈ 5e-14` relative). (No measurable effect on the default model, whose
/// weights rarely get that small; it bounds the worst case.)
pub const EXP2_FLUSH: f32 = -64.0;

/// `2^x`, flushed to zero below [`EXP2_FLUSH`] (so `2^-inf == 0`), as every tier.
#[inline]
pub fn exp2(x: f32) -> f32 {
    if x < EXP2_FLUSH { 0.0 } else { x.exp2() }
}

/// Scalar tier of [`AttnMergeFn`].
///
/// # Safety
///
/// None beyond equal `acc` lengths.
pub unsafe fn attn_merge(
    dst_m: &mut f32,
    dst_l: &mut f32,
    dst_acc: &mut [f32],
    m: f32,
    l: f32,
    acc: &[f32],
) {
    let mx = dst_m.max(m);
    let (a, b) = (exp2(*dst_m - mx), exp2(m - mx));
    *dst_l = *dst_l * a + l * b;
    *dst_m = mx;
    for (d, &s) in dst_acc.iter_mut().zip(acc) {
        *d = *d * a + s * b;
    }
}

/// Scalar tier of [`SiluMulFn`]: the reference formula.
///
/// # Safety
///
/// None beyond equal lengths.
pub unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}
