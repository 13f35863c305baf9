//! SIMD dot products of [Rows16](crate::quant::rows16) weights (16 interleaved rows of Q4_0,
//! Q4_1, Q5_0, Q8_0, Q4_K or Q6_K) with A16 activations: `matmul`'s kernels for those formats.
//!
//! Q5_0 ORs its fifth bits (one plane widened per four nibble chunks) into the nibbles before
//! the multiply-adds. Q4_K runs each 32-column sub-block as a Q4_1 block whose scale and
//! offset are `d · sc` and `dmin · m` (decoded per sub-block from the three scale planes, 16
//! rows at once) against the sub-block's own A16 block: `acc += f32(sumi) · (d·sc · d_a)`,
//! then `acc += dmin·m · (−s_a)`. Q6_K ORs the top two bits (one plane per two nibble
//! chunks) into the nibbles and subtracts 32; each 32-column chunk is two 16-column
//! sub-blocks (its low and high nibbles), each summed exactly and scaled by `d · sc` (the 16
//! rows' i8 scales widened at once) against the chunk's one A16 block.
//!
//! Per group-block and activation row: each 32-byte chunk of quants widens to 16 lanes of
//! (row, two columns) i16 pairs, and one multiply-add against the activation pair broadcast
//! from memory advances all 16 rows — `vpdpwssd zmm, zmm, m32{1to16}` on AVX-512, `vpdpwssd`
//! or `vpmaddwd` + `vpaddd` on 256-bit tiers (two registers per 16 lanes). The block's 16 exact
//! i32 sums then meet the scales in one FMA: `acc += f32(sumi) · (d_w · d_a)`, and Q4_1 adds
//! `m_w · s_a`. Each weight chunk is widened once for up to [`MAX_ROWS_16`] activation rows.
//!
//! Numerics: the integer sum of a block is exact whatever order or split of accumulators
//! computes it (with few activation rows two chains hide the multiply-add latency), and it is
//! converted to f32 whole, as the reference does; only the fused multiply-add of the scales
//! differs from the reference twin. A row's result never depends on its lane, its group, how
//! many activation rows share the call, or the tile.
//!
//! The multiply-adds are inline `asm!`: LLVM rewrites the `vpdpwssd` intrinsic into
//! `vpmaddwd` + `vpaddd` (and a separate broadcast) for generic x86-64 tuning, which measured
//! 1.8× slower here.

use std::arch::asm;
use std::arch::x86_64::*;

use crate::quant::rows16::{self, GROUP};
use crate::simd::{MAX_ROWS_16, Tile};

/// How far ahead of the weight bytes being read to prefetch them, in bytes: 4 KiB measured
/// best on a one-row matmul streaming from DRAM (1.3–1.8× over 1 KiB; 2–6 KiB are within noise
/// of it).
const PREFETCH: usize = 4096;

/// Prefetches into L1 every cache line of `[p + PREFETCH, p + PREFETCH + len)`: called on each
/// span `[p, p + len)` of a weight stream as it is read, it keeps the next `PREFETCH` bytes in
/// flight. One line per group-block (the rest left to the hardware prefetcher) measured
/// 1.3–1.8× slower on one-row matmuls from DRAM.
#[inline(always)]
pub(super) unsafe fn prefetch_ahead(p: *const u8, len: usize) {
    let mut o = 0;
    while o < len {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + o).cast()) };
        o += 64;
    }
}
/// Offset of the quants in an A16 block (after `d: f32, s: f32`).
const A16_QS: usize = 8;
/// Bytes of an A16 block.
const A16_BYTES: usize = crate::quant::A16_BYTES;

