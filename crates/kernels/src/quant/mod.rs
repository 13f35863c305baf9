//! Quantized tensor formats as stored in GGUF files (ggml's block formats), and their
//! reference kernels.
//!
//! A tensor row of `n` elements of type `t` is `n / t.block_size()` blocks of
//! `t.type_size()` bytes. Type ids follow ggml's `enum ggml_type` so they can be read
//! straight from a GGUF tensor info.
//!
//! This module is the *reference tier* (ggml's `ggml-quants.c` and the `*_generic` kernels of
//! `ggml-cpu/quants.c`): plain scalar code, obviously correct, checked against vectors from
//! the Python `gguf` package. Faster tiers are tested against it.
//!
//! * [`blocks`]: `#[repr(C)]` block types with ggml's byte layouts, alignment 1, viewed in
//!   place from GGUF bytes by [`cast_blocks`]; decoders that unpack each bit layout.
//! * [`dequant`]: [`dequantize_row`] for every type, bit-exact with ggml.
//! * [`quantize`], [`kquants`], [`kquants_low`] and [`q8`]: [`quantize_row`] (float types,
//!   Q4_0..Q8_0, Q2_K..Q6_K) and the activation quantizers Q8_0 / Q8_1 / Q8_K, byte-exact with ggml.
//! * [`dot`]: integer dot products `vec_dot_<weight>_<activation>`, one per weight type,
//!   paired by [`GgmlType::vec_dot_type`].
//! * [`a16`]: tokenmill's activation format A16 (12-bit quants stored as i16; not a ggml type), the partner of the
//!   32-element weight formats in `matmul`, with its reference quantizer and dot products.
//! * [`a8`]: the opt-in 8-bit activation format of the Rows16 matmuls (`--activation-bits 8`).
//! * [`rows16`]: tokenmill's interleaved layout of Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K weights (16 rows per
//!   group, one per SIMD lane), repacked once at load, with its reference dot product.
//! * [`testing`]: deterministic random rows of every type, for tests.

pub mod a16;
pub mod a8;
pub mod blocks;
pub mod dequant;
pub mod dot;
pub mod kquants;
pub mod kquants_low;
pub mod q8;
pub mod quantize;
pub mod rows16;
pub mod testing;
mod types;

pub use a8::{A8_BYTES, BlockA8, a8_blocks, a8_blocks_mut, dequantize_row_a8, quantize_row_a8};
pub use a16::{
    A16_BYTES, A16_QMAX, BlockA16, a16_as_bytes, a16_blocks, a16_blocks_mut, a16_inverse_scale,
    dequantize_row_a16, quantize_row_a16, vec_dot_q4_0_a16, vec_dot_q4_1_a16, vec_dot_q4_K_a16,
    vec_dot_q5_0_a16, vec_dot_q5_1_a16, vec_dot_q6_K_a16, vec_dot_q8_0_a16,
};
pub use blocks::{
    Block, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ5_K,
    BlockQ6_K, BlockQ8_0, BlockQ8_1, BlockQ8_K, F16Le, QK, blocks_as_bytes, cast_blocks,
    cast_blocks_mut,
};
pub use dequant::dequantize_row;
pub use dot::{
    vec_dot_q2_K_q8_K, vec_dot_q3_K_q8_K, vec_dot_q4_0_q8_0, vec_dot_q4_1_q8_1, vec_dot_q4_K_q8_K,
    vec_dot_q5_0_q8_0, vec_dot_q5_1_q8_1, vec_dot_q5_K_q8_K, vec_dot_q6_K_q8_K, vec_dot_q8_0_q8_0,
};
pub use kquants::{quantize_row_q4_K, quantize_row_q5_K, quantize_row_q6_K};
pub use kquants_low::{quantize_row_q2_K, quantize_row_q3_K};
pub use q8::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_K};
pub use quantize::{
    quantize_row, quantize_row_q4_0, quantize_row_q4_1, quantize_row_q5_0, quantize_row_q5_1,
};
pub use types::{GgmlType, QK_K};
