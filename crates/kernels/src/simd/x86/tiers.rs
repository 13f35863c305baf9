//! The `#[target_feature]` entry points of the x86 tiers, and their function tables.
//!
//! Each tier is one instantiation of the `tier!` macro: a module of non-generic
//! `#[target_feature(enable = ...)]` functions whose bodies are the `#[inline(always)]` generic
//! kernels of [`super::a16`], [`super::q32`], [`super::kquants`] and [`super::quantize`],
//! specialised with the tier's [`MulSum`](super::common::MulSum) /
//! [`MulSum16`](super::common::MulSum16). Inlining a feature-less body into a function with
//! features is what makes the intrinsics compile for that tier; the entry points are only ever
//! called through a [`TierFns`] that `dispatch` hands out after checking the CPU.

use super::attn::{F32s, F32x8, F32x16};
use super::common::{Avx512Vnni, AvxVnni, Maddubs};
use super::{
    a16, amx, attn, kquants, q32, quantize, rows16, rows16_a8, rows16_a8_avx2, rows16_q8_avx2,
};
use crate::quant::GgmlType;
use crate::simd::attn::{AccRows, AttnTile, DotRows};
use crate::simd::{MAX_ROWS, TierFns, Tile, scalar};

/// Defines module `$tier` of entry points compiled with `$features`, using `$mul_sum` for the
/// integer dots and f32 vectors `$f32s` for attention (`$kv` vectors per key tile, `$rows` query
/// rows per pipelined block, steps of up to `$one` rows in one block), `$a8()` the table of
/// its Rows16 kernels against A8 activations, and `$q8_0` a Rows16 Q8_0 kernel against A16
/// in place of the generic one, if any ([`rows16_q8_avx2`] on the `avx2` tier).
macro_rules! tier {
    ($tier:ident, $features:literal, $mul_sum:ty, $lanes16:ty, $f32s:ty, $kv:literal, $rows:literal, $one:literal, $a8:path, $q8_0:expr) => {
        #[allow(non_snake_case)]
        pub mod $tier {
            use super::*;

            macro_rules! q32_entry {
                ($name:ident, $fmt:ty) => {
                    /// # Safety
                    ///
                    /// As [`crate::simd::DotTileFn`], with this tier's CPU features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $name(t: &Tile) {
                        unsafe { q32::tile::<$fmt, $mul_sum>(t) }
                    }
                };
            }

            macro_rules! a16_entry {
                ($name:ident, $fmt:ty) => {
                    /// # Safety
                    ///
                    /// As [`crate::simd::DotTileFn`], with this tier's CPU features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $name(t: &Tile) {
                        unsafe { a16::tile::<$fmt, a16::L256<$mul_sum>>(t) }
                    }
                };
            }

            macro_rules! rows16_entry {
                ($name:ident, $fmt:ty) => {
                    /// # Safety
                    ///
                    /// As [`crate::simd::DotTileFn`] for Rows16 weights, with this tier's CPU
                    /// features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $name(t: &Tile) {
                        unsafe { rows16::tile::<$fmt, $lanes16>(t) }
                    }
                };
            }

            macro_rules! k_entry {
                ($name:ident, $row:path) => {
                    /// # Safety
                    ///
                    /// As [`crate::simd::DotTileFn`], with this tier's CPU features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $name(t: &Tile) {
                        for i in 0..t.n_w {
                            let mut o = [0f32; MAX_ROWS];
                            for (j, o) in o.iter_mut().enumerate().take(t.n_a) {
                                let (w, a) = (
                                    t.w.wrapping_add(i * t.w_stride),
                                    t.a.wrapping_add(j * t.a_stride),
                                );
                                *o = unsafe { $row(t.nb, w, a) };
                            }
                            unsafe { t.store(i, &o[..t.n_a]) };
                        }
                    }
                };
            }

            q32_entry!(q4_0_q8_0, q32::Q4_0);
            q32_entry!(q4_1_q8_1, q32::Q4_1);
            q32_entry!(q5_0_q8_0, q32::Q5_0);
            q32_entry!(q5_1_q8_1, q32::Q5_1);
            q32_entry!(q8_0_q8_0, q32::Q8_0);
            a16_entry!(q4_0_a16, q32::Q4_0);
            a16_entry!(q4_1_a16, q32::Q4_1);
            a16_entry!(q5_0_a16, q32::Q5_0);
            a16_entry!(q5_1_a16, q32::Q5_1);
            a16_entry!(q8_0_a16, q32::Q8_0);
            rows16_entry!(q4_0_rows16, rows16::R16Q4_0);
            rows16_entry!(q4_1_rows16, rows16::R16Q4_1);
            rows16_entry!(q5_0_rows16, rows16::R16Q5_0);
            rows16_entry!(q8_0_rows16, rows16::R16Q8_0);
            rows16_entry!(q4_K_rows16, rows16::R16Q4_K);
            rows16_entry!(q6_K_rows16, rows16::R16Q6_K);
            k_entry!(q4_K_q8_K, kquants::q4_K_row);
            k_entry!(q5_K_q8_K, kquants::q5_K_row);
            k_entry!(q6_K_q8_K, kquants::q6_K_row);

            /// # Safety
            ///
            /// As [`crate::simd::QuantizeFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn quantize_a16(x: &[f32], y: &mut [u8]) {
                unsafe { quantize::quantize_a16(x, y) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::QuantizeFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn quantize_a8(x: &[f32], y: &mut [u8]) {
                unsafe { quantize::quantize_a8(x, y) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::QuantizeFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn quantize_q8_0(x: &[f32], y: &mut [u8]) {
                unsafe { quantize::quantize_q8_0(x, y) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::QuantizeFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn quantize_q8_1(x: &[f32], y: &mut [u8]) {
                unsafe { quantize::quantize_q8_1(x, y) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::DotF32Fn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
                unsafe { quantize::dot_f32(a, b) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::AttnTileFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn attn_tile(t: &AttnTile) {
                unsafe { attn::tile::<$f32s, f32, $kv, $rows, $one>(t) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::AttnTileFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn attn_tile_f16(t: &AttnTile<half::f16>) {
                unsafe { attn::tile::<$f32s, half::f16, $kv, $rows, $one>(t) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::AttnTileFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn attn_tile_bf16(t: &AttnTile<half::bf16>) {
                unsafe { attn::tile::<$f32s, half::bf16, $kv, $rows, $one>(t) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::AttnTileFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn attn_tile_i8(t: &AttnTile<i8>) {
                unsafe { attn::tile::<$f32s, i8, $kv, $rows, $one>(t) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::AttnMergeFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn attn_merge(
                dst_m: &mut f32,
                dst_l: &mut f32,
                dst_acc: &mut [f32],
                m: f32,
                l: f32,
                acc: &[f32],
            ) {
                unsafe { attn::merge::<$f32s>(dst_m, dst_l, dst_acc, m, l, acc) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::SiluMulFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
                unsafe { attn::silu_mul::<$f32s>(gate, up, out) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::AccRowsFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn acc_rows(s: &AccRows, o: &mut [f32], p: &[f32], x: &[f32]) {
                unsafe { attn::acc_rows::<$f32s>(s, o, p, x) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::DotRowsFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_rows(d: &DotRows, s: &mut [f32], q: &[f32], k: &[f32]) {
                unsafe { attn::dot_rows::<$f32s>(d, s, q, k) }
            }

            /// # Safety
            ///
            /// As [`crate::simd::attn::SoftmaxStepFn`], with this tier's CPU features.
            #[target_feature(enable = $features)]
            pub unsafe fn softmax_step(
                s: &mut [f32],
                valid: usize,
                scale: f32,
                m: &mut f32,
                l: &mut f32,
            ) -> f32 {
                unsafe { attn::softmax_step::<$f32s>(s, valid, scale, m, l) }
            }

            /// This tier's table: its SIMD kernels, the scalar tier for the rest.
            pub fn fns() -> TierFns {
                let mut t = scalar::fns();
                let mut set =
                    |ty: GgmlType, f: crate::simd::DotTileFn| t.dots[ty as usize] = Some(f);
                set(GgmlType::Q4_0, q4_0_q8_0);
                set(GgmlType::Q4_1, q4_1_q8_1);
                set(GgmlType::Q5_0, q5_0_q8_0);
                set(GgmlType::Q5_1, q5_1_q8_1);
                set(GgmlType::Q8_0, q8_0_q8_0);
                set(GgmlType::Q4_K, q4_K_q8_K);
                set(GgmlType::Q5_K, q5_K_q8_K);
                set(GgmlType::Q6_K, q6_K_q8_K);
                let mut set =
                    |ty: GgmlType, f: crate::simd::DotTileFn| t.dots_a16[ty as usize] = Some(f);
                set(GgmlType::Q4_0, q4_0_a16);
                set(GgmlType::Q4_1, q4_1_a16);
                set(GgmlType::Q5_0, q5_0_a16);
                set(GgmlType::Q5_1, q5_1_a16);
                set(GgmlType::Q8_0, q8_0_a16);
                let mut set =
                    |ty: GgmlType, f: crate::simd::DotTileFn| t.dots_rows16[ty as usize] = Some(f);
                set(GgmlType::Q4_0, q4_0_rows16);
                set(GgmlType::Q4_1, q4_1_rows16);
                set(GgmlType::Q5_0, q5_0_rows16);
                set(GgmlType::Q8_0, q8_0_rows16);
                if let Some(f) = $q8_0 {
                    set(GgmlType::Q8_0, f);
                }
                set(GgmlType::Q4_K, q4_K_rows16);
                set(GgmlType::Q6_K, q6_K_rows16);
                t.quantize_a16 = quantize_a16;
                t.quantize_a8 = quantize_a8;
                // A weight type without an A8 kernel on this tier (Q8_0 on the 256-bit tiers)
                // runs against A16, not the scalar reference.
                t.dots_rows16_a8 = $a8();
                t.quantize_q8_0 = quantize_q8_0;
                t.quantize_q8_1 = quantize_q8_1;
                t.dot_f32 = dot_f32;
                t.attn_tile = attn_tile;
                t.attn_tile_f16 = attn_tile_f16;
                t.attn_tile_bf16 = attn_tile_bf16;
                t.attn_tile_i8 = attn_tile_i8;
                t.attn_merge = attn_merge;
                t.attn_lanes = <$f32s as F32s>::N;
                t.silu_mul = silu_mul;
                t.acc_rows = acc_rows;
                t.dot_rows = dot_rows;
                t.softmax_step = softmax_step;
                t
            }
        }
    };
}

tier!(
    avx2,
    "avx2,fma,f16c",
    Maddubs,
    rows16::Y256<rows16::MaddAdd>,
    F32x8,
    2,
    2,
    3,
    rows16_a8_avx2::table,
    Some(rows16_q8_avx2::q8_0)
);
tier!(
    avx_vnni,
    "avx2,fma,f16c,avxvnni",
    AvxVnni,
    rows16::Y256<rows16::VexDpwssd>,
    F32x8,
    2,
    2,
    3,
    rows16_a8_avx2::table,
    None
);
tier!(
    avx512_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    Avx512Vnni,
    rows16::Z512,
    F32x16,
    1,
    4,
    4,
    rows16_a8::table,
    None
);

/// The AMX tier: the AVX-512 VNNI tier's kernels, plus the AMX int8 matmul of Rows16 weights
/// ([`amx`]) for calls with many activation rows.
pub mod amx_int8 {
    use super::*;
    use crate::simd::AmxFns;
    use crate::simd::x86::amx::AmxJob;

    macro_rules! amx_entry {
        ($name:ident, $fmt:ty) => {
            /// # Safety
            ///
            /// As [`amx::AmxGroupsFn`].
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            pub unsafe fn $name(job: &AmxJob, g0: usize, g1: usize) {
                unsafe { amx::groups::<$fmt>(job, g0, g1) }
            }
        };
    }

    amx_entry!(q4_0_groups, rows16::R16Q4_0);
    amx_entry!(q4_1_groups, rows16::R16Q4_1);
    amx_entry!(q8_0_groups, rows16::R16Q8_0);
    amx_entry!(q5_0_groups, rows16::R16Q5_0);
    amx_entry!(q4_k_groups, rows16::R16Q4_K);

    /// # Safety
    ///
    /// As [`amx::split_a16`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn split(a: *const u8, a_row: usize, n_rows: usize, nb: usize, dst: *mut u8) {
        unsafe { amx::split_a16(a, a_row, n_rows, nb, dst) }
    }

    /// This tier's table.
    pub fn fns() -> TierFns {
        let mut t = avx512_vnni::fns();
        let mut groups: [Option<amx::AmxGroupsFn>; 15] = [None; 15];
        groups[GgmlType::Q4_0 as usize] = Some(q4_0_groups);
        groups[GgmlType::Q4_1 as usize] = Some(q4_1_groups);
        groups[GgmlType::Q8_0 as usize] = Some(q8_0_groups);
        groups[GgmlType::Q5_0 as usize] = Some(q5_0_groups);
        groups[GgmlType::Q4_K as usize] = Some(q4_k_groups);
        t.amx = Some(AmxFns { split, groups });
        t
    }
}
