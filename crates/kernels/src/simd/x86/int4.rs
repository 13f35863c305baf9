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
//! for bit). Up to 4 activation rows (decode) take [`dot_rows_few`], which keeps its
//! accumulators in registers with two FMA chains per row and one horizontal sum per weight
//! row.

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
    // SAFETY (all four): same contract as this function.
    match m {
        1 => return unsafe { dot_rows_few::<1>(qs, scales, mins, k, gs, xs, gsum, dst) },
        2 => return unsafe { dot_rows_few::<2>(qs, scales, mins, k, gs, xs, gsum, dst) },
        3 => return unsafe { dot_rows_few::<3>(qs, scales, mins, k, gs, xs, gsum, dst) },
        4 => return unsafe { dot_rows_few::<4>(qs, scales, mins, k, gs, xs, gsum, dst) },
        _ => {}
    }
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

/// [`dot_rows_avx2`] for `M ≤ 4` activation rows (decode): everything stays in registers.
/// Per group, two accumulators per activation row take alternate 8-weight steps (two
/// independent FMA chains instead of one), and the group's sum is folded into a per-row
/// vector total with one FMA by the group's scale — one horizontal sum per weight row, not
/// per group. The `min · gsum` terms are a scalar dot over the groups.
///
/// # Safety
///
/// As [`dot_rows_avx2`], with `xs.len() == M * k`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // `t` indexes 3 arrays
unsafe fn dot_rows_few<const M: usize>(
    qs: &[u8],
    scales: &[f32],
    mins: &[f32],
    k: usize,
    gs: usize,
    xs: &[f32],
    gsum: &[f32],
    dst: &mut [f32],
) {
    let ng = k / gs;
    let rows = dst.len() / M;
    let mask = _mm_set1_epi8(0x0F);
    let unpack = |row: &[u8], j: usize| {
        // SAFETY: j + 8 <= k, so bytes j / 2 .. j / 2 + 4 lie inside `row` (k / 2 bytes).
        let packed = unsafe { (row.as_ptr().add(j / 2) as *const i32).read_unaligned() };
        let v = _mm_cvtsi32_si128(packed);
        let lo = _mm_and_si128(v, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)))
    };
    // SAFETY: t < M and j + 8 <= k, so the 8 floats lie inside `xs` ([M, k]).
    let x8 = |t: usize, j: usize| unsafe { _mm256_loadu_ps(xs.as_ptr().add(t * k + j)) };
    for r in 0..rows {
        let row = &qs[r * k / 2..(r + 1) * k / 2];
        let mut total = [_mm256_setzero_ps(); M];
        for g in 0..ng {
            let mut a = [[_mm256_setzero_ps(); M]; 2];
            let (start, end) = (g * gs, (g + 1) * gs);
            let mut j = start;
            while j + 16 <= end {
                let (w0, w1) = (unpack(row, j), unpack(row, j + 8));
                for t in 0..M {
                    a[0][t] = _mm256_fmadd_ps(w0, x8(t, j), a[0][t]);
                    a[1][t] = _mm256_fmadd_ps(w1, x8(t, j + 8), a[1][t]);
                }
                j += 16;
            }
            if j < end {
                let w0 = unpack(row, j);
                for t in 0..M {
                    a[0][t] = _mm256_fmadd_ps(w0, x8(t, j), a[0][t]);
                }
            }
            let scale = _mm256_set1_ps(scales[r * ng + g]);
            for t in 0..M {
                total[t] = _mm256_fmadd_ps(scale, _mm256_add_ps(a[0][t], a[1][t]), total[t]);
            }
        }
        let mins = &mins[r * ng..(r + 1) * ng];
        for t in 0..M {
            let offset: f32 = mins
                .iter()
                .zip(&gsum[t * ng..(t + 1) * ng])
                .map(|(a, b)| a * b)
                .sum();
            dst[r * M + t] = hsum(total[t]) - offset;
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
