//! AVX2 + FMA tier of the int4 (AWQ/GPTQ) row kernel: [`dot_rows_avx2`] is the SIMD twin of
//! `int4::kernel::dot_rows_scalar` and computes the same quantity (see that module's doc):
//! for one weight row, per group, `scale * Σ_j x[t, j] q_j - min * gsum[t, g]` for every
//! activation row `t`.
//!
//! Per 4 packed bytes (8 weights): the low and high nibbles are split with a mask and a
//! shift, interleaved back into element order with `unpacklo_epi8`, widened to 8 i32 and
//! converted to f32 (exact: codes are 0..=15); then one FMA per activation row into that
//! row's 8-lane accumulator. Each group's accumulators are summed horizontally (the scalar
//! twin sums its lanes in a different order: results agree within the f32 budget, not bit
//! for bit).

use std::arch::x86_64::*;

/// See the module doc: rows `i` of the chunk, `dst[i * m + t]` for every activation row `t`.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA. With `ng = k / gs` groups per row and `gs % 8 == 0`: `qs`
/// is `[rows, k / 2]`, `scales` and `mins` `[rows, ng]`, `xs` `[m, k]`, `gsum` `[m, ng]` and
/// `dst` `[rows, m]`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn dot_rows_avx2(
    qs: &[u8],
    scales: &[f32],
    mins: &[f32],
    k: usize,
    gs: usize,
    xs: &[f32],
    gsum: &[f32],
    dst: &mut [f32],
) {
    let (ng, m) = (k / gs, xs.len() / k);
    let rows = dst.len() / m;
    debug_assert!(qs.len() == rows * k / 2 && scales.len() == rows * ng && gsum.len() == m * ng);
    debug_assert!(mins.len() == rows * ng && gs.is_multiple_of(8) && k.is_multiple_of(gs));
    let mask = _mm_set1_epi8(0x0F);
    let mut acc = vec![_mm256_setzero_ps(); m];
    for r in 0..rows {
        let row = &qs[r * k / 2..(r + 1) * k / 2];
        let out = &mut dst[r * m..(r + 1) * m];
        out.fill(0.0);
        for g in 0..ng {
            acc.fill(_mm256_setzero_ps());
            for j0 in (g * gs..(g + 1) * gs).step_by(8) {
                // SAFETY: j0 + 8 <= k, so bytes j0 / 2 .. j0 / 2 + 4 lie inside `row`.
                let packed = unsafe { (row.as_ptr().add(j0 / 2) as *const i32).read_unaligned() };
                let v = _mm_cvtsi32_si128(packed);
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
                let w8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
                for (t, a) in acc.iter_mut().enumerate() {
                    // SAFETY: t * k + j0 + 8 <= m * k = xs.len().
                    let x8 = unsafe { _mm256_loadu_ps(xs.as_ptr().add(t * k + j0)) };
                    *a = _mm256_fmadd_ps(w8, x8, *a);
                }
            }
            let (scale, min) = (scales[r * ng + g], mins[r * ng + g]);
            for (t, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
                *o += scale * hsum(*a) - min * gsum[t * ng + g];
            }
        }
    }
}

/// Horizontal sum of 8 lanes.
#[inline(always)]
fn hsum(v: __m256) -> f32 {
    // SAFETY: only inlined into `dot_rows_avx2`, which has AVX2 (module doc of `common`).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}
