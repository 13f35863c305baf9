//! The portable scalar tier: the reference twins of [`crate::quant::dot`],
//! [`crate::quant::q8`] and [`crate::quant::a16`] behind the raw kernel shapes of [`super`]. Always available; the
//! baseline every other tier is tested against.

// ggml's names: `q4_K`, `q8_K` keep the capital K of the type names.
#![allow(non_snake_case)]

use super::{MAX_ROWS, TierFns, Tile};
use crate::quant::{
    self, BlockA16, BlockQ8_0, BlockQ8_1, BlockQ8_K, a16_blocks, a16_blocks_mut, cast_blocks,
    cast_blocks_mut,
};

/// Defines `$name`, a [`super::DotTileFn`] that calls the reference `$reference` once per
/// activation row with activation blocks `$act`.
macro_rules! scalar_dot_rows {
    ($name:ident, $reference:path, $wty:ident, $act:ty) => {
        scalar_dot_rows!($name, $reference, $wty, $act, cast_blocks::<$act>);
    };
    ($name:ident, $reference:path, $wty:ident, $act:ty, $cast:expr) => {
        scalar_dot_rows!($name, $reference, $wty, $act, $cast, 1);
    };
    // `$per`: activation blocks per weight block.
    ($name:ident, $reference:path, $wty:ident, $act:ty, $cast:expr, $per:expr) => {
        /// Scalar tier: the reference kernel once per (weight row, activation row).
        ///
        /// # Safety
        ///
        /// As [`super::DotTileFn`].
        pub unsafe fn $name(t: &Tile) {
            let ty = quant::GgmlType::$wty;
            let n = t.nb * ty.block_size();
            for i in 0..t.n_w {
                // SAFETY: the caller guarantees `nb` readable weight blocks per weight row.
                let w = unsafe {
                    std::slice::from_raw_parts(t.w.add(i * t.w_stride), t.nb * ty.type_size())
                };
                let mut o = [0f32; MAX_ROWS];
                for (j, o) in o.iter_mut().enumerate().take(t.n_a) {
                    // SAFETY: the caller guarantees `nb` readable activation blocks per row.
                    let a = unsafe {
                        std::slice::from_raw_parts(
                            t.a.add(j * t.a_stride),
                            t.nb * $per * std::mem::size_of::<$act>(),
                        )
                    };
                    *o = $reference(n, w, $cast(a));
                }
                // SAFETY: the caller guarantees the outputs are writable.
                unsafe { t.store(i, &o[..t.n_a]) };
            }
        }
    };
}

scalar_dot_rows!(q4_0_q8_0, quant::vec_dot_q4_0_q8_0, Q4_0, BlockQ8_0);
scalar_dot_rows!(q4_1_q8_1, quant::vec_dot_q4_1_q8_1, Q4_1, BlockQ8_1);
scalar_dot_rows!(q5_0_q8_0, quant::vec_dot_q5_0_q8_0, Q5_0, BlockQ8_0);
scalar_dot_rows!(q5_1_q8_1, quant::vec_dot_q5_1_q8_1, Q5_1, BlockQ8_1);
scalar_dot_rows!(q8_0_q8_0, quant::vec_dot_q8_0_q8_0, Q8_0, BlockQ8_0);
scalar_dot_rows!(q2_K_q8_K, quant::vec_dot_q2_K_q8_K, Q2_K, BlockQ8_K);
scalar_dot_rows!(q3_K_q8_K, quant::vec_dot_q3_K_q8_K, Q3_K, BlockQ8_K);
scalar_dot_rows!(q4_K_q8_K, quant::vec_dot_q4_K_q8_K, Q4_K, BlockQ8_K);
scalar_dot_rows!(q5_K_q8_K, quant::vec_dot_q5_K_q8_K, Q5_K, BlockQ8_K);
scalar_dot_rows!(q6_K_q8_K, quant::vec_dot_q6_K_q8_K, Q6_K, BlockQ8_K);
scalar_dot_rows!(
    q4_0_a16,
    quant::vec_dot_q4_0_a16,
    Q4_0,
    BlockA16,
    a16_blocks
);
scalar_dot_rows!(
    q4_1_a16,
    quant::vec_dot_q4_1_a16,
    Q4_1,
    BlockA16,
    a16_blocks
);
scalar_dot_rows!(
    q5_0_a16,
    quant::vec_dot_q5_0_a16,
    Q5_0,
    BlockA16,
    a16_blocks
);
scalar_dot_rows!(
    q5_1_a16,
    quant::vec_dot_q5_1_a16,
    Q5_1,
    BlockA16,
    a16_blocks
);
scalar_dot_rows!(
    q4_K_a16,
    quant::vec_dot_q4_K_a16,
    Q4_K,
    BlockA16,
    a16_blocks,
    quant::QK_K / quant::QK
);
scalar_dot_rows!(
    q6_K_a16,
    quant::vec_dot_q6_K_a16,
    Q6_K,
    BlockA16,
    a16_blocks,
    quant::QK_K / quant::QK
);
scalar_dot_rows!(
    q8_0_a16,
    quant::vec_dot_q8_0_a16,
    Q8_0,
    BlockA16,
    a16_blocks
);

