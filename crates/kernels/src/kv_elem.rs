//! The element type of a paged K/V store: f32, or at half the bytes per token IEEE binary16
//! (`half::f16`) or bfloat16 (`half::bf16`: f32's exponent range, 8 bits of mantissa), or at
//! a quarter (plus a scale) int8 with one f32 scale per row (`i8`).
//!
//! Attention reads K and V from memory once per step, so in batched decode it is bound by the
//! cache's bytes; f16 and bf16 halve them (llama.cpp's default `-ctk f16 -ctv f16`, and its
//! `-ctk bf16`; vLLM's `--kv-cache-dtype`). bf16 trades f16's three extra mantissa bits for
//! f32's range: no value a model writes overflows it. Keys and values are rounded (to nearest,
//! ties to even) when written ([`crate::attention::PagedKvMut::write`]: K after RoPE) and
//! widened back to f32 exactly as the kernels load them (x86: F16C `vcvtph2ps` / AVX-512
//! `vcvtph2ps zmm` for f16; for bf16 a zero-extension of each 16-bit lane and a shift into
//! the top half of the f32); every operation after the load is the f32 kernel's, in the same
//! canonical order. So a 16-bit run is the f32 kernel over the rounded cache, bit for bit
//! (`tests/attention.rs` checks it), and the f32 path is unchanged.
//!
//! **int8** (`--kv-cache-dtype int8`; OpenVINO's default KV precision is u8, llama.cpp's
//! `-ctk q8_0`): each (token, KV head) row of K (after RoPE) and of V is stored as `i8`
//! quants `q = round(x · 127 / absmax)` (to nearest even, within ±127) with its scale
//! `absmax / 127` beside the store ([`int8_scale`]) — a key in four groups, its quarters
//! ([`K_SCALE_GROUPS`]); a group of zeros, or one with a value that is not finite, gets
//! scale 0. The kernels widen the quants exactly and apply the scales where they cost
//! least: each of a tile's four partial score sums (one per quarter of `head_dim`) is
//! multiplied by its keys' scales before they are added, and each probability by its value
//! row's scale before `P · V` ([`KvElem::SCALED`]). So an int8 run is not the f32 kernel
//! over the dequantized cache bit for bit (the scale moves from each element to the sum); it
//! is tested against the reference over the dequantized values with an error budget.
//!
//! One generic code path over the element type: the store, the views, the write, the tile
//! gather and the kernels are generic over [`KvElem`] (implemented for `f32`, `f16`, `bf16`
//! and `i8` only), and the SIMD kernels over "load one vector of lanes of `E` as f32"
//! (`simd::x86::attn::LoadKv`); the scales only where `E::SCALED`. This module sits below
//! both the attention code and the SIMD kernels (it depends on neither); the tier table picks
//! a tile kernel per element type (`TierFns::attn_tile_for`).

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

/// What a K/V cache stores per element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 4 bytes; exact.
    #[default]
    F32,
    /// 2 bytes; IEEE binary16, rounded to nearest even on write.
    F16,
    /// 2 bytes; bfloat16 (the top half of an f32), rounded to nearest even on write.
    BF16,
    /// 1 byte, plus one f32 scale per row (a KV head's K or V of one token); symmetric, to
    /// nearest even.
    I8,
}

impl KvDtype {
    /// Every dtype, in the order the CLI lists them.
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::I8];

    /// Bytes of one element (without the scales of [`KvDtype::I8`]: see
    /// [`Self::row_bytes`]).
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::BF16 => 2,
            KvDtype::I8 => 1,
        }
    }

    /// Bytes the store holds for one token's K and V of one KV head: `2 · head_dim`
    /// elements, and for int8 their f32 scales ([`K_SCALE_GROUPS`] for K, one for V).
    pub fn head_bytes(self, head_dim: usize) -> usize {
        let scales = if self == KvDtype::I8 {
            K_SCALE_GROUPS + 1
        } else {
            0
        };
        2 * head_dim * self.bytes() + 4 * scales
    }

    /// `"f32"`, `"f16"`, `"bf16"` or `"int8"`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::BF16 => "bf16",
            KvDtype::I8 => "int8",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!("unknown KV cache dtype {s:?} (expected f32, f16, bf16 or int8)")
            })
    }
}

mod sealed {
    /// Seals [`super::KvElem`]: only `f32`, `f16`, `bf16` and `i8` implement it.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for i8 {}
}

