//! Differential tests of the reference integer dot products: for every weight type,
//! `vec_dot_<w>_<a>(w, q8(x))` must equal `dot(dequant(w), dequant(q8(x)))`, the exact dot
//! product of the values the two rows represent (computed in f64 from the bit-exact
//! dequantizers, which `quant_dequant.rs` checks against the `gguf` package).
//!
//! Error budget per type (candle's `quantized_tests.rs` style):
//! * all types: `1e-5 * sum_i |w_i * a_i|` for f32 rounding -- per-block products and the
//!   running sum in the kernel, the dequantized values in the oracle (~2^-24 each, ~170x
//!   headroom for a few hundred blocks);
//! * Q4_1 / Q5_1 additionally `sum_b |m_b| * (|s_b| * 2^-10 + 2^-25)`: ggml's format uses
//!   the Q8_1 block sum `s = f16(d * sum(q))` in place of `d_f16 * sum(q)`, the sum of the
//!   dequantized activations; the two differ by the f16 rounding of `d` and of `s` (2^-11
//!   relative each, or 2^-25 absolute for an f16 subnormal `s`).
//!
//! Shapes are odd on purpose: one block, a prime number of blocks, several weight rows against
//! one activation row, activations with zero and constant blocks.

use tokenmill_kernels::quant::testing::{SplitMix64, random_f32_row, random_weight_row};
use tokenmill_kernels::quant::{
    Block, BlockQ4_1, BlockQ5_1, BlockQ8_0, BlockQ8_1, BlockQ8_K, GgmlType, QK_K, blocks_as_bytes,
    cast_blocks, dequantize_row, quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_K,
    vec_dot_q2_K_q8_K, vec_dot_q3_K_q8_K, vec_dot_q4_0_q8_0, vec_dot_q4_1_q8_1, vec_dot_q4_K_q8_K,
    vec_dot_q5_0_q8_0, vec_dot_q5_1_q8_1, vec_dot_q5_K_q8_K, vec_dot_q6_K_q8_K, vec_dot_q8_0_q8_0,
};

/// An activation row quantized to one of the three activation formats.
#[allow(non_camel_case_types)]
enum Act {
    Q8_0(Vec<BlockQ8_0>),
    Q8_1(Vec<BlockQ8_1>),
    Q8_K(Vec<BlockQ8_K>),
}

impl Act {
    fn quantize(ty: GgmlType, x: &[f32]) -> Act {
        match ty {
            GgmlType::Q8_0 => {
                let mut y = vec![BlockQ8_0::ZERO; x.len() / 32];
                quantize_row_q8_0(x, &mut y);
                Act::Q8_0(y)
            }
            GgmlType::Q8_1 => {
                let mut y = vec![BlockQ8_1::ZERO; x.len() / 32];
                quantize_row_q8_1(x, &mut y);
                Act::Q8_1(y)
            }
            GgmlType::Q8_K => {
                let mut y = vec![BlockQ8_K::ZERO; x.len() / QK_K];
                quantize_row_q8_K(x, &mut y);
                Act::Q8_K(y)
            }
            _ => unreachable!("{ty} is not an activation format"),
        }
    }

    fn dequantize(&self, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        match self {
            Act::Q8_0(b) => dequantize_row(GgmlType::Q8_0, blocks_as_bytes(b), &mut out),
            Act::Q8_1(b) => dequantize_row(GgmlType::Q8_1, blocks_as_bytes(b), &mut out),
            Act::Q8_K(b) => dequantize_row(GgmlType::Q8_K, blocks_as_bytes(b), &mut out),
        }
        out
    }
}

/// The reference kernel for weight type `ty`.
fn vec_dot(ty: GgmlType, n: usize, w: &[u8], a: &Act) -> f32 {
    match (ty, a) {
        (GgmlType::Q4_0, Act::Q8_0(a)) => vec_dot_q4_0_q8_0(n, w, a),
        (GgmlType::Q4_1, Act::Q8_1(a)) => vec_dot_q4_1_q8_1(n, w, a),
        (GgmlType::Q5_0, Act::Q8_0(a)) => vec_dot_q5_0_q8_0(n, w, a),
        (GgmlType::Q5_1, Act::Q8_1(a)) => vec_dot_q5_1_q8_1(n, w, a),
        (GgmlType::Q8_0, Act::Q8_0(a)) => vec_dot_q8_0_q8_0(n, w, a),
        (GgmlType::Q2_K, Act::Q8_K(a)) => vec_dot_q2_K_q8_K(n, w, a),
        (GgmlType::Q3_K, Act::Q8_K(a)) => vec_dot_q3_K_q8_K(n, w, a),
        (GgmlType::Q4_K, Act::Q8_K(a)) => vec_dot_q4_K_q8_K(n, w, a),
        (GgmlType::Q5_K, Act::Q8_K(a)) => vec_dot_q5_K_q8_K(n, w, a),
        (GgmlType::Q6_K, Act::Q8_K(a)) => vec_dot_q6_K_q8_K(n, w, a),
        _ => unreachable!("{ty} does not pair with this activation format"),
    }
}

