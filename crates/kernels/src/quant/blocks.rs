//! ggml's quantized blocks as `#[repr(C)]` Rust types, and safe views of GGUF bytes as blocks.
//!
//! Every block type has exactly ggml's byte layout (`ggml-common.h`, `block_q4_0` ...
//! `block_q8_K`), proven by a compile-time size check, and **alignment 1**: scalars wider than a
//! byte are stored as little-endian byte arrays ([`F16Le`], `[u8; 4]`, `[[u8; 2]; 16]`) and read
//! through accessors. GGUF only aligns a tensor's data to 32 bytes and blocks have odd sizes
//! (18, 22, 34, 110 ... bytes), so block `i` of a tensor is in general not 2- or 4-aligned;
//! alignment 1 is what makes [`cast_blocks`] sound on any `&[u8]`.
//!
//! Invariants of every [`Block`] type (what the `unsafe impl` promises):
//! `#[repr(C)]`, alignment 1, no padding, size == [`GgmlType::type_size`], and every bit pattern
//! is a valid value. All four are checked at compile time except the last, which holds because
//! every field is an integer or an array of integers.
//!
//! Besides the raw fields, each weight block has small decoders (`quants`, `scales`, ...) that
//! unpack its bit layout into plain integers, in element order. The reference dequantizers
//! ([`super::dequant`]) and integer dot products ([`super::dot`]) are both written on top of
//! them, so the bit-twiddling of each format lives in exactly one place; the fixtures from the
//! Python `gguf` package check it.
//!
//! Follows ggml `ggml-common.h` (layouts) and `ggml-quants.c` (element order):
//! <https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-common.h>.

use std::mem::{align_of, size_of};

use half::f16;

use super::types::{GgmlType, QK_K};

/// Elements per block of the 32-element formats (`QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 =
/// QK8_1` in ggml).
pub const QK: usize = 32;
/// Bytes of packed 6-bit scales and mins in a Q3_K / Q4_K / Q5_K block.
pub const K_SCALE_SIZE: usize = 12;

/// An IEEE-754 binary16 value stored as two little-endian bytes (alignment 1).
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    /// Rounds `v` to the nearest f16 (ties to even), as ggml's `GGML_FP32_TO_FP16`.
    #[inline]
    pub fn from_f32(v: f32) -> Self {
        Self(f16::from_f32(v).to_bits().to_le_bytes())
    }

    /// The value as f32 (exact).
    #[inline]
    pub fn to_f32(self) -> f32 {
        f16::from_bits(self.to_bits()).to_f32()
    }

    /// The raw binary16 bits.
    #[inline]
    pub fn to_bits(self) -> u16 {
        u16::from_le_bytes(self.0)
    }

    /// From raw binary16 bits.
    #[inline]
    pub fn from_bits(bits: u16) -> Self {
        Self(bits.to_le_bytes())
    }
}

/// A ggml block type that can be viewed in place from raw bytes.
///
/// # Safety
///
/// Implementors must be `#[repr(C)]` with alignment 1 and no padding, `size_of::<Self>()` must
/// equal `Self::TYPE.type_size()`, and every bit pattern must be a valid value (only integer
/// fields). The `block!` macro below implements it and checks what can be checked at compile
/// time.
pub unsafe trait Block: Copy + 'static {
    /// The ggml type whose block this is.
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK_SIZE: usize;
    /// The all-zero block (for Q8 types: `d = 0`, all quants 0).
    const ZERO: Self;
}

/// Declares a block type's `Block` impl and its compile-time layout checks.
macro_rules! block {
    ($name:ident, $ty:ident, $bytes:expr) => {
        const _: () = assert!(size_of::<$name>() == $bytes);
        const _: () = assert!(align_of::<$name>() == 1);
        const _: () = assert!(GgmlType::$ty.type_size() == $bytes);
        // SAFETY: repr(C), integer fields only, alignment 1 and size checked just above (a
        // repr(C) struct of align-1 fields has no padding).
        unsafe impl Block for $name {
            const TYPE: GgmlType = GgmlType::$ty;
            const BLOCK_SIZE: usize = GgmlType::$ty.block_size();
            // SAFETY: all-zero bytes are a valid value of an integer-only struct.
            const ZERO: Self = unsafe { std::mem::zeroed() };
        }
    };
}

/// Views `bytes` as a slice of blocks, in place.
///
/// Panics if `bytes.len()` is not a whole number of blocks. Works at any address: block types
/// have alignment 1 (checked at compile time here as well).
#[inline]
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    const { assert!(align_of::<B>() == 1) };
    let size = size_of::<B>();
    assert!(
        bytes.len().is_multiple_of(size),
        "{} bytes is not a whole number of {} blocks",
        bytes.len(),
        B::TYPE
    );
    // SAFETY: B has alignment 1, no padding and no invalid bit patterns (the `Block` contract),
    // and the length covers exactly `len / size` blocks of the borrowed bytes.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) }
}