/// An element type of the paged K/V store: `f32`, `f16`, `bf16` or `i8` (sealed).
pub trait KvElem: sealed::Sealed + Copy + Default + Send + Sync + fmt::Debug + 'static {
    const DTYPE: KvDtype;
    /// Whether each stored row carries an f32 scale (the value is `to_f32() · scale`): `i8`
    /// only. The float types are their own values.
    const SCALED: bool = false;
    /// This type's nearest value to `x` (round to nearest, ties to even; `i8`: of the
    /// already scaled `x`, saturated to ±127).
    fn from_f32(x: f32) -> Self;
    /// Exact widening.
    fn to_f32(self) -> f32;
    /// `dst[i] = from_f32(src[i])` (equal lengths), the way a whole run converts fastest.
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len());
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(x);
        }
    }
}

impl KvElem for f32 {
    const DTYPE: KvDtype = KvDtype::F32;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for f16 {
    const DTYPE: KvDtype = KvDtype::F16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    /// `half`'s slice conversion: F16C `vcvtps2ph` several lanes at a time where the CPU has
    /// it (detected once per call, not per element), the same rounding as [`f16::from_f32`].
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

impl KvElem for bf16 {
    const DTYPE: KvDtype = KvDtype::BF16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl KvElem for i8 {
    const DTYPE: KvDtype = KvDtype::I8;
    const SCALED: bool = true;
    /// Clamped to ±127, then rounded to nearest even by adding 1.5 · 2^23, where the f32
    /// spacing is 1, and read back from the sum's bits (whose mantissa counts up by one per
    /// integer there): plain arithmetic that the compiler vectorizes, where `round_ties_even`
    /// is a libm call on baseline x86-64 and a saturating `as` is not vectorized. A NaN gives
    /// some quant; the write only quantizes one in a group of scale 0, which reads back as 0.
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        const MAGIC: f32 = 12_582_912.0;
        ((x.clamp(-127.0, 127.0) + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32) as i8
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

/// Scales per (token, KV head) row of an int8 K: one per quarter of `head_dim` — the four
/// chains a score sums ([`crate::simd::attn`]'s canonical order), so each chain's sum is
/// scaled once. Keys carry outlier channels (a few dims far larger than the rest); a quarter
/// without one keeps its own resolution. V has one scale per row.
pub const K_SCALE_GROUPS: usize = 4;

/// The int8 scale of a row whose largest magnitude is `absmax`, and the factor its values
/// are multiplied by before rounding: `(absmax / 127, 127 / absmax)`, or `(0, 0)` for a row
/// of zeros or one that is not finite (it reads back as zeros).
#[inline]
pub fn int8_scale(absmax: f32) -> (f32, f32) {
    if absmax > 0.0 && absmax.is_finite() {
        (absmax / 127.0, 127.0 / absmax)
    } else {
        (0.0, 0.0)
    }
}

/// The largest `|x|` of `xs` (0 for none) as the bits of an f32, NaN if one is NaN: for
/// non-negative floats the bits' integer order is the values' order, and a NaN's bits lie
/// above every number's, so an integer max (which vectorizes) finds it. `f32::from_bits` of
/// the result is the magnitude; two results combine with `max`.
#[inline]
pub fn absmax_bits(xs: &[f32]) -> u32 {
    xs.iter().fold(0, |m, x| m.max(x.to_bits() & 0x7fff_ffff))
}

/// Quantizes `src` into `dst` (equal lengths) as one int8 row; returns its scale.
pub fn quantize_int8_row(src: &[f32], dst: &mut [i8]) -> f32 {
    assert_eq!(src.len(), dst.len());
    let (scale, inv) = int8_scale(f32::from_bits(absmax_bits(src)));
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = i8::from_f32(x * inv);
    }
    scale
}

/// `buf` viewed as elements of `T` (as many as its bytes hold): the tile gather's scratch is
/// f32, whatever the store's element type.
pub(crate) fn cast_buf<T: KvElem>(buf: &mut [f32]) -> &mut [T] {
    const { assert!(std::mem::size_of::<T>() <= 4 && std::mem::align_of::<T>() <= 4) };
    let n = std::mem::size_of_val(buf) / std::mem::size_of::<T>();
    // SAFETY: `T` is f32, f16, bf16 or i8 (the sealed trait): plain bits, every pattern valid,
    // alignment at most f32's; the view covers exactly the bytes of `buf` and borrows it
    // mutably.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<T>(), n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_parses_and_prints() {
        for d in KvDtype::ALL {
            assert_eq!(d.to_string().parse::<KvDtype>(), Ok(d));
        }
        assert_eq!("F16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert_eq!("BF16".parse::<KvDtype>(), Ok(KvDtype::BF16));
        assert_eq!("INT8".parse::<KvDtype>(), Ok(KvDtype::I8));
        assert!("fp8".parse::<KvDtype>().is_err());
        assert_eq!(KvDtype::F16.bytes() * 2, KvDtype::F32.bytes());
        assert_eq!(KvDtype::BF16.bytes(), KvDtype::F16.bytes());
        assert_eq!(KvDtype::F16.head_bytes(64), 256);
        assert_eq!(KvDtype::I8.head_bytes(64), 128 + 20);
    }

    #[test]
    fn int8_rows_round_to_nearest_even_within_the_row_scale() {
        // absmax 254: scale 2, so the quants are the halves, ties to even.
        let src = [254.0f32, -127.0, 1.0, 3.0, 0.0, -254.0, 100.2];
        let mut q = [0i8; 7];
        let scale = quantize_int8_row(&src, &mut q);
        assert_eq!(scale, 2.0);
        assert_eq!(q, [127, -64, 0, 2, 0, -127, 50]);
        for (x, q) in src.iter().zip(q) {
            assert!((q as f32 * scale - x).abs() <= 0.5 * scale);
        }
        // Zeros and non-finite rows get scale 0 (they read back as 0); saturation is symmetric.
        assert_eq!(quantize_int8_row(&[0.0; 3], &mut q[..3]), 0.0);
        assert_eq!(q[..3], [0, 0, 0]);
        assert_eq!(quantize_int8_row(&[1.0, f32::NAN, 2.0], &mut q[..3]), 0.0);
        assert_eq!(
            quantize_int8_row(&[1.0, f32::INFINITY, -2.0], &mut q[..3]),
            0.0
        );
        assert!(f32::from_bits(absmax_bits(&[1.0, f32::NAN, -3.0])).is_nan());
        assert_eq!(f32::from_bits(absmax_bits(&[1.0, -3.5, 2.0])), 3.5);
        assert_eq!(absmax_bits(&[]), 0);
        assert_eq!(i8::from_f32(300.0), 127);
        assert_eq!(i8::from_f32(-300.0), -127);
        // The rounding trick agrees with round_ties_even over the whole range, halves included.
        for i in -1300..=1300 {
            let x = i as f32 / 10.0 + 0.05 * (i % 2) as f32;
            let want = x.round_ties_even().clamp(-127.0, 127.0) as i8;
            assert_eq!(i8::from_f32(x), want, "{x}");
        }
        for h in -255..=255 {
            let x = h as f32 / 2.0;
            assert_eq!(
                i8::from_f32(x),
                x.round_ties_even().clamp(-127.0, 127.0) as i8
            );
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
        assert_eq!(f16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
        // 1 + 3·2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9.
        let x = 1.0 + 3.0 * 2f32.powi(-11);
        assert_eq!(<f16 as KvElem>::from_f32(x).to_f32(), 1.0 + 2f32.powi(-9));
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_f32_range() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
        assert_eq!(
            <bf16 as KvElem>::from_f32(1.0 + 2f32.powi(-8)).to_f32(),
            1.0
        );
        // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        let x = 1.0 + 3.0 * 2f32.powi(-8);
        assert_eq!(<bf16 as KvElem>::from_f32(x).to_f32(), 1.0 + 2f32.powi(-6));
        // Past f16's largest finite value (65504), bf16 still holds it to 3 digits.
        let big = <bf16 as KvElem>::from_f32(1.0e6).to_f32();
        assert!((big - 1.0e6).abs() < 1.0e6 / 256.0, "{big}");
        assert!(<f16 as KvElem>::from_f32(1.0e6).to_f32().is_infinite());
        // Widening is exact: the f32 with the same top 16 bits and zeros below.
        let b = <bf16 as KvElem>::from_f32(-3.3);
        assert_eq!(b.to_f32().to_bits(), (b.to_bits() as u32) << 16);
    }
}
