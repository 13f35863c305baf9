//! Reference quantizers for the 8-bit activation formats Q8_0, Q8_1 and Q8_K.
//!
//! Before an integer dot product, a row of f32 activations is quantized to the weight type's
//! [`GgmlType::vec_dot_type`](super::GgmlType::vec_dot_type). These are the plain twins of the
//! SIMD quantizers: ggml's `quantize_row_q8_0_ref`, `quantize_row_q8_1_ref` and
//! `quantize_row_q8_K_ref` in `ggml-quants.c`
//! (<https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-quants.c>), bit for bit:
//!
//! * Q8_0 / Q8_1: `d = amax / 127`, `q = round(x / d)` computed as `x * (1 / d)` with
//!   round-half-away-from-zero (C `roundf`), `d` stored as f16 (so `|x - d_f16 * q|` can exceed
//!   `d / 2` by up to `127 * d * 2^-11`, or by `127 * 2^-25` for blocks with `amax` below
//!   ~7.8e-3, whose `d` is an f16 subnormal). Q8_1 also stores `s = f16(d * sum(q))`.
//! * Q8_K: `d = max / -127` where `max` is the element of largest magnitude (its sign
//!   included), `q = nearest_int(x * (-127 / max))` (round half to even), `q <= 127`; `d` stays
//!   f32, and `bsums[j]` is the exact sum of quants `16j..16j + 16`. An all-zero block has
//!   `d = 0` and zero quants and sums (ggml leaves its `bsums` untouched there; we zero them).
//!
//! Q8_0 is also a weight format (tied embeddings); [`quantize_row_q8_0`] is its weight
//! quantizer as well.

// ggml's names: `q4_K`, `q8_K` keep the capital K of the type names.
#![allow(non_snake_case)]

use super::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8_K, F16Le, QK};
use super::types::QK_K;

/// The largest `|x|` of a block, folded as ggml's `amax = MAX(amax, fabsf(v))`.
#[inline]
fn abs_max(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() })
}

/// Q8_0 / Q8_1 common part: scale and quants of one block of 32.
#[inline]
fn quantize_block_32(x: &[f32], qs: &mut [i8; QK]) -> f32 {
    let d = abs_max(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        // `as i8` saturates; |v * id| <= 127 up to rounding, so it never needs to.
        *q = (v * id).round() as i8;
    }
    d
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to Q8_0.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let d = quantize_block_32(x, &mut b.qs);
        b.d = F16Le::from_f32(d);
    }
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to Q8_1.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let d = quantize_block_32(x, &mut b.qs);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = F16Le::from_f32(d);
        b.s = F16Le::from_f32(sum as f32 * d);
    }
}

