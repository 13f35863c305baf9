//! x86-64 SIMD tiers: AVX2 (+FMA, F16C), AVX-VNNI, and AVX-512 VNNI (F + BW + VL + VNNI).
//!
//! * [`common`]: shared inline helpers and [`common::MulSum`], the u8 × i8 dot primitive
//!   (`maddubs`+`madd` on AVX2, `vpdpbusd` with VNNI) — the one place the tiers differ;
//! * [`a16`]: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 against A16 activations (`matmul`'s path), tiles of
//!   weight rows × up to four activation rows;
//! * [`rows16`]: Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K in the interleaved Rows16 layout against A16 activations —
//!   what `matmul` runs for those formats (512-bit on AVX-512, 256-bit otherwise), tiles of
//!   16-row groups × up to eight activation rows;
//! * [`rows16_a8`]: Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K Rows16 against the opt-in 8-bit A8 activations
//!   on AVX-512 VNNI (`vpdpbusd`), and [`rows16_a8_avx2`] the same formats except Q8_0 on the
//!   256-bit tiers (`vpmaddubsw`);
//! * [`q32`]: the same weight formats against ggml's Q8_0/Q8_1, and the block decoders both
//!   share;
//! * [`kquants`]: Q4_K/Q5_K/Q6_K against Q8_K, bit-identical to the reference;
//! * [`int4`]: AWQ/GPTQ int4 rows (unpacked nibbles, f32 FMA) against f32 activations;
//! * [`quantize`]: Q8_0/Q8_1 activation quantizers (byte-identical to the reference) and the
//!   f32 dot;
//! * [`attn`]: attention tiles, merge and the SiLU gate over f32 vectors (AVX2 or AVX-512);
//! * [`amx`]: the same Rows16 × A16 products on AMX int8 tiles (16 activation rows × 16
//!   weight rows per tile product for the 4-bit formats, per pair for Q5_0/Q8_0),
//!   bit-identical to [`rows16`], for calls with many activation rows;
//! * [`tiers`]: the `#[target_feature]` entry points and per-tier [`crate::simd::TierFns`].
//!
//! The AVX-512 tier runs the same 256-bit kernels with EVEX `vpdpwssd` / `vpdpbusd` (512-bit
//! A16 kernels measured slower on the development machine; see [`a16`]). It matters on CPUs
//! with AVX-512 VNNI but no AVX-VNNI (Ice Lake / Cascade Lake servers).

pub mod a16;
pub mod amx;
pub mod attn;
pub mod common;
pub mod int4;
pub mod kquants;
pub mod q32;
pub mod quantize;
pub mod rows16;
pub mod rows16_a8;
pub mod rows16_a8_avx2;
pub mod rows16_q8_avx2;
pub mod tiers;
