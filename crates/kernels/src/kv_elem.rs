//! The element type of a paged K/V store: f32, or at half the bytes per token IEEE binary16
//! (`half::f16`) or bfloat16 (`half::bf16`: f32's exponent range, 8 bits of mantissa).
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
//! One generic code path over the element type: the store, the views, the write, the tile
//! gather and the kernels are generic over [`KvElem`] (implemented for `f32`, `f16` and
//! `bf16` only), and the SIMD kernels over "load one vector of lanes of `E` as f32"
//! (`simd::x86::attn::LoadKv`). This module sits below both the attention code and the SIMD
//! kernels (it depends on neither); the tier table picks a tile kernel per element type
//! (`TierFns::attn_tile_for`).

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
}

impl KvDtype {
    /// Every dtype, in the order the CLI lists them.
    pub const ALL: [KvDtype; 3] = [KvDtype::F32, KvDtype::F16, KvDtype::BF16];

    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::BF16 => 2,
        }
    }

    /// `"f32"`, `"f16"` or `"bf16"`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::BF16 => "bf16",
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
            .ok_or_else(|| format!("unknown KV cache dtype {s:?} (expected f32, f16 or bf16)"))
    }
}

mod sealed {
    /// Seals [`super::KvElem`]: only `f32`, `f16` and `bf16` implement it.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type of the paged K/V store: `f32`, `f16` or `bf16` (sealed).
pub trait KvElem: sealed::Sealed + Copy + Default + Send + Sync + fmt::Debug + 'static {
    const DTYPE: KvDtype;
    /// This type's nearest value to `x` (round to nearest, ties to even).
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

/// `buf` viewed as elements of `T` (as many as its bytes hold): the tile gather's scratch is
/// f32, whatever the store's element type.
pub(crate) fn cast_buf<T: KvElem>(buf: &mut [f32]) -> &mut [T] {
    const { assert!(std::mem::size_of::<T>() <= 4 && std::mem::align_of::<T>() <= 4) };
    let n = std::mem::size_of_val(buf) / std::mem::size_of::<T>();
    // SAFETY: `T` is f32, f16 or bf16 (the sealed trait): plain bits, every pattern valid,
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
        assert!("fp8".parse::<KvDtype>().is_err());
        assert_eq!(KvDtype::F16.bytes() * 2, KvDtype::F32.bytes());
        assert_eq!(KvDtype::BF16.bytes(), KvDtype::F16.bytes());
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
