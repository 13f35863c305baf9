//! Rows16 Q4_0 / Q4_1 / Q5_0 / Q4_K / Q6_K weights × [A8](crate::quant::a8) activations on
//! AVX2: `vpmaddubsw` (pairs of u8 × i8 products summed into i16 lanes), for a model run with
//! `--activation-bits 8` on a CPU without AVX-512 VNNI. Q8_0 keeps A16 here: its biased
//! bytes (up to 255) times an i8 would saturate `vpmaddubsw`'s i16 pairs.
//!
//! Why: the A16 kernels ([`super::rows16`]) multiply i16 pairs with `vpmaddwd`, 16
//! multiply-adds an instruction. `vpmaddubsw` makes 32 u8 × i8 products an instruction, and
//! while a block's sums stay inside i16 they are added as i16 (`vpaddw`, off the multiply
//! ports) and widened to i32 by a `vpmaddwd` against ones (once per block for 4-bit weights;
//! see Range) — nearly twice the multiply-adds per multiply-port instruction, the rate
//! llama.cpp's AVX2 kernels run at.
//!
//! Layout: nibble chunks `2k` and `2k + 1` of a group-block (byte `2r + e` of chunk `c`: row
//! `r`, column `2c + e` low, `16 + 2c + e` high) interleave by 16-bit words
//! (`vpunpcklwd`/`vpunpckhwd`) into two registers of eight row-lanes × four u8 weights:
//! `x & 0x0F` holds columns `4k..4k + 4` of its rows and `(x >> 4) & 0x0F` columns
//! `16 + 4k..` — the activations' own order, so one broadcast dword meets each. The word
//! interleave works inside 128-bit halves, so the first register holds rows 0..4 and 8..12,
//! the second rows 4..8 and 12..16: the accumulators and scales stay in that order ([`perm`]
//! puts per-row f32 vectors into it and back: the scales once per block, the results once
//! per group at the store).
//!
//! Range: a `vpmaddubsw` lane is at most `2 · 128 · w_max` in magnitude, for any i8
//! activation (the quantizer writes ±127 at most). Four-bit weights (Q4_0, Q4_1, Q4_K,
//! `w_max = 15`) add a whole 32-column block in i16 (16 products, at most 30,720); Q5_0
//! (`w_max = 31`) widens every 16 columns' worth (two chunk pairs), Q6_K (`63`) every 8 of a
//! 16-column sub-block's columns (`a8_kernels_hold_the_largest_block_sums` runs every
//! format at its extremes). A block's exact integer sum then drops its zero point with the
//! A8 block's sums (trusted as the quantizer wrote them, as [`super::rows16_a8`] does) and
//! meets the scales in the same FMAs as the A16 kernels. Q6_K's i8 sub-block scales instead
//! multiply its i16 sums in the widening `vpmaddwd` (in place of ones), so both sub-blocks
//! of a 32-column chunk meet `d · d_a` in one FMA.
//!
//! Numerics: exact sums in i32 of each block (each 32-column sub-block of Q4_K, each
//! 32-column chunk of Q6_K with its sub-block scales inside), converted whole; only the scale
//! FMAs differ from the reference twin ([`crate::quant::rows16::vec_dot_a8`]), which scales
//! Q6_K's sub-blocks in f32.

use std::arch::x86_64::*;

use super::rows16::{
    Fmt16, Lanes16, MaddAdd, R16Q4_0, R16Q4_1, R16Q5_0, Y256, k4_scales, prefetch_ahead,
};
use super::rows16_a8::{d_s, qsum};
use crate::quant::GgmlType;
use crate::quant::a8::{A8_BYTES, A8_QS, A8_SUMS};
use crate::quant::rows16::{
    GROUP, Q4_K_SUB_BYTES, Q5_0_HBITS, Q6_K_HBITS, Q6_K_SCALES, Q6_K_SUB_BYTES, quants_offset,
};
use crate::simd::{DotTileFn, MAX_ROWS_16, Tile};

