//! Reference (plain scalar) dequantizers: GGUF bytes of any supported type to f32.
//!
//! [`dequantize_row`] dispatches on [`GgmlType`]; the per-type functions take typed blocks.
//! Each follows ggml's `dequantize_row_*` in `ggml-quants.c`
//! (<https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-quants.c>) *including
//! the order of the f32 operations*: e.g. Q4_K computes `d1 = d * sc`, `m1 = dmin * m` once per
//! sub-block and then `d1 * q - m1`. With IEEE-754 f32 arithmetic and no FMA contraction (Rust
//! never contracts `a * b + c`), the results are bit-identical to ggml's and to the Python
//! `gguf` package's numpy implementation, which the tests in `tests/quant_dequant.rs` check.
//!
//! The bit layouts are decoded by the block types' decoders in [`super::blocks`]; this module
//! only applies the scales.

// ggml's names: `q4_K`, `q8_K` keep the capital K of the type names.
#![allow(non_snake_case)]

use half::{bf16, f16};

use super::blocks::{
    BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ5_K,
    BlockQ6_K, BlockQ8_0, BlockQ8_1, BlockQ8_K, QK, cast_blocks,
};
use super::types::{GgmlType, QK_K};

/// Dequantizes `dst.len()` elements of type `ty` from `src` (ggml's `to_float`).
///
/// Preconditions (debug-asserted; the caller checked shapes at the layer boundary):
/// `dst.len()` is a multiple of `ty.block_size()` and `src.len() == ty.bytes_for(dst.len())`.
/// `src` may start at any address.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(
        ty.bytes_for(dst.len() as u64),
        Some(src.len() as u64),
        "{ty}: {} bytes for {} elements",
        src.len(),
        dst.len()
    );
    match ty {
        GgmlType::F32 => dequantize_row_f32(src, dst),
        GgmlType::F16 => dequantize_row_f16(src, dst),
        GgmlType::BF16 => dequantize_row_bf16(src, dst),
        GgmlType::Q4_0 => dequantize_row_q4_0(cast_blocks(src), dst),
        GgmlType::Q4_1 => dequantize_row_q4_1(cast_blocks(src), dst),
        GgmlType::Q5_0 => dequantize_row_q5_0(cast_blocks(src), dst),
        GgmlType::Q5_1 => dequantize_row_q5_1(cast_blocks(src), dst),
        GgmlType::Q8_0 => dequantize_row_q8_0(cast_blocks(src), dst),
        GgmlType::Q8_1 => dequantize_row_q8_1(cast_blocks(src), dst),
        GgmlType::Q2_K => dequantize_row_q2_K(cast_blocks(src), dst),
        GgmlType::Q3_K => dequantize_row_q3_K(cast_blocks(src), dst),
        GgmlType::Q4_K => dequantize_row_q4_K(cast_blocks(src), dst),
        GgmlType::Q5_K => dequantize_row_q5_K(cast_blocks(src), dst),
        GgmlType::Q6_K => dequantize_row_q6_K(cast_blocks(src), dst),
        GgmlType::Q8_K => dequantize_row_q8_K(cast_blocks(src), dst),
    }
}

/// Little-endian f32 bytes to f32.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), 4 * dst.len());
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Little-endian binary16 bytes to f32 (exact).
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), 2 * dst.len());
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// Little-endian bfloat16 bytes to f32 (exact: the bits shifted up by 16).
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), 2 * dst.len());
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// Checks the block count against the output length (one output chunk per block).
#[inline]
fn check_len(num_blocks: usize, block_size: usize, dst: &[f32]) {
    debug_assert_eq!(
        num_blocks * block_size,
        dst.len(),
        "{num_blocks} blocks for {} elements",
        dst.len()
    );
}

/// `y = d * (q - 8)`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], dst: &mut [f32]) {
    check_len(x.len(), QK, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (y, q) in y.iter_mut().zip(b.quants()) {
            *y = q as f32 * d;
        }
    }
}

/// `y = q * d + m`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], dst: &mut [f32]) {
    check_len(x.len(), QK, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (y, q) in y.iter_mut().zip(b.quants()) {
            *y = q as f32 * d + m;
        }
    }
}

/// `y = d * (q - 16)`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], dst: &mut [f32]) {
    check_len(x.len(), QK, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (y, q) in y.iter_mut().zip(b.quants()) {
            *y = q as f32 * d;
        }
    }
}

/// `y = q * d + m`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], dst: &mut [f32]) {
    check_len(x.len(), QK, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (y, q) in y.iter_mut().zip(b.quants()) {
            *y = q as f32 * d + m;
        }
    }
}

/// `y = q * d`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], dst: &mut [f32]) {
    check_len(x.len(), QK, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = q as f32 * d;
        }
    }
}