const WEIGHT_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The extra budget for Q8_1's f16 block sums: `sum_b |m_b| * (|s_b| * 2^-10 + 2^-25)`.
fn q8_1_sum_budget(ty: GgmlType, w: &[u8], a: &Act) -> f64 {
    let Act::Q8_1(a) = a else { return 0.0 };
    let mins: Vec<f32> = match ty {
        GgmlType::Q4_1 => cast_blocks::<BlockQ4_1>(w)
            .iter()
            .map(|b| b.m.to_f32())
            .collect(),
        GgmlType::Q5_1 => cast_blocks::<BlockQ5_1>(w)
            .iter()
            .map(|b| b.m.to_f32())
            .collect(),
        _ => unreachable!(),
    };
    let per_block =
        |m: f32, s: f32| (m as f64).abs() * ((s as f64).abs() * 2f64.powi(-10) + 2f64.powi(-25));
    mins.iter()
        .zip(a)
        .map(|(&m, b)| per_block(m, b.s.to_f32()))
        .sum()
}

/// Checks one weight row against one activation row; returns the fraction of the budget used.
fn check(ty: GgmlType, n: usize, w: &[u8], a: &Act, a_deq: &[f32], what: &str) -> f64 {
    let got = vec_dot(ty, n, w, a) as f64;
    let mut w_deq = vec![0f32; n];
    dequantize_row(ty, w, &mut w_deq);
    let exact: f64 = w_deq
        .iter()
        .zip(a_deq)
        .map(|(&w, &a)| w as f64 * a as f64)
        .sum();
    let magnitude: f64 = w_deq
        .iter()
        .zip(a_deq)
        .map(|(&w, &a)| (w as f64 * a as f64).abs())
        .sum();
    let tolerance = 1e-5 * magnitude + q8_1_sum_budget(ty, w, a) + 1e-30;
    let err = (got - exact).abs();
    assert!(
        err <= tolerance,
        "{ty} {what}: got {got:e}, exact {exact:e}, error {err:e} > tolerance {tolerance:e}"
    );
    err / tolerance
}

/// Activations with a zero block, a constant block and mixed magnitudes.
fn activations(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    let mut x = random_f32_row(rng, n, 1.0);
    for (b, chunk) in x.chunks_mut(32).enumerate() {
        match b % 7 {
            3 => chunk.fill(0.0),
            5 => chunk.fill(-0.375),
            6 => chunk.iter_mut().for_each(|v| *v *= 100.0),
            _ => {}
        }
    }
    x
}

#[test]
fn vec_dot_types_pair_as_in_ggml() {
    for ty in WEIGHT_TYPES {
        let want = match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
            _ => GgmlType::Q8_K,
        };
        assert_eq!(ty.vec_dot_type(), Some(want), "{ty}");
    }
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
    ] {
        assert_eq!(ty.vec_dot_type(), None, "{ty}");
    }
}

#[test]
fn vec_dot_equals_dot_of_dequantized_rows() {
    let mut rng = SplitMix64::new(0x5EED);
    let mut worst: Vec<(GgmlType, f64)> = Vec::new();
    for ty in WEIGHT_TYPES {
        let bs = ty.block_size();
        let act_ty = ty.vec_dot_type().unwrap();
        let mut worst_used = 0f64;
        // 1 block, 2, a prime number of blocks, and a long row (4096 elements).
        for num_blocks in [1usize, 2, 7, 4096 / bs] {
            let n = num_blocks * bs;
            let x = activations(&mut rng, n);
            let a = Act::quantize(act_ty, &x);
            let a_deq = a.dequantize(n);
            // Several weight rows against the same activation row.
            for row in 0..5 {
                let w = random_weight_row(&mut rng, ty, n);
                let used = check(
                    ty,
                    n,
                    &w,
                    &a,
                    &a_deq,
                    &format!("{num_blocks} blocks, row {row}"),
                );
                worst_used = worst_used.max(used);
            }
        }
        worst.push((ty, worst_used));
    }
    // Printed with --nocapture: how much of its error budget each type used at worst.
    for (ty, used) in worst {
        println!("{ty:>5}: worst error = {used:.2e} of the budget");
    }
}

#[test]
fn vec_dot_reads_weights_at_odd_addresses() {
    let mut rng = SplitMix64::new(11);
    for ty in WEIGHT_TYPES {
        let n = 3 * ty.block_size();
        let x = activations(&mut rng, n);
        let a = Act::quantize(ty.vec_dot_type().unwrap(), &x);
        let w = random_weight_row(&mut rng, ty, n);
        let mut shifted = vec![0u8; w.len() + 1];
        shifted[1..].copy_from_slice(&w);
        assert_eq!(
            vec_dot(ty, n, &w, &a).to_bits(),
            vec_dot(ty, n, &shifted[1..], &a).to_bits(),
            "{ty}"
        );
    }
}

#[test]
fn vec_dot_of_zero_activations_is_zero() {
    let mut rng = SplitMix64::new(12);
    for ty in WEIGHT_TYPES {
        let n = 2 * ty.block_size();
        let a = Act::quantize(ty.vec_dot_type().unwrap(), &vec![0.0; n]);
        let w = random_weight_row(&mut rng, ty, n);
        assert_eq!(vec_dot(ty, n, &w, &a), 0.0, "{ty}");
        assert_eq!(
            vec_dot(ty, 0, &[], &Act::quantize(ty.vec_dot_type().unwrap(), &[])),
            0.0,
            "{ty}"
        );
    }
}
