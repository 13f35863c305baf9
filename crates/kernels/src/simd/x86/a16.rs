//! SIMD dot products of the 32-element weight formats with A16 activations
//! ([`crate::quant::a16`]), tiles of weight rows × up to [`crate::simd::MAX_ROWS`] activation
//! rows — the kernels of `matmul`'s integer path.
//!
//! Per weight block: decode the 32 quants once, straight to i16 lanes ([`Widen`]); then per
//! activation row: multiply-add the i16 pairs exactly into i32 lanes (each lane sums at most
//! four products `<= 4 · 128 · 2047 < 2^24`, so the conversion to f32 is exact), and
//! accumulate `lanes · (d_w · d_a)` with one FMA; Q4_1/Q5_1 also accumulate `m · s`. Only the
//! f32 accumulation order differs from the reference twin.
//!
//! One generic body ([`tile`]) over a register width ([`Lanes`]). Every tier uses [`L256`]: a
//! block is two registers of 16 i16, `vpmaddwd` then the tier's [`MulSum16`] (`vpmaddwd` +
//! add, or `vpdpwssd`). A 512-bit variant (a block in one register, one `vpmaddwd`) was
//! measured on the Sapphire-Rapids-class development VM and lost: prefill ~305 vs ~358 tok/s,
//! decode no better (fewer ports take 512-bit ops) — so the AVX-512 tier runs these 256-bit
//! kernels with EVEX `vpdpwssd`.
//!
//! Register blocking: with one activation row (decode) two weight rows share each activation
//! block load; with several activation rows (prefill, batches) each weight block is widened
//! once for all of them. With one activation row, each weight row alternates two accumulators
//! so consecutive FMAs do not wait on each other.

use std::arch::x86_64::*;

use super::common::{MulSum16, hsum_ps, load_256, load_f16x2};
use super::q32::{Fmt32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::A16_BYTES;
use crate::simd::Tile;

/// How far ahead of the current weight block to prefetch, in bytes (weights stream from L3 or
/// DRAM; the activations stay in L1/L2). A prefetch past the end of the weights is harmless.
const PREFETCH: usize = 1024;

/// Offset of the quants in an A16 block (after `d: f32, s: f32`).
const A16_QS: usize = 8;

/// `[d_a, s_a, 0, 0]` of the A16 block at `p`.
#[inline(always)]
unsafe fn load_ds(p: *const u8) -> __m128 {
    unsafe { _mm_castsi128_ps(_mm_loadl_epi64(p.cast())) }
}

/// A 32-element weight format decoded straight to i16 lanes, with as few cross-lane
/// shuffles (port 5 on Intel, the bottleneck of these loops) as the format allows.
pub trait Widen: Fmt32 {
    /// Quants 0..16 and 16..32 of the block at `p` as i16, and `[d, m, _, _]`.
    ///
    /// # Safety
    ///
    /// `p` is valid for reads of one block; AVX2 + F16C available.
    unsafe fn widen_256(p: *const u8) -> (__m256i, __m256i, __m128);
}

/// The 16 nibble bytes at `p` as i16: low nibbles (elements 0..16), high nibbles (16..32).
#[inline(always)]
unsafe fn nibbles_256(p: *const u8) -> (__m256i, __m256i) {
    unsafe {
        let x = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
        let m = _mm256_set1_epi16(0x0F);
        (
            _mm256_and_si256(x, m),
            _mm256_and_si256(_mm256_srli_epi16(x, 4), m),
        )
    }
}

/// The 32 fifth bits (`qh`, little-endian u32 at `p`) as `0x10` in the i16 lanes where set:
/// elements 0..16 and 16..32.
#[inline(always)]
unsafe fn fifth_bits_256(p: *const u8) -> (__m256i, __m256i) {
    unsafe {
        let qh = p.cast::<u32>().read_unaligned();
        (spread_16_bits(qh as u16), spread_16_bits((qh >> 16) as u16))
    }
}

/// Bit `i` of `bits` as `0x10` (set) or 0 in i16 lane `i`.
#[inline(always)]
unsafe fn spread_16_bits(bits: u16) -> __m256i {
    unsafe {
        let sel = _mm256_setr_epi16(
            1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, -32768,
        );
        let x = _mm256_and_si256(_mm256_set1_epi16(bits as i16), sel);
        _mm256_and_si256(_mm256_cmpeq_epi16(x, sel), _mm256_set1_epi16(0x10))
    }
}

impl Widen for Q4_0 {
    #[inline(always)]
    unsafe fn widen_256(p: *const u8) -> (__m256i, __m256i, __m128) {
        unsafe {
            let (lo, hi) = nibbles_256(p.add(2));
            let eight = _mm256_set1_epi16(8);
            (
                _mm256_sub_epi16(lo, eight),
                _mm256_sub_epi16(hi, eight),
                load_f16x2(p),
            )
        }
    }
}

impl Widen for Q4_1 {
    #[inline(always)]
    unsafe fn widen_256(p: *const u8) -> (__m256i, __m256i, __m128) {
        unsafe {
            let (lo, hi) = nibbles_256(p.add(4));
            (lo, hi, load_f16x2(p))
        }
    }
}

impl Widen for Q5_0 {
    #[inline(always)]
    unsafe fn widen_256(p: *const u8) -> (__m256i, __m256i, __m128) {
        unsafe {
            let (lo, hi) = nibbles_256(p.add(6));
            let (hb_lo, hb_hi) = fifth_bits_256(p.add(2));
            let sixteen = _mm256_set1_epi16(16);
            (
                _mm256_sub_epi16(_mm256_or_si256(lo, hb_lo), sixteen),
                _mm256_sub_epi16(_mm256_or_si256(hi, hb_hi), sixteen),
                load_f16x2(p),
            )
        }
    }
}

impl Widen for Q5_1 {
    #[inline(always)]
    unsafe fn widen_256(p: *const u8) -> (__m256i, __m256i, __m128) {
        unsafe {
            let (lo, hi) = nibbles_256(p.add(8));
            let (hb_lo, hb_hi) = fifth_bits_256(p.add(4));
            (
                _mm256_or_si256(lo, hb_lo),
                _mm256_or_si256(hi, hb_hi),
                load_f16x2(p),
            )
        }
    }
}

impl Widen for Q8_0 {
    #[inline(always)]
    unsafe fn widen_256(p: *const u8) -> (__m256i, __m256i, __m128) {
        unsafe {
            let lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2).cast()));
            let hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18).cast()));
            (lo, hi, load_f16x2(p))
        }
    }
}

