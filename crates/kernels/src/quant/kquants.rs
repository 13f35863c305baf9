//! Reference weight quantizers for the k-quants Q4_K, Q5_K and Q6_K.
//!
//! These reproduce ggml's `quantize_row_q4_K_ref`, `quantize_row_q5_K_ref` and
//! `quantize_row_q6_K_ref` (`ggml-quants.c`,
//! <https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-quants.c>), which is what
//! `llama-quantize` runs when no importance matrix is given (`quantize_q4_K(.., imatrix =
//! NULL)` calls the `_ref` function). The same f32 operations happen in the same order, so the
//! bytes match ggml's; `tests/kquant_quantize.rs` checks them against vectors produced by the
//! peer's `libggml-base` (`scripts/golden/make_kquant_vectors.py`).
//!
//! # Algorithms
//!
//! * **Q4_K / Q5_K** (affine, 8 sub-blocks of 32 per 256-element super-block): for each
//!   sub-block, [`make_qkx2_quants`] searches a scale and a min that minimise the weighted
//!   squared error (weights `sqrt(mean(x^2)) + |x|`), trying `nstep + 1` candidate inverse
//!   scales around `nmax / (max - min)` and solving the 2x2 least-squares system for each.
//!   The 8 scales and 8 mins are then quantized to 6 bits against the super-block's largest
//!   (`d = max_scale / 63`, `dmin = max_min / 63`, both f16), and the elements re-quantized
//!   with the rounded scales: `q = nearest((x + dmin * m) / (d * sc))` clamped to `0..=nmax`.
//! * **Q6_K** (symmetric, 16 sub-blocks of 16): [`make_qx_quants`] with `rmse_type = 1`
//!   (weights `x^2`) searches 19 candidate scales around `-32 / max`; the 16 scales are
//!   quantized to i8 against the largest in magnitude (`d = max_scale / -128`), and the
//!   elements re-quantized: `q = nearest(x / (d * sc))` clamped to `-32..=31`.
//!
//! Invariants: outputs depend only on the input row (no state); an all-zero (or all-tiny,
//! `|x| < 1e-15`) sub-block quantizes to code 0 with a zero scale, so the row dequantizes to
//! exact zeros there. NaN input gives unspecified but valid blocks (every bit pattern is).

#![allow(non_snake_case)]

use super::blocks::{BlockQ4_K, BlockQ5_K, BlockQ6_K, F16Le, K_SCALE_SIZE, get_scale_min_k4};
use super::types::QK_K;

/// ggml's `GROUP_MAX_EPS`: a sub-block whose largest magnitude is below this is all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, for `|x| <= 4194303` (ggml's `nearest_int`: add 1.5 * 2^23
/// and read the mantissa bits).
#[inline]
pub(super) fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// One element's error in [`make_qkx2_quants`]: absolute (`use_mad`, Q2_K) or squared.
#[inline]
fn error_term(diff: f32, use_mad: bool) -> f32 {
    if use_mad { diff.abs() } else { diff * diff }
}

