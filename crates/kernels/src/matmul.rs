//! Matrix multiplication with weights in their native (quantized) format.
//!
//! `matmul(x, w, out)` computes `out[t][n] = Σ_k x[t][k] · w[n][k]` — activations `x` are
//! row-major `[n_tokens, k]` f32, the weight is `[n, k]` in any [`GgmlType`] (ggml stores a
//! linear layer's weight as `n` rows of `k` elements), and `out` is `[n_tokens, n]`.
//!
//! This is the plain tier: each weight row is dequantized once into a stack-sized f32 buffer
//! and dotted with every activation row, so a prefill chunk amortises the dequantization over
//! its tokens. The weight is never dequantized as a whole. The fast tiers (integer dot products
//! on quantized activations, SIMD, threads) slot in behind this same entry point.

use crate::quant::{GgmlType, dequantize_row};

/// A weight matrix view: `rows` rows of `cols` elements of type `ty`, packed as in GGUF.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// The packed bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Dequantizes row `r` into `dst` (`dst.len() == cols`).
    pub fn dequantize_row_into(&self, r: usize, dst: &mut [f32]) {
        dequantize_row(self.ty, self.row(r), dst);
    }
}

/// Rows of the weight dequantized per pass: bounds the scratch buffer while still letting the
/// inner loop stream over several weight rows per activation row.
const ROWS_PER_PASS: usize = 8;

/// `out[t][n] = Σ_k x[t][k] · w[n][k]` for `t < n_tokens`.
///
/// `x.len() == n_tokens * w.cols`, `out.len() == n_tokens * w.rows`.
pub fn matmul(x: &[f32], w: &QMatrix<'_>, out: &mut [f32]) {
    let k = w.cols;
    let n = w.rows;
    debug_assert_eq!(x.len() % k, 0);
    let n_tokens = x.len() / k;
    debug_assert_eq!(out.len(), n_tokens * n);
    let mut scratch = vec![0f32; ROWS_PER_PASS * k];
    let mut r0 = 0;
    while r0 < n {
        let nr = ROWS_PER_PASS.min(n - r0);
        for i in 0..nr {
            w.dequantize_row_into(r0 + i, &mut scratch[i * k..(i + 1) * k]);
        }
        for t in 0..n_tokens {
            let xt = &x[t * k..(t + 1) * k];
            let ot = &mut out[t * n + r0..t * n + r0 + nr];
            for (i, o) in ot.iter_mut().enumerate() {
                *o = dot(xt, &scratch[i * k..(i + 1) * k]);
            }
        }
        r0 += nr;
    }
}

/// f32 dot product with eight independent accumulators so the compiler vectorises it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (pa, pb) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for j in 0..8 {
            acc[j] = pa[j].mul_add(pb[j], acc[j]);
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for j in chunks * 8..a.len() {
        sum += a[j] * b[j];
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_matrix(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        (0..rows * cols)
            .flat_map(|i| {
                ((((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
                    .to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn matches_naive_f32_product_on_odd_shapes() {
        for (t, n, k) in [(1, 1, 1), (3, 7, 5), (2, 17, 33), (5, 9, 64)] {
            let data = f32_matrix(n, k, 7);
            let w = QMatrix {
                ty: GgmlType::F32,
                rows: n,
                cols: k,
                data: &data,
            };
            let x: Vec<f32> = (0..t * k).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
            let mut out = vec![0f32; t * n];
            matmul(&x, &w, &mut out);
            let wf: Vec<f32> = data
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            for ti in 0..t {
                for ni in 0..n {
                    let want: f32 = (0..k).map(|j| x[ti * k + j] * wf[ni * k + j]).sum();
                    let got = out[ti * n + ni];
                    assert!(
                        (want - got).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{want} vs {got}"
                    );
                }
            }
        }
    }
}
