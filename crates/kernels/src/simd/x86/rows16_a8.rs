//! Rows16 Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K weights × [A8](crate::quant::a8) activations on
//! AVX-512 VNNI: `vpdpbusd`, four u8 × i8 products a lane, twice the multiply-adds per
//! instruction of the A16 kernels' `vpdpwssd` ([`super::rows16`]). Only for a model run with
//! `--activation-bits 8`.
//!
//! Nibble chunks `2k` and `2k + 1` of a group-block (byte `2r + e` of chunk `c`: column
//! `2c + e` low, `16 + 2c + e` high) widen into two registers of 16 lanes × four u8 weights:
//! `x = zext(chunk 2k) | zext(chunk 2k + 1) << 16` per lane, `x & 0x0F0F0F0F` holds columns
//! `4k..4k + 4` and `(x >> 4) & 0x0F0F0F0F` columns `16 + 4k..` — the activations' own
//! order, so one broadcast dword meets each. Q8_0 chunks `2k, 2k + 1` make columns `4k..4k + 4`
//! the same way, `^ 0x80808080`: the i8 weights biased to u8 (`vpdpbusd`'s first operand is
//! unsigned). Q5_0 ORs in its fifth bits (one plane per four chunks), Q6_K its top two (one
//! plane per two). A block's exact
//! integer sum then drops the bias from the A8 block's sums — `8 · Σ q_a` (Q4_0), `16 · Σ q_a`
//! (Q5_0), `128 · Σ q_a` (Q8_0), `32 · Σ q_a` of each 16-column half (Q6_K) — and meets the scales in one FMA as in
//! the A16 kernels; Q4_1 adds `m_w · s_a`, Q4_K runs each 32-column sub-block as a Q4_1
//! block of scale `d·sc` and offset `−dmin·m`.
//!
//! Numerics: as the A16 kernels — exact block sums in i32, converted whole; only the scale
//! FMAs differ from the reference twin ([`crate::quant::rows16::vec_dot_a8`]).

use std::arch::asm;
use std::arch::x86_64::*;

use super::rows16::{
    Fmt16, Lanes16, R16Q4_0, R16Q4_1, R16Q5_0, R16Q8_0, Z512, k4_scales, prefetch_ahead,
};
use crate::quant::GgmlType;
use crate::quant::a8::{A8_BYTES, A8_QS, A8_SUMS};
use crate::quant::rows16::{
    GROUP, Q4_K_SUB_BYTES, Q5_0_HBITS, Q6_K_HBITS, Q6_K_SCALES, Q6_K_SUB_BYTES, quants_offset,
};
use crate::simd::{DotTileFn, MAX_ROWS_16, Tile};

/// `acc += Σ_4 u8(w) · i8(a)` per lane, the activation dword broadcast from `p`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn vpdpbusd_bcst(acc: __m512i, w: __m512i, p: *const u8) -> __m512i {
    let mut acc = acc;
    // SAFETY: `p` is readable for 4 bytes (the caller's contract); no memory is written.
    unsafe {
        asm!(
            "vpdpbusd {a}, {w}, dword ptr [{p}]{{1to16}}",
            a = inout(zmm_reg) acc,
            w = in(zmm_reg) w,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// Nibble chunks `2k` and `2k + 1` at `p` as two registers of 16 lanes × four u8 weights:
/// columns `4k..4k + 4` (the low nibbles) and `16 + 4k..16 + 4k + 4` (the high nibbles).
#[inline(always)]
unsafe fn nibble_pair(p: *const u8) -> (__m512i, __m512i) {
    unsafe {
        let x = chunk_pair(p);
        let m = _mm512_set1_epi32(0x0F0F_0F0F);
        (
            _mm512_and_si512(x, m),
            _mm512_and_si512(_mm512_srli_epi32(x, 4), m),
        )
    }
}

/// The 32-byte chunks at `p` and `p + 32` as 16 lanes of their bytes `2r, 2r + 1` (first
/// chunk) and `2r, 2r + 1` (second).
#[inline(always)]
unsafe fn chunk_pair(p: *const u8) -> __m512i {
    unsafe {
        let lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        let hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(2 * GROUP).cast()));
        _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16))
    }
}

/// Q8_0 chunks `2k` and `2k + 1` at `p` as 16 lanes of columns `4k..4k + 4`, `+ 128` (u8).
#[inline(always)]
unsafe fn byte_pair(p: *const u8) -> __m512i {
    unsafe { _mm512_xor_si512(chunk_pair(p), _mm512_set1_epi32(0x8080_8080u32 as i32)) }
}