/// A register set of 16 lanes: one 512-bit register, or two 256-bit ones.
pub trait Lanes16 {
    /// 16 lanes of i32 (or 32 of i16).
    type I: Copy;
    /// 16 lanes of f32.
    type F: Copy;
    unsafe fn zero_i() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    /// 32 bytes at `p`, zero-extended to i16.
    unsafe fn load_u8(p: *const u8) -> Self::I;
    /// 32 bytes at `p`, sign-extended to i16.
    unsafe fn load_i8(p: *const u8) -> Self::I;
    /// Low and high nibbles of zero-extended bytes, as i16.
    unsafe fn nibbles(x: Self::I) -> (Self::I, Self::I);
    /// `x - v` in every i16 lane.
    unsafe fn sub(x: Self::I, v: i16) -> Self::I;
    /// `x | (((h >> from) & mask) << 4)` in every i16 lane (Q5_0's fifth bit or Q6_K's top
    /// two bits above a nibble): one shift that moves bit `from` to bit 4 (none for 4), one
    /// mask, one or.
    unsafe fn or_high(x: Self::I, h: Self::I, from: i32, mask: i16) -> Self::I;
    /// 16 i8 at `p`, sign-extended to i32.
    unsafe fn load_i8_i32(p: *const u8) -> Self::I;
    /// 16 little-endian u32 at `p`.
    unsafe fn load_u32(p: *const u8) -> Self::I;
    /// `(x >> shift) & mask` in every u32 lane.
    unsafe fn shr_and(x: Self::I, shift: i32, mask: i32) -> Self::I;
    /// Lane-wise bitwise or.
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    /// `f · f32(x)` per lane (`x` as i32).
    unsafe fn mul_i(f: Self::F, x: Self::I) -> Self::F;
    /// `acc += Σ pairs of w · (the i16 pair at p, broadcast)`, exact in i32.
    unsafe fn dp(acc: Self::I, w: Self::I, p: *const u8) -> Self::I;
    /// Lane-wise i32 sum.
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    /// 16 f16 at `p` as f32.
    unsafe fn f16(p: *const u8) -> Self::F;
    /// `acc + f32(sumi) · (d · *da)`.
    unsafe fn scale(acc: Self::F, sumi: Self::I, d: Self::F, da: f32) -> Self::F;
    /// `acc + m · s`.
    unsafe fn offset(acc: Self::F, m: Self::F, s: f32) -> Self::F;
    /// Stores lanes `0..n` at `out`.
    unsafe fn store(x: Self::F, out: *mut f32, n: usize);
}

