//! A16: tokenmill's activation format for the integer matmuls — 12-bit quants stored as i16 —
//! the partner of the 32-element weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and of the
//! Rows16 K-quants, with its reference quantizer, dequantizer and dot products (the plain
//! twins of the SIMD kernels).
//!
//! Why not ggml's Q8_0 / Q8_1 activations: 8-bit activations (a step of `amax / 127` per block
//! of 32) move the real model's logits too far from the fp32 reference — on SmolLM2-135M
//! Q4_1, teacher-forced top-1 agreement falls to ~0.977 and top-1 logprobs move by up to ~0.3,
//! with the error spread over every matmul (8-bit stays available as the opt-in
//! [A8](super::a8), `--activation-bits 8`, for twice the integer rate). 12-bit quants cut that
//! error 16× for the same
//! integer machinery: `vpmaddwd` (AVX2) / `vpdpwssd` (VNNI) multiply i16 pairs exactly into
//! i32, and the weight quants widen to i16 for free while they are decoded.
//!
//! Why 12 bits and not the full 16 of the storage: a quant `q` in `-2047..=2047` is
//! `16·h + l` with `h = q >> 4` an i8 and `l = q & 15`, so the AMX tier
//! ([`crate::simd::x86::amx`]) computes a block's exact `Σ q·w` for 4-bit weights in *one*
//! full-depth int8 tile product (`[h | l]` against `[16·w ; w]`) and one tile store, where 16
//! bits took two half-depth products and two stores — 1.1–1.5× on its matmuls. Measured on
//! the default model (tests/golden): the top-1 logprob moves by up to 0.0142 instead of 0.0010
//! against the fp32 reference (the golden bar is 0.05), greedy continuations stay 12/12
//! identical, and perplexity on tests/eval/prose.txt (f32 KV) is 18.6121 against 18.6132.
//!
//! Layout of a block of 32 values (72 bytes, alignment 1 like every ggml block):
//! `d: f32` scale, `s: f32 = d · Σ q` (for the offset `m` of Q4_1/Q5_1), `qs: [i16; 32]`, all
//! little-endian. Quantization: `d = amax / 2047` ([`A16_QMAX`]),
//! `q = round_ties_even(x · (1 / d))` (`vcvtps2dq`'s default rounding), `|q| <= 2047`; an
//! all-zero block has `d = 0` and `q = 0`. Error per element: at most half a step `d / 2`
//! plus f32 rounding.
//!
//! Dot products, per block: `sumi = Σ q_w · q_a` exactly in i32 (at most
//! `32 · 128 · 32767 < 2^31` for any i16 quants), then `d_w · d_a · sumi` (`+ m · s` for
//! Q4_1/Q5_1), summed in f32 block by block.

use std::mem::{align_of, size_of};

use super::blocks::{
    Block, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ6_K, BlockQ8_0, QK,
    cast_blocks,
};
use super::types::QK_K;

/// One A16 block: 32 activations as `d · q`, `q: i16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockA16 {
    /// Scale, a little-endian f32.
    pub d: [u8; 4],
    /// `d · Σ q`, a little-endian f32.
    pub s: [u8; 4],
    /// Quants, little-endian i16, in element order.
    pub qs: [[u8; 2]; QK],
}

/// The largest quant magnitude the quantizers write: 12 bits (see the module docs).
pub const A16_QMAX: i16 = 2047;

/// Bytes of one [`BlockA16`].
pub const A16_BYTES: usize = 72;
const _: () = assert!(size_of::<BlockA16>() == A16_BYTES);
const _: () = assert!(align_of::<BlockA16>() == 1);

impl BlockA16 {
    /// The all-zero block.
    pub const ZERO: BlockA16 = BlockA16 {
        d: [0; 4],
        s: [0; 4],
        qs: [[0; 2]; QK],
    };

    /// The scale.
    #[inline]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// `d · Σ q`.
    #[inline]
    pub fn s(&self) -> f32 {
        f32::from_le_bytes(self.s)
    }

    /// The 32 quants.
    #[inline]
    pub fn quants(&self) -> [i16; QK] {
        self.qs.map(i16::from_le_bytes)
    }
}

/// Views `bytes` as A16 blocks in place (any address). Panics unless whole blocks.
pub fn a16_blocks(bytes: &[u8]) -> &[BlockA16] {
    assert!(bytes.len().is_multiple_of(A16_BYTES), "partial A16 block");
    // SAFETY: BlockA16 is repr(C) of byte arrays (alignment 1, no padding, every bit pattern
    // valid, checked above), and the length covers whole blocks of the borrowed bytes.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / A16_BYTES) }
}