/// One register width's way of computing a block: the widened weight block, the exact i32
/// sums against an A16 block (converted to f32 lanes), and the f32 accumulator ops.
pub trait Lanes {
    /// A widened weight block.
    type W: Copy;
    /// f32 accumulator lanes.
    type F: Copy;
    /// Zeroed accumulator.
    unsafe fn zero() -> Self::F;
    /// The block of format `Fm` at `p`, widened, and its `[d, m, _, _]`.
    unsafe fn widen<Fm: Widen>(p: *const u8) -> (Self::W, __m128);
    /// `Σ w · a` of the widened block and the 32 i16 quants at `qs`, as exact i32 lane sums
    /// converted to f32.
    unsafe fn sums(w: Self::W, qs: *const u8) -> Self::F;
    /// `acc + x · broadcast(lane 0 of s)`.
    unsafe fn fma(x: Self::F, s: __m128, acc: Self::F) -> Self::F;
    /// Lane-wise sum.
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    /// Sum of the lanes.
    unsafe fn hsum(x: Self::F) -> f32;
}

/// 256-bit lanes (AVX2 / AVX-VNNI / AVX-512VL): a block is two registers of 16 i16, combined
/// by the tier's [`MulSum16`].
pub struct L256<M>(std::marker::PhantomData<M>);

