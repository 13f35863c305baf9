//! Building blocks shared by the x86 kernels: the one instruction where the tiers differ
//! ([`MulSum`]), f16 scale loads, horizontal sums and the bit unpacking of ggml's formats.
//!
//! Every function here is `#[inline(always)]` *without* `#[target_feature]`: it is only ever
//! inlined into a kernel body, which is itself inlined into a `#[target_feature]` entry point of
//! [`super::tiers`], so the intrinsics compile with that tier's features. Never call these from
//! code that lacks AVX2 + FMA + F16C. For the same reason kernel bodies use no closures
//! (`array::map`, iterator adaptors taking closures): a closure is a separate function without
//! the target features, and its intrinsics would become out-of-line calls.

use std::arch::x86_64::*;

/// `acc + Σ u·s` over each group of four adjacent bytes: unsigned `u` times signed `s`, summed
/// exactly into the eight i32 lanes. The only primitive whose instruction differs by tier.
///
/// The AVX2 form (`maddubs` + `madd`) goes through saturating i16 pair sums, so it is exact as
/// long as `|u_i * s_i + u_{i+1} * s_{i+1}| <= 32767`: true for every caller here (at most
/// `2 * 128 * 127`, because activations are never -128).
pub trait MulSum {
    /// See the trait docs.
    ///
    /// # Safety
    ///
    /// The CPU supports the implementor's instructions (a tier entry point guarantees it).
    unsafe fn mul_sum(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` then `vpmaddwd` with ones.
pub struct Maddubs;

impl MulSum for Maddubs {
    #[inline(always)]
    unsafe fn mul_sum(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe {
            let p16 = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
        }
    }
}

/// AVX-VNNI (VEX encoded `vpdpbusd`).
pub struct AvxVnni;

impl MulSum for AvxVnni {
    #[inline(always)]
    unsafe fn mul_sum(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

/// AVX-512 VNNI + VL (EVEX encoded `vpdpbusd` on 256-bit registers).
pub struct Avx512Vnni;

impl MulSum for Avx512Vnni {
    #[inline(always)]
    unsafe fn mul_sum(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// `acc + Σ a·b` over each pair of adjacent i16 lanes, exactly into the eight i32 lanes: the
/// 16-bit twin of [`MulSum`] for A16 activations. `vpmaddwd` cannot overflow here (a weight
/// quant is at most 128 in magnitude, an A16 quant 2047).
pub trait MulSum16 {
    /// See the trait docs.
    ///
    /// # Safety
    ///
    /// The CPU supports the implementor's instructions (a tier entry point guarantees it).
    unsafe fn mul_sum16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

impl MulSum16 for Maddubs {
    #[inline(always)]
    unsafe fn mul_sum16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
}

impl MulSum16 for AvxVnni {
    #[inline(always)]
    unsafe fn mul_sum16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_dpwssd_avx_epi32(acc, a, b) }
    }
}

impl MulSum16 for Avx512Vnni {
    #[inline(always)]
    unsafe fn mul_sum16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_dpwssd_epi32(acc, a, b) }
    }
}

/// Loads two consecutive little-endian f16 values at `p` (any address) as f32 lanes 0 and 1
/// (lanes 2 and 3 are zero). Reading one f16 this way reads the two bytes after it as well:
/// callers only do so inside a block.
#[inline(always)]
pub unsafe fn load_f16x2(p: *const u8) -> __m128 {
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned())) }
}

/// One little-endian f16 at `p` as f32.
#[inline(always)]
pub unsafe fn load_f16(p: *const u8) -> f32 {
    unsafe {
        let bits = p.cast::<u16>().read_unaligned() as i32;
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }
}

/// A little-endian f32 at `p` (any address).
#[inline(always)]
pub unsafe fn load_f32(p: *const u8) -> f32 {
    unsafe { p.cast::<f32>().read_unaligned() }
}

/// 32 bytes at `p` (any address).
#[inline(always)]
pub unsafe fn load_256(p: *const u8) -> __m256i {
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// Sum of the eight lanes.
#[inline(always)]
pub unsafe fn hsum_ps(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// Sum of the eight i32 lanes (wrapping).
#[inline(always)]
pub unsafe fn hsum_epi32(v: __m256i) -> i32 {
    unsafe {
        hsum_epi32x4(_mm_add_epi32(
            _mm256_castsi256_si128(v),
            _mm256_extracti128_si256(v, 1),
        ))
    }
}

/// Sum of the four i32 lanes (wrapping).
#[inline(always)]
pub unsafe fn hsum_epi32x4(s: __m128i) -> i32 {
    unsafe {
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
        _mm_cvtsi128_si32(s)
    }
}

/// The 16 nibble bytes of a 32-element block at `p` as 32 bytes in element order: byte `j`
/// holds element `j` (low nibble) and `j + 16` (high nibble), so the low nibbles fill the low
/// 128-bit lane and the high nibbles the high lane.
#[inline(always)]
pub unsafe fn nibbles_32(p: *const u8) -> __m256i {
    unsafe {
        let lo = _mm_loadu_si128(p.cast());
        let hi = _mm_srli_epi16(lo, 4);
        _mm256_and_si256(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(0x0F))
    }
}

/// The little-endian u32 at `p` spread over 32 bytes: byte `i` is `0xFF` if bit `i` is set,
/// else `0x00`.
#[inline(always)]
pub unsafe fn bits_to_bytes_32(p: *const u8) -> __m256i {
    unsafe {
        let x = p.cast::<i32>().read_unaligned();
        // Byte i takes source byte i / 8 ...
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(x),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        // ... and keeps bit i % 8: OR-ing every other bit in leaves all ones iff it is set.
        let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1))
    }
}
