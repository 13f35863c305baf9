//! Reference weight quantizers: f32 to F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 (and, via
//! [`super::q8`], Q8_0, Q8_1, Q8_K; via [`super::kquants`] and [`super::kquants_low`], Q2_K to
//! Q6_K).
//!
//! These reproduce ggml's `quantize_row_*_ref` in `ggml-quants.c`
//! (<https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-quants.c>) byte for byte:
//! the same f32 operations in the same order (`d = max / -8`, `id = 1 / d`, `x * id + 8.5`
//! truncated ...), f16 rounding to nearest-even. The Python `gguf` package implements the same
//! algorithms and `tests/quant_dequant.rs` checks our bytes against its output. They exist for
//! `tokenmill quantize` and for building random quantized weights in tests; the k-quant weight
//! quantizers (an iterative scale search) live in [`super::kquants`] (Q4_K..Q6_K) and
//! [`super::kquants_low`] (Q2_K, Q3_K).
//!
//! Rounding of the 4/5-bit formats is `trunc(x * id + offset)` clamped to the top code, so
//! the element of largest magnitude maps exactly onto the end of the range (`-8 * d` is `max`
//! for Q4_0) and its negation saturates one step short: the error bound is one step `|d|` for
//! Q4_0/Q5_0 and half a step for Q4_1/Q5_1 (plus the f16 rounding of `d` and `m`).

use half::{bf16, f16};

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, F16Le, QK, cast_blocks_mut};
use super::kquants::{quantize_row_q4_K, quantize_row_q5_K, quantize_row_q6_K};
use super::kquants_low::{quantize_row_q2_K, quantize_row_q3_K};
use super::q8::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_K};
use super::types::GgmlType;

/// Quantizes `src` into `dst` as type `ty` (ggml's `from_float_ref`).
///
/// Preconditions: `ty.has_ref_quantizer()` (panics otherwise), `src.len()` a multiple of
/// `ty.block_size()` and `dst.len() == ty.bytes_for(src.len())` (debug-asserted).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    debug_assert_eq!(
        ty.bytes_for(src.len() as u64),
        Some(dst.len() as u64),
        "{ty}: {} elements",
        src.len()
    );
    match ty {
        GgmlType::F32 => {
            for (d, &x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            // Round to nearest even; NaN stays NaN with the quiet bit set (ggml_fp32_to_bf16).
            for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes());
            }
        }
        GgmlType::Q4_0 => quantize_row_q4_0(src, cast_blocks_mut(dst)),
        GgmlType::Q4_1 => quantize_row_q4_1(src, cast_blocks_mut(dst)),
        GgmlType::Q5_0 => quantize_row_q5_0(src, cast_blocks_mut(dst)),
        GgmlType::Q5_1 => quantize_row_q5_1(src, cast_blocks_mut(dst)),
        GgmlType::Q8_0 => quantize_row_q8_0(src, cast_blocks_mut(dst)),
        GgmlType::Q8_1 => quantize_row_q8_1(src, cast_blocks_mut(dst)),
        GgmlType::Q8_K => quantize_row_q8_K(src, cast_blocks_mut(dst)),
        GgmlType::Q4_K => quantize_row_q4_K(src, cast_blocks_mut(dst)),
        GgmlType::Q5_K => quantize_row_q5_K(src, cast_blocks_mut(dst)),
        GgmlType::Q6_K => quantize_row_q6_K(src, cast_blocks_mut(dst)),
        GgmlType::Q2_K => quantize_row_q2_K(src, cast_blocks_mut(dst)),
        GgmlType::Q3_K => quantize_row_q3_K(src, cast_blocks_mut(dst)),
    }
}

/// The first element of largest magnitude, with its sign (0 for an all-zero block).
#[inline]
fn signed_abs_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Minimum and maximum of a block.
#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    })
}

/// `trunc(v)` saturated into 0..=top (C's `(int8_t)v` then `MIN(top, ..)`; `v` is never
/// negative here except for NaN input, which gives 0).
#[inline]
fn trunc_code(v: f32, top: u8) -> u8 {
    (v as i8).clamp(0, top as i8) as u8
}

