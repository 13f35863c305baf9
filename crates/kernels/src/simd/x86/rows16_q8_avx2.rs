//! Rows16 Q8_0 weights × A16 activations on AVX2, in passes of up to four activation rows:
//! the kernel for Q8_0 matrices (SmolLM2's LM head) on the `avx2` tier, whichever activation
//! width the model runs (Q8_0 has no A8 kernel on 256-bit tiers: see
//! [`super::rows16_a8_avx2`]).
//!
//! Why: the generic Rows16 kernel ([`super::rows16`]) takes up to eight activation rows a
//! pass over a group, and on AVX2 each row's 16 weight rows are two registers of i32 sums:
//! 16 sums (32 with its two chains a row up to four rows) against 16 registers, so its
//! multiply-add loop spills. Four rows hold eight sums, two weight registers and a broadcast;
//! each broadcast A16 pair feeds both halves. Q8_0's weights only sign-extend
//! (`vpmovsxbw`), so widening them once a pass instead of once a group costs little. Measured
//! 1.1–1.5× the generic kernel at 1–16 rows (BENCHMARKS.md).
//!
//! Layout: chunk `c` of a group-block (32 bytes at `QS + 32 c`) holds columns `2c, 2c + 1` of
//! the 16 rows (bytes `2r, 2r + 1`); its first 16 bytes, widened to i16, are rows 0..8 as i16
//! pairs, the next 16 rows 8..16. Each pair meets the broadcast A16 pair of its two columns
//! in one `vpmaddwd`.
//!
//! Numerics: the same exact i32 block sums and the same scale FMA per block as the generic
//! kernel, so the results are bit-identical to it.

use std::arch::x86_64::*;

use super::rows16::{Fmt16, Lanes16, MaddAdd, R16Q8_0, Y256, prefetch_ahead};
use crate::quant::rows16::GROUP;
use crate::simd::{MAX_ROWS_16, Tile};

/// Offset of the quants in an A16 block (after `d: f32, s: f32`).
const A16_QS: usize = 8;
/// Bytes of an A16 block.
const A16_BYTES: usize = crate::quant::A16_BYTES;
/// The generic kernel's 256-bit lanes, for the block scales and the stores.
type L = Y256<MaddAdd>;

/// One group (16 weight rows from `row0`, the first `t.n_w - row0` real) against `NA <= 4`
/// activation rows: per row two i32 sums (rows 0..8 and 8..16) a block, one broadcast of
/// each A16 pair for both.
#[inline(always)]
unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
    unsafe {
        let n_rows = (t.n_w - row0).min(GROUP);
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); NA], [_mm256_setzero_ps(); NA]);
        for b in 0..t.nb {
            let wb = w.add(b * R16Q8_0::BYTES);
            prefetch_ahead(wb, R16Q8_0::BYTES);
            let a: [*const u8; NA] =
                std::array::from_fn(|r| t.a.add(r * t.a_stride + b * A16_BYTES));
            let qs = wb.add(R16Q8_0::QS);
            let mut s0 = [_mm256_setzero_si256(); NA];
            let mut s1 = [_mm256_setzero_si256(); NA];
            for c in 0..16 {
                let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(qs.add(2 * GROUP * c).cast()));
                let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(qs.add(2 * GROUP * c + 16).cast()));
                for r in 0..NA {
                    let p =
                        _mm256_set1_epi32(a[r].add(A16_QS + 4 * c).cast::<i32>().read_unaligned());
                    s0[r] = _mm256_add_epi32(s0[r], _mm256_madd_epi16(w0, p));
                    s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(w1, p));
                }
            }
            let (d0, d1) = L::f16(wb);
            for r in 0..NA {
                let da = _mm256_set1_ps(a[r].cast::<f32>().read_unaligned());
                lo[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0[r]), _mm256_mul_ps(d0, da), lo[r]);
                hi[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[r]), _mm256_mul_ps(d1, da), hi[r]);
            }
        }
        for r in 0..NA {
            L::store((lo[r], hi[r]), t.out.add(r * t.out_stride + row0), n_rows);
        }
    }
}

/// # Safety
///
/// As [`crate::simd::DotTileFn`] for Rows16 Q8_0 weights against A16 activations, on a CPU
/// with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0(t: &Tile) {
    unsafe {
        debug_assert!((1..=MAX_ROWS_16).contains(&t.n_a));
        let mut row0 = 0;
        while row0 < t.n_w {
            let w = t.w.add(row0 / GROUP * t.w_stride);
            // Passes of up to four rows (5 as 3 + 2, 6 as 3 + 3, 7 as 4 + 3, 8 as 4 + 4).
            let first = if t.n_a <= 4 { t.n_a } else { t.n_a.div_ceil(2) };
            let mut j0 = 0;
            for n in [first, t.n_a - first] {
                let t = &Tile {
                    a: t.a.add(j0 * t.a_stride),
                    out: t.out.add(j0 * t.out_stride),
                    n_a: n,
                    ..*t
                };
                match n {
                    0 => {}
                    1 => group::<1>(t, w, row0),
                    2 => group::<2>(t, w, row0),
                    3 => group::<3>(t, w, row0),
                    _ => group::<4>(t, w, row0),
                }
                j0 += n;
            }
            row0 += GROUP;
        }
    }
}