/// The 256-bit lanes of the A16 kernels, for the scales, FMAs and stores.
type L = Y256<MaddAdd>;
/// Two registers of eight i32 (or sixteen i16) lanes, rows in the order [`perm`] makes.
type I2 = (__m256i, __m256i);
/// Two registers of eight f32 lanes.
type F2 = (__m256, __m256);

/// Rows 0..8 and 8..16 of a per-row vector into the kernels' order (rows 0..4 and 8..12,
/// then 4..8 and 12..16), or back: the permutation is its own inverse.
#[inline(always)]
unsafe fn perm(x: F2) -> F2 {
    unsafe {
        (
            _mm256_permute2f128_ps::<0x20>(x.0, x.1),
            _mm256_permute2f128_ps::<0x31>(x.0, x.1),
        )
    }
}

#[inline(always)]
unsafe fn zero2() -> I2 {
    unsafe { (_mm256_setzero_si256(), _mm256_setzero_si256()) }
}

/// The activation dword at `p` in every lane.
#[inline(always)]
unsafe fn bcst(p: *const u8) -> __m256i {
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Chunks `2k` and `2k + 1` (at `p` and `p + 32`) interleaved by words: per row-lane the
/// bytes `2r, 2r + 1` of the first chunk, then of the second.
#[inline(always)]
unsafe fn chunk_pair(p: *const u8) -> I2 {
    unsafe {
        let c0 = _mm256_loadu_si256(p.cast());
        let c1 = _mm256_loadu_si256(p.add(2 * GROUP).cast());
        (_mm256_unpacklo_epi16(c0, c1), _mm256_unpackhi_epi16(c0, c1))
    }
}

/// The low and high nibbles of every byte.
#[inline(always)]
unsafe fn nibbles(x: __m256i) -> (__m256i, __m256i) {
    unsafe {
        let m = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(x, m),
            _mm256_and_si256(_mm256_srli_epi16(x, 4), m),
        )
    }
}

/// Bit `b` of every byte moved to bit 4 (by a 16-bit shift: bit 4 of each byte still comes
/// from its own byte for `b <= 7`; the other bits are garbage for the caller to mask).
#[inline(always)]
unsafe fn bit_to_4(x: __m256i, b: i32) -> __m256i {
    unsafe {
        match b {
            ..4 => _mm256_sll_epi16(x, _mm_cvtsi32_si128(4 - b)),
            4 => x,
            _ => _mm256_srl_epi16(x, _mm_cvtsi32_si128(b - 4)),
        }
    }
}

/// `(lo | hi)`-interleaved by words as [`chunk_pair`] does, masked by `m` per byte.
#[inline(always)]
unsafe fn pair_masked(lo: __m256i, hi: __m256i, m: i8) -> I2 {
    unsafe {
        let m = _mm256_set1_epi8(m);
        (
            _mm256_and_si256(_mm256_unpacklo_epi16(lo, hi), m),
            _mm256_and_si256(_mm256_unpackhi_epi16(lo, hi), m),
        )
    }
}

/// `acc + u8(w) · i8(a)` summed by pairs into each i16 lane (exact while in range).
#[inline(always)]
unsafe fn dot16(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)) }
}

/// `acc +` each row-lane's two i16 sums, as i32.
#[inline(always)]
unsafe fn widen(acc: I2, s: I2) -> I2 {
    unsafe {
        let ones = _mm256_set1_epi16(1);
        (
            _mm256_add_epi32(acc.0, _mm256_madd_epi16(s.0, ones)),
            _mm256_add_epi32(acc.1, _mm256_madd_epi16(s.1, ones)),
        )
    }
}

/// `x - v` per i32 lane.
#[inline(always)]
unsafe fn sub2(x: I2, v: i32) -> I2 {
    unsafe {
        let v = _mm256_set1_epi32(v);
        (_mm256_sub_epi32(x.0, v), _mm256_sub_epi32(x.1, v))
    }
}

