//! SIMD dot products of the 32-element weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with
//! Q8_0 / Q8_1 activations, one weight row against up to [`MAX_ROWS`] activation rows.
//!
//! Per block, as ggml's AVX2 kernels (`ggml-cpu/arch/x86/quants.c`), written anew:
//! * decode the weight block to 32 bytes in element order ([`Fmt32::decode`]) — once per block,
//!   shared by every activation row;
//! * signed formats (Q4_0, Q5_0, Q8_0; partner Q8_0) use the sign trick `|w| · sign(a, w)` so
//!   the unsigned × signed [`MulSum`] applies; unsigned formats (Q4_1, Q5_1; partner Q8_1) feed
//!   their quants directly and add `m · s` from the Q8_1 block sum;
//! * the exact i32 lane sums are converted to f32 and accumulated with one FMA by
//!   `d_w · d_a`, alternating between two accumulators so consecutive blocks do not wait on
//!   each other's FMA latency.
//!
//! The i32 lanes hold sums of four products (at most `4 · 128 · 127`), so the conversion to
//! f32 is exact; only the f32 accumulation differs from the reference twin.

use std::arch::x86_64::*;

use super::common::{MulSum, bits_to_bytes_32, hsum_ps, load_256, load_f16x2, nibbles_32};
use crate::simd::{MAX_ROWS, Tile};

/// A 32-element weight format, as the kernels see it.
pub trait Fmt32 {
    /// Bytes of one block.
    const W_BYTES: usize;
    /// Signed quants without offset (pairs with Q8_0), or unsigned quants with an offset `m`
    /// (pairs with Q8_1).
    const SIGNED: bool;
    /// The block at `p`: its 32 quants in element order (i8 if `SIGNED`, else u8) and
    /// `[d, m, _, _]` as f32 (lane 1 is meaningless for signed formats).
    ///
    /// # Safety
    ///
    /// `p` is valid for reads of one block; AVX2 + F16C available.
    unsafe fn decode(p: *const u8) -> (__m256i, __m128);
}

/// Q4_0: `d(f16) qs[16]`, quants `nibble - 8`.
pub struct Q4_0;
/// Q4_1: `d(f16) m(f16) qs[16]`, quants `nibble`.
pub struct Q4_1;
/// Q5_0: `d(f16) qh[4] qs[16]`, quants `nibble | bit << 4` minus 16.
pub struct Q5_0;
/// Q5_1: `d(f16) m(f16) qh[4] qs[16]`, quants `nibble | bit << 4`.
pub struct Q5_1;
/// Q8_0: `d(f16) qs[32]`.
pub struct Q8_0;

impl Fmt32 for Q4_0 {
    const W_BYTES: usize = 18;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, __m128) {
        unsafe {
            let q = _mm256_sub_epi8(nibbles_32(p.add(2)), _mm256_set1_epi8(8));
            (q, load_f16x2(p))
        }
    }
}

impl Fmt32 for Q4_1 {
    const W_BYTES: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, __m128) {
        unsafe { (nibbles_32(p.add(4)), load_f16x2(p)) }
    }
}

impl Fmt32 for Q5_0 {
    const W_BYTES: usize = 22;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, __m128) {
        unsafe {
            // A clear fifth bit means `nibble - 16`, i.e. the byte `0xF0 | nibble`.
            let high = _mm256_andnot_si256(bits_to_bytes_32(p.add(2)), _mm256_set1_epi8(-16));
            (_mm256_or_si256(nibbles_32(p.add(6)), high), load_f16x2(p))
        }
    }
}

impl Fmt32 for Q5_1 {
    const W_BYTES: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, __m128) {
        unsafe {
            let high = _mm256_and_si256(bits_to_bytes_32(p.add(4)), _mm256_set1_epi8(0x10));
            (_mm256_or_si256(nibbles_32(p.add(8)), high), load_f16x2(p))
        }
    }
}