/// Views `bytes` as mutable A16 blocks in place. Panics unless whole blocks.
pub fn a16_blocks_mut(bytes: &mut [u8]) -> &mut [BlockA16] {
    assert!(bytes.len().is_multiple_of(A16_BYTES), "partial A16 block");
    // SAFETY: as in `a16_blocks`.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / A16_BYTES) }
}

/// The bytes of A16 blocks.
pub fn a16_as_bytes(blocks: &[BlockA16]) -> &[u8] {
    // SAFETY: plain bytes without padding.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast(), size_of_val(blocks)) }
}

/// `1 / d` for a block of scale `d`, or 0 where that is not finite (an all-zero block, or one
/// so small that `d` is subnormal and its inverse overflows): such a block quantizes to zeros
/// instead of to saturated quants. Shared by every A16 quantizer.
#[inline(always)]
pub fn a16_inverse_scale(d: f32) -> f32 {
    let id = 1.0 / d;
    if d != 0.0 && id.is_finite() { id } else { 0.0 }
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to A16.
pub fn quantize_row_a16(x: &[f32], y: &mut [BlockA16]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / A16_QMAX as f32;
        let id = a16_inverse_scale(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            // |v * id| <= 2047 up to rounding for finite values (a NaN becomes 0); the clamp
            // is the SIMD quantizer's, which keeps every quant a valid pair of AMX digits.
            let qi = ((v * id).round_ties_even() as i32).clamp(-(A16_QMAX as i32), A16_QMAX as i32)
                as i16;
            sum += qi as i32;
            *q = qi.to_le_bytes();
        }
        b.d = d.to_le_bytes();
        b.s = (sum as f32 * d).to_le_bytes();
    }
}

/// `y = q · d`.
pub fn dequantize_row_a16(x: &[BlockA16], dst: &mut [f32]) {
    debug_assert_eq!(dst.len(), QK * x.len());
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d();
        for (y, q) in y.iter_mut().zip(b.quants()) {
            *y = q as f32 * d;
        }
    }
}

/// The weight row as blocks, with the shapes checked.
#[inline]
fn weight_blocks<'a, W: Block>(n: usize, w: &'a [u8], a: &[BlockA16]) -> &'a [W] {
    debug_assert_eq!(n % QK, 0);
    let w: &[W] = cast_blocks(w);
    debug_assert_eq!(w.len(), n / QK);
    debug_assert_eq!(a.len(), w.len());
    w
}

/// `Σ q_w · q_a` of one block, exact in i32.
#[inline]
fn isum<X: Copy + Into<i32>>(w: &[X; QK], a: &BlockA16) -> i32 {
    w.iter()
        .zip(a.quants())
        .map(|(&w, a)| w.into() * a as i32)
        .sum()
}

/// Q4_0 weights · A16 activations.
pub fn vec_dot_q4_0_a16(n: usize, w: &[u8], a: &[BlockA16]) -> f32 {
    let w: &[BlockQ4_0] = weight_blocks(n, w, a);
    let mut sumf = 0f32;
    for (bw, ba) in w.iter().zip(a) {
        sumf += bw.d.to_f32() * ba.d() * isum(&bw.quants(), ba) as f32;
    }
    sumf
}

/// Q4_1 weights · A16 activations.
pub fn vec_dot_q4_1_a16(n: usize, w: &[u8], a: &[BlockA16]) -> f32 {
    let w: &[BlockQ4_1] = weight_blocks(n, w, a);
    let mut sumf = 0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sumi = isum(&bw.quants(), ba);
        sumf += bw.d.to_f32() * ba.d() * sumi as f32 + bw.m.to_f32() * ba.s();
    }
    sumf
}

/// Q5_0 weights · A16 activations.
pub fn vec_dot_q5_0_a16(n: usize, w: &[u8], a: &[BlockA16]) -> f32 {
    let w: &[BlockQ5_0] = weight_blocks(n, w, a);
    let mut sumf = 0f32;
    for (bw, ba) in w.iter().zip(a) {
        sumf += bw.d.to_f32() * ba.d() * isum(&bw.quants(), ba) as f32;
    }
    sumf
}

/// Q5_1 weights · A16 activations.
pub fn vec_dot_q5_1_a16(n: usize, w: &[u8], a: &[BlockA16]) -> f32 {
    let w: &[BlockQ5_1] = weight_blocks(n, w, a);
    let mut sumf = 0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sumi = isum(&bw.quants(), ba);
        sumf += bw.d.to_f32() * ba.d() * sumi as f32 + bw.m.to_f32() * ba.s();
    }
    sumf
}