/// The exact `Σ u8(w) · q_a` of one 32-column block of nibbles at `qs` (with Q5_0's fifth
/// bits from the planes at `qs + Q5_0_HBITS − QS` when `HBITS`) against the A8 blocks `a[j]`.
#[inline(always)]
unsafe fn nibble_sums<const HBITS: bool, const NA: usize>(
    qs: *const u8,
    a: &[*const u8; NA],
) -> [I2; NA] {
    unsafe {
        let mut acc = [zero2(); NA];
        let mut s16 = [zero2(); NA];
        for k in 0..4 {
            let (x, y) = chunk_pair(qs.add(4 * GROUP * k));
            let (mut xl, mut xh) = nibbles(x);
            let (mut yl, mut yh) = nibbles(y);
            if HBITS {
                // Chunk `c` keeps column `2c + e`'s fifth bit at bit `2 (c % 4)` of its
                // plane byte, column `16 + 2c + e`'s at the next bit.
                let p = _mm256_loadu_si256(
                    qs.add(Q5_0_HBITS - R16Q5_0::QS + 2 * GROUP * (k / 2))
                        .cast(),
                );
                let t = 4 * (k % 2) as i32;
                let (hxl, hyl) = pair_masked(bit_to_4(p, t), bit_to_4(p, t + 2), 0x10);
                let (hxh, hyh) = pair_masked(bit_to_4(p, t + 1), bit_to_4(p, t + 3), 0x10);
                (xl, yl) = (_mm256_or_si256(xl, hxl), _mm256_or_si256(yl, hyl));
                (xh, yh) = (_mm256_or_si256(xh, hxh), _mm256_or_si256(yh, hyh));
            }
            for (s, &a) in s16.iter_mut().zip(a) {
                let al = bcst(a.add(A8_QS + 4 * k));
                let ah = bcst(a.add(A8_QS + 16 + 4 * k));
                s.0 = dot16(dot16(s.0, xl, al), xh, ah);
                s.1 = dot16(dot16(s.1, yl, al), yh, ah);
            }
            // Five-bit weights: at most 8 products a lane between widenings.
            if k == 3 || (HBITS && k == 1) {
                for (acc, s) in acc.iter_mut().zip(s16.iter_mut()) {
                    *acc = widen(*acc, *s);
                    *s = zero2();
                }
            }
        }
        acc
    }
}

/// `acc + f32(sumi) · (d · da)` per lane, `d` in the kernels' row order.
#[inline(always)]
unsafe fn scale(acc: F2, sumi: I2, d: F2, da: f32) -> F2 {
    unsafe { L::scale(acc, sumi, d, da) }
}

/// Stores the 16 (or `n`) row results of `acc`, in the kernels' row order, at `out`.
#[inline(always)]
unsafe fn store(acc: F2, out: *mut f32, n: usize) {
    unsafe { L::store(perm(acc), out, n) }
}

/// The A8 blocks of column block `i` of the `NA` activation rows at `t.a`.
#[inline(always)]
unsafe fn act_blocks<const NA: usize>(t: &Tile, i: usize) -> [*const u8; NA] {
    unsafe { std::array::from_fn(|r| t.a.add(r * t.a_stride + i * A8_BYTES)) }
}

/// A format's kernel of one group × `NA` activation rows.
trait GroupA8 {
    unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize);
}

