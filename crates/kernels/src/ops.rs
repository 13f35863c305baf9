//! Element-wise and normalisation ops on f32 rows: RMSNorm (alone and fused with the residual
//! add), SiLU-gated products, residual adds, `axpy` and scaling, softmax and rotary position
//! embeddings.
//!
//! All ops work on flat row-major slices; the caller guarantees lengths (checked with
//! `debug_assert!` only — kernels are infallible).
//!
//! Fusion: [`add_rms_norm`] does the residual add and the next sub-layer's RMSNorm in one
//! pass over the row (the sum of squares is taken while the sum is written), so the residual
//! stream is read once per sub-layer instead of three times. Its reference twin is
//! [`add_in_place`] followed by [`rms_norm`]; both sum squares in the same eight-lane order,
//! so they agree bit for bit. RoPE is split into [`rope_cos_sin`] (once per token per
//! forward, shared by every layer and head) and [`rope_with`]; the K side is fused into the
//! cache write ([`crate::attention::PagedKvMut::write`]).

/// `Σ v²` over a row, in eight interleaved partial sums (vectorises; a fixed order).
#[inline]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] += c[j] * c[j];
        }
    }
    for (j, &v) in rest.iter().enumerate() {
        acc[j] += v * v;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `out = x · weight / sqrt(Σ x² / d + eps)` for one row, given `Σ x²`.
#[inline]
fn scale_row(x: &[f32], ss: f32, weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = 1.0 / (ss / weight.len() as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// `out = x / sqrt(mean(x²) + eps) * weight`, row by row (`weight.len()` is the row length).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    debug_assert_eq!(x.len(), out.len());
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        scale_row(xr, sum_squares(xr), weight, eps, or);
    }
}

/// Rows from which [`add_rms_norm`] splits its rows across the global pool (a prefill chunk or
/// a batch of decode rows; a few rows are not worth a hand-off).
const PAR_ROWS: usize = 32;

/// Residual add and RMSNorm in one pass: `x += y`, then `out = rms_norm(x) · weight`, row by
/// row. Bit-identical to [`add_in_place`] then [`rms_norm`]. From [`PAR_ROWS`] rows the rows
/// are split across the global pool (each row is computed alike wherever it runs).
pub fn add_rms_norm(x: &mut [f32], y: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    debug_assert!(x.len() == y.len() && x.len() == out.len());
    let rows = x.len().checked_div(d).unwrap_or(0);
    let pool = crate::pool::global();
    if rows < PAR_ROWS || pool.num_threads() == 1 {
        return add_rms_norm_rows(x, y, weight, eps, out);
    }
    let per = rows.div_ceil(pool.num_threads()) * d;
    let (xp, op) = (
        crate::pool::SyncPtr(x.as_mut_ptr()),
        crate::pool::SyncPtr(out.as_mut_ptr()),
    );
    let len = x.len().min(out.len()).min(y.len());
    pool.parallel_for(len.div_ceil(per), |i| {
        let (a, b) = (i * per, len.min((i + 1) * per));
        // SAFETY: task `i` gets elements `a..b` of `x` and `out`, disjoint from every other
        // task's and within both, which stay mutably borrowed for the whole `parallel_for`.
        let (xs, os) = unsafe {
            (
                std::slice::from_raw_parts_mut(xp.get().add(a), b - a),
                std::slice::from_raw_parts_mut(op.get().add(a), b - a),
            )
        };
        add_rms_norm_rows(xs, &y[a..b], weight, eps, os);
    });
}

/// [`add_rms_norm`] on the calling thread.
fn add_rms_norm_rows(x: &mut [f32], y: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for ((xr, yr), or) in x
        .chunks_exact_mut(d)
        .zip(y.chunks_exact(d))
        .zip(out.chunks_exact_mut(d))
    {
        let mut acc = [0f32; 8];
        let mut xc = xr.chunks_exact_mut(8);
        let mut yc = yr.chunks_exact(8);
        for (xa, ya) in (&mut xc).zip(&mut yc) {
            for j in 0..8 {
                xa[j] += ya[j];
                acc[j] += xa[j] * xa[j];
            }
        }
        for (j, (xv, &yv)) in xc
            .into_remainder()
            .iter_mut()
            .zip(yc.remainder())
            .enumerate()
        {
            *xv += yv;
            acc[j] += *xv * *xv;
        }
        let ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        scale_row(xr, ss, weight, eps, or);
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `y += a · x` (BLAS `saxpy`; a plain loop the compiler vectorises).
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

/// `x *= a`.
pub fn scale(x: &mut [f32], a: f32) {
    for v in x.iter_mut() {
        *v *= a;
    }
}

/// `x[row] += bias` for every row of `x` (`bias.len()` is the row length).
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// `gate = silu(gate) * up`, SwiGLU's element-wise half.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// In-place numerically stable softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Which elements RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-J / llama.cpp "normal": adjacent pairs `(2i, 2i+1)`.
    Interleaved,
    /// GPT-NeoX / HF `rotate_half`: pairs `(i, i + d/2)`.
    NeoX,
}

/// The dims `(a, b)` RoPE rotates together as pair `i` of the `rot` rotated dims.
#[inline]
pub fn rope_pair(i: usize, rot: usize, style: RopeStyle) -> (usize, usize) {
    match style {
        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        RopeStyle::NeoX => (i, i + rot / 2),
    }
}

/// `cos_sin = [m·cos θ_0, m·sin θ_0, m·cos θ_1, m·sin θ_1, ...]` with `θ_i = pos · inv_freq[i]`
/// and `m = mscale` (`cos_sin.len() == 2 * inv_freq.len()`). `mscale` is YaRN's attention
/// factor on cos and sin (DeepSeek, <https://arxiv.org/abs/2309.00071>); 1 leaves them plain
/// (exactly: `x · 1.0 == x`).
pub fn rope_cos_sin(pos: usize, inv_freq: &[f32], mscale: f32, cos_sin: &mut [f32]) {
    debug_assert_eq!(cos_sin.len(), 2 * inv_freq.len());
    for (cs, &f) in cos_sin.chunks_exact_mut(2).zip(inv_freq) {
        let (sin, cos) = (pos as f32 * f).sin_cos();
        cs[0] = cos * mscale;
        cs[1] = sin * mscale;
    }
}

/// One RoPE rotation of the pair `(x0, x1)`: `(x0·cos − x1·sin, x0·sin + x1·cos)`, each
/// product rounded before the sum (no fused multiply-add). Every RoPE in the crate — the
/// queries' ([`rope_with`], [`rope`]) and the keys' on their way into the cache
/// ([`crate::attention::PagedKvMut::write`]) — is this arithmetic, so they agree bit for bit.
#[inline(always)]
pub fn rotate(x0: f32, x1: f32, cos: f32, sin: f32) -> (f32, f32) {
    (x0 * cos - x1 * sin, x0 * sin + x1 * cos)
}

/// Rotates the first `cos_sin.len()` dims of one head (`head.len() >= cos_sin.len()`) by the
/// angles of [`rope_cos_sin`]: a loop over contiguous pairs per style, with no index checks
/// in it.
#[inline]
fn rope_head(head: &mut [f32], cos_sin: &[f32], style: RopeStyle) {
    let rot = cos_sin.len();
    match style {
        RopeStyle::Interleaved => {
            for (x, cs) in head[..rot].chunks_exact_mut(2).zip(cos_sin.chunks_exact(2)) {
                (x[0], x[1]) = rotate(x[0], x[1], cs[0], cs[1]);
            }
        }
        RopeStyle::NeoX => {
            let (lo, hi) = head[..rot].split_at_mut(rot / 2);
            for ((a, b), cs) in lo
                .iter_mut()
                .zip(hi.iter_mut())
                .zip(cos_sin.chunks_exact(2))
            {
                (*a, *b) = rotate(*a, *b, cs[0], cs[1]);
            }
        }
    }
}

/// [`rope`] with the angles of [`rope_cos_sin`] precomputed.
pub fn rope_with(x: &mut [f32], head_dim: usize, cos_sin: &[f32], style: RopeStyle) {
    debug_assert!(cos_sin.len() <= head_dim);
    for head in x.chunks_exact_mut(head_dim) {
        rope_head(head, cos_sin, style);
    }
}

/// Rotates the first `2 * inv_freq.len()` dims of each `head_dim`-sized head in `x` by
/// angle `pos * inv_freq[i]` (RoFormer, <https://arxiv.org/abs/2104.09864>).
///
/// `x` holds the heads of one token, `[n_heads, head_dim]`; dims past the rotary part
/// (partial rotary) are left as they are.
pub fn rope(x: &mut [f32], head_dim: usize, pos: usize, inv_freq: &[f32], style: RopeStyle) {
    let rot = 2 * inv_freq.len();
    debug_assert!(rot <= head_dim);
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &f) in inv_freq.iter().enumerate() {
            let (sin, cos) = (pos as f32 * f).sin_cos();
            let (a, b) = rope_pair(i, rot, style);
            (head[a], head[b]) = rotate(head[a], head[b], cos, sin);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0, 0.0, 0.0, 1.0, 1.0];
        let mut out = [0.0; 6];
        rms_norm(&x, &[1.0, 2.0], 1e-9, &mut out);
        let s = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / s).abs() < 1e-6 && (out[1] - 8.0 / s).abs() < 1e-6);
        assert_eq!(&out[2..4], &[0.0, 0.0]);
        assert!((out[4] - 1.0).abs() < 1e-6 && (out[5] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn softmax_sums_to_one_and_is_shift_invariant() {
        let mut a = [1.0, 2.0, 3.0];
        let mut b = [1001.0, 1002.0, 1003.0];
        softmax(&mut a);
        softmax(&mut b);
        assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_styles_pair_the_right_dims_and_keep_norms() {
        let inv = [1.0, 0.1];
        let mut a = [1.0, 0.0, 1.0, 0.0];
        rope(&mut a, 4, 1, &inv, RopeStyle::Interleaved);
        assert!((a[0] - 1f32.cos()).abs() < 1e-6 && (a[1] - 1f32.sin()).abs() < 1e-6);
        assert!((a[2] - 0.1f32.cos()).abs() < 1e-6 && (a[3] - 0.1f32.sin()).abs() < 1e-6);
        let mut b = [1.0, 1.0, 0.0, 0.0];
        rope(&mut b, 4, 1, &inv, RopeStyle::NeoX);
        assert!((b[0] - 1f32.cos()).abs() < 1e-6 && (b[2] - 1f32.sin()).abs() < 1e-6);
        assert!((b[1] - 0.1f32.cos()).abs() < 1e-6 && (b[3] - 0.1f32.sin()).abs() < 1e-6);
        let mut c = [0.3, -0.7, 0.2, 0.9];
        let n0: f32 = c.iter().map(|v| v * v).sum();
        rope(&mut c, 4, 17, &inv, RopeStyle::NeoX);
        assert!((c.iter().map(|v| v * v).sum::<f32>() - n0).abs() < 1e-5);
    }

    #[test]
    fn add_rms_norm_is_add_then_rms_norm_bit_for_bit() {
        // 3 rows on the caller; 37 and 100 split across the pool (when it has threads).
        for (d, rows) in [
            (1, 3),
            (7, 3),
            (8, 3),
            (13, 3),
            (64, 3),
            (576, 3),
            (13, 37),
            (576, 100),
        ] {
            let n = rows * d;
            let w: Vec<f32> = (0..d).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
            let x0: Vec<f32> = (0..n).map(|i| ((i * 37) % 19) as f32 * 0.3 - 2.0).collect();
            let y: Vec<f32> = (0..n).map(|i| ((i * 11) % 23) as f32 * 0.1 - 1.0).collect();
            let (mut xa, mut xb) = (x0.clone(), x0);
            let (mut oa, mut ob) = (vec![0f32; n], vec![0f32; n]);
            add_rms_norm(&mut xa, &y, &w, 1e-5, &mut oa);
            add_in_place(&mut xb, &y);
            rms_norm(&xb, &w, 1e-5, &mut ob);
            assert_eq!(xa, xb);
            assert_eq!(oa, ob);
        }
    }

    #[test]
    fn rope_with_mscale_scales_cos_and_sin() {
        let inv = [1.0, 0.1];
        let (mut plain, mut scaled) = ([0f32; 4], [0f32; 4]);
        rope_cos_sin(7, &inv, 1.0, &mut plain);
        rope_cos_sin(7, &inv, 1.25, &mut scaled);
        for (p, s) in plain.iter().zip(&scaled) {
            assert_eq!(p * 1.25, *s);
        }
        let (mut a, mut b) = ([0.3, -0.7, 0.2, 0.9], [0.3, -0.7, 0.2, 0.9]);
        rope(&mut a, 4, 7, &inv, RopeStyle::Interleaved);
        rope_with(&mut b, 4, &plain, RopeStyle::Interleaved);
        assert_eq!(a, b);
    }

    #[test]
    fn axpy_and_scale() {
        let mut y = [1.0, 2.0, 3.0];
        axpy(&mut y, 2.0, &[0.5, -1.0, 0.25]);
        assert_eq!(y, [2.0, 0.0, 3.5]);
        scale(&mut y, 0.5);
        assert_eq!(y, [1.0, 0.0, 1.75]);
    }

    #[test]
    fn silu_mul_matches_formula() {
        let mut g = [0.0, 1.0, -2.0];
        silu_mul(&mut g, &[2.0, 3.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 3.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
        assert!((g[2] - -2.0 / (1.0 + 2f32.exp())).abs() < 1e-6);
    }
}