/// The formats of [`sums`]: 4-bit nibbles, Q5_0's nibbles with their fifth bits, bytes.
const NIB: u8 = 0;
const NIB5: u8 = 1;
const BYTE: u8 = 2;

/// Q5_0's fifth bits for nibble chunks `2k, 2k + 1` from their plane at `plane` (byte `2r + e`:
/// column `2c + e` at bit `2 (c % 4)`, column `16 + 2c + e` at bit `2 (c % 4) + 1`), as bit 4 of
/// each byte of the low-column and high-column registers [`nibble_pair`] makes.
#[inline(always)]
unsafe fn fifth_bits(plane: *const u8, k: usize) -> (__m512i, __m512i) {
    unsafe {
        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(plane.cast()));
        let t = 4 * (k % 2) as i32;
        let m = _mm512_set1_epi32(0x1010_1010);
        // (A | B) & C.
        (
            _mm512_ternarylogic_epi32::<0xA8>(sl(h, 4 - t), sl(h, 18 - t), m),
            _mm512_ternarylogic_epi32::<0xA8>(sl(h, 3 - t), sl(h, 17 - t), m),
        )
    }
}

/// `x << n` for `n >= 0`, else `x >> -n` (logical), per 32-bit lane.
#[inline(always)]
unsafe fn sl(x: __m512i, n: i32) -> __m512i {
    unsafe {
        if n >= 0 {
            _mm512_sll_epi32(x, _mm_cvtsi32_si128(n))
        } else {
            _mm512_srl_epi32(x, _mm_cvtsi32_si128(-n))
        }
    }
}

/// The exact `Σ u8(w) · q_a` of one 32-column block at `qs` (format `FMT`) against the A8
/// blocks `a[j]`, as two chains per row when `split` (summed into `.0`), else one.
#[inline(always)]
unsafe fn sums<const FMT: u8, const NA: usize>(
    qs: *const u8,
    a: &[*const u8; NA],
    split: bool,
) -> [(__m512i, __m512i); NA] {
    unsafe {
        let mut acc = [(_mm512_setzero_si512(), _mm512_setzero_si512()); NA];
        if FMT == BYTE {
            for k in 0..8 {
                let w = byte_pair(qs.add(4 * GROUP * k));
                for (acc, &a) in acc.iter_mut().zip(a) {
                    let p = a.add(A8_QS + 4 * k);
                    if split && k % 2 == 1 {
                        acc.1 = vpdpbusd_bcst(acc.1, w, p);
                    } else {
                        acc.0 = vpdpbusd_bcst(acc.0, w, p);
                    }
                }
            }
        } else {
            for k in 0..4 {
                let (mut lo, mut hi) = nibble_pair(qs.add(4 * GROUP * k));
                if FMT == NIB5 {
                    let plane = qs.add(Q5_0_HBITS - 2 * GROUP + 2 * GROUP * (k / 2));
                    let (hl, hh) = fifth_bits(plane, k);
                    lo = _mm512_or_si512(lo, hl);
                    hi = _mm512_or_si512(hi, hh);
                }
                for (acc, &a) in acc.iter_mut().zip(a) {
                    let p = a.add(A8_QS + 4 * k);
                    acc.0 = vpdpbusd_bcst(acc.0, lo, p);
                    if split {
                        acc.1 = vpdpbusd_bcst(acc.1, hi, p.add(16));
                    } else {
                        acc.0 = vpdpbusd_bcst(acc.0, hi, p.add(16));
                    }
                }
            }
        }
        if split {
            // No closures (`array::map`): they would not inherit the target features.
            for acc in acc.iter_mut() {
                acc.0 = _mm512_add_epi32(acc.0, acc.1);
            }
        }
        acc
    }
}

/// The A8 block at `a`'s `Σ q` of columns 0..16 (`half` 0), 16..32 (1) or all (2).
#[inline(always)]
pub(super) unsafe fn qsum(a: *const u8, half: usize) -> i32 {
    unsafe {
        let s = |h: usize| a.add(A8_SUMS + 2 * h).cast::<i16>().read_unaligned() as i32;
        match half {
            0 | 1 => s(half),
            _ => s(0) + s(1),
        }
    }
}