impl<F: Fmt16> GroupA8 for F {
    /// One group (16 weight rows, the first `t.n_w - row0` real) of Q4_0, Q4_1 or Q5_0.
    #[inline(always)]
    unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe {
            debug_assert!(F::NIBBLES);
            let n_rows = (t.n_w - row0).min(GROUP);
            // The zero point: Q4_0's nibbles are `q + 8`, Q5_0's `q + 16`.
            let zero = match (F::SUB8, F::HBITS) {
                (true, _) => 8,
                (_, true) => 16,
                _ => 0,
            };
            let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); NA];
            for b in 0..t.nb {
                let wb = w.add(b * F::BYTES);
                prefetch_ahead(wb, F::BYTES);
                let a = act_blocks::<NA>(t, b);
                let sumi = if F::HBITS {
                    nibble_sums::<true, NA>(wb.add(F::QS), &a)
                } else {
                    nibble_sums::<false, NA>(wb.add(F::QS), &a)
                };
                let d = perm(L::f16(wb));
                for j in 0..NA {
                    let s = if zero == 0 {
                        sumi[j]
                    } else {
                        sub2(sumi[j], zero * qsum(a[j], 2))
                    };
                    acc[j] = scale(acc[j], s, d, d_s(a[j]).0);
                }
                if F::HAS_M {
                    let m = perm(L::f16(wb.add(2 * GROUP)));
                    for j in 0..NA {
                        acc[j] = L::offset(acc[j], m, d_s(a[j]).1);
                    }
                }
            }
            for (j, acc) in acc.iter().enumerate() {
                store(*acc, t.out.add(j * t.out_stride + row0), n_rows);
            }
        }
    }
}

/// Rows16 Q4_K against A8: each sub-block of 32 columns a Q4_1-like block.
struct A8Q4K;

impl GroupA8 for A8Q4K {
    #[inline(always)]
    unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe {
            let bytes = GROUP * GgmlType::Q4_K.type_size();
            let qs0 = quants_offset(GgmlType::Q4_K);
            let n_rows = (t.n_w - row0).min(GROUP);
            let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); NA];
            for b in 0..t.nb {
                let wb = w.add(b * bytes);
                for j in 0..8 {
                    // An eighth of the group-block per sub-block, as the A16 kernel.
                    prefetch_ahead(wb.add(j * bytes / 8), bytes / 8);
                    let a = act_blocks::<NA>(t, 8 * b + j);
                    let sumi = nibble_sums::<false, NA>(wb.add(qs0 + j * Q4_K_SUB_BYTES), &a);
                    let (dsc, dm) = k4_scales::<L>(wb, j);
                    let (dsc, dm) = (perm(dsc), perm(dm));
                    for r in 0..NA {
                        let (da, sa) = d_s(a[r]);
                        acc[r] = L::offset(scale(acc[r], sumi[r], dsc, da), dm, -sa);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                store(*acc, t.out.add(r * t.out_stride + row0), n_rows);
            }
        }
    }
}

/// Rows16 Q6_K against A8, one half of the group's rows at a time (`H` 0: rows 0..4 and
/// 8..12, the word interleave's low halves; 1: rows 4..8 and 12..16), both 16-column
/// sub-blocks of a 32-column chunk in one pass over its quants.
///
/// Each sub-block's i16 sums meet its i8 scale in the widening `vpmaddwd` (in place of ones),
/// so a chunk's two sub-blocks add into one exact i32 sum per row:
/// `Σ_h sc_h · (Σ q_w · q_a − 32 · Σ q_a)`, the zero points from the A8 block's two half sums
/// in one `vpmaddwd` against the pairs `32 · (sc_0, sc_1)`. That sum is converted once and
/// meets `d · d_a`: the reference ([`crate::quant::rows16::vec_dot_a8`]) scales each
/// sub-block's sum in f32 instead, which rounds differently (within the A8 budget).
struct A8Q6K;

/// Bytes of a Q6_K group-block.
const Q6_K_BYTES: usize = GROUP * 210;

