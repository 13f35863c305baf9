//! A8: tokenmill's 8-bit activation format, the opt-in partner of the Rows16 weights
//! (`--activation-bits 8`), with its reference quantizer and dequantizer. The Rows16
//! reference dot is [`crate::quant::rows16::vec_dot_a8`].
//!
//! Why: A16's 12-bit quants multiply with `vpdpwssd` (two i16 pairs a lane); 8-bit quants
//! multiply with `vpdpbusd` (four u8 × i8 products a lane), twice the multiply-adds per
//! instruction — the rate llama.cpp's and OpenVINO's 8-bit activations run at. On AVX2,
//! `vpmaddubsw` makes 32 such products an instruction against `vpmaddwd`'s 16. The price is
//! fidelity: a step of `amax / 127` per block of 32 instead of `amax / 2047` (A16's module
//! docs give what that does to the default model's logits). A16 stays the default.
//!
//! Layout of a block of 32 values (44 bytes, alignment 1): `d: f32` scale, `s: f32 = d · Σ q`
//! (for the offsets of Q4_1 and Q4_K), `sums: [i16; 2]`, the exact `Σ q` of columns 0..16 and
//! 16..32 (for the zero points of Q4_0, Q5_0, Q8_0 and each 16-column half of Q6_K),
//! `qs: [i8; 32]` in column order, all little-endian.
//!
//! Quantization: `d = amax / 127`, `q = round_ties_even(x · (1 / d))` clamped to ±127; an
//! all-zero block (or one whose `1 / d` is not finite) has `q = 0`. Error per element: at most
//! half a step `d / 2` plus f32 rounding.

use std::mem::{align_of, size_of};

use super::a16::a16_inverse_scale;
use super::blocks::QK;

/// One A8 block: 32 activations as `d · q`, `q: i8`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockA8 {
    /// Scale, a little-endian f32.
    pub d: [u8; 4],
    /// `d · Σ q`, a little-endian f32.
    pub s: [u8; 4],
    /// `Σ q` of columns 0..16 and 16..32, little-endian i16s.
    pub sums: [u8; 4],
    /// Quants (i8), in column order.
    pub qs: [u8; QK],
}

/// The largest quant magnitude.
pub const A8_QMAX: i32 = 127;

/// Bytes of one [`BlockA8`].
pub const A8_BYTES: usize = 44;
/// Offset of the half sums in a block.
pub const A8_SUMS: usize = 8;
/// Offset of the quants in a block.
pub const A8_QS: usize = 12;
const _: () = assert!(size_of::<BlockA8>() == A8_BYTES);
const _: () = assert!(align_of::<BlockA8>() == 1);

impl BlockA8 {
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

    /// `Σ q` of columns 0..16 and of 16..32.
    #[inline]
    pub fn half_sums(&self) -> [i32; 2] {
        [
            i16::from_le_bytes([self.sums[0], self.sums[1]]) as i32,
            i16::from_le_bytes([self.sums[2], self.sums[3]]) as i32,
        ]
    }

    /// `Σ q`.
    #[inline]
    pub fn sum(&self) -> i32 {
        self.half_sums().iter().sum()
    }

    /// The 32 quants.
    pub fn quants(&self) -> [i32; QK] {
        self.qs.map(|b| b as i8 as i32)
    }
}

/// Views `bytes` as A8 blocks in place (any address). Panics unless whole blocks.
pub fn a8_blocks(bytes: &[u8]) -> &[BlockA8] {
    assert!(bytes.len().is_multiple_of(A8_BYTES), "partial A8 block");
    // SAFETY: BlockA8 is repr(C) of byte arrays (alignment 1, no padding, every bit pattern
    // valid, checked above), and the length covers whole blocks of the borrowed bytes.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / A8_BYTES) }
}

/// Views `bytes` as mutable A8 blocks in place. Panics unless whole blocks.
pub fn a8_blocks_mut(bytes: &mut [u8]) -> &mut [BlockA8] {
    assert!(bytes.len().is_multiple_of(A8_BYTES), "partial A8 block");
    // SAFETY: as in `a8_blocks`.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / A8_BYTES) }
}

/// Quantizes `x` (`x.len() == 32 * y.len()`) to A8.
pub fn quantize_row_a8(x: &[f32], y: &mut [BlockA8]) {
    debug_assert_eq!(x.len(), QK * y.len());
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / A8_QMAX as f32;
        let id = a16_inverse_scale(d);
        let mut sums = [0i32; 2];
        for (i, (q, &v)) in b.qs.iter_mut().zip(x).enumerate() {
            // A NaN becomes 0 (`as` saturates and maps NaN to 0).
            let qi = ((v * id).round_ties_even() as i32).clamp(-A8_QMAX, A8_QMAX);
            sums[i / 16] += qi;
            *q = qi as i8 as u8;
        }
        b.d = d.to_le_bytes();
        b.s = ((sums[0] + sums[1]) as f32 * d).to_le_bytes();
        let [lo, hi] = sums.map(|s| (s as i16).to_le_bytes());
        b.sums = [lo[0], lo[1], hi[0], hi[1]];
    }
}

/// `y = q · d`.
pub fn dequantize_row_a8(x: &[BlockA8], dst: &mut [f32]) {
    debug_assert_eq!(dst.len(), QK * x.len());
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d();
        for (y, q) in y.iter_mut().zip(b.quants()) {
            *y = q as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::SplitMix64;

    #[test]
    fn quantize_error_is_half_a_step_and_sums_agree() {
        let mut rng = SplitMix64::new(8);
        let x: Vec<f32> = (0..4 * QK).map(|_| rng.next_f32() * 6.0 - 3.0).collect();
        let mut y = [BlockA8 {
            d: [0; 4],
            s: [0; 4],
            sums: [0; 4],
            qs: [0; QK],
        }; 4];
        quantize_row_a8(&x, &mut y);
        let mut back = vec![0f32; x.len()];
        dequantize_row_a8(&y, &mut back);
        for (b, (xs, bs)) in y.iter().zip(x.chunks(QK).zip(back.chunks(QK))) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                b.quants().iter().any(|q| q.abs() == 127),
                "amax maps to ±127"
            );
            for (v, r) in xs.iter().zip(bs) {
                assert!(
                    (v - r).abs() <= amax / 127.0 * 0.5 + 1e-6,
                    "{v} came back as {r}"
                );
            }
            let q = b.quants();
            assert_eq!(
                b.half_sums(),
                [q[..16].iter().sum::<i32>(), q[16..].iter().sum::<i32>()]
            );
            assert_eq!(b.s(), b.sum() as f32 * b.d());
        }
    }

    #[test]
    fn zero_and_nan_blocks_quantize_to_zero() {
        let mut y = [BlockA8 {
            d: [1; 4],
            s: [1; 4],
            sums: [1; 4],
            qs: [1; QK],
        }];
        quantize_row_a8(&[0.0; QK], &mut y);
        assert_eq!((y[0].d(), y[0].sum(), y[0].quants()), (0.0, 0, [0; QK]));
        let mut x = [1.0f32; QK];
        x[5] = f32::NAN;
        quantize_row_a8(&x, &mut y);
        assert!(y[0].quants().iter().all(|q| (0..=127).contains(q)));
    }
}