/// [`qsum`] times `bias`, in every lane.
#[inline(always)]
unsafe fn bias(a: *const u8, half: usize, bias: i32) -> __m512i {
    unsafe { _mm512_set1_epi32(bias * qsum(a, half)) }
}

/// The A8 block's `d` and `s` at `a`.
#[inline(always)]
pub(super) unsafe fn d_s(a: *const u8) -> (f32, f32) {
    unsafe {
        (
            a.cast::<f32>().read_unaligned(),
            a.add(4).cast::<f32>().read_unaligned(),
        )
    }
}

/// A format's kernel of one group × `NA` activation rows.
trait GroupA8 {
    unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize);
}

/// One group (16 weight rows, the first `t.n_w - row0` real) of a 32-column format.
#[inline(always)]
unsafe fn group32<F: Fmt16, const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
    unsafe {
        let n_rows = (t.n_w - row0).min(GROUP);
        let mut acc = [_mm512_setzero_ps(); NA];
        for b in 0..t.nb {
            let wb = w.add(b * F::BYTES);
            prefetch_ahead(wb, F::BYTES);
            let a: [*const u8; NA] =
                std::array::from_fn(|j| t.a.add(j * t.a_stride + b * A8_BYTES));
            let qs = wb.add(F::QS);
            let sumi = match (F::NIBBLES, F::HBITS) {
                (false, _) => sums::<BYTE, NA>(qs, &a, NA <= 4),
                (true, false) => sums::<NIB, NA>(qs, &a, NA <= 4),
                (true, true) => sums::<NIB5, NA>(qs, &a, NA <= 4),
            };
            let d = Z512::f16(wb);
            for j in 0..NA {
                // The zero point: Q4_0's nibbles are `q + 8`, Q5_0's `q + 16`, Q8_0's biased
                // bytes `q + 128`.
                let zero = match (F::NIBBLES, F::SUB8, F::HBITS) {
                    (false, _, _) => 128,
                    (true, true, _) => 8,
                    (true, _, true) => 16,
                    _ => 0,
                };
                let s = if zero == 0 {
                    sumi[j].0
                } else {
                    _mm512_sub_epi32(sumi[j].0, bias(a[j], 2, zero))
                };
                let (da, sa) = d_s(a[j]);
                acc[j] = Z512::scale(acc[j], s, d, da);
                if F::HAS_M {
                    acc[j] = Z512::offset(acc[j], Z512::f16(wb.add(2 * GROUP)), sa);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            Z512::store(*acc, t.out.add(j * t.out_stride + row0), n_rows);
        }
    }
}

impl<F: Fmt16> GroupA8 for F {
    #[inline(always)]
    unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe { group32::<F, NA>(t, w, row0) }
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
            let mut acc = [_mm512_setzero_ps(); NA];
            for b in 0..t.nb {
                let wb = w.add(b * bytes);
                for j in 0..8 {
                    // An eighth of the group-block per sub-block, as the A16 kernel.
                    prefetch_ahead(wb.add(j * bytes / 8), bytes / 8);
                    let a: [*const u8; NA] =
                        std::array::from_fn(|r| t.a.add(r * t.a_stride + (8 * b + j) * A8_BYTES));
                    let qs = wb.add(qs0 + j * Q4_K_SUB_BYTES);
                    let sumi = sums::<NIB, NA>(qs, &a, NA <= 4);
                    let (dsc, dm) = k4_scales::<Z512>(wb, j);
                    for r in 0..NA {
                        let (da, sa) = d_s(a[r]);
                        acc[r] = Z512::offset(Z512::scale(acc[r], sumi[r].0, dsc, da), dm, -sa);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                Z512::store(*acc, t.out.add(r * t.out_stride + row0), n_rows);
            }
        }
    }
}

/// Rows16 Q6_K against A8: each 32-column chunk two 16-column sub-blocks, summed apart.
struct A8Q6K;

/// Bytes of a Q6_K group-block.
const Q6_K_BYTES: usize = GROUP * 210;

impl GroupA8 for A8Q6K {
    /// The 6-bit quants `q + 32` (u8) of chunk `j`: the nibbles of chunks `2k, 2k + 1` ORed
    /// with their top two bits from plane `k` (byte `2r + e`: column `2c + e` at bit
    /// `4 (c % 2)`, column `16 + 2c + e` at bit `4 (c % 2) + 2`), moved to bits 4..6 of each
    /// byte by two shifts apiece. Each half's exact sum drops `32 · Σ q_a` of its 16 columns
    /// and meets `d · sc` of its sub-block, `2j` before `2j + 1`, as the reference adds them.
    #[inline(always)]
    unsafe fn group<const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe {
            let n_rows = (t.n_w - row0).min(GROUP);
            let qs0 = quants_offset(GgmlType::Q6_K);
            let m2 = _mm512_set1_epi32(0x3030_3030);
            let mut acc = [_mm512_setzero_ps(); NA];
            for b in 0..t.nb {
                let wb = w.add(b * Q6_K_BYTES);
                let d = Z512::f16(wb);
                for j in 0..8 {
                    let qs = wb.add(qs0 + j * Q6_K_SUB_BYTES);
                    prefetch_ahead(wb.add(j * Q6_K_BYTES / 8), Q6_K_BYTES / 8);
                    let a: [*const u8; NA] =
                        std::array::from_fn(|r| t.a.add(r * t.a_stride + (8 * b + j) * A8_BYTES));
                    let mut acc_i = [(_mm512_setzero_si512(), _mm512_setzero_si512()); NA];
                    for k in 0..4 {
                        let (lo, hi) = nibble_pair(qs.add(4 * GROUP * k));
                        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                            qs.add(Q6_K_HBITS + 2 * GROUP * k).cast(),
                        ));
                        // (A | B) & C.
                        let hl = _mm512_ternarylogic_epi32::<0xA8>(
                            _mm512_slli_epi32(h, 4),
                            _mm512_slli_epi32(h, 16),
                            m2,
                        );
                        let hh = _mm512_ternarylogic_epi32::<0xA8>(
                            _mm512_slli_epi32(h, 2),
                            _mm512_slli_epi32(h, 14),
                            m2,
                        );
                        let (lo, hi) = (_mm512_or_si512(lo, hl), _mm512_or_si512(hi, hh));
                        for (acc, &a) in acc_i.iter_mut().zip(&a) {
                            let p = a.add(A8_QS + 4 * k);
                            acc.0 = vpdpbusd_bcst(acc.0, lo, p);
                            acc.1 = vpdpbusd_bcst(acc.1, hi, p.add(16));
                        }
                    }
                    // `d · sc` of sub-blocks 2j and 2j + 1 (16 rows' i8 scales widened).
                    let sc = wb.add(Q6_K_SCALES + GROUP * 2 * j);
                    let d0 = Z512::mul_i(d, Z512::load_i8_i32(sc));
                    let d1 = Z512::mul_i(d, Z512::load_i8_i32(sc.add(GROUP)));
                    for r in 0..NA {
                        let (da, _) = d_s(a[r]);
                        let s0 = _mm512_sub_epi32(acc_i[r].0, bias(a[r], 0, 32));
                        let s1 = _mm512_sub_epi32(acc_i[r].1, bias(a[r], 1, 32));
                        acc[r] = Z512::scale(Z512::scale(acc[r], s0, d0, da), s1, d1, da);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                Z512::store(*acc, t.out.add(r * t.out_stride + row0), n_rows);
            }
        }
    }
}

