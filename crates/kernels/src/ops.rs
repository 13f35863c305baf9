//! Element-wise and normalisation ops on f32 rows: RMSNorm, SiLU-gated products, residual
//! adds, softmax and rotary position embeddings.
//!
//! All ops work on flat row-major slices; the caller guarantees lengths (checked with
//! `debug_assert!` only — kernels are infallible).

/// `out = x / sqrt(mean(x²) + eps) * weight`, row by row (`weight.len()` is the row length).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    debug_assert_eq!(x.len(), out.len());
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
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

/// Rotates the first `2 * inv_freq.len()` dims of each `head_dim`-sized head in `x` by
/// angle `pos * inv_freq[i]` (RoFormer, <https://arxiv.org/abs/2104.09864>).
///
/// `x` holds the heads of one token, `[n_heads, head_dim]`; dims past the rotary part
/// (partial rotary) are left as they are.
pub fn rope(x: &mut [f32], head_dim: usize, pos: usize, inv_freq: &[f32], style: RopeStyle) {
    let half = inv_freq.len();
    let rot = 2 * half;
    debug_assert!(rot <= head_dim);
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &f) in inv_freq.iter().enumerate() {
            let (sin, cos) = (pos as f32 * f).sin_cos();
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::NeoX => (i, i + rot / 2),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
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
    fn silu_mul_matches_formula() {
        let mut g = [0.0, 1.0, -2.0];
        silu_mul(&mut g, &[2.0, 3.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 3.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
        assert!((g[2] - -2.0 / (1.0 + 2f32.exp())).abs() < 1e-6);
    }
}
