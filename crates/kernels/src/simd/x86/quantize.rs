//! SIMD activation quantizers A16, A8, Q8_0 and Q8_1, byte-identical to the reference twins
//! [`crate::quant::quantize_row_a16`], [`crate::quant::quantize_row_a8`], [`crate::quant::quantize_row_q8_0`] and
//! [`crate::quant::quantize_row_q8_1`] — and the f32 dot product.
//!
//! Same f32 operations as the reference: `amax` by `max`, `d = amax / 127`, `id = 1 / d` (0 for
//! an all-zero block), `x · id` and round half away from zero (C `roundf`; not the
//! ties-to-even of `vroundps`' nearest mode, which ggml's AVX path uses): truncate, then step
//! one away from zero when the dropped fraction is at least one half. `x - trunc(x)` is exact
//! for `|x| < 2^23`. Scales go through the same [`F16Le::from_f32`] as the reference.
//!
//! Q8_K keeps the scalar reference quantizer on every tier (k-quant weights are not on the
//! default model's hot path).

use std::arch::x86_64::*;

use super::common::hsum_epi32;
use crate::quant::F16Le;

/// `x` rounded half away from zero, as i32 lanes.
#[inline(always)]
unsafe fn round_half_away(x: __m256) -> __m256i {
    unsafe {
        let t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0));
        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(x, t)); // |x - t|
        let step = _mm256_or_ps(sign, _mm256_set1_ps(1.0)); // ±1 with the sign of x
        let away = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5), _CMP_GE_OQ), step);
        _mm256_cvttps_epi32(_mm256_add_ps(t, away))
    }
}

/// Quantizes the 32 values at `x` into `qs` (32 bytes) and returns `(d, Σ q)`.
#[inline(always)]
unsafe fn quantize_block(x: *const f32, qs: *mut u8) -> (f32, i32) {
    unsafe {
        // No closures here (`array::map` ...): they would not inherit the target features.
        let v = [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ];
        let amax = abs_max_32(&v);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let id = _mm256_set1_ps(id);
        let q = [
            round_half_away(_mm256_mul_ps(v[0], id)),
            round_half_away(_mm256_mul_ps(v[1], id)),
            round_half_away(_mm256_mul_ps(v[2], id)),
            round_half_away(_mm256_mul_ps(v[3], id)),
        ];
        let sum = hsum_epi32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        // i32 -> i8 with saturation; the packs interleave 128-bit lanes, the permute undoes it.
        let p16a = _mm256_packs_epi32(q[0], q[1]);
        let p16b = _mm256_packs_epi32(q[2], q[3]);
        let p8 = _mm256_packs_epi16(p16a, p16b);
        let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.cast(), p8);
        (d, sum)
    }
}

/// Q8_0 (`d(f16) qs[32]`, 34 bytes a block).
#[inline(always)]
pub unsafe fn quantize_q8_0(x: &[f32], y: &mut [u8]) {
    debug_assert_eq!(x.len() / 32 * 34, y.len());
    for (xb, yb) in x.chunks_exact(32).zip(y.chunks_exact_mut(34)) {
        let (d, _) = unsafe { quantize_block(xb.as_ptr(), yb.as_mut_ptr().add(2)) };
        yb[..2].copy_from_slice(&F16Le::from_f32(d).0);
    }
}

/// Q8_1 (`d(f16) s(f16) qs[32]`, 36 bytes a block), `s = f16(d · Σ q)`.
#[inline(always)]
pub unsafe fn quantize_q8_1(x: &[f32], y: &mut [u8]) {
    debug_assert_eq!(x.len() / 32 * 36, y.len());
    for (xb, yb) in x.chunks_exact(32).zip(y.chunks_exact_mut(36)) {
        let (d, sum) = unsafe { quantize_block(xb.as_ptr(), yb.as_mut_ptr().add(4)) };
        yb[..2].copy_from_slice(&F16Le::from_f32(d).0);
        yb[2..4].copy_from_slice(&F16Le::from_f32(sum as f32 * d).0);
    }
}