/// Views `bytes` as a mutable slice of blocks, in place. Panics as [`cast_blocks`].
#[inline]
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    const { assert!(align_of::<B>() == 1) };
    let size = size_of::<B>();
    assert!(
        bytes.len().is_multiple_of(size),
        "{} bytes is not a whole number of {} blocks",
        bytes.len(),
        B::TYPE
    );
    // SAFETY: as in `cast_blocks`; every bit pattern written through the result is valid bytes.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size) }
}

/// The bytes of `blocks` (ggml's on-disk layout).
#[inline]
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: B is plain bytes without padding (the `Block` contract).
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
}

/// `Q4_0`: 32 weights `d * (q - 8)`, `q` in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: F16Le,
    /// Byte `j` holds element `j` (low nibble) and element `j + 16` (high nibble).
    pub qs: [u8; QK / 2],
}
block!(BlockQ4_0, Q4_0, 18);

/// `Q4_1`: 32 weights `d * q + m`, `q` in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: F16Le,
    /// Offset (the block minimum).
    pub m: F16Le,
    /// Nibbles, as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
block!(BlockQ4_1, Q4_1, 20);

/// `Q5_0`: 32 weights `d * (q - 16)`, `q` in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: F16Le,
    /// Little-endian u32: bit `i` is bit 4 of element `i`.
    pub qh: [u8; 4],
    /// Low 4 bits, as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
block!(BlockQ5_0, Q5_0, 22);

/// `Q5_1`: 32 weights `d * q + m`, `q` in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: F16Le,
    /// Offset (the block minimum).
    pub m: F16Le,
    /// High bits, as in [`BlockQ5_0`].
    pub qh: [u8; 4],
    /// Low 4 bits, as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
block!(BlockQ5_1, Q5_1, 24);

/// `Q8_0`: 32 values `d * q`, `q` in -127..=127 (-128 is never produced but decodes fine).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: F16Le,
    /// Quants, in element order.
    pub qs: [i8; QK],
}
block!(BlockQ8_0, Q8_0, 34);

/// `Q8_1`: as [`BlockQ8_0`] plus `s = d * sum(qs)`, the activation partner of Q4_1 / Q5_1
/// (whose offsets `m` multiply the sum of the activations).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: F16Le,
    /// `d * sum(qs)`, rounded to f16.
    pub s: F16Le,
    /// Quants, in element order.
    pub qs: [i8; QK],
}
block!(BlockQ8_1, Q8_1, 36);

/// `Q2_K`: 256 weights in 16 sub-blocks of 16: `d * sc * q - dmin * m`, `q` in 0..4, 4-bit
/// `sc` and `m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2_K {
    /// Sub-block `j`: scale in the low nibble, min in the high nibble.
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants; see [`BlockQ2_K::quants`] for the order.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales.
    pub d: F16Le,
    /// Super-block scale of the mins.
    pub dmin: F16Le,
}
block!(BlockQ2_K, Q2_K, 84);

/// `Q3_K`: 256 weights in 16 sub-blocks of 16: `d * (sc - 32) * q`, `q` in -4..4, 6-bit `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3_K {
    /// High bits; a *clear* bit subtracts 4 (see [`BlockQ3_K::quants`]).
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits.
    pub qs: [u8; QK_K / 4],
    /// 16 packed 6-bit scales (see [`BlockQ3_K::scales`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Super-block scale.
    pub d: F16Le,
}
block!(BlockQ3_K, Q3_K, 110);

/// `Q4_K`: 256 weights in 8 sub-blocks of 32: `d * sc * q - dmin * m`, `q` in 0..16, 6-bit
/// `sc` and `m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_K {
    /// Super-block scale of the scales.
    pub d: F16Le,
    /// Super-block scale of the mins.
    pub dmin: F16Le,
    /// 8 scales and 8 mins, 6 bits each (see [`get_scale_min_k4`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Nibbles; see [`BlockQ4_K::quants`] for the order.
    pub qs: [u8; QK_K / 2],
}
block!(BlockQ4_K, Q4_K, 144);

/// `Q5_K`: as [`BlockQ4_K`] with a fifth bit per weight, `q` in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_K {
    /// Super-block scale of the scales.
    pub d: F16Le,
    /// Super-block scale of the mins.
    pub dmin: F16Le,
    /// 8 scales and 8 mins, 6 bits each (see [`get_scale_min_k4`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits; see [`BlockQ5_K::quants`].
    pub qh: [u8; QK_K / 8],
    /// Low nibbles, as in [`BlockQ4_K`].
    pub qs: [u8; QK_K / 2],
}
block!(BlockQ5_K, Q5_K, 176);