/// Scalar tier of a Rows16 tile against A16 activations: the reference
/// [`quant::rows16::vec_dot_a16`] of every (weight row, activation row).
///
/// # Safety
///
/// As [`super::DotTileFn`] for Rows16 weights (`w_stride`: bytes of a group).
unsafe fn rows16_tile(ty: quant::GgmlType, t: &Tile) {
    // SAFETY: as this function's.
    unsafe {
        rows16_tile_with(ty, t, quant::A16_BYTES, |g, lane, a| {
            quant::rows16::vec_dot_a16(ty, t.nb, g, lane, a16_blocks(a))
        })
    }
}

/// Scalar tier of a Rows16 tile against A8 activations: the reference
/// [`quant::rows16::vec_dot_a8`] of every (weight row, activation row).
///
/// # Safety
///
/// As [`rows16_tile`], with A8 activation blocks.
unsafe fn rows16_a8_tile(ty: quant::GgmlType, t: &Tile) {
    // SAFETY: as this function's.
    unsafe {
        rows16_tile_with(ty, t, quant::A8_BYTES, |g, lane, a| {
            quant::rows16::vec_dot_a8(ty, t.nb, g, lane, quant::a8_blocks(a))
        })
    }
}

/// `dot(group, lane, activation row)` of every (weight row, activation row) of a Rows16 tile
/// whose activation blocks of 32 are `a_bytes` each.
///
/// # Safety
///
/// As [`super::DotTileFn`] for Rows16 weights, with activation blocks of `a_bytes`.
unsafe fn rows16_tile_with(
    ty: quant::GgmlType,
    t: &Tile,
    a_bytes: usize,
    dot: impl Fn(&[u8], usize, &[u8]) -> f32,
) {
    use quant::rows16::GROUP;
    let group_bytes = t.nb * GROUP * ty.type_size();
    // Activation blocks of 32 per weight block.
    let a_blocks = ty.block_size() / quant::QK;
    for i in 0..t.n_w {
        // SAFETY: the caller guarantees whole groups of `nb` group-blocks for every row.
        let group =
            unsafe { std::slice::from_raw_parts(t.w.add(i / GROUP * t.w_stride), group_bytes) };
        for j in 0..t.n_a {
            // SAFETY: the caller guarantees `nb` readable activation blocks per row.
            let a = unsafe {
                std::slice::from_raw_parts(t.a.add(j * t.a_stride), t.nb * a_blocks * a_bytes)
            };
            let v = dot(group, i % GROUP, a);
            // SAFETY: the caller guarantees the outputs are writable.
            unsafe { *t.out.add(j * t.out_stride + i) = v };
        }
    }
}

/// Scalar tier: Rows16 Q4_0 · A16.
///
/// # Safety
///
/// As [`rows16_tile`].
pub unsafe fn q4_0_rows16(t: &Tile) {
    unsafe { rows16_tile(quant::GgmlType::Q4_0, t) }
}

