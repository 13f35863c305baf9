//! Reference integer dot products of one quantized weight row with one quantized activation
//! row: the plain twins every SIMD kernel is tested against.
//!
//! Each weight type pairs with the activation format of [`GgmlType::vec_dot_type`] as in ggml's
//! `type_traits_cpu` (`ggml-cpu/ggml-cpu.c`), and follows the math of `ggml_vec_dot_*_generic`
//! in `ggml-cpu/quants.c`
//! (<https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-cpu/quants.c>):
//!
//! * 32-element formats, per block: `sumi = sum(qw * qa)` in i32, then
//!   `dw * da * sumi` (+ `mw * sa` for Q4_1/Q5_1, whose offset multiplies the activation sum
//!   `sa = da * sum(qa)` stored in the Q8_1 block as f16).
//! * k-quants, per super-block: the whole scaled integer sum `isum = sum_j sc_j * sum(qw * qa)`
//!   over sub-blocks `j` is exact in i32 (at most 256 * 127 * 64 * 128 < 2^31), then
//!   `dw * da * isum`; the mins of Q2_K/Q4_K/Q5_K use Q8_K's `bsums`:
//!   `- dmin * da * sum_j m_j * bsum_j`.
//!
//! ggml's generic Q3_K..Q6_K kernels accumulate per-lane f32 partial sums instead of one exact
//! i32, so results can differ from ggml's in the last bits; both are within f32 rounding of the
//! exact value `dot(dequant(w), dequant(a))`, which `tests/quant_dot.rs` checks. Block sums are
//! accumulated in f32, block by block, as ggml does.
//!
//! Signature of every function: `n` elements, `w` the weight row's bytes (any address),
//! `a` the activation blocks. Preconditions (debug-asserted): `n` is a multiple of the block
//! size, `w.len() == w_type.bytes_for(n)`, `a.len() == n / block size`.

// ggml's names: `q4_K`, `q8_K` keep the capital K of the type names.
#![allow(non_snake_case)]

use super::blocks::{
    Block, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ5_K,
    BlockQ6_K, BlockQ8_0, BlockQ8_1, BlockQ8_K, cast_blocks,
};
#[cfg(doc)]
use super::types::GgmlType;

/// The weight row as blocks, with the shapes checked.
#[inline]
fn weight_blocks<'a, W: Block, A>(n: usize, w: &'a [u8], a: &[A]) -> &'a [W] {
    debug_assert_eq!(n % W::BLOCK_SIZE, 0, "{n} elements of {}", W::TYPE);
    let w: &[W] = cast_blocks(w);
    debug_assert_eq!(
        w.len(),
        n / W::BLOCK_SIZE,
        "{} bytes for {n} elements of {}",
        std::mem::size_of_val(w),
        W::TYPE
    );
    debug_assert_eq!(
        a.len(),
        w.len(),
        "{} activation blocks for {} weight blocks",
        a.len(),
        w.len()
    );
    w
}

/// `sum(x * y)` of two integer sequences, in i32.
#[inline]
fn isum<X: Copy + Into<i32>>(x: &[X], y: &[i8]) -> i32 {
    x.iter().zip(y).map(|(&x, &y)| x.into() * y as i32).sum()
}

/// Q4_0 weights · Q8_0 activations.
pub fn vec_dot_q4_0_q8_0(n: usize, w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let w: &[BlockQ4_0] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sumi = isum(&bw.quants(), &ba.qs);
        sumf += bw.d.to_f32() * ba.d.to_f32() * sumi as f32;
    }
    sumf
}

/// Q4_1 weights · Q8_1 activations.
pub fn vec_dot_q4_1_q8_1(n: usize, w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let w: &[BlockQ4_1] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sumi = isum(&bw.quants(), &ba.qs);
        sumf += bw.d.to_f32() * ba.d.to_f32() * sumi as f32 + bw.m.to_f32() * ba.s.to_f32();
    }
    sumf
}

/// Q5_0 weights · Q8_0 activations.
pub fn vec_dot_q5_0_q8_0(n: usize, w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let w: &[BlockQ5_0] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sumi = isum(&bw.quants(), &ba.qs);
        sumf += bw.d.to_f32() * ba.d.to_f32() * sumi as f32;
    }
    sumf
}

/// Q5_1 weights · Q8_1 activations.
pub fn vec_dot_q5_1_q8_1(n: usize, w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let w: &[BlockQ5_1] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sumi = isum(&bw.quants(), &ba.qs);
        sumf += bw.d.to_f32() * ba.d.to_f32() * sumi as f32 + bw.m.to_f32() * ba.s.to_f32();
    }
    sumf
}

/// Q8_0 weights · Q8_0 activations.
pub fn vec_dot_q8_0_q8_0(n: usize, w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let w: &[BlockQ8_0] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sumi = isum(&bw.qs, &ba.qs);
        sumf += bw.d.to_f32() * ba.d.to_f32() * sumi as f32;
    }
    sumf
}