/// One 512-bit register (AVX-512 F + BW + VNNI).
pub struct Z512;

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn vpdpwssd_zmm_bcst(acc: __m512i, w: __m512i, p: *const u8) -> __m512i {
    let mut acc = acc;
    // SAFETY: `p` is readable for 4 bytes (the caller's contract); no memory is written.
    unsafe {
        asm!(
            "vpdpwssd {a}, {w}, dword ptr [{p}]{{1to16}}",
            a = inout(zmm_reg) acc,
            w = in(zmm_reg) w,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

impl Lanes16 for Z512 {
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> __m512i {
        unsafe { _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> __m512i {
        unsafe { _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn nibbles(x: __m512i) -> (__m512i, __m512i) {
        unsafe {
            (
                _mm512_and_si512(x, _mm512_set1_epi16(0x0F)),
                _mm512_srli_epi16(x, 4),
            )
        }
    }
    #[inline(always)]
    unsafe fn sub(x: __m512i, v: i16) -> __m512i {
        unsafe { _mm512_sub_epi16(x, _mm512_set1_epi16(v)) }
    }
    #[inline(always)]
    unsafe fn or_high(x: __m512i, h: __m512i, from: i32, mask: i16) -> __m512i {
        unsafe {
            let h = match from {
                ..4 => _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - from)),
                4 => h,
                _ => _mm512_srl_epi16(h, _mm_cvtsi32_si128(from - 4)),
            };
            // x | (h & m): `vpternlogq` with truth table A | (B & C).
            _mm512_ternarylogic_epi64::<0xF8>(x, h, _mm512_set1_epi16(mask << 4))
        }
    }
    #[inline(always)]
    unsafe fn load_i8_i32(p: *const u8) -> __m512i {
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_u32(p: *const u8) -> __m512i {
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn shr_and(x: __m512i, shift: i32, mask: i32) -> __m512i {
        unsafe {
            _mm512_and_si512(
                _mm512_srl_epi32(x, _mm_cvtsi32_si128(shift)),
                _mm512_set1_epi32(mask),
            )
        }
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn mul_i(f: __m512, x: __m512i) -> __m512 {
        unsafe { _mm512_mul_ps(f, _mm512_cvtepi32_ps(x)) }
    }
    #[inline(always)]
    unsafe fn dp(acc: __m512i, w: __m512i, p: *const u8) -> __m512i {
        unsafe { vpdpwssd_zmm_bcst(acc, w, p) }
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn f16(p: *const u8) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn scale(acc: __m512, sumi: __m512i, d: __m512, da: f32) -> __m512 {
        unsafe {
            let s = _mm512_mul_ps(d, _mm512_set1_ps(da));
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), s, acc)
        }
    }
    #[inline(always)]
    unsafe fn offset(acc: __m512, m: __m512, s: f32) -> __m512 {
        unsafe { _mm512_fmadd_ps(m, _mm512_set1_ps(s), acc) }
    }
    #[inline(always)]
    unsafe fn store(x: __m512, out: *mut f32, n: usize) {
        unsafe {
            if n >= GROUP {
                _mm512_storeu_ps(out, x);
            } else {
                _mm512_mask_storeu_ps(out, ((1u32 << n) - 1) as u16, x);
            }
        }
    }
}

/// The 256-bit i16 multiply-add of a tier: `acc += Σ pairs of w · b` exact in i32.
pub trait Dp256 {
    unsafe fn dp(acc: __m256i, w: __m256i, b: __m256i) -> __m256i;
}

/// AVX2: `vpmaddwd` + `vpaddd`.
pub struct MaddAdd;

impl Dp256 for MaddAdd {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, w: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(w, b)) }
    }
}

/// AVX-VNNI: VEX `vpdpwssd`.
pub struct VexDpwssd;

#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn vpdpwssd_vex(acc: __m256i, w: __m256i, b: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: register-only instruction.
    unsafe {
        asm!(
            "{{vex}} vpdpwssd {a}, {w}, {b}",
            a = inout(ymm_reg) acc,
            w = in(ymm_reg) w,
            b = in(ymm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

impl Dp256 for VexDpwssd {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, w: __m256i, b: __m256i) -> __m256i {
        unsafe { vpdpwssd_vex(acc, w, b) }
    }
}

/// Two 256-bit registers (AVX2 + FMA + F16C), lanes 0..8 and 8..16, multiply-added by `D`.
pub struct Y256<D>(std::marker::PhantomData<D>);

impl<D: Dp256> Lanes16 for Y256<D> {
    type I = (__m256i, __m256i);
    type F = (__m256, __m256);
    #[inline(always)]
    unsafe fn zero_i() -> Self::I {
        unsafe { (_mm256_setzero_si256(), _mm256_setzero_si256()) }
    }
    #[inline(always)]
    unsafe fn zero_f() -> Self::F {
        unsafe { (_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> Self::I {
        unsafe {
            (
                _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast())),
                _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16).cast())),
            )
        }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> Self::I {
        unsafe {
            (
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast())),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16).cast())),
            )
        }
    }
    #[inline(always)]
    unsafe fn nibbles(x: Self::I) -> (Self::I, Self::I) {
        unsafe {
            let m = _mm256_set1_epi16(0x0F);
            (
                (_mm256_and_si256(x.0, m), _mm256_and_si256(x.1, m)),
                (_mm256_srli_epi16(x.0, 4), _mm256_srli_epi16(x.1, 4)),
            )
        }
    }
    #[inline(always)]
    unsafe fn sub(x: Self::I, v: i16) -> Self::I {
        unsafe {
            let e = _mm256_set1_epi16(v);
            (_mm256_sub_epi16(x.0, e), _mm256_sub_epi16(x.1, e))
        }
    }
    #[inline(always)]
    unsafe fn or_high(x: Self::I, h: Self::I, from: i32, mask: i16) -> Self::I {
        unsafe {
            let h = match from {
                ..4 => {
                    let n = _mm_cvtsi32_si128(4 - from);
                    (_mm256_sll_epi16(h.0, n), _mm256_sll_epi16(h.1, n))
                }
                4 => h,
                _ => {
                    let n = _mm_cvtsi32_si128(from - 4);
                    (_mm256_srl_epi16(h.0, n), _mm256_srl_epi16(h.1, n))
                }
            };
            let m = _mm256_set1_epi16(mask << 4);
            (
                _mm256_or_si256(x.0, _mm256_and_si256(h.0, m)),
                _mm256_or_si256(x.1, _mm256_and_si256(h.1, m)),
            )
        }
    }
    #[inline(always)]
    unsafe fn load_i8_i32(p: *const u8) -> Self::I {
        unsafe {
            (
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8).cast())),
            )
        }
    }
    #[inline(always)]
    unsafe fn load_u32(p: *const u8) -> Self::I {
        unsafe {
            (
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(32).cast()),
            )
        }
    }
    #[inline(always)]
    unsafe fn shr_and(x: Self::I, shift: i32, mask: i32) -> Self::I {
        unsafe {
            let (n, m) = (_mm_cvtsi32_si128(shift), _mm256_set1_epi32(mask));
            (
                _mm256_and_si256(_mm256_srl_epi32(x.0, n), m),
                _mm256_and_si256(_mm256_srl_epi32(x.1, n), m),
            )
        }
    }
    #[inline(always)]
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I {
        unsafe { (_mm256_or_si256(a.0, b.0), _mm256_or_si256(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn mul_i(f: Self::F, x: Self::I) -> Self::F {
        unsafe {
            (
                _mm256_mul_ps(f.0, _mm256_cvtepi32_ps(x.0)),
                _mm256_mul_ps(f.1, _mm256_cvtepi32_ps(x.1)),
            )
        }
    }
    #[inline(always)]
    unsafe fn dp(acc: Self::I, w: Self::I, p: *const u8) -> Self::I {
        unsafe {
            let b = _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
            (D::dp(acc.0, w.0, b), D::dp(acc.1, w.1, b))
        }
    }
    #[inline(always)]
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I {
        unsafe { (_mm256_add_epi32(a.0, b.0), _mm256_add_epi32(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn f16(p: *const u8) -> Self::F {
        unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
            )
        }
    }
    #[inline(always)]
    unsafe fn scale(acc: Self::F, sumi: Self::I, d: Self::F, da: f32) -> Self::F {
        unsafe {
            let da = _mm256_set1_ps(da);
            (
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi.0), _mm256_mul_ps(d.0, da), acc.0),
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi.1), _mm256_mul_ps(d.1, da), acc.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn offset(acc: Self::F, m: Self::F, s: f32) -> Self::F {
        unsafe {
            let s = _mm256_set1_ps(s);
            (
                _mm256_fmadd_ps(m.0, s, acc.0),
                _mm256_fmadd_ps(m.1, s, acc.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn store(x: Self::F, out: *mut f32, n: usize) {
        unsafe {
            if n >= GROUP {
                _mm256_storeu_ps(out, x.0);
                _mm256_storeu_ps(out.add(8), x.1);
            } else {
                let mut o = [0f32; GROUP];
                _mm256_storeu_ps(o.as_mut_ptr(), x.0);
                _mm256_storeu_ps(o.as_mut_ptr().add(8), x.1);
                std::ptr::copy_nonoverlapping(o.as_ptr(), out, n);
            }
        }
    }
}

/// A Rows16 weight format: where its quants are, how they widen, whether it has offsets.
pub trait Fmt16 {
    /// Bytes of a group-block.
    const BYTES: usize;
    /// Offset of the quants in a group-block.
    const QS: usize;
    /// Has the per-row offset `m` (Q4_1).
    const HAS_M: bool;
    /// Quants are nibbles (Q4_0, Q4_1), else bytes (Q8_0).
    const NIBBLES: bool;
    /// Nibbles are stored `+ 8` (Q4_0).
    const SUB8: bool;
    /// Nibbles take a fifth bit from the planes at [`rows16::Q5_0_HBITS`] and are stored
    /// `+ 16` (Q5_0).
    const HBITS: bool = false;
}

/// Rows16 Q4_0.
pub struct R16Q4_0;
/// Rows16 Q4_1.
pub struct R16Q4_1;
/// Rows16 Q8_0.
pub struct R16Q8_0;
/// Rows16 Q5_0.
pub struct R16Q5_0;

impl Fmt16 for R16Q4_0 {
    const BYTES: usize = 16 * 18;
    const QS: usize = 32;
    const HAS_M: bool = false;
    const NIBBLES: bool = true;
    const SUB8: bool = true;
}

impl Fmt16 for R16Q4_1 {
    const BYTES: usize = 16 * 20;
    const QS: usize = 64;
    const HAS_M: bool = true;
    const NIBBLES: bool = true;
    const SUB8: bool = false;
}

impl Fmt16 for R16Q5_0 {
    const BYTES: usize = 16 * 22;
    const QS: usize = 32;
    const HAS_M: bool = false;
    const NIBBLES: bool = true;
    const SUB8: bool = false;
    const HBITS: bool = true;
}

impl Fmt16 for R16Q8_0 {
    const BYTES: usize = 16 * 34;
    const QS: usize = 32;
    const HAS_M: bool = false;
    const NIBBLES: bool = false;
    const SUB8: bool = false;
}

/// `acc += w · a` into the first or (`second`) the second accumulator.
#[inline(always)]
unsafe fn dp_into<L: Lanes16>(acc: &mut (L::I, L::I), w: L::I, a: *const u8, second: bool) {
    unsafe {
        if second {
            acc.1 = L::dp(acc.1, w, a);
        } else {
            acc.0 = L::dp(acc.0, w, a);
        }
    }
}

/// Adds `Σ w · a_j` of the group-block's quants at `qs` and the A16 quants at `a[j]` to
/// `acc[j]`, each weight chunk widened once for every row: into two accumulators per row when
/// `split` (the caller adds them), else into `acc[j].0` alone. Q4 chunk `c` holds pairs `c`
/// (low nibbles) and `c + 8` (high nibbles); Q8 chunk `c` holds pair `c`.
#[inline(always)]
unsafe fn sums<F: Fmt16, L: Lanes16, const NA: usize>(
    qs: *const u8,
    a: &[*const u8; NA],
    acc: &mut [(L::I, L::I); NA],
    split: bool,
) {
    unsafe {
        if F::NIBBLES {
            let mut h = L::zero_i();
            for c in 0..8 {
                let (mut lo, mut hi) = L::nibbles(L::load_u8(qs.add(32 * c)));
                if F::SUB8 {
                    lo = L::sub(lo, 8);
                    hi = L::sub(hi, 8);
                }
                if F::HBITS {
                    if c % 4 == 0 {
                        let plane = rows16::Q5_0_HBITS - F::QS + 2 * GROUP * (c / 4);
                        h = L::load_u8(qs.add(plane));
                    }
                    let bit = 2 * (c % 4) as i32;
                    lo = L::sub(L::or_high(lo, h, bit, 1), 16);
                    hi = L::sub(L::or_high(hi, h, bit + 1, 1), 16);
                }
                for (acc, &a) in acc.iter_mut().zip(a) {
                    dp_into::<L>(acc, lo, a.add(4 * c), false);
                    dp_into::<L>(acc, hi, a.add(4 * (c + 8)), split);
                }
            }
        } else {
            for c in 0..16 {
                let w = L::load_i8(qs.add(32 * c));
                for (acc, &a) in acc.iter_mut().zip(a) {
                    dp_into::<L>(acc, w, a.add(4 * c), split && c % 2 == 1);
                }
            }
        }
    }
}

/// One group (16 weight rows, the first `t.n_w - row0` of them real) × `NA` activation rows.
///
/// With up to four activation rows each row's block sum runs as two chains (added before the
/// conversion, exactly), so consecutive multiply-adds do not wait on each other; with more,
/// the rows themselves are independent chains and one accumulator each saves registers.
#[inline(always)]
unsafe fn group<F: Fmt16, L: Lanes16, const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
    unsafe {
        let n_rows = (t.n_w - row0).min(GROUP);
        let split = NA <= 4;
        let mut acc = [L::zero_f(); NA];
        for b in 0..t.nb {
            let wb = w.add(b * F::BYTES);
            prefetch_ahead(wb, F::BYTES);
            let a: [*const u8; NA] =
                std::array::from_fn(|j| t.a.add(j * t.a_stride + b * A16_BYTES));
            let qa: [*const u8; NA] = a.map(|p| p.add(A16_QS));
            let mut acc_i = [(L::zero_i(), L::zero_i()); NA];
            sums::<F, L, NA>(wb.add(F::QS), &qa, &mut acc_i, split);
            let d = L::f16(wb);
            for j in 0..NA {
                let sumi = if split {
                    L::add_i(acc_i[j].0, acc_i[j].1)
                } else {
                    acc_i[j].0
                };
                acc[j] = L::scale(acc[j], sumi, d, a[j].cast::<f32>().read_unaligned());
            }
            if F::HAS_M {
                let m = L::f16(wb.add(2 * GROUP));
                for j in 0..NA {
                    acc[j] = L::offset(acc[j], m, a[j].add(4).cast::<f32>().read_unaligned());
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            L::store(*acc, t.out.add(j * t.out_stride + row0), n_rows);
        }
    }
}

/// A Rows16 format's kernel of one group × `NA` activation rows.
pub trait Group16 {
    /// One group (16 weight rows at `w`, the first `t.n_w - row0` of them real) × `NA`
    /// activation rows, stored at `t.out` columns `row0..`.
    unsafe fn group<L: Lanes16, const NA: usize>(t: &Tile, w: *const u8, row0: usize);
}

impl<F: Fmt16> Group16 for F {
    #[inline(always)]
    unsafe fn group<L: Lanes16, const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe { group::<F, L, NA>(t, w, row0) }
    }
}

/// Rows16 Q4_K.
#[allow(non_camel_case_types)]
pub struct R16Q4_K;

/// Bytes of a Q4_K group-block.
const Q4_K_BYTES: usize = 16 * 144;

/// `(d · sc_j, dmin · m_j)` of sub-block `j` of the 16 rows of the Q4_K group-block at `wb`,
/// decoded from its three scale planes as ggml's `get_scale_min_k4` does per row.
#[inline(always)]
pub(super) unsafe fn k4_scales<L: Lanes16>(wb: *const u8, j: usize) -> (L::F, L::F) {
    unsafe {
        // No closure: it would not inherit the target features.
        let planes = wb.add(rows16::Q4_K_SCALES);
        let (u0, u1, u2) = (
            L::load_u32(planes),
            L::load_u32(planes.add(4 * GROUP)),
            L::load_u32(planes.add(8 * GROUP)),
        );
        let (sc, m) = if j < 4 {
            let s = 8 * j as i32;
            (L::shr_and(u0, s, 63), L::shr_and(u1, s, 63))
        } else {
            // The low nibble from plane 2, the top two bits from planes 0 and 1.
            let s = 8 * (j - 4) as i32;
            (
                L::or(L::shr_and(u2, s, 15), L::shr_and(u0, s + 2, 48)),
                L::or(L::shr_and(u2, s + 4, 15), L::shr_and(u1, s + 2, 48)),
            )
        };
        (
            L::mul_i(L::f16(wb), sc),
            L::mul_i(L::f16(wb.add(rows16::Q4_K_DMIN)), m),
        )
    }
}

impl Group16 for R16Q4_K {
    /// Each sub-block of 32 columns is a Q4_1 block of scale `d·sc` and offset `dmin·m`
    /// against its own A16 block (`8b + j`), the same two FMAs as the reference twin's order.
    #[inline(always)]
    unsafe fn group<L: Lanes16, const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe {
            let n_rows = (t.n_w - row0).min(GROUP);
            let split = NA <= 4;
            let qs0 = rows16::quants_offset(crate::quant::GgmlType::Q4_K);
            let mut acc = [L::zero_f(); NA];
            for b in 0..t.nb {
                let wb = w.add(b * Q4_K_BYTES);
                for j in 0..8 {
                    let qs = wb.add(qs0 + j * rows16::Q4_K_SUB_BYTES);
                    // An eighth of the group-block per sub-block.
                    prefetch_ahead(wb.add(j * Q4_K_BYTES / 8), Q4_K_BYTES / 8);
                    let a: [*const u8; NA] =
                        std::array::from_fn(|r| t.a.add(r * t.a_stride + (8 * b + j) * A16_BYTES));
                    let qa: [*const u8; NA] = a.map(|p| p.add(A16_QS));
                    let mut acc_i = [(L::zero_i(), L::zero_i()); NA];
                    sums::<R16Q4_1, L, NA>(qs, &qa, &mut acc_i, split);
                    let (dsc, dm) = k4_scales::<L>(wb, j);
                    for r in 0..NA {
                        let sumi = if split {
                            L::add_i(acc_i[r].0, acc_i[r].1)
                        } else {
                            acc_i[r].0
                        };
                        let (da, sa) = (
                            a[r].cast::<f32>().read_unaligned(),
                            a[r].add(4).cast::<f32>().read_unaligned(),
                        );
                        acc[r] = L::offset(L::scale(acc[r], sumi, dsc, da), dm, -sa);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                L::store(*acc, t.out.add(r * t.out_stride + row0), n_rows);
            }
        }
    }
}

/// Rows16 Q6_K.
#[allow(non_camel_case_types)]
pub struct R16Q6_K;

/// Bytes of a Q6_K group-block.
const Q6_K_BYTES: usize = 16 * 210;

/// Adds the 6-bit quants (minus 32) of one Q6_K chunk at `qs` times the A16 quants at `a[r]`
/// into `acc[r]`: its low nibbles (columns 0..16, one sub-block) into `.0` and its high
/// nibbles (columns 16..32, the next sub-block) into `.1` when `half` is `None`, else only
/// half `h` into `.0` (`half = Some(h)`: one accumulator per row, for many rows).
#[inline(always)]
unsafe fn k6_sums<L: Lanes16, const NA: usize>(
    qs: *const u8,
    a: &[*const u8; NA],
    acc: &mut [(L::I, L::I); NA],
    half: Option<usize>,
) {
    unsafe {
        let mut h = L::zero_i();
        for c in 0..8 {
            if c % 2 == 0 {
                h = L::load_u8(qs.add(rows16::Q6_K_HBITS + 2 * GROUP * (c / 2)));
            }
            let (lo, hi) = L::nibbles(L::load_u8(qs.add(32 * c)));
            let bit = 4 * (c % 2) as i32;
            match half {
                None => {
                    let lo = L::sub(L::or_high(lo, h, bit, 3), 32);
                    let hi = L::sub(L::or_high(hi, h, bit + 2, 3), 32);
                    for (acc, &a) in acc.iter_mut().zip(a) {
                        dp_into::<L>(acc, lo, a.add(4 * c), false);
                        dp_into::<L>(acc, hi, a.add(4 * (c + 8)), true);
                    }
                }
                Some(s) => {
                    let x = if s == 0 { lo } else { hi };
                    let x = L::sub(L::or_high(x, h, bit + 2 * s as i32, 3), 32);
                    for (acc, &a) in acc.iter_mut().zip(a) {
                        dp_into::<L>(acc, x, a.add(4 * (c + 8 * s)), false);
                    }
                }
            }
        }
    }
}

impl Group16 for R16Q6_K {
    /// Each 32-column chunk holds two sub-blocks of 16 columns against one A16 block
    /// (`8b + j`); each sub-block's exact sum meets `d·sc` (16 rows' i8 scales widened) in one
    /// FMA, sub-block `2j` before `2j + 1`, as the reference twin adds them. Up to four
    /// activation rows take both halves in one pass (two accumulators per row, two chains);
    /// more take one pass per half so each row keeps one accumulator.
    #[inline(always)]
    unsafe fn group<L: Lanes16, const NA: usize>(t: &Tile, w: *const u8, row0: usize) {
        unsafe {
            let n_rows = (t.n_w - row0).min(GROUP);
            let qs0 = rows16::quants_offset(crate::quant::GgmlType::Q6_K);
            let mut acc = [L::zero_f(); NA];
            for b in 0..t.nb {
                let wb = w.add(b * Q6_K_BYTES);
                let d = L::f16(wb);
                for j in 0..8 {
                    let qs = wb.add(qs0 + j * rows16::Q6_K_SUB_BYTES);
                    // An eighth of the group-block per chunk.
                    prefetch_ahead(wb.add(j * Q6_K_BYTES / 8), Q6_K_BYTES / 8);
                    let a: [*const u8; NA] =
                        std::array::from_fn(|r| t.a.add(r * t.a_stride + (8 * b + j) * A16_BYTES));
                    let qa: [*const u8; NA] = a.map(|p| p.add(A16_QS));
                    let dsc = |s: usize| {
                        L::mul_i(d, L::load_i8_i32(wb.add(rows16::Q6_K_SCALES + GROUP * s)))
                    };
                    let da: [f32; NA] = a.map(|p| p.cast::<f32>().read_unaligned());
                    if NA <= 4 {
                        let mut acc_i = [(L::zero_i(), L::zero_i()); NA];
                        k6_sums::<L, NA>(qs, &qa, &mut acc_i, None);
                        let (d0, d1) = (dsc(2 * j), dsc(2 * j + 1));
                        for r in 0..NA {
                            acc[r] = L::scale(
                                L::scale(acc[r], acc_i[r].0, d0, da[r]),
                                acc_i[r].1,
                                d1,
                                da[r],
                            );
                        }
                    } else {
                        for s in 0..2 {
                            let mut acc_i = [(L::zero_i(), L::zero_i()); NA];
                            k6_sums::<L, NA>(qs, &qa, &mut acc_i, Some(s));
                            let ds = dsc(2 * j + s);
                            for r in 0..NA {
                                acc[r] = L::scale(acc[r], acc_i[r].0, ds, da[r]);
                            }
                        }
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                L::store(*acc, t.out.add(r * t.out_stride + row0), n_rows);
            }
        }
    }
}

/// A whole [`Tile`] of Rows16 weights: `t.w` is the tile's first group, `t.w_stride` the bytes
/// of a group, `t.n_w` its rows (the last group may be partial), `1 <= t.n_a <= MAX_ROWS_16`.
#[inline(always)]
pub unsafe fn tile<G: Group16, L: Lanes16>(t: &Tile) {
    unsafe {
        debug_assert!((1..=MAX_ROWS_16).contains(&t.n_a));
        let mut row0 = 0;
        while row0 < t.n_w {
            let w = t.w.add(row0 / GROUP * t.w_stride);
            // No closures: they would not inherit the target features.
            match t.n_a {
                1 => G::group::<L, 1>(t, w, row0),
                2 => G::group::<L, 2>(t, w, row0),
                3 => G::group::<L, 3>(t, w, row0),
                4 => G::group::<L, 4>(t, w, row0),
                5 => G::group::<L, 5>(t, w, row0),
                6 => G::group::<L, 6>(t, w, row0),
                7 => G::group::<L, 7>(t, w, row0),
                _ => G::group::<L, 8>(t, w, row0),
            }
            row0 += GROUP;
        }
    }
}