/// Quantizes `x` (`x.len() == 256 * y.len()`) to Q8_K.
pub fn quantize_row_q8_K(x: &[f32], y: &mut [BlockQ8_K]) {
    debug_assert_eq!(x.len(), QK_K * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        // The first element of largest magnitude, with its sign.
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8_K {
                d: 0f32.to_le_bytes(),
                qs: [0; QK_K],
                bsums: [[0; 2]; QK_K / 16],
            };
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            // ggml's `nearest_int` (the 1.5 * 2^23 trick) rounds half to even.
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            let sum: i32 = q.iter().map(|&q| q as i32).sum();
            *s = (sum as i16).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::Block;
    use crate::quant::dequant::{dequantize_row_q8_0, dequantize_row_q8_1, dequantize_row_q8_K};
    use crate::quant::testing::SplitMix64;

    /// Rows with varied magnitudes, an all-zero block and a constant block.
    fn rows(n: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = SplitMix64::new(seed);
        let mut out = Vec::new();
        for scale in [1e-4f32, 1.0, 3e3] {
            out.push((0..n).map(|_| rng.normal() * scale).collect());
        }
        let mut special: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        special[..QK].fill(0.0);
        special[QK..2 * QK].fill(-0.75);
        out.push(special);
        out
    }

    /// Checks `|x - deq| <= bound(block amax)` element-wise, per block of `bs`.
    fn check_error(x: &[f32], deq: &[f32], bs: usize, bound: impl Fn(f32) -> f32) {
        for (xb, yb) in x.chunks(bs).zip(deq.chunks(bs)) {
            let b = bound(abs_max(xb));
            for (&a, &y) in xb.iter().zip(yb) {
                assert!((a - y).abs() <= b, "x {a} deq {y} bound {b}");
            }
        }
    }

    /// Q8_0 / Q8_1 error: half a step, plus the f16 rounding of `d` amplified by `|q| <= 127`
    /// (relative 2^-11, or absolute 2^-25 once `d` is an f16 subnormal, i.e. amax < ~7.8e-3).
    fn q8_32_bound(amax: f32) -> f32 {
        amax / 127.0 * (0.5 + 127.0 / 2048.0) * (1.0 + 1e-5) + 127.0 * 2f32.powi(-25)
    }

    #[test]
    fn q8_0_error_bound() {
        for x in rows(4 * QK_K, 1) {
            let mut y = vec![BlockQ8_0::ZERO; x.len() / QK];
            quantize_row_q8_0(&x, &mut y);
            let mut deq = vec![0f32; x.len()];
            dequantize_row_q8_0(&y, &mut deq);
            check_error(&x, &deq, QK, q8_32_bound);
            assert!(y.iter().all(|b| b.qs.iter().all(|&q| q != i8::MIN)));
        }
    }

    #[test]
    fn q8_1_error_bound_and_sum() {
        for x in rows(4 * QK_K, 2) {
            let mut y = vec![BlockQ8_1::ZERO; x.len() / QK];
            quantize_row_q8_1(&x, &mut y);
            let mut deq = vec![0f32; x.len()];
            dequantize_row_q8_1(&y, &mut deq);
            check_error(&x, &deq, QK, q8_32_bound);
            for (b, xb) in y.iter().zip(x.chunks(QK)) {
                let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
                let d = abs_max(xb) / 127.0;
                assert_eq!(b.s, F16Le::from_f32(sum as f32 * d));
            }
        }
    }

    #[test]
    fn q8_k_error_bound_and_bsums() {
        for x in rows(4 * QK_K, 3) {
            let mut y = vec![BlockQ8_K::ZERO; x.len() / QK_K];
            quantize_row_q8_K(&x, &mut y);
            let mut deq = vec![0f32; x.len()];
            dequantize_row_q8_K(&y, &mut deq);
            // d stays f32: half a step plus rounding of the products.
            check_error(&x, &deq, QK_K, |amax| amax / 127.0 * 0.5 * (1.0 + 1e-5));
            for (b, xb) in y.iter().zip(x.chunks(QK_K)) {
                for j in 0..QK_K / 16 {
                    let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
                    assert_eq!(b.bsum(j) as i32, sum);
                }
                // The element of largest magnitude lands exactly on -127 (d carries its sign).
                let imax = (0..QK_K).fold(0, |i, j| if xb[j].abs() > xb[i].abs() { j } else { i });
                if xb[imax] != 0.0 {
                    assert_eq!(b.qs[imax], -127);
                    assert_eq!(b.d().is_sign_negative(), xb[imax] > 0.0);
                }
            }
        }
    }

    #[test]
    fn q8_k_zero_block() {
        let mut y = [BlockQ8_K::ZERO; 1];
        y[0].bsums = [[7, 7]; 16];
        quantize_row_q8_K(&[0.0; QK_K], &mut y);
        assert_eq!(y[0], BlockQ8_K::ZERO);
    }

    #[test]
    fn rounding_modes_follow_ggml() {
        // Q8_0 rounds half away from zero: x * id = 2.5 -> 3, -0.5 -> -1.
        let mut x = [0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -0.5;
        let mut y = [BlockQ8_0::ZERO];
        quantize_row_q8_0(&x, &mut y);
        assert_eq!(&y[0].qs[..3], &[127, 3, -1]);
        // Q8_K rounds half to even: max = -127 -> iscale = 1, 2.5 -> 2, -0.5 -> -0.
        let mut x = [0f32; QK_K];
        x[0] = -127.0;
        x[1] = 2.5;
        x[2] = -0.5;
        x[3] = 3.5;
        let mut y = [BlockQ8_K::ZERO];
        quantize_row_q8_K(&x, &mut y);
        assert_eq!(&y[0].qs[..4], &[-127, 2, 0, 4]);
        assert_eq!(y[0].d(), 1.0);
    }
}
