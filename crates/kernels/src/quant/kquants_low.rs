//! Reference weight quantizers for the low-bit k-quants Q2_K and Q3_K.
//!
//! These reproduce ggml's `quantize_row_q2_K_ref` and `quantize_row_q3_K_ref`
//! (`ggml-quants.c`,
//! <https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-quants.c>), which
//! `llama-quantize` runs when no importance matrix is given (`quantize_q2_K(.., imatrix =
//! NULL)` calls the `_ref` function). The same f32 operations happen in the same order, so the
//! bytes match ggml's; `tests/kquant_quantize.rs` checks them against vectors produced by the
//! peer's `libggml-base` (`scripts/golden/make_kquant_vectors.py`).
//!
//! # Algorithms
//!
//! * **Q2_K** (affine, 16 sub-blocks of 16 per 256-element super-block): each sub-block's
//!   scale and min come from [`make_qkx2_quants`] with codes `0..=3`, weights `|x|` and the
//!   *absolute* error as the search criterion (`use_mad`); the 16 scales and 16 mins are
//!   quantized to 4 bits against the super-block's largest (`d = max_scale / 15`,
//!   `dmin = max_min / 15`, both f16) and packed as `scale | min << 4`; the elements are then
//!   re-quantized under the rounded scales: `q = nearest((x + dmin * m) / (d * sc))` clamped
//!   to `0..=3`.
//! * **Q3_K** (symmetric, 16 sub-blocks of 16): [`make_q3_quants`] picks codes `-4..=3` and a
//!   scale by up to five rounds of coordinate descent on the `x^2`-weighted error; the 16
//!   scales are quantized to 6 bits against the largest in magnitude (`d = max_scale / -32`)
//!   and packed into 12 bytes (low nibbles in bytes 0..8, 2-bit highs in 8..12); the
//!   elements are re-quantized: `q = nearest(x / (d * sc))` clamped to `-4..=3`, stored as
//!   2 low bits in `qs` and the third bit in `hmask`.
//!
//! Invariants: outputs depend only on the input row; a sub-block whose rounded scale is zero
//! keeps the codes of its search (as ggml does), so an all-zero sub-block dequantizes to
//! exact zeros. NaN input gives unspecified but valid blocks (every bit pattern is).

#![allow(non_snake_case)]

use super::blocks::{BlockQ2_K, BlockQ3_K, F16Le};
use super::kquants::{GROUP_MAX_EPS, make_qkx2_quants, nearest_int};
use super::types::QK_K;

/// Symmetric quantization of `x` (16 values) to codes `-nmax..nmax` with ggml's
/// `make_q3_quants(.., do_rmse = true)`: start from `nearest(-nmax / max * x)`, then move one
/// code at a time while that raises `sumlx^2 / suml2` (weights `x^2`). Codes go to `l` offset
/// by `nmax`; returns the least-squares scale `sumlx / suml2`.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
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
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*li);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*li) {
                    let q = new_l as f32;
                    slx += w * v * q;
                    sl2 += w * q * q;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        (sumlx, suml2) = (slx, sl2);
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Packs 256 2-bit codes into the `qs` layout shared by Q2_K and Q3_K: byte `32 * h + i` of
/// half `h` holds codes `128h + i + 32k` at bits `2k`.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// The sub-block scales and mins of one Q2_K super-block, quantized into `b.scales`, `b.d`
/// and `b.dmin`; the search's codes go to `l`.
fn q2_K_scales(x: &[f32], b: &mut BlockQ2_K, l: &mut [u8; QK_K]) {
    const Q4SCALE: f32 = 15.0;
    let mut scales = [0f32; QK_K / 16];
    let mut mins = [0f32; QK_K / 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut weights = [0f32; 16];
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let ls = &mut l[16 * j..16 * j + 16];
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, ls, -0.5, 0.1, 15, true);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (bs, &s) in b.scales.iter_mut().zip(&scales) {
            // C: `y[i].scales[j] = l` into a uint8_t.
            *bs = nearest_int(iscale * s) as u8;
        }
        b.d = F16Le::from_f32(max_scale / Q4SCALE);
    } else {
        b.scales = [0; QK_K / 16];
        b.d = F16Le::from_f32(0.0);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (bs, &m) in b.scales.iter_mut().zip(&mins) {
            *bs |= (nearest_int(iscale * m) << 4) as u8;
        }
        b.dmin = F16Le::from_f32(max_min / Q4SCALE);
    } else {
        b.dmin = F16Le::from_f32(0.0);
    }
}

/// Quantizes `x` (`x.len() == 256 * y.len()`) to Q2_K (`quantize_row_q2_K_ref`).
pub fn quantize_row_q2_K(x: &[f32], y: &mut [BlockQ2_K]) {
    debug_assert_eq!(x.len(), QK_K * y.len());
    let mut l = [0u8; QK_K];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        q2_K_scales(x, b, &mut l);
        let (d_all, dmin_all) = (b.d.to_f32(), b.dmin.to_f32());
        for j in 0..QK_K / 16 {
            let d = d_all * (b.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmin_all * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
                l[16 * j + ii] = q as u8;
            }
        }
        pack_2bit(&l, &mut b.qs);
    }
}