/// A whole tile of Rows16 weights (`t.w_stride` the bytes of a group) against A8 rows,
/// `1 <= t.n_a <= MAX_ROWS_16`.
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
        /// with AVX-512 F/BW/VL/VNNI, F16C and FMA.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub unsafe fn $name(t: &Tile) {
            unsafe { tile::<$g>(t) }
        }
    };
}

entry!(q4_0, R16Q4_0);
entry!(q5_0, R16Q5_0);
entry!(q4_1, R16Q4_1);
entry!(q8_0, R16Q8_0);
entry!(q4_k, A8Q4K);
entry!(q6_k, A8Q6K);

/// The A8 kernels by weight type, for the AVX-512 VNNI tiers' tables.
pub fn table() -> [Option<DotTileFn>; 15] {
    let mut t: [Option<DotTileFn>; 15] = [None; 15];
    t[GgmlType::Q4_0 as usize] = Some(q4_0);
    t[GgmlType::Q5_0 as usize] = Some(q5_0);
    t[GgmlType::Q4_1 as usize] = Some(q4_1);
    t[GgmlType::Q8_0 as usize] = Some(q8_0);
    t[GgmlType::Q4_K as usize] = Some(q4_k);
    t[GgmlType::Q6_K as usize] = Some(q6_k);
    t
}
