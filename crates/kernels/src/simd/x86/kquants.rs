//! SIMD dot products of the k-quant weight formats Q4_K, Q5_K and Q6_K with Q8_K activations.
//!
//! Per 256-element super-block, as ggml's AVX2 kernels (`ggml-cpu/arch/x86/quants.c`), written
//! anew: decode 32 quants at a time to unsigned bytes, `maddubs` them with the activations
//! (pairs of at most `63 · 127 · 2`, no i16 saturation), `madd` the i16 pair sums with the
//! sub-block scale, and sum into eight i32 lanes. The super-block's integer sum is then reduced
//! to one exact i32 and scaled **with exactly the f32 operations of the reference twin**
//! ([`crate::quant::dot`]), so these kernels are bit-identical to it: every product fits i32
//! (`256 · 63 · 127 · 128 < 2^31`), and Q6_K's offset 32 and Q4_K/Q5_K's mins come from Q8_K's
//! exact `bsums`.
//!
//! The sub-block scales need i16 `madd`, which VNNI's `vpdpbusd` cannot replace (a scale times
//! a quant overflows a byte), so every x86 tier shares these bodies; they only differ in the
//! target features they are compiled with. Multi-row calls run the one-row body per row
//! ([`super::tiers`]).

// ggml's names: `q4_K`, `q8_K` keep the capital K of the type names.
#![allow(non_snake_case)]

use std::arch::x86_64::*;

use super::common::{hsum_epi32, hsum_epi32x4, load_256, load_f16, load_f32};
/// Bytes of a Q8_K block: `d(f32) qs[256] bsums[16](i16)`.
const Q8K_BYTES: usize = 292;
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

/// The 8 six-bit scales and 8 mins of a Q4_K / Q5_K block from its 12 packed bytes at `p`
/// (ggml's `get_scale_min_k4`, four sub-blocks per u32).
#[inline(always)]
unsafe fn scales_mins_k4(p: *const u8) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let u: [u32; 3] = unsafe { p.cast::<[u32; 3]>().read_unaligned() };
    let [u0, u1, u2] = u.map(u32::from_le);
    let sc_lo = u0 & LOW6;
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let m_lo = u1 & LOW6;
    let m_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    let join = |lo: u32, hi: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&lo.to_le_bytes());
        out[4..].copy_from_slice(&hi.to_le_bytes());
        out
    };
    (join(sc_lo, sc_hi), join(m_lo, m_hi))
}

/// `Σ_j mins[j] · (bsum[2j] + bsum[2j + 1])` of a Q8_K block at `a`.
#[inline(always)]
unsafe fn mins_dot_bsums(mins: &[u8; 8], a: *const u8) -> i32 {
    unsafe {
        let bsums = load_256(a.add(Q8K_BSUMS));
        let pair_sums = _mm_hadd_epi16(
            _mm256_castsi256_si128(bsums),
            _mm256_extracti128_si256(bsums, 1),
        );
        let mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr().cast()));
        let p = _mm_madd_epi16(mins16, pair_sums);
        hsum_epi32x4(p)
    }
}

/// `sumi + Σ scale · (u · s)` over one 32-element chunk whose 32 quants share `scale`.
#[inline(always)]
unsafe fn scaled_chunk(sumi: __m256i, u: __m256i, s: __m256i, scale: u8) -> __m256i {
    unsafe {
        let p16 = _mm256_maddubs_epi16(u, s);
        let p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(scale as i16));
        _mm256_add_epi32(sumi, p32)
    }
}

/// One row of Q4_K (`d dmin scales[12] qs[128]`, 144 bytes) · Q8_K.
#[inline(always)]
pub unsafe fn q4_K_row(nb: usize, w: *const u8, a: *const u8) -> f32 {
    let mut sumf = 0f32;
    let low4 = unsafe { _mm256_set1_epi8(0x0F) };
    for i in 0..nb {
        unsafe {
            let (wb, ab) = (w.add(144 * i), a.add(Q8K_BYTES * i));
            let (scales, mins) = scales_mins_k4(wb.add(4));
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let q4 = load_256(wb.add(16 + 32 * j));
                let lo = _mm256_and_si256(q4, low4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
                let a_lo = load_256(ab.add(Q8K_QS + 64 * j));
                let a_hi = load_256(ab.add(Q8K_QS + 64 * j + 32));
                sumi = scaled_chunk(sumi, lo, a_lo, scales[2 * j]);
                sumi = scaled_chunk(sumi, hi, a_hi, scales[2 * j + 1]);
            }
            let isum = hsum_epi32(sumi);
            let msum = mins_dot_bsums(&mins, ab);
            let da = load_f32(ab);
            sumf += da * load_f16(wb) * isum as f32 - da * load_f16(wb.add(2)) * msum as f32;
        }
    }
    sumf
}