impl Fmt32 for Q8_0 {
    const W_BYTES: usize = 34;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, __m128) {
        unsafe { (load_256(p.add(2)), load_f16x2(p)) }
    }
}

/// Per activation row: the f32 sum of `d_w · d_a · sumi` lanes and, lane 1, `Σ m · s`.
#[derive(Clone, Copy)]
struct Acc<const NA: usize> {
    f: [__m256; NA],
    m: [__m128; NA],
}

impl<const NA: usize> Acc<NA> {
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe {
            Self {
                f: [_mm256_setzero_ps(); NA],
                m: [_mm_setzero_ps(); NA],
            }
        }
    }
}

/// Accumulates weight block `b` against block `b` of every activation row into `acc`.
#[inline(always)]
unsafe fn step<F: Fmt32, M: MulSum, const NA: usize>(
    b: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    acc: &mut Acc<NA>,
) {
    // Q8_0: `d(f16) qs[32]`; Q8_1: `d(f16) s(f16) qs[32]`.
    let (a_bytes, a_qs) = if F::SIGNED { (34, 2) } else { (36, 4) };
    unsafe {
        let (q, dm) = F::decode(w.add(b * F::W_BYTES));
        let uq = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
        for j in 0..NA {
            let ab = a.add(j * a_stride + b * a_bytes);
            let qa = load_256(ab.add(a_qs));
            let sa = if F::SIGNED {
                _mm256_sign_epi8(qa, q)
            } else {
                qa
            };
            let sumi = M::mul_sum(_mm256_setzero_si256(), uq, sa);
            // [d_w · d_a, m · s, ..]
            let scales = _mm_mul_ps(dm, load_f16x2(ab));
            acc.f[j] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(sumi),
                _mm256_broadcastss_ps(scales),
                acc.f[j],
            );
            if !F::SIGNED {
                acc.m[j] = _mm_add_ps(acc.m[j], scales);
            }
        }
    }
}

/// `out[j] = vec_dot(w, a_j)` for `j < NA`: one weight row of a [`Tile`].
#[inline(always)]
pub unsafe fn dot_rows<F: Fmt32, M: MulSum, const NA: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    out: &mut [f32; MAX_ROWS],
) {
    unsafe {
        let (mut even, mut odd) = (Acc::<NA>::zero(), Acc::<NA>::zero());
        let mut b = 0;
        while b + 1 < nb {
            step::<F, M, NA>(b, w, a, a_stride, &mut even);
            step::<F, M, NA>(b + 1, w, a, a_stride, &mut odd);
            b += 2;
        }
        if b < nb {
            step::<F, M, NA>(b, w, a, a_stride, &mut even);
        }
        for (j, o) in out.iter_mut().enumerate().take(NA) {
            let mut sum = hsum_ps(_mm256_add_ps(even.f[j], odd.f[j]));
            if !F::SIGNED {
                let m = _mm_add_ps(even.m[j], odd.m[j]);
                sum += _mm_cvtss_f32(_mm_movehdup_ps(m));
            }
            *o = sum;
        }
    }
}

/// A whole [`Tile`]: [`dot_rows`] per weight row, for a run-time row count.
#[inline(always)]
pub unsafe fn tile<F: Fmt32, M: MulSum>(t: &Tile) {
    unsafe {
        match t.n_a {
            1 => tile_na::<F, M, 1>(t),
            2 => tile_na::<F, M, 2>(t),
            3 => tile_na::<F, M, 3>(t),
            _ => tile_na::<F, M, 4>(t),
        }
    }
}

#[inline(always)]
unsafe fn tile_na<F: Fmt32, M: MulSum, const NA: usize>(t: &Tile) {
    for i in 0..t.n_w {
        let mut o = [0f32; MAX_ROWS];
        unsafe {
            dot_rows::<F, M, NA>(t.nb, t.w.add(i * t.w_stride), t.a, t.a_stride, &mut o);
            t.store(i, &o[..NA]);
        }
    }
}