impl<M: MulSum16> Lanes for L256<M> {
    type W = (__m256i, __m256i);
    type F = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn widen<Fm: Widen>(p: *const u8) -> ((__m256i, __m256i), __m128) {
        unsafe {
            let (lo, hi, dm) = Fm::widen_256(p);
            ((lo, hi), dm)
        }
    }
    #[inline(always)]
    unsafe fn sums(w: (__m256i, __m256i), qs: *const u8) -> __m256 {
        unsafe {
            let sumi = _mm256_madd_epi16(w.0, load_256(qs));
            _mm256_cvtepi32_ps(M::mul_sum16(sumi, w.1, load_256(qs.add(32))))
        }
    }
    #[inline(always)]
    unsafe fn fma(x: __m256, s: __m128, acc: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(x, _mm256_broadcastss_ps(s), acc) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn hsum(x: __m256) -> f32 {
        unsafe { hsum_ps(x) }
    }
}

/// Accumulators of `NW` weight rows × `NA` activation rows: f32 lanes of `d_w · d_a · sumi`,
/// and (lane 1) `Σ m · s`.
#[derive(Clone, Copy)]
struct Acc<V: Copy, const NW: usize, const NA: usize> {
    f: [[V; NA]; NW],
    m: [[__m128; NA]; NW],
}

impl<V: Copy, const NW: usize, const NA: usize> Acc<V, NW, NA> {
    #[inline(always)]
    unsafe fn new(zero: V) -> Self {
        unsafe {
            Acc {
                f: [[zero; NA]; NW],
                m: [[_mm_setzero_ps(); NA]; NW],
            }
        }
    }
}

/// Accumulates block `b` of `NW` weight rows (at `w`, `w_stride` apart) against block `b` of
/// `NA` activation rows: each weight block is widened once, each activation block loaded once.
#[inline(always)]
unsafe fn step<F: Widen, L: Lanes, const NW: usize, const NA: usize>(
    b: usize,
    (w, w_stride): (*const u8, usize),
    (a, a_stride): (*const u8, usize),
    acc: &mut Acc<L::F, NW, NA>,
) {
    unsafe {
        for i in 0..NW {
            let wb = w.add(i * w_stride + b * F::W_BYTES);
            _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
            let (wq, dm) = L::widen::<F>(wb);
            for j in 0..NA {
                let ab = a.add(j * a_stride + b * A16_BYTES);
                let scales = _mm_mul_ps(dm, load_ds(ab)); // [d_w · d_a, m · s, ..]
                acc.f[i][j] = L::fma(L::sums(wq, ab.add(A16_QS)), scales, acc.f[i][j]);
                if !F::SIGNED {
                    acc.m[i][j] = _mm_add_ps(acc.m[i][j], scales);
                }
            }
        }
    }
}

/// `NW` weight rows × `NA` activation rows of a [`Tile`], starting at weight row `i0`.
///
/// With a single activation row the blocks alternate between two accumulators per weight row,
/// so consecutive FMAs do not wait on each other — also with two weight rows, so that a row's
/// result never depends on whether it was paired (outputs must not depend on the chunking).
#[inline(always)]
unsafe fn micro<F: Widen, L: Lanes, const NW: usize, const NA: usize>(t: &Tile, i0: usize) {
    unsafe {
        let w = (t.w.add(i0 * t.w_stride), t.w_stride);
        let a = (t.a, t.a_stride);
        let (mut even, mut odd) = (Acc::<L::F, NW, NA>::new(L::zero()), Acc::new(L::zero()));
        let mut b = 0;
        if NA == 1 {
            while b + 1 < t.nb {
                step::<F, L, NW, NA>(b, w, a, &mut even);
                step::<F, L, NW, NA>(b + 1, w, a, &mut odd);
                b += 2;
            }
        }
        while b < t.nb {
            step::<F, L, NW, NA>(b, w, a, &mut even);
            b += 1;
        }
        for i in 0..NW {
            let mut o = [0f32; NA];
            for (j, o) in o.iter_mut().enumerate() {
                *o = L::hsum(L::add(even.f[i][j], odd.f[i][j]));
                if !F::SIGNED {
                    let m = _mm_add_ps(even.m[i][j], odd.m[i][j]);
                    *o += _mm_cvtss_f32(_mm_movehdup_ps(m));
                }
            }
            t.store(i0 + i, &o);
        }
    }
}

/// A whole [`Tile`]: pairs of weight rows for a single activation row (decode: the activation
/// block is loaded once for both), one weight row × `n_a` activation rows otherwise.
#[inline(always)]
pub unsafe fn tile<F: Widen, L: Lanes>(t: &Tile) {
    unsafe {
        match t.n_a {
            1 => {
                let mut i = 0;
                while i + 2 <= t.n_w {
                    micro::<F, L, 2, 1>(t, i);
                    i += 2;
                }
                if i < t.n_w {
                    micro::<F, L, 1, 1>(t, i);
                }
            }
            // No closures here: they would not inherit the target features.
            2 => {
                for i in 0..t.n_w {
                    micro::<F, L, 1, 2>(t, i);
                }
            }
            3 => {
                for i in 0..t.n_w {
                    micro::<F, L, 1, 3>(t, i);
                }
            }
            _ => {
                for i in 0..t.n_w {
                    micro::<F, L, 1, 4>(t, i);
                }
            }
        }
    }
}