/// Packs 32 codes into the 16-byte nibble layout (element `j` low, `j + 16` high) and
/// returns the fifth bits as Q5's little-endian `qh`.
#[inline]
fn pack_codes(codes: &[u8; QK], qs: &mut [u8; QK / 2]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (lo, hi) = (codes[j], codes[j + QK / 2]);
        qs[j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
        qh |= (((lo & 0x10) >> 4) as u32) << j;
        qh |= (((hi & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    qh.to_le_bytes()
}

/// Symmetric codes `trunc(x * id + offset)` in 0..=top for `d = max / -(offset - 0.5)`.
#[inline]
fn symmetric_codes(x: &[f32], half_range: f32, top: u8) -> (f32, [u8; QK]) {
    let d = signed_abs_max(x) / -half_range;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let offset = half_range + 0.5;
    (
        d,
        std::array::from_fn(|j| trunc_code(x[j] * id + offset, top)),
    )
}

/// Affine codes `trunc((x - min) * id + 0.5)` in 0..=top for `d = (max - min) / top`.
#[inline]
fn affine_codes(x: &[f32], top: u8) -> (f32, f32, [u8; QK]) {
    let (min, max) = min_max(x);
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (
        d,
        min,
        std::array::from_fn(|j| trunc_code((x[j] - min) * id + 0.5, top)),
    )
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to Q4_0 (`quantize_row_q4_0_ref`).
pub fn quantize_row_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, codes) = symmetric_codes(x, 8.0, 15);
        b.d = F16Le::from_f32(d);
        pack_codes(&codes, &mut b.qs);
    }
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to Q4_1 (`quantize_row_q4_1_ref`).
pub fn quantize_row_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, min, codes) = affine_codes(x, 15);
        b.d = F16Le::from_f32(d);
        b.m = F16Le::from_f32(min);
        pack_codes(&codes, &mut b.qs);
    }
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to Q5_0 (`quantize_row_q5_0_ref`).
pub fn quantize_row_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, codes) = symmetric_codes(x, 16.0, 31);
        b.d = F16Le::from_f32(d);
        b.qh = pack_codes(&codes, &mut b.qs);
    }
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to Q5_1 (`quantize_row_q5_1_ref`).
pub fn quantize_row_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, min, codes) = affine_codes(x, 31);
        b.d = F16Le::from_f32(d);
        b.m = F16Le::from_f32(min);
        b.qh = pack_codes(&codes, &mut b.qs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequant::dequantize_row;
    use crate::quant::testing::SplitMix64;

    /// Round trip error per block is within `bound(min, max)` plus the f16 rounding of `d` and
    /// `m` (at most ~1.5e-3 of the block's largest magnitude).
    fn check_round_trip(ty: GgmlType, bound: impl Fn(f32, f32) -> f32) {
        let mut rng = SplitMix64::new(ty.id() as u64);
        for scale in [1e-3f32, 1.0, 100.0] {
            let x: Vec<f32> = (0..8 * QK).map(|_| rng.normal() * scale).collect();
            let mut bytes = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
            quantize_row(ty, &x, &mut bytes);
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &bytes, &mut y);
            for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
                let (lo, hi) = min_max(xb);
                let tol = bound(lo, hi) + hi.abs().max(lo.abs()) * 2e-3;
                for (&a, &b) in xb.iter().zip(yb) {
                    assert!((a - b).abs() <= tol, "{ty}: {a} -> {b}, tolerance {tol}");
                }
            }
        }
    }

    #[test]
    fn round_trip_error_bounds() {
        let amax = |lo: f32, hi: f32| lo.abs().max(hi.abs());
        // Symmetric formats: one step |d| (the negated extreme saturates one step short).
        check_round_trip(GgmlType::Q4_0, |lo, hi| amax(lo, hi) / 8.0);
        check_round_trip(GgmlType::Q5_0, |lo, hi| amax(lo, hi) / 16.0);
        // Affine formats: half a step of (max - min) / top.
        check_round_trip(GgmlType::Q4_1, |lo, hi| (hi - lo) / 15.0 / 2.0);
        check_round_trip(GgmlType::Q5_1, |lo, hi| (hi - lo) / 31.0 / 2.0);
    }

    #[test]
    fn constant_and_zero_blocks() {
        // (Not Q8_0: its d = v / 127 is rounded to f16, so 127 * d need not be v.)
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ] {
            for v in [0.0f32, 0.25, -3.0] {
                let x = [v; QK];
                let mut bytes = vec![0u8; ty.type_size()];
                quantize_row(ty, &x, &mut bytes);
                let mut y = [0f32; QK];
                dequantize_row(ty, &bytes, &mut y);
                assert_eq!(y, x, "{ty} {v}");
            }
        }
    }

    #[test]
    fn q5_high_bits_land_in_qh() {
        // Codes 0..32 in order: element i gets code i, so qh = 0xFFFF0000.
        let x: [f32; QK] = std::array::from_fn(|i| i as f32);
        let mut b = [BlockQ5_1 {
            d: F16Le::default(),
            m: F16Le::default(),
            qh: [0; 4],
            qs: [0; 16],
        }];
        quantize_row_q5_1(&x, &mut b);
        assert_eq!(u32::from_le_bytes(b[0].qh), 0xFFFF_0000);
        assert_eq!(b[0].quants(), std::array::from_fn(|i| i as u8));
    }

    #[test]
    fn q2_k_and_q3_k_dispatch_to_their_quantizers() {
        let mut rng = crate::quant::testing::SplitMix64::new(5);
        let x = crate::quant::testing::random_f32_row(&mut rng, 256, 1.0);
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
            let mut q = vec![0u8; ty.bytes_for(256).unwrap() as usize];
            quantize_row(ty, &x, &mut q);
            let mut y = vec![0f32; 256];
            crate::quant::dequantize_row(ty, &q, &mut y);
            let se: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
            let norm: f32 = x.iter().map(|a| a * a).sum();
            assert!((se / norm).sqrt() < 0.45, "{ty}");
        }
    }
}