/// A16 (`d(f32) s(f32) qs[32](i16)`, 72 bytes a block): `d = amax / 2047`,
/// `q = round_ties_even(x · (1 / d))` — `vcvtps2dq` under the default rounding mode, exactly
/// the reference's `round_ties_even` — and `s = d · Σ q`.
#[inline(always)]
pub unsafe fn quantize_a16(x: &[f32], y: &mut [u8]) {
    debug_assert_eq!(x.len() / 32 * 72, y.len());
    for (xb, yb) in x.chunks_exact(32).zip(y.chunks_exact_mut(72)) {
        unsafe {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let amax = abs_max_32(&v);
            let d = amax / crate::quant::A16_QMAX as f32;
            let id = _mm256_set1_ps(crate::quant::a16_inverse_scale(d));
            let q = [
                a16_quants(v[0], id),
                a16_quants(v[1], id),
                a16_quants(v[2], id),
                a16_quants(v[3], id),
            ];
            let sum = hsum_epi32(_mm256_add_epi32(
                _mm256_add_epi32(q[0], q[1]),
                _mm256_add_epi32(q[2], q[3]),
            ));
            // i32 -> i16 with saturation; `packs` interleaves 128-bit lanes, the permute undoes it.
            let lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0b11_01_10_00);
            let hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0b11_01_10_00);
            let out = yb.as_mut_ptr();
            _mm256_storeu_si256(out.add(8).cast(), lo);
            _mm256_storeu_si256(out.add(40).cast(), hi);
            yb[..4].copy_from_slice(&d.to_le_bytes());
            yb[4..8].copy_from_slice(&(sum as f32 * d).to_le_bytes());
        }
    }
}

/// `round_ties_even(x · id)` as i32 lanes, a NaN as 0 (the reference's `as`), clamped to
/// ±[`A16_QMAX`](crate::quant::A16_QMAX): a no-op for finite inputs, but nothing leaves the
/// 12-bit range the AMX digit split is exact on.
#[inline(always)]
unsafe fn a16_quants(x: __m256, id: __m256) -> __m256i {
    unsafe { clamped_quants(x, id, crate::quant::A16_QMAX as i32) }
}

/// `round_ties_even(x · id)` as i32 lanes, a NaN as 0, clamped to `±top`.
#[inline(always)]
unsafe fn clamped_quants(x: __m256, id: __m256, top: i32) -> __m256i {
    unsafe {
        let p = _mm256_mul_ps(x, id);
        let ordered = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_ORD_Q));
        let q = _mm256_and_si256(_mm256_cvtps_epi32(p), ordered);
        _mm256_min_epi32(
            _mm256_max_epi32(q, _mm256_set1_epi32(-top)),
            _mm256_set1_epi32(top),
        )
    }
}

/// A8 (`d(f32) s(f32) sums[2](i16) qs[32](i8)`, 44 bytes a block): `d = amax / 127`,
/// `q = round_ties_even(x · (1 / d))` clamped to ±127, `Σ q` of each 16-column half, as the
/// reference [`crate::quant::quantize_row_a8`].
#[inline(always)]
pub unsafe fn quantize_a8(x: &[f32], y: &mut [u8]) {
    use crate::quant::a8::{A8_BYTES, A8_QMAX, A8_QS};
    debug_assert_eq!(x.len() / 32 * A8_BYTES, y.len());
    for (xb, yb) in x.chunks_exact(32).zip(y.chunks_exact_mut(A8_BYTES)) {
        unsafe {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let d = abs_max_32(&v) / A8_QMAX as f32;
            let id = _mm256_set1_ps(crate::quant::a16_inverse_scale(d));
            let q = [
                clamped_quants(v[0], id, A8_QMAX),
                clamped_quants(v[1], id, A8_QMAX),
                clamped_quants(v[2], id, A8_QMAX),
                clamped_quants(v[3], id, A8_QMAX),
            ];
            let lo = hsum_epi32(_mm256_add_epi32(q[0], q[1]));
            let hi = hsum_epi32(_mm256_add_epi32(q[2], q[3]));
            // i32 -> i8 in column order: the packs interleave 128-bit lanes, the permute undoes it.
            let p8 = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(yb.as_mut_ptr().add(A8_QS).cast(), p8);
            yb[..4].copy_from_slice(&d.to_le_bytes());
            yb[4..8].copy_from_slice(&((lo + hi) as f32 * d).to_le_bytes());
            yb[8..10].copy_from_slice(&(lo as i16).to_le_bytes());
            yb[10..12].copy_from_slice(&(hi as i16).to_le_bytes());
        }
    }
}

/// The largest `|x|` of four vectors (32 values).
#[inline(always)]
unsafe fn abs_max_32(v: &[__m256; 4]) -> f32 {
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        let m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        let m = _mm256_max_ps(m01, m23);
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }
}

/// f32 dot product: four 8-lane FMA accumulators, then the scalar tail.
#[inline(always)]
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let o = i + 8 * k;
                *acc =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(o)), _mm256_loadu_ps(pb.add(o)), *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i)),
                _mm256_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut sum = super::common::hsum_ps(s);
        while i < n {
            sum += *pa.add(i) * *pb.add(i);
            i += 1;
        }
        sum
    }
}