/// One row of Q5_K (`d dmin scales[12] qh[32] qs[128]`, 176 bytes) · Q8_K.
#[inline(always)]
pub unsafe fn q5_K_row(nb: usize, w: *const u8, a: *const u8) -> f32 {
    let mut sumf = 0f32;
    let (low4, one) = unsafe { (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1)) };
    for i in 0..nb {
        unsafe {
            let (wb, ab) = (w.add(176 * i), a.add(Q8K_BYTES * i));
            let (scales, mins) = scales_mins_k4(wb.add(4));
            // Bit `e / 32` of qh[e % 32] is bit 4 of element e: shift each next bit down.
            let mut qh = load_256(wb.add(16));
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let q4 = load_256(wb.add(48 + 32 * j));
                let lo = _mm256_and_si256(q4, low4);
                let lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
                qh = _mm256_srli_epi16(qh, 1);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
                let hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
                qh = _mm256_srli_epi16(qh, 1);
                let a_lo = load_256(ab.add(Q8K_QS + 64 * j));
                let a_hi = load_256(ab.add(Q8K_QS + 64 * j + 32));
                sumi = scaled_chunk(sumi, lo, a_lo, scales[2 * j]);
                sumi = scaled_chunk(sumi, hi, a_hi, scales[2 * j + 1]);
            }
            let isum = hsum_epi32(sumi);
            let msum = mins_dot_bsums(&mins, ab);
            let da = load_f32(ab);
            sumf += da * load_f16(wb) * isum as f32 - da * load_f16(wb.add(2)) * msum as f32;
        }
    }
    sumf
}

/// One row of Q6_K (`ql[128] qh[64] scales[16](i8) d`, 210 bytes) · Q8_K.
#[inline(always)]
pub unsafe fn q6_K_row(nb: usize, w: *const u8, a: *const u8) -> f32 {
    let mut sumf = 0f32;
    let (low4, bits45) = unsafe { (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30)) };
    for i in 0..nb {
        unsafe {
            let (wb, ab) = (w.add(210 * i), a.add(Q8K_BYTES * i));
            let sc: [i8; 16] = wb.add(192).cast::<[i8; 16]>().read_unaligned();
            let mut sumi = _mm256_setzero_si256();
            for c in 0..2 {
                let ql0 = load_256(wb.add(64 * c));
                let ql1 = load_256(wb.add(64 * c + 32));
                let qh = load_256(wb.add(128 + 32 * c));
                // Element 128c + 32k + l: nibble k / 2 of ql[64c + 32 (k % 2) + l], and bits
                // 2k..2k+2 of qh[32c + l] as bits 4..6 (the quant before its offset 32).
                let q = [
                    (ql0, _mm256_slli_epi16(qh, 4)),
                    (ql1, _mm256_slli_epi16(qh, 2)),
                    (_mm256_srli_epi16(ql0, 4), qh),
                    (_mm256_srli_epi16(ql1, 4), _mm256_srli_epi16(qh, 2)),
                ];
                for (k, (low, high)) in q.into_iter().enumerate() {
                    let u = _mm256_or_si256(
                        _mm256_and_si256(low, low4),
                        _mm256_and_si256(high, bits45),
                    );
                    let s = load_256(ab.add(Q8K_QS + 128 * c + 32 * k));
                    // The first 16 elements are sub-block 8c + 2k, the next 16 the one after.
                    let sub = 8 * c + 2 * k;
                    let scale = _mm256_set_m128i(
                        _mm_set1_epi16(sc[sub + 1] as i16),
                        _mm_set1_epi16(sc[sub] as i16),
                    );
                    let p16 = _mm256_maddubs_epi16(u, s);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scale));
                }
            }
            // Offset: Σ sc · (q - 32) · a = Σ sc · q · a - 32 Σ_j sc_j · bsum_j.
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192).cast()));
            let corr = _mm256_madd_epi16(sc16, load_256(ab.add(Q8K_BSUMS)));
            let isum = hsum_epi32(sumi) - 32 * hsum_epi32(corr);
            sumf += load_f32(ab) * load_f16(wb.add(208)) * isum as f32;
        }
    }
    sumf
}