/// The six-bit quants `q + 32` of chunk pair `k` (chunks `2k`, `2k + 1` at `qs + 64 k`, their
/// top-bit plane at `qs + Q6_K_HBITS + 32 k`) for half `H` of the rows, as `(low, high)`: the
/// low nibbles (the chunk's first sub-block) and the high ones (its second), each eight
/// row-lanes of four u8 in the activations' column order.
///
/// The plane's byte `2r + e` holds chunk `2k`'s top bits at bits 0..2 (low nibble) and 2..4
/// (high), chunk `2k + 1`'s at 4..6 and 6..8. Interleaved by words with itself shifted left by
/// four, its bits 4..6 are the low nibbles' top bits and bits 6..8 the high ones' (a 16-bit
/// shift keeps each byte's bits 4..8 from its own byte).
#[inline(always)]
unsafe fn six_bits<const H: usize>(qs: *const u8, k: usize) -> I2 {
    unsafe {
        let c0 = _mm256_loadu_si256(qs.add(4 * GROUP * k).cast());
        let c1 = _mm256_loadu_si256(qs.add(4 * GROUP * k + 2 * GROUP).cast());
        let p = _mm256_loadu_si256(qs.add(Q6_K_HBITS + 2 * GROUP * k).cast());
        let p4 = _mm256_slli_epi16(p, 4);
        let (x, u) = if H == 0 {
            (_mm256_unpacklo_epi16(c0, c1), _mm256_unpacklo_epi16(p4, p))
        } else {
            (_mm256_unpackhi_epi16(c0, c1), _mm256_unpackhi_epi16(p4, p))
        };
        let (m4, m6) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let lo = _mm256_or_si256(_mm256_and_si256(x, m4), _mm256_and_si256(u, m6));
        let hi = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(x, 4), m4),
            _mm256_and_si256(_mm256_srli_epi16(u, 2), m6),
        );
        (lo, hi)
    }
}

/// The i16 scales of sub-blocks `2j` and `2j + 1` at `sc` (two planes of 16 i8) for half `H`
/// of the rows: each row's scale in both words of its lane, then the pairs
/// `32 · (sc_2j, sc_2j+1)` a lane, for the zero points.
#[inline(always)]
unsafe fn six_scales<const H: usize>(sc: *const u8) -> [__m256i; 3] {
    unsafe {
        let s0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.cast()));
        let s1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.add(GROUP).cast()));
        // No closure: it would not inherit the target features.
        let (x0, x1, x01) = if H == 0 {
            (
                _mm256_unpacklo_epi16(s0, s0),
                _mm256_unpacklo_epi16(s1, s1),
                _mm256_unpacklo_epi16(s0, s1),
            )
        } else {
            (
                _mm256_unpackhi_epi16(s0, s0),
                _mm256_unpackhi_epi16(s1, s1),
                _mm256_unpackhi_epi16(s0, s1),
            )
        };
        [x0, x1, _mm256_slli_epi16(x01, 5)]
    }
}

impl A8Q6K {
    /// Half `H` of chunk `j` of the group-block at `wb` (scales `d` in the half's row order)
    /// against the `NA` A8 blocks `a[r]`: `acc[r] +` each row's dot.
    #[inline(always)]
    unsafe fn half<const H: usize, const NA: usize>(
        wb: *const u8,
        j: usize,
        d: __m256,
        a: &[*const u8; NA],
        acc: &mut [__m256; NA],
    ) {
        unsafe {
            let qs = wb.add(quants_offset(GgmlType::Q6_K) + j * Q6_K_SUB_BYTES);
            let [sc0, sc1, zp] = six_scales::<H>(wb.add(Q6_K_SCALES + GROUP * 2 * j));
            let mut sumi = [_mm256_setzero_si256(); NA];
            for kp in 0..2 {
                let (lo0, hi0) = six_bits::<H>(qs, 2 * kp);
                let (lo1, hi1) = six_bits::<H>(qs, 2 * kp + 1);
                for (s, &a) in sumi.iter_mut().zip(a) {
                    // Columns `8 kp..` of the block (no closure: it would not inherit the
                    // target features).
                    let q = a.add(A8_QS + 8 * kp);
                    // Six-bit weights: two products a lane each, two `vpmaddubsw` a widening.
                    let t0 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo0, bcst(q)),
                        _mm256_maddubs_epi16(lo1, bcst(q.add(4))),
                    );
                    let t1 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(hi0, bcst(q.add(16))),
                        _mm256_maddubs_epi16(hi1, bcst(q.add(20))),
                    );
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(t0, sc0));
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(t1, sc1));
                }
            }
            for r in 0..NA {
                let z = _mm256_madd_epi16(bcst(a[r].add(A8_SUMS)), zp);
                let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r], z));
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(d_s(a[r]).0));
                acc[r] = _mm256_fmadd_ps(s, dd, acc[r]);
            }
        }
    }
}