/// Scalar tier: Rows16 Q4_1 · A16.
///
/// # Safety
///
/// As [`rows16_tile`].
pub unsafe fn q4_1_rows16(t: &Tile) {
    unsafe { rows16_tile(quant::GgmlType::Q4_1, t) }
}

/// Scalar tier: Rows16 Q5_0 · A16.
///
/// # Safety
///
/// As [`rows16_tile`].
pub unsafe fn q5_0_rows16(t: &Tile) {
    unsafe { rows16_tile(quant::GgmlType::Q5_0, t) }
}

/// Scalar tier: Rows16 Q4_K · A16.
///
/// # Safety
///
/// As [`rows16_tile`].
pub unsafe fn q4_K_rows16(t: &Tile) {
    unsafe { rows16_tile(quant::GgmlType::Q4_K, t) }
}

/// Scalar tier: Rows16 Q6_K · A16.
///
/// # Safety
///
/// As [`rows16_tile`].
pub unsafe fn q6_K_rows16(t: &Tile) {
    unsafe { rows16_tile(quant::GgmlType::Q6_K, t) }
}

/// Scalar tier: Rows16 Q8_0 · A16.
///
/// # Safety
///
/// As [`rows16_tile`].
pub unsafe fn q8_0_rows16(t: &Tile) {
    unsafe { rows16_tile(quant::GgmlType::Q8_0, t) }
}

macro_rules! rows16_a8_entry {
    ($name:ident, $ty:ident) => {
        /// Scalar tier: Rows16 · A8, the reference.
        ///
        /// # Safety
        ///
        /// As [`rows16_a8_tile`].
        pub unsafe fn $name(t: &Tile) {
            unsafe { rows16_a8_tile(quant::GgmlType::$ty, t) }
        }
    };
}

rows16_a8_entry!(q4_0_rows16_a8, Q4_0);
rows16_a8_entry!(q4_1_rows16_a8, Q4_1);
rows16_a8_entry!(q5_0_rows16_a8, Q5_0);
rows16_a8_entry!(q8_0_rows16_a8, Q8_0);
rows16_a8_entry!(q4_K_rows16_a8, Q4_K);
rows16_a8_entry!(q6_K_rows16_a8, Q6_K);

/// Scalar tier of [`super::QuantizeFn`] for A8: the reference quantizer.
///
/// # Safety
///
/// None beyond the slice contract.
pub unsafe fn quantize_a8(x: &[f32], y: &mut [u8]) {
    quant::quantize_row_a8(x, quant::a8_blocks_mut(y));
}

/// Scalar tier of [`super::QuantizeFn`] for A16: the reference quantizer.
///
/// # Safety
///
/// None beyond the slice contract.
pub unsafe fn quantize_a16(x: &[f32], y: &mut [u8]) {
    quant::quantize_row_a16(x, a16_blocks_mut(y));
}

/// Scalar tier of [`super::QuantizeFn`] for Q8_0: the reference quantizer.
///
/// # Safety
///
/// None beyond the slice contract (kept `unsafe` to fit the table's function type).
pub unsafe fn quantize_q8_0(x: &[f32], y: &mut [u8]) {
    quant::quantize_row_q8_0(x, cast_blocks_mut(y));
}

/// Scalar tier of [`super::QuantizeFn`] for Q8_1: the reference quantizer.
///
/// # Safety
///
/// None beyond the slice contract.
pub unsafe fn quantize_q8_1(x: &[f32], y: &mut [u8]) {
    quant::quantize_row_q8_1(x, cast_blocks_mut(y));
}

/// Scalar tier of [`super::QuantizeFn`] for Q8_K: the reference quantizer.
///
/// # Safety
///
/// None beyond the slice contract.
pub unsafe fn quantize_q8_K(x: &[f32], y: &mut [u8]) {
    quant::quantize_row_q8_K(x, cast_blocks_mut(y));
}

/// Scalar tier of [`super::DotF32Fn`]: eight independent accumulators, plain multiply-add
/// (no `mul_add`: without FMA in the baseline target it would be a libm call).
///
/// # Safety
///
/// None beyond `a.len() == b.len()`.
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (pa, pb) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += pa[j] * pb[j];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