/// `Q6_K`: 256 weights in 16 sub-blocks of 16: `d * sc * (q - 32)`, `q` in 0..64, i8 `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6_K {
    /// Low 4 bits; see [`BlockQ6_K::quants`].
    pub ql: [u8; QK_K / 2],
    /// High 2 bits.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: F16Le,
}
block!(BlockQ6_K, Q6_K, 210);

/// `Q8_K`: 256 activations `d * q` with an f32 scale and the sums of each 16 quants, the
/// activation partner of every k-quant.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_K {
    /// Scale, a little-endian f32 (see [`BlockQ8_K::d`]).
    pub d: [u8; 4],
    /// Quants, in element order.
    pub qs: [i8; QK_K],
    /// Little-endian i16 sums of `qs[16 * j..16 * j + 16]` (see [`BlockQ8_K::bsum`]).
    pub bsums: [[u8; 2]; QK_K / 16],
}
block!(BlockQ8_K, Q8_K, 292);

// ---------------------------------------------------------------------------------------------
// Decoders: unpack each layout into integers in element order.
// ---------------------------------------------------------------------------------------------

/// Splits a 16-byte nibble array into 32 values: byte `j` gives element `j` (low nibble) and
/// element `j + 16` (high nibble).
#[inline]
fn nibbles_32(qs: &[u8; QK / 2]) -> [u8; QK] {
    std::array::from_fn(|i| {
        if i < QK / 2 {
            qs[i] & 0x0F
        } else {
            qs[i - QK / 2] >> 4
        }
    })
}

/// Adds bit `i` of the little-endian u32 `qh` as bit 4 of element `i`.
#[inline]
fn with_high_bits_32(low: [u8; QK], qh: [u8; 4]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    std::array::from_fn(|i| low[i] | ((((qh >> i) & 1) as u8) << 4))
}

impl BlockQ4_0 {
    /// The 32 signed quants `q - 8`, in -8..8.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        nibbles_32(&self.qs).map(|q| q as i8 - 8)
    }
}

impl BlockQ4_1 {
    /// The 32 quants, in 0..16.
    #[inline]
    pub fn quants(&self) -> [u8; QK] {
        nibbles_32(&self.qs)
    }
}

impl BlockQ5_0 {
    /// The 32 signed quants `q - 16`, in -16..16.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        with_high_bits_32(nibbles_32(&self.qs), self.qh).map(|q| q as i8 - 16)
    }
}

impl BlockQ5_1 {
    /// The 32 quants, in 0..32.
    #[inline]
    pub fn quants(&self) -> [u8; QK] {
        with_high_bits_32(nibbles_32(&self.qs), self.qh)
    }
}

impl BlockQ8_K {
    /// The scale.
    #[inline]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// The sum of quants `16 * j .. 16 * j + 16`.
    #[inline]
    pub fn bsum(&self, j: usize) -> i16 {
        i16::from_le_bytes(self.bsums[j])
    }
}

impl BlockQ2_K {
    /// The 256 quants, in 0..4. Element `128 * c + 32 * j + l` is bits `2j..2j+2` of
    /// `qs[32 * c + l]`.
    #[inline]
    pub fn quants(&self) -> [u8; QK_K] {
        std::array::from_fn(|e| {
            let (c, j, l) = (e / 128, (e / 32) % 4, e % 32);
            (self.qs[32 * c + l] >> (2 * j)) & 3
        })
    }
}