impl GroupA8 for A8Q6K {
    /// Up to two rows take both halves of a chunk before the next: a decode step streams the
    /// weights once. More rows run one half of the group's rows over all its columns, then
    /// the other (reading the group again from cache), which keeps fewer sums in registers.
    #[inline(always)]
    unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe {
            let n_rows = (t.n_w - row0).min(GROUP);
            let mut lo = [_mm256_setzero_ps(); NA];
            let mut hi = [_mm256_setzero_ps(); NA];
            // No closures for the two orders: they would not inherit the target features.
            for b in 0..t.nb {
                let wb = w.add(b * Q6_K_BYTES);
                let d = perm(L::f16(wb));
                for j in 0..8 {
                    prefetch_ahead(wb.add(j * Q6_K_BYTES / 8), Q6_K_BYTES / 8);
                    let a = act_blocks::<NA>(t, 8 * b + j);
                    Self::half::<0, NA>(wb, j, d.0, &a, &mut lo);
                    if NA <= 2 {
                        Self::half::<1, NA>(wb, j, d.1, &a, &mut hi);
                    }
                }
            }
            if NA > 2 {
                for b in 0..t.nb {
                    let wb = w.add(b * Q6_K_BYTES);
                    let d = perm(L::f16(wb));
                    for j in 0..8 {
                        let a = act_blocks::<NA>(t, 8 * b + j);
                        Self::half::<1, NA>(wb, j, d.1, &a, &mut hi);
                    }
                }
            }
            for r in 0..NA {
                store((lo[r], hi[r]), t.out.add(r * t.out_stride + row0), n_rows);
            }
        }
    }
}

// `tile` matches row counts up to 8.
const _: () = assert!(MAX_ROWS_16 == 8);

/// A whole tile of Rows16 weights (`t.w_stride` the bytes of a group) against A8 rows,
/// `1 <= t.n_a <= MAX_ROWS_16`, all of them in one pass over each group.
#[inline(always)]
unsafe fn tile<G: GroupA8>(t: &Tile) {
    unsafe {
        debug_assert!((1..=MAX_ROWS_16).contains(&t.n_a));
        let mut row0 = 0;
        while row0 < t.n_w {
            let w = t.w.add(row0 / GROUP * t.w_stride);
            match t.n_a {
                1 => G::group::<1>(t, w, row0),
                2 => G::group::<2>(t, w, row0),
                3 => G::group::<3>(t, w, row0),
                4 => G::group::<4>(t, w, row0),
                5 => G::group::<5>(t, w, row0),
                6 => G::group::<6>(t, w, row0),
                7 => G::group::<7>(t, w, row0),
                _ => G::group::<8>(t, w, row0),
            }
            row0 += GROUP;
        }
    }
}

macro_rules! entry {
    ($name:ident, $g:ty) => {
        /// # Safety
        ///
        /// As [`crate::simd::DotTileFn`] for Rows16 weights against A8 activations, on a CPU
        /// with AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(t: &Tile) {
            unsafe { tile::<$g>(t) }
        }
    };
}

entry!(q4_0, R16Q4_0);
entry!(q5_0, R16Q5_0);
entry!(q4_1, R16Q4_1);
entry!(q4_k, A8Q4K);
entry!(q6_k, A8Q6K);

/// The AVX2 A8 kernels by weight type (Q8_0 has none: it runs against A16).
pub fn table() -> [Option<DotTileFn>; 15] {
    let mut t: [Option<DotTileFn>; 15] = [None; 15];
    t[GgmlType::Q4_0 as usize] = Some(q4_0);
    t[GgmlType::Q5_0 as usize] = Some(q5_0);
    t[GgmlType::Q4_1 as usize] = Some(q4_1);
    t[GgmlType::Q4_K as usize] = Some(q4_k);
    t[GgmlType::Q6_K as usize] = Some(q6_k);
    t
}