/// The scalar tier's table: the reference kernels of every quantized weight type.
pub fn fns() -> TierFns {
    use quant::GgmlType as T;
    let mut dots: [Option<super::DotTileFn>; 15] = [None; 15];
    dots[T::Q4_0 as usize] = Some(q4_0_q8_0);
    dots[T::Q4_1 as usize] = Some(q4_1_q8_1);
    dots[T::Q5_0 as usize] = Some(q5_0_q8_0);
    dots[T::Q5_1 as usize] = Some(q5_1_q8_1);
    dots[T::Q8_0 as usize] = Some(q8_0_q8_0);
    dots[T::Q2_K as usize] = Some(q2_K_q8_K);
    dots[T::Q3_K as usize] = Some(q3_K_q8_K);
    dots[T::Q4_K as usize] = Some(q4_K_q8_K);
    dots[T::Q5_K as usize] = Some(q5_K_q8_K);
    dots[T::Q6_K as usize] = Some(q6_K_q8_K);
    let mut dots_a16: [Option<super::DotTileFn>; 15] = [None; 15];
    dots_a16[T::Q4_0 as usize] = Some(q4_0_a16);
    dots_a16[T::Q4_1 as usize] = Some(q4_1_a16);
    dots_a16[T::Q5_0 as usize] = Some(q5_0_a16);
    dots_a16[T::Q5_1 as usize] = Some(q5_1_a16);
    dots_a16[T::Q8_0 as usize] = Some(q8_0_a16);
    // The references of the Rows16 Q4_K and Q6_K kernels only: no SIMD tier pairs a k-quant
    // in GGUF layout with A16.
    dots_a16[T::Q4_K as usize] = Some(q4_K_a16);
    dots_a16[T::Q6_K as usize] = Some(q6_K_a16);
    let mut dots_rows16: [Option<super::DotTileFn>; 15] = [None; 15];
    dots_rows16[T::Q4_0 as usize] = Some(q4_0_rows16);
    dots_rows16[T::Q4_1 as usize] = Some(q4_1_rows16);
    dots_rows16[T::Q5_0 as usize] = Some(q5_0_rows16);
    dots_rows16[T::Q8_0 as usize] = Some(q8_0_rows16);
    dots_rows16[T::Q4_K as usize] = Some(q4_K_rows16);
    dots_rows16[T::Q6_K as usize] = Some(q6_K_rows16);
    let mut dots_rows16_a8: [Option<super::DotTileFn>; 15] = [None; 15];
    dots_rows16_a8[T::Q4_0 as usize] = Some(q4_0_rows16_a8);
    dots_rows16_a8[T::Q4_1 as usize] = Some(q4_1_rows16_a8);
    dots_rows16_a8[T::Q5_0 as usize] = Some(q5_0_rows16_a8);
    dots_rows16_a8[T::Q8_0 as usize] = Some(q8_0_rows16_a8);
    dots_rows16_a8[T::Q4_K as usize] = Some(q4_K_rows16_a8);
    dots_rows16_a8[T::Q6_K as usize] = Some(q6_K_rows16_a8);
    TierFns {
        dots,
        dots_a16,
        dots_rows16,
        dots_rows16_a8,
        quantize_a16,
        quantize_a8,
        quantize_q8_0,
        quantize_q8_1,
        quantize_q8_K,
        dot_f32,
        attn_tile: super::attn::attn_tile::<f32>,
        attn_tile_f16: super::attn::attn_tile::<half::f16>,
        attn_tile_bf16: super::attn::attn_tile::<half::bf16>,
        attn_tile_i8: super::attn::attn_tile::<i8>,
        attn_merge: super::attn::attn_merge,
        attn_lanes: 1,
        silu_mul: super::attn::silu_mul,
        acc_rows: super::attn::acc_rows,
        dot_rows: super::attn::dot_rows,
        softmax_step: super::attn::softmax_step,
        #[cfg(target_arch = "x86_64")]
        amx: None,
    }
}