/// The 6-bit scale of sub-block `j` (`0..16`) from Q3_K's 12 packed scale bytes, `-32..32`.
fn q3_K_scale(scales: &[u8; 12], j: usize) -> i32 {
    let low = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// The sub-block scales of one Q3_K super-block, quantized into `b.scales` and `b.d`; the
/// search's codes (offset by 4) go to `l`.
fn q3_K_scales(x: &[f32], b: &mut BlockQ3_K, l: &mut [i8; QK_K]) {
    let mut scales = [0f32; QK_K / 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for (j, s) in scales.iter_mut().enumerate() {
        *s = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if s.abs() > amax {
            amax = s.abs();
            max_scale = *s;
        }
    }
    b.scales = [0; 12];
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // C: `int8_t l = nearest_int(..)` (the low byte), clamped, offset by 32.
            let q = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                b.scales[j] = q & 0xF;
            } else {
                b.scales[j - 8] |= (q & 0xF) << 4;
            }
            b.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
        }
        b.d = F16Le::from_f32(1.0 / iscale);
    } else {
        b.d = F16Le::from_f32(0.0);
    }
}

/// Quantizes `x` (`x.len() == 256 * y.len()`) to Q3_K (`quantize_row_q3_K_ref`).
pub fn quantize_row_q3_K(x: &[f32], y: &mut [BlockQ3_K]) {
    debug_assert_eq!(x.len(), QK_K * y.len());
    let mut l = [0i8; QK_K];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        q3_K_scales(x, b, &mut l);
        let d_all = b.d.to_f32();
        for j in 0..QK_K / 16 {
            let d = d_all * q3_K_scale(&b.scales, j) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }
        // The third bit of code j goes to hmask[j % 32], bit j / 32.
        b.hmask = [0; QK_K / 8];
        let mut low = [0u8; QK_K];
        for (j, (&q, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
            let q = q as u8;
            if q > 3 {
                b.hmask[j % (QK_K / 8)] |= 1 << (j / (QK_K / 8));
            }
            *lo = q & 3;
        }
        pack_2bit(&low, &mut b.qs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{Block, GgmlType, blocks_as_bytes, dequantize_row};

    fn rel_rms_error(ty: GgmlType, x: &[f32], bytes: &[u8]) -> f32 {
        let mut y = vec![0f32; x.len()];
        dequantize_row(ty, bytes, &mut y);
        let se: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let norm: f32 = x.iter().map(|a| a * a).sum();
        (se / norm).sqrt()
    }

    #[test]
    fn scale_packing_round_trips_through_the_reader() {
        // Every 6-bit value in every position: pack like q3_K_scales, read back.
        for v in 0..64u8 {
            for j in 0..16 {
                let mut s = [0u8; 12];
                if j < 8 {
                    s[j] = v & 0xF;
                } else {
                    s[j - 8] |= (v & 0xF) << 4;
                }
                s[j % 4 + 8] |= (v >> 4) << (2 * (j / 4));
                assert_eq!(q3_K_scale(&s, j), i32::from(v) - 32, "{v} at {j}");
            }
        }
    }

    #[test]
    fn zero_rows_stay_zero() {
        let x = [0f32; QK_K];
        let mut q2 = [<BlockQ2_K as Block>::ZERO];
        let mut q3 = [<BlockQ3_K as Block>::ZERO];
        quantize_row_q2_K(&x, &mut q2);
        quantize_row_q3_K(&x, &mut q3);
        let mut y = [1f32; QK_K];
        dequantize_row(GgmlType::Q2_K, blocks_as_bytes(&q2), &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        dequantize_row(GgmlType::Q3_K, blocks_as_bytes(&q3), &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn error_orders_q2_above_q3_above_q4() {
        let mut rng = crate::quant::testing::SplitMix64::new(11);
        let x = crate::quant::testing::random_f32_row(&mut rng, 8 * QK_K, 1.0);
        let mut q2 = vec![<BlockQ2_K as Block>::ZERO; 8];
        let mut q3 = vec![<BlockQ3_K as Block>::ZERO; 8];
        let mut q4 = vec![0u8; 8 * 144];
        quantize_row_q2_K(&x, &mut q2);
        quantize_row_q3_K(&x, &mut q3);
        crate::quant::quantize_row(GgmlType::Q4_K, &x, &mut q4);
        let e2 = rel_rms_error(GgmlType::Q2_K, &x, blocks_as_bytes(&q2));
        let e3 = rel_rms_error(GgmlType::Q3_K, &x, blocks_as_bytes(&q3));
        let e4 = rel_rms_error(GgmlType::Q4_K, &x, &q4);
        // Gaussian data: 2, 3 and 4 bits per weight plus scales; each bit roughly halves it.
        assert!(e2 < 0.45 && e3 < 0.25, "{e2} {e3}");
        assert!(e4 < e3 && e3 < e2, "{e2} {e3} {e4}");
    }
}
