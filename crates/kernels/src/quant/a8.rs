//! A8: tokenmill's 8-bit activation format, the opt-in partner of the Rows16 Q4_0 / Q4_1 / Q8_0
//! weights (`--activation-bits 8`), with its reference quantizer and dequantizer. The Rows16
//! reference dot is [`crate::quant::rows16::vec_dot_a8`].
//!
//! Why: A16's 12-bit quants multiply with `vpdpwssd` (two i16 pairs a lane); 8-bit quants
//! multiply with `vpdpbusd` (four u8 × i8 products a lane), twice the multiply-adds per
//! instruction — the rate llama.cpp's and OpenVINO's 8-bit activations run at. The price is
//! fidelity: a step of `amax / 127` per block of 32 instead of `amax / 2047` (A16's module
//! docs give what that does to the default model's logits). A16 stays the default.
//!
//! Layout of a block of 32 values (44 bytes, alignment 1): `d: f32` scale, `s: f32 = d · Σ q`
//! (for Q4_1's offset), `sum: i32 = Σ q` (for the offsets of Q4_0 and Q8_0, exact), `qs: [i8;
//! 32]`, all little-endian. The quants are in **pair order**, the order a Rows16 nibble chunk
//! widens into: bytes `4c..4c + 4` hold columns `2c, 2c + 1, 16 + 2c, 17 + 2c` (`c < 8`), so
//! one broadcast dword meets one 32-bit lane of (row, those four columns).
//!
//! Quantization: `d = amax / 127`, `q = round_ties_even(x · (1 / d))` clamped to ±127; an
//! all-zero block (or one whose `1 / d` is not finite) has `q = 0`. Error per element: at most
//! half a step `d / 2` plus f32 rounding.

use std::mem::{align_of, size_of};

use super::a16::a16_inverse_scale;
use super::blocks::QK;

/// One A8 block: 32 activations as `d · q`, `q: i8`, in pair order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockA8 {
    /// Scale, a little-endian f32.
    pub d: [u8; 4],
    /// `d · Σ q`, a little-endian f32.
    pub s: [u8; 4],
    /// `Σ q`, a little-endian i32.
    pub sum: [u8; 4],
    /// Quants (i8) in pair order ([`a8_column`]).
    pub qs: [u8; QK],
}

/// The largest quant magnitude.
pub const A8_QMAX: i32 = 127;

/// Bytes of one [`BlockA8`].
pub const A8_BYTES: usize = 44;
/// Offset of the quants in a block.
pub const A8_QS: usize = 12;
const _: () = assert!(size_of::<BlockA8>() == A8_BYTES);
const _: () = assert!(align_of::<BlockA8>() == 1);

/// The column of a block that quant byte `p` holds (pair order).
#[inline]
pub const fn a8_column(p: usize) -> usize {
    let (c, e) = (p / 4, p % 4);
    if e < 2 { 2 * c + e } else { 16 + 2 * c + e - 2 }
}

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

    /// `Σ q`.
    #[inline]
    pub fn sum(&self) -> i32 {
        i32::from_le_bytes(self.sum)
    }

    /// The 32 quants in column order.
    pub fn quants(&self) -> [i32; QK] {
        let mut q = [0; QK];
        for (p, &b) in self.qs.iter().enumerate() {
            q[a8_column(p)] = b as i8 as i32;
        }
        q
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
        let mut sum = 0i32;
        for (p, q) in b.qs.iter_mut().enumerate() {
            // A NaN becomes 0 (`as` saturates and maps NaN to 0).
            let qi = ((x[a8_column(p)] * id).round_ties_even() as i32).clamp(-A8_QMAX, A8_QMAX);
            sum += qi;
            *q = qi as i8 as u8;
        }
        b.d = d.to_le_bytes();
        b.s = (sum as f32 * d).to_le_bytes();
        b.sum = sum.to_le_bytes();
    }
}

/// `y = q · d`, in column order.
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
    fn pair_order_is_a_permutation() {
        let mut seen = [false; QK];
        for p in 0..QK {
            assert!(!seen[a8_column(p)], "column {} twice", a8_column(p));
            seen[a8_column(p)] = true;
        }
        assert_eq!(
            (0..8).map(a8_column).collect::<Vec<_>>(),
            [0, 1, 16, 17, 2, 3, 18, 19]
        );
    }

    #[test]
    fn quantize_error_is_half_a_step_and_sums_agree() {
        let mut rng = SplitMix64::new(8);
        let x: Vec<f32> = (0..4 * QK).map(|_| rng.next_f32() * 6.0 - 3.0).collect();
        let mut y = [BlockA8 {
            d: [0; 4],
            s: [0; 4],
            sum: [0; 4],
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
            assert_eq!(b.sum(), b.quants().iter().sum::<i32>());
            assert_eq!(b.s(), b.sum() as f32 * b.d());
        }
    }

    #[test]
    fn zero_and_nan_blocks_quantize_to_zero() {
        let mut y = [BlockA8 {
            d: [1; 4],
            s: [1; 4],
            sum: [1; 4],
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
