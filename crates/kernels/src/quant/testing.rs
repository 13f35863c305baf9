//! Deterministic test data for the quantized formats: a tiny seeded RNG and random weight rows
//! of every type. For tests and benchmarks (here and in the crates that test kernels against
//! the reference twins), never for model data.
//!
//! The generator is our own SplitMix64 so that a seed means the same data forever, whatever
//! version of `rand` the workspace uses.

use super::blocks::{
    BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, F16Le, cast_blocks_mut,
};
use super::quantize::quantize_row;
use super::types::GgmlType;

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, good enough for test data.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next_f32()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = 1.0 - self.next_f32() as f64; // (0, 1]
        let u2 = self.next_f32() as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// Fills `dst` with random bytes.
    pub fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }

    /// A random f16 scale: random sign, magnitude log-uniform in `[lo, hi)`.
    pub fn f16_scale(&mut self, lo: f32, hi: f32) -> F16Le {
        let mag = (lo.ln() + (hi.ln() - lo.ln()) * self.next_f32()).exp();
        let sign = if self.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        F16Le::from_f32(sign * mag)
    }
}

/// `n` values `normal() * scale`.
pub fn random_f32_row(rng: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * scale).collect()
}

/// A random row of `n` elements of weight type `ty`, as GGUF bytes.
///
/// Types with a reference quantizer quantize normal data; the k-quants are random bytes (every
/// bit pattern is a valid block) with their f16 super-block scales replaced by moderate finite
/// values, so all scale, min and quant codes occur.
pub fn random_weight_row(rng: &mut SplitMix64, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; ty.bytes_for(n as u64).expect("whole blocks") as usize];
    // The k-quants stay random bytes even where a quantizer exists: every code occurs.
    let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K);
    if ty.has_ref_quantizer() && !k_quant {
        let x = random_f32_row(rng, n, 1.0);
        quantize_row(ty, &x, &mut bytes);
        return bytes;
    }
    rng.fill_bytes(&mut bytes);
    let (lo, hi) = (1e-3, 1e-1);
    match ty {
        GgmlType::Q2_K => cast_blocks_mut::<BlockQ2_K>(&mut bytes)
            .iter_mut()
            .for_each(|b| {
                b.d = rng.f16_scale(lo, hi);
                b.dmin = rng.f16_scale(lo, hi);
            }),
        GgmlType::Q3_K => cast_blocks_mut::<BlockQ3_K>(&mut bytes)
            .iter_mut()
            .for_each(|b| b.d = rng.f16_scale(lo, hi)),
        GgmlType::Q4_K => cast_blocks_mut::<BlockQ4_K>(&mut bytes)
            .iter_mut()
            .for_each(|b| {
                b.d = rng.f16_scale(lo, hi);
                b.dmin = rng.f16_scale(lo, hi);
            }),
        GgmlType::Q5_K => cast_blocks_mut::<BlockQ5_K>(&mut bytes)
            .iter_mut()
            .for_each(|b| {
                b.d = rng.f16_scale(lo, hi);
                b.dmin = rng.f16_scale(lo, hi);
            }),
        GgmlType::Q6_K => cast_blocks_mut::<BlockQ6_K>(&mut bytes)
            .iter_mut()
            .for_each(|b| b.d = rng.f16_scale(lo, hi)),
        _ => unreachable!("{ty} is not a k-quant"),
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        for _ in 0..1000 {
            let (x, y) = (a.next_f32(), b.next_f32());
            assert_eq!(x, y);
            assert!((0.0..1.0).contains(&x));
        }
        let mean = (0..10_000).map(|_| a.normal()).sum::<f32>() / 10_000.0;
        assert!(mean.abs() < 0.05);
    }

    #[test]
    fn random_rows_have_the_right_size() {
        let mut rng = SplitMix64::new(1);
        for ty in GgmlType::ALL {
            let n = 2 * 256;
            assert_eq!(
                random_weight_row(&mut rng, ty, n).len() as u64,
                ty.bytes_for(n as u64).unwrap()
            );
        }
    }
}