/// `y = q * d` (the block sum `s` is redundant for dequantization).
pub fn dequantize_row_q8_1(x: &[BlockQ8_1], dst: &mut [f32]) {
    check_len(x.len(), QK, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = q as f32 * d;
        }
    }
}

/// `y = q * d` with an f32 `d`.
pub fn dequantize_row_q8_K(x: &[BlockQ8_K], dst: &mut [f32]) {
    check_len(x.len(), QK_K, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = q as f32 * d;
        }
    }
}

/// Per sub-block of 16: `dl = d * (sc & 0xF)`, `ml = dmin * (sc >> 4)`, `y = dl * q - ml`.
pub fn dequantize_row_q2_K(x: &[BlockQ2_K], dst: &mut [f32]) {
    check_len(x.len(), QK_K, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        let q = b.quants();
        for ((y, q), &sc) in y
            .chunks_exact_mut(16)
            .zip(q.chunks_exact(16))
            .zip(&b.scales)
        {
            let dl = d * (sc & 0x0F) as f32;
            let ml = dmin * (sc >> 4) as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32 - ml;
            }
        }
    }
}

/// Per sub-block of 16: `dl = d * (sc - 32)`, `y = dl * q`.
pub fn dequantize_row_q3_K(x: &[BlockQ3_K], dst: &mut [f32]) {
    check_len(x.len(), QK_K, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let q = b.quants();
        for ((y, q), sc) in y
            .chunks_exact_mut(16)
            .zip(q.chunks_exact(16))
            .zip(b.scales())
        {
            let dl = d * sc as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32;
            }
        }
    }
}

/// Per sub-block of 32: `d1 = d * sc`, `m1 = dmin * m`, `y = d1 * q - m1`.
pub fn dequantize_row_q4_K(x: &[BlockQ4_K], dst: &mut [f32]) {
    check_len(x.len(), QK_K, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (sc, m) = b.scales_mins();
        dequantize_k_with_min(b.d.to_f32(), b.dmin.to_f32(), &sc, &m, &b.quants(), y);
    }
}

/// As Q4_K with 5-bit quants.
pub fn dequantize_row_q5_K(x: &[BlockQ5_K], dst: &mut [f32]) {
    check_len(x.len(), QK_K, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (sc, m) = b.scales_mins();
        dequantize_k_with_min(b.d.to_f32(), b.dmin.to_f32(), &sc, &m, &b.quants(), y);
    }
}

/// Q4_K / Q5_K super-block: 8 sub-blocks of 32, `y = (d * sc) * q - (dmin * m)`.
#[inline]
fn dequantize_k_with_min(
    d: f32,
    dmin: f32,
    sc: &[u8; 8],
    m: &[u8; 8],
    q: &[u8; QK_K],
    y: &mut [f32],
) {
    for (j, (y, q)) in y.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
        let d1 = d * sc[j] as f32;
        let m1 = dmin * m[j] as f32;
        for (y, &q) in y.iter_mut().zip(q) {
            *y = d1 * q as f32 - m1;
        }
    }
}

/// Per sub-block of 16: `y = (d * sc) * (q - 32)`.
pub fn dequantize_row_q6_K(x: &[BlockQ6_K], dst: &mut [f32]) {
    check_len(x.len(), QK_K, dst);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let q = b.quants();
        for ((y, q), &sc) in y
            .chunks_exact_mut(16)
            .zip(q.chunks_exact(16))
            .zip(&b.scales)
        {
            let dl = d * sc as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::{Block, F16Le, blocks_as_bytes};

    #[test]
    fn q4_0_known_block() {
        let mut b = BlockQ4_0::ZERO;
        b.d = F16Le::from_f32(0.5);
        b.qs[0] = 0xF0; // element 0: q = 0 -> -8 * 0.5; element 16: q = 15 -> 7 * 0.5
        b.qs[1] = 0x98; // element 1: q = 8 -> 0; element 17: q = 9 -> 0.5
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, blocks_as_bytes(&[b]), &mut y);
        assert_eq!(
            (y[0], y[16], y[1], y[17], y[2]),
            (-4.0, 3.5, 0.0, 0.5, -4.0)
        );
    }

    #[test]
    fn float_types() {
        let mut y = [0f32; 2];
        dequantize_row(GgmlType::F32, &[0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0], &mut y);
        assert_eq!(y, [1.0, -2.0]);
        dequantize_row(GgmlType::F16, &[0x00, 0x3C, 0x00, 0xC0], &mut y);
        assert_eq!(y, [1.0, -2.0]);
        dequantize_row(GgmlType::BF16, &[0x80, 0x3F, 0x00, 0xC0], &mut y);
        assert_eq!(y, [1.0, -2.0]);
    }

    #[test]
    fn empty_row() {
        for ty in GgmlType::ALL {
            dequantize_row(ty, &[], &mut []);
        }
    }
}