/// `sum_j scale_j * sum(qw * qa over sub-block j)` for sub-blocks of `len` elements.
#[inline]
fn scaled_isum<X: Copy + Into<i32>, S: Copy + Into<i32>>(
    qw: &[X],
    qa: &[i8],
    scales: &[S],
    len: usize,
) -> i32 {
    qw.chunks_exact(len)
        .zip(qa.chunks_exact(len))
        .zip(scales)
        .map(|((w, a), &s)| s.into() * isum(w, a))
        .sum()
}

/// `sum_j m_j * (activation sum over sub-block j)` from Q8_K's 16-element `bsums`, for
/// sub-blocks of `16 * per` elements.
#[inline]
fn mins_isum(mins: &[u8], a: &BlockQ8_K, per: usize) -> i32 {
    mins.iter()
        .enumerate()
        .map(|(j, &m)| m as i32 * (0..per).map(|k| a.bsum(per * j + k) as i32).sum::<i32>())
        .sum()
}

/// Q2_K weights · Q8_K activations.
pub fn vec_dot_q2_K_q8_K(n: usize, w: &[u8], a: &[BlockQ8_K]) -> f32 {
    let w: &[BlockQ2_K] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let scales = bw.scales.map(|s| s & 0x0F);
        let mins = bw.scales.map(|s| s >> 4);
        let isum = scaled_isum(&bw.quants(), &ba.qs, &scales, 16);
        let msum = mins_isum(&mins, ba, 1);
        let da = ba.d();
        sumf += da * bw.d.to_f32() * isum as f32 - da * bw.dmin.to_f32() * msum as f32;
    }
    sumf
}

/// Q3_K weights · Q8_K activations.
pub fn vec_dot_q3_K_q8_K(n: usize, w: &[u8], a: &[BlockQ8_K]) -> f32 {
    let w: &[BlockQ3_K] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let isum = scaled_isum(&bw.quants(), &ba.qs, &bw.scales(), 16);
        sumf += ba.d() * bw.d.to_f32() * isum as f32;
    }
    sumf
}

/// Q4_K weights · Q8_K activations.
pub fn vec_dot_q4_K_q8_K(n: usize, w: &[u8], a: &[BlockQ8_K]) -> f32 {
    let w: &[BlockQ4_K] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let (scales, mins) = bw.scales_mins();
        let isum = scaled_isum(&bw.quants(), &ba.qs, &scales, 32);
        let msum = mins_isum(&mins, ba, 2);
        let da = ba.d();
        sumf += da * bw.d.to_f32() * isum as f32 - da * bw.dmin.to_f32() * msum as f32;
    }
    sumf
}

/// Q5_K weights · Q8_K activations.
pub fn vec_dot_q5_K_q8_K(n: usize, w: &[u8], a: &[BlockQ8_K]) -> f32 {
    let w: &[BlockQ5_K] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let (scales, mins) = bw.scales_mins();
        let isum = scaled_isum(&bw.quants(), &ba.qs, &scales, 32);
        let msum = mins_isum(&mins, ba, 2);
        let da = ba.d();
        sumf += da * bw.d.to_f32() * isum as f32 - da * bw.dmin.to_f32() * msum as f32;
    }
    sumf
}

/// Q6_K weights · Q8_K activations.
pub fn vec_dot_q6_K_q8_K(n: usize, w: &[u8], a: &[BlockQ8_K]) -> f32 {
    let w: &[BlockQ6_K] = weight_blocks(n, w, a);
    let mut sumf = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let isum = scaled_isum(&bw.quants(), &ba.qs, &bw.scales, 16);
        sumf += ba.d() * bw.d.to_f32() * isum as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::{F16Le, blocks_as_bytes};

    #[test]
    fn q8_0_by_hand() {
        let mut w = BlockQ8_0::ZERO;
        let mut a = BlockQ8_0::ZERO;
        w.d = F16Le::from_f32(0.5);
        a.d = F16Le::from_f32(2.0);
        w.qs[0] = 3;
        a.qs[0] = -4;
        w.qs[31] = 127;
        a.qs[31] = 1;
        let got = vec_dot_q8_0_q8_0(32, blocks_as_bytes(&[w]), &[a]);
        assert_eq!(got, (3.0 * -4.0 + 127.0) * 0.5 * 2.0);
        assert_eq!(vec_dot_q8_0_q8_0(0, &[], &[]), 0.0);
    }

    #[test]
    fn worst_case_k_sums_fit_i32() {
        // Q6_K: every quant -32, every scale -128, every activation -127 (or +127).
        let mut w = BlockQ6_K::ZERO;
        w.scales = [-128; 16];
        w.d = F16Le::from_f32(1.0);
        let mut a = BlockQ8_K::ZERO;
        a.qs = [127; 256];
        a.d = 1f32.to_le_bytes();
        let got = vec_dot_q6_K_q8_K(256, blocks_as_bytes(&[w]), &[a]);
        assert_eq!(got, (256 * 127 * 32 * 128) as f32);
    }
}
