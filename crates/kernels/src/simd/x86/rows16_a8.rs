//! Rows16 Q4_0 / Q4_1 / Q8_0 / Q4_K weights × [A8](crate::quant::a8) activations on AVX-512
//! VNNI: `vpdpbusd`, four u8 × i8 products a lane, twice the multiply-adds per instruction of
//! the A16 kernels' `vpdpwssd` ([`super::rows16`]). Only for weights of a model loaded with
//! `--activation-bits 8`.
//!
//! A 32-byte nibble chunk `c` of a group-block (byte `2r + e`: column `2c + e` low, `16 + 2c +
//! e` high) widens into one register of 16 lanes × four u8 weights: `x = zext16→32(chunk)`,
//! `w = (x | x << 12) & 0x0F0F0F0F` puts columns `2c, 2c + 1, 16 + 2c, 17 + 2c` in bytes 0..4
//! of lane `r` — A8's pair order, so one broadcast dword of activations meets it. Q8_0 chunks
//! `c` and `c + 8` make the same four columns, `(x_c | x_{c+8} << 16) ^ 0x80808080`: the i8
//! weights biased to u8 (`vpdpbusd`'s first operand is unsigned). Each block's exact integer
//! sum then drops the bias, `− 8 · Σ q_a` (Q4_0) or `− 128 · Σ q_a` (Q8_0), from the A8
//! block's `sum`, and meets the scales in one FMA as in the A16 kernels; Q4_1 adds `m_w · s_a`,
//! Q4_K runs each 32-column sub-block as a Q4_1 block of scale `d·sc` and offset `−dmin·m`.
//!
//! Numerics: as the A16 kernels — exact block sums in i32, converted whole; only the scale
//! FMAs differ from the reference twin ([`crate::quant::rows16::vec_dot_a8`]).

use std::arch::asm;
use std::arch::x86_64::*;

use super::rows16::{Fmt16, Lanes16, R16Q4_0, R16Q4_1, R16Q8_0, Z512, k4_scales, prefetch_ahead};
use crate::quant::GgmlType;
use crate::quant::a8::{A8_BYTES, A8_QS};
use crate::quant::rows16::{GROUP, Q4_K_SUB_BYTES, quants_offset};
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

/// Nibble chunk at `p` as 16 lanes of four u8 weights in pair order.
#[inline(always)]
unsafe fn nibble_chunk(p: *const u8) -> __m512i {
    unsafe {
        let x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        // (A | B) & C.
        _mm512_ternarylogic_epi32::<0xA8>(
            x,
            _mm512_slli_epi32(x, 12),
            _mm512_set1_epi32(0x0F0F_0F0F),
        )
    }
}

/// Q8_0 chunks at `p` and `p + 256` as 16 lanes of four weights `+ 128` in pair order.
#[inline(always)]
unsafe fn byte_chunks(p: *const u8) -> __m512i {
    unsafe {
        let lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        let hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(8 * 2 * GROUP).cast()));
        // (A | B) ^ C.
        _mm512_ternarylogic_epi32::<0x56>(
            lo,
            _mm512_slli_epi32(hi, 16),
            _mm512_set1_epi32(0x8080_8080u32 as i32),
        )
    }
}

/// The exact `Σ u8(w) · q_a` of one 32-column block at `qs` against the A8 blocks `a[j]`,
/// into two chains per row when `split` (up to four rows), else one.
#[inline(always)]
unsafe fn sums<const NIBBLES: bool, const NA: usize>(
    qs: *const u8,
    a: &[*const u8; NA],
    split: bool,
) -> [__m512i; NA] {
    unsafe {
        let mut acc = [(_mm512_setzero_si512(), _mm512_setzero_si512()); NA];
        for c in 0..8 {
            let w = if NIBBLES {
                nibble_chunk(qs.add(2 * GROUP * c))
            } else {
                byte_chunks(qs.add(2 * GROUP * c))
            };
            for (acc, &a) in acc.iter_mut().zip(a) {
                let p = a.add(A8_QS + 4 * c);
                if split && c % 2 == 1 {
                    acc.1 = vpdpbusd_bcst(acc.1, w, p);
                } else {
                    acc.0 = vpdpbusd_bcst(acc.0, w, p);
                }
            }
        }
        // No closures (`array::map`): they would not inherit the target features.
        let mut out = [_mm512_setzero_si512(); NA];
        for j in 0..NA {
            out[j] = if split {
                _mm512_add_epi32(acc[j].0, acc[j].1)
            } else {
                acc[j].0
            };
        }
        out
    }
}

/// `Σ q_a` of the A8 block at `a`, times `bias`, in every lane.
#[inline(always)]
unsafe fn bias(a: *const u8, bias: i32) -> __m512i {
    unsafe { _mm512_set1_epi32(bias * a.add(8).cast::<i32>().read_unaligned()) }
}

/// The A8 block's `d` and `s` at `a`.
#[inline(always)]
unsafe fn d_s(a: *const u8) -> (f32, f32) {
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
            let sumi = if F::NIBBLES {
                sums::<true, NA>(wb.add(F::QS), &a, NA <= 4)
            } else {
                sums::<false, NA>(wb.add(F::QS), &a, NA <= 4)
            };
            let d = Z512::f16(wb);
            for j in 0..NA {
                let s = match (F::NIBBLES, F::SUB8) {
                    (true, true) => _mm512_sub_epi32(sumi[j], bias(a[j], 8)),
                    (true, false) => sumi[j],
                    (false, _) => _mm512_sub_epi32(sumi[j], bias(a[j], 128)),
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
                    let sumi = sums::<true, NA>(wb.add(qs0 + j * Q4_K_SUB_BYTES), &a, NA <= 4);
                    let (dsc, dm) = k4_scales::<Z512>(wb, j);
                    for r in 0..NA {
                        let (da, sa) = d_s(a[r]);
                        acc[r] = Z512::offset(Z512::scale(acc[r], sumi[r], dsc, da), dm, -sa);
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
entry!(q4_1, R16Q4_1);
entry!(q8_0, R16Q8_0);
entry!(q4_k, A8Q4K);

/// The A8 kernels by weight type, for the AVX-512 VNNI tiers' tables.
pub fn table() -> [Option<DotTileFn>; 15] {
    let mut t: [Option<DotTileFn>; 15] = [None; 15];
    t[GgmlType::Q4_0 as usize] = Some(q4_0);
    t[GgmlType::Q4_1 as usize] = Some(q4_1);
    t[GgmlType::Q8_0 as usize] = Some(q8_0);
    t[GgmlType::Q4_K as usize] = Some(q4_k);
    t
}