/// Affine quantization of `x` to codes `0..=nmax` with a weighted least-squares search
/// (ggml's `make_qkx2_quants`; `use_mad` weighs absolute instead of squared errors when
/// comparing candidates). Returns `(scale, -min)`; codes go to `l`.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * error_term(diff, use_mad);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * error_term(diff, use_mad);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric quantization of `x` to codes `0..2 * nmax` (stored offset by `nmax`) with the
/// `x^2`-weighted scale search of ggml's `make_qx_quants(.., rmse_type = 1, qw = NULL)`.
/// Returns the scale; codes go to `l`.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let codes = |iscale: f32, x: f32| nearest_int(iscale * x).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = codes(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (li, &v) in l.iter_mut().zip(x) {
        *li = (codes(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (codes(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The shared first half of Q4_K and Q5_K: per-sub-block scales and mins searched, quantized
/// to 6 bits into `scales` (the `get_scale_min_k4` packing), `d` and `dmin` returned; then the
/// codes `0..=nmax` of every element under the rounded scales into `l`.
fn quantize_affine_superblock(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    packed: &mut [u8; K_SCALE_SIZE],
    l: &mut [u8; QK_K],
) -> (F16Le, F16Le) {
    let mut scales = [0f32; QK_K / 32];
    let mut mins = [0f32; QK_K / 32];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut weights = [0f32; 32];
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        (scales[j], mins[j]) = (scale, min);
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    *packed = [0; K_SCALE_SIZE];
    for j in 0..QK_K / 32 {
        // C: `uint8_t ls = nearest_int(..)` truncates to 8 bits before the MIN.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = F16Le::from_f32(max_scale / 63.0);
    let dmin = F16Le::from_f32(max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    (d, dmin)
}

/// Quantizes `x` (`x.len() == 256 * y.len()`) to Q4_K (`quantize_row_q4_K_ref`).
pub fn quantize_row_q4_K(x: &[f32], y: &mut [BlockQ4_K]) {
    debug_assert_eq!(x.len(), QK_K * y.len());
    let mut l = [0u8; QK_K];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        (b.d, b.dmin) = quantize_affine_superblock(x, 15, -1.0, 20, &mut b.scales, &mut l);
        for (c, q) in b.qs.chunks_exact_mut(32).enumerate() {
            for (i, qi) in q.iter_mut().enumerate() {
                *qi = l[64 * c + i] | (l[64 * c + i + 32] << 4);
            }
        }
    }
}

/// Quantizes `x` (`x.len() == 256 * y.len()`) to Q5_K (`quantize_row_q5_K_ref`).
pub fn quantize_row_q5_K(x: &[f32], y: &mut [BlockQ5_K]) {
    debug_assert_eq!(x.len(), QK_K * y.len());
    let mut l = [0u8; QK_K];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        (b.d, b.dmin) = quantize_affine_superblock(x, 31, -0.5, 15, &mut b.scales, &mut l);
        b.qh = [0; QK_K / 8];
        for (c, q) in b.qs.chunks_exact_mut(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for (j, qj) in q.iter_mut().enumerate() {
                let (mut l1, mut l2) = (l[64 * c + j], l[64 * c + j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                *qj = l1 | (l2 << 4);
            }
        }
    }
}

/// Quantizes `x` (`x.len() == 256 * y.len()`) to Q6_K (`quantize_row_q6_K_ref`).
pub fn quantize_row_q6_K(x: &[f32], y: &mut [BlockQ6_K]) {
    debug_assert_eq!(x.len(), QK_K * y.len());
    let mut l = [0i8; QK_K];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut scales = [0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for (ib, s) in scales.iter_mut().enumerate() {
            *s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = *s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = BlockQ6_K {
                ql: [0; QK_K / 2],
                qh: [0; QK_K / 4],
                scales: [0; QK_K / 16],
                d: F16Le::from_f32(0.0),
            };
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = F16Le::from_f32(1.0 / iscale);
        for (bs, &s) in b.scales.iter_mut().zip(&scales) {
            // C: `int8_t = MIN(127, nearest_int(..))`, the low byte of the int.
            *bs = nearest_int(iscale * s).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = b.d.to_f32() * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        pack_q6_K(&l, b);
    }
}

/// Packs 256 codes `0..64` into Q6_K's `ql` (low nibbles) and `qh` (2 high bits) layout.
fn pack_q6_K(l: &[i8; QK_K], b: &mut BlockQ6_K) {
    for h in 0..2 {
        let (ql, qh, l) = (
            &mut b.ql[64 * h..64 * h + 64],
            &mut b.qh[32 * h..32 * h + 32],
            &l[128 * h..128 * h + 128],
        );
        for i in 0..32 {
            let q = [l[i], l[i + 32], l[i + 64], l[i + 96]].map(|v| v as u8);
            ql[i] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
            ql[i + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
            qh[i] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{Block, GgmlType, blocks_as_bytes, dequantize_row};

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
        ];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    fn rms_error(ty: GgmlType, x: &[f32], bytes: &[u8]) -> f32 {
        let mut y = vec![0f32; x.len()];
        dequantize_row(ty, bytes, &mut y);
        let se: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        (se / x.len() as f32).sqrt()
    }

    #[test]
    fn round_trip_error_shrinks_with_bits() {
        let mut rng = crate::quant::testing::SplitMix64::new(3);
        let x = crate::quant::testing::random_f32_row(&mut rng, 4 * QK_K, 1.0);
        let mut q4 = vec![<BlockQ4_K as Block>::ZERO; 4];
        let mut q5 = vec![<BlockQ5_K as Block>::ZERO; 4];
        let mut q6 = vec![<BlockQ6_K as Block>::ZERO; 4];
        quantize_row_q4_K(&x, &mut q4);
        quantize_row_q5_K(&x, &mut q5);
        quantize_row_q6_K(&x, &mut q6);
        let e4 = rms_error(GgmlType::Q4_K, &x, blocks_as_bytes(&q4));
        let e5 = rms_error(GgmlType::Q5_K, &x, blocks_as_bytes(&q5));
        let e6 = rms_error(GgmlType::Q6_K, &x, blocks_as_bytes(&q6));
        // Unit normal data: a uniform quantizer over ~[-3, 3] with 2^b levels has rms error
        // about 6 / 2^b / sqrt(12); the searches do at least that well.
        assert!(e4 < 0.12 && e5 < 0.06 && e6 < 0.03, "{e4} {e5} {e6}");
        assert!(e6 < e5 && e5 < e4);
    }

    #[test]
    fn zero_rows_stay_zero() {
        let x = [0f32; QK_K];
        let mut q4 = [<BlockQ4_K as Block>::ZERO];
        let mut q6 = [<BlockQ6_K as Block>::ZERO];
        quantize_row_q4_K(&x, &mut q4);
        quantize_row_q6_K(&x, &mut q6);
        assert_eq!(rms_error(GgmlType::Q4_K, &x, blocks_as_bytes(&q4)), 0.0);
        assert_eq!(rms_error(GgmlType::Q6_K, &x, blocks_as_bytes(&q6)), 0.0);
    }
}