impl BlockQ3_K {
    /// The 256 signed quants, in -4..4. Element `e = 128 * c + 32 * j + l` takes its low 2
    /// bits as Q2_K does and subtracts 4 unless bit `e / 32` of `hmask[l]` is set.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let (c, j, l) = (e / 128, (e / 32) % 4, e % 32);
            let low = ((self.qs[32 * c + l] >> (2 * j)) & 3) as i8;
            let high_set = self.hmask[l] & (1 << (e / 32)) != 0;
            if high_set { low } else { low - 4 }
        })
    }

    /// The 16 sub-block scales `sc - 32`, in -32..32. Scale `j` has its low 4 bits in the
    /// low (`j < 8`) or high (`j >= 8`) nibble of byte `j % 8`, and its high 2 bits at bits
    /// `2 * (j / 4)` of byte `8 + j % 4`.
    #[inline]
    pub fn scales(&self) -> [i8; QK_K / 16] {
        let s = &self.scales;
        std::array::from_fn(|j| {
            let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
            let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K / Q5_K block
/// (ggml `get_scale_min_k4`): for `j < 4` the low 6 bits of bytes `j` and `j + 4`; for
/// `j >= 4` a nibble of byte `j + 4` plus the top 2 bits of bytes `j - 4` and `j`.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (sc, m)
    }
}

/// All 8 (scale, min) pairs of a Q4_K / Q5_K block, each in 0..64.
#[inline]
fn scales_mins_k4(q: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let pairs: [(u8, u8); 8] = std::array::from_fn(|j| get_scale_min_k4(j, q));
    (pairs.map(|p| p.0), pairs.map(|p| p.1))
}

/// Nibbles of a k-quant: element `64 * c + 32 * h + l` is nibble `h` of `qs[32 * c + l]`.
#[inline]
fn nibbles_k(qs: &[u8; QK_K / 2]) -> [u8; QK_K] {
    std::array::from_fn(|e| {
        let (c, h, l) = (e / 64, (e / 32) % 2, e % 32);
        (qs[32 * c + l] >> (4 * h)) & 0x0F
    })
}

impl BlockQ4_K {
    /// The 256 quants, in 0..16; sub-block `e / 32`.
    #[inline]
    pub fn quants(&self) -> [u8; QK_K] {
        nibbles_k(&self.qs)
    }

    /// The 8 sub-block scales and mins, each in 0..64.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        scales_mins_k4(&self.scales)
    }
}

impl BlockQ5_K {
    /// The 256 quants, in 0..32: the Q4_K nibble plus bit `e / 32` of `qh[e % 32]` as bit 4.
    #[inline]
    pub fn quants(&self) -> [u8; QK_K] {
        let low = nibbles_k(&self.qs);
        std::array::from_fn(|e| low[e] | (((self.qh[e % 32] >> (e / 32)) & 1) << 4))
    }

    /// The 8 sub-block scales and mins, each in 0..64.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        scales_mins_k4(&self.scales)
    }
}

impl BlockQ6_K {
    /// The 256 signed quants `q - 32`, in -32..32; sub-block `e / 16`. Element
    /// `128 * c + 32 * k + l` takes nibble `k / 2` of `ql[64 * c + 32 * (k % 2) + l]` and bits
    /// `2k..2k+2` of `qh[32 * c + l]`.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let (c, k, l) = (e / 128, (e / 32) % 4, e % 32);
            let low = (self.ql[64 * c + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
            let high = (self.qh[32 * c + l] >> (2 * k)) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_works_at_odd_addresses() {
        let bytes: Vec<u8> = (0..1 + 2 * 18).map(|i| i as u8).collect();
        let blocks: &[BlockQ4_0] = cast_blocks(&bytes[1..]);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[1].d.0, [19, 20]);
        assert_eq!(blocks_as_bytes(blocks), &bytes[1..]);
    }

    #[test]
    #[should_panic(expected = "whole number")]
    fn cast_rejects_partial_blocks() {
        let _ = cast_blocks::<BlockQ8_0>(&[0u8; 35]);
    }

    #[test]
    fn f16_round_trip() {
        for v in [0.0f32, -0.0, 1.0, -2.5, 65504.0, 6.1035156e-5, 5.9604645e-8] {
            assert_eq!(F16Le::from_f32(v).to_f32().to_bits(), v.to_bits());
        }
        assert_eq!(F16Le::from_f32(1.0).0, [0x00, 0x3C]);
    }

    #[test]
    fn get_scale_min_k4_unpacks_six_bits() {
        // Sub-block j: scale 10 + j, min 40 + j, packed as ggml's quantize_row_q4_K_ref does.
        let (ls, lm): ([u8; 8], [u8; 8]) = (
            std::array::from_fn(|j| 10 + j as u8),
            std::array::from_fn(|j| 40 + j as u8),
        );
        let mut q = [0u8; K_SCALE_SIZE];
        for j in 0..8 {
            if j < 4 {
                q[j] = ls[j];
                q[j + 4] = lm[j];
            } else {
                q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
                q[j - 4] |= (ls[j] >> 4) << 6;
                q[j] |= (lm[j] >> 4) << 6;
            }
        }
        assert_eq!(scales_mins_k4(&q), (ls, lm));
    }

    #[test]
    fn q3_k_scales_and_signs() {
        let mut b = BlockQ3_K::ZERO;
        // All scale bits zero -> every scale is -32; hmask zero -> every quant is low - 4.
        assert_eq!(b.scales(), [-32; 16]);
        assert_eq!(b.quants(), [-4; QK_K]);
        b.hmask = [0xFF; 32];
        b.qs = [0xFF; 64];
        b.scales = [0xFF; 12];
        assert_eq!(b.scales(), [31; 16]);
        assert_eq!(b.quants(), [3; QK_K]);
    }
}