/// Q4_K weights · A16 activations (8 A16 blocks per weight block): per sub-block `j`,
/// `d·sc_j · d_a · sumi + dmin·m_j · (−s_a)` — the reference of the Rows16 Q4_K kernels (the
/// k-quants otherwise pair with ggml's Q8_K).
#[allow(non_snake_case)]
pub fn vec_dot_q4_K_a16(n: usize, w: &[u8], a: &[BlockA16]) -> f32 {
    debug_assert_eq!(n % QK_K, 0);
    let w: &[BlockQ4_K] = cast_blocks(w);
    debug_assert_eq!(w.len() * (QK_K / QK), a.len());
    let mut sumf = 0f32;
    for (bw, ba) in w.iter().zip(a.chunks_exact(QK_K / QK)) {
        let (q, (sc, m)) = (bw.quants(), bw.scales_mins());
        let (d, dmin) = (bw.d.to_f32(), bw.dmin.to_f32());
        for (j, ba) in ba.iter().enumerate() {
            let qj: &[u8; QK] = q[QK * j..QK * (j + 1)].try_into().unwrap();
            sumf += super::rows16::k4_dot(d, dmin, sc[j], m[j], ba, isum(qj, ba));
        }
    }
    sumf
}

/// Q6_K weights · A16 activations (8 A16 blocks per weight block): per A16 block its two
/// 16-column sub-blocks, `d·sc · d_a · sumi` each — the reference of the Rows16 Q6_K kernels.
#[allow(non_snake_case)]
pub fn vec_dot_q6_K_a16(n: usize, w: &[u8], a: &[BlockA16]) -> f32 {
    debug_assert_eq!(n % QK_K, 0);
    let w: &[BlockQ6_K] = cast_blocks(w);
    debug_assert_eq!(w.len() * (QK_K / QK), a.len());
    let mut sumf = 0f32;
    for (bw, ba) in w.iter().zip(a.chunks_exact(QK_K / QK)) {
        let (q, d) = (bw.quants(), bw.d.to_f32());
        for (j, ba) in ba.iter().enumerate() {
            let qa = ba.quants();
            let half = |h: usize| -> i32 {
                (16 * h..16 * h + 16)
                    .map(|k| q[QK * j + k] as i32 * qa[k] as i32)
                    .sum()
            };
            let sc = [bw.scales[2 * j], bw.scales[2 * j + 1]];
            sumf += super::rows16::k6_dot(d, sc, ba, [half(0), half(1)]);
        }
    }
    sumf
}

/// Q8_0 weights · A16 activations.
pub fn vec_dot_q8_0_a16(n: usize, w: &[u8], a: &[BlockA16]) -> f32 {
    let w: &[BlockQ8_0] = weight_blocks(n, w, a);
    let mut sumf = 0f32;
    for (bw, ba) in w.iter().zip(a) {
        sumf += bw.d.to_f32() * ba.d() * isum(&bw.qs, ba) as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::F16Le;
    use crate::quant::testing::SplitMix64;

    #[test]
    fn quantize_error_is_half_a_step() {
        let mut rng = SplitMix64::new(9);
        let mut x: Vec<f32> = (0..256).map(|_| rng.normal() * 3.0).collect();
        x[..32].fill(0.0);
        let mut y = vec![BlockA16::ZERO; 8];
        quantize_row_a16(&x, &mut y);
        let mut deq = vec![0f32; 256];
        dequantize_row_a16(&y, &mut deq);
        for (xb, (b, db)) in x.chunks(32).zip(y.iter().zip(deq.chunks(32))) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (&a, &q) in xb.iter().zip(db) {
                assert!((a - q).abs() <= amax / A16_QMAX as f32 * 0.5 * (1.0 + 1e-3));
            }
            let sum: i32 = b.quants().iter().map(|&q| q as i32).sum();
            let top = b.quants().iter().map(|q| q.abs()).max().unwrap();
            assert!(
                top == A16_QMAX || amax == 0.0,
                "the block's largest quant is {top}"
            );
            assert_eq!(b.s(), sum as f32 * b.d());
        }
        assert_eq!(y[0], BlockA16::ZERO);
    }

    #[test]
    fn q8_0_by_hand() {
        let mut w = BlockQ8_0::ZERO;
        w.d = F16Le::from_f32(0.5);
        w.qs[0] = -128;
        w.qs[31] = 127;
        let mut a = BlockA16::ZERO;
        a.d = 2f32.to_le_bytes();
        // The dot takes any i16 quants, not only the quantizer's 12 bits.
        a.qs[0] = (-32767i16).to_le_bytes();
        a.qs[31] = 3i16.to_le_bytes();
        let got = vec_dot_q8_0_a16(32, crate::quant::blocks_as_bytes(&[w]), &[a]);
        assert_eq!(got, (128.0 * 32767.0 + 381.0) * 0.5 * 2.0);
    }
}
