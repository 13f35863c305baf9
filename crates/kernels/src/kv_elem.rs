//! The element type of a paged K/V store: f32, or IEEE binary16 (`half::f16`) at half the
//! bytes per token.
//!
//! Attention reads K and V from memory once per step, so in batched decode it is bound by the
//! cache's bytes; f16 halves them (llama.cpp's default `-ctk f16 -ctv f16`, vLLM's
//! `--kv-cache-dtype`). Keys and values are rounded to f16 (round to nearest, ties to even)
//! when written ([`crate::attention::PagedKvMut::write`]: K after RoPE) and widened back to f32 exactly
//! as the kernels load them (x86: F16C `vcvtph2ps` / AVX-512 `vcvtph2ps zmm`); every
//! operation after the load is the f32 kernel's, in the same canonical order. So an f16 run is
//! the f32 kernel over the f16-rounded cache, bit for bit (`tests/attention.rs` checks it),
//! and the f32 path is unchanged.
//!
//! One generic code path over the element type: the store, the views, the write, the tile
//! gather and the kernels are generic over [`KvElem`] (implemented for `f32` and `f16` only),
//! and the SIMD kernels over "load one vector of lanes of `E` as f32"
//! (`simd::x86::attn::LoadKv`). This module sits below both the attention code and the SIMD
//! kernels (it depends on neither); the tier table picks a tile kernel per element type
//! (`TierFns::attn_tile_for`).

use std::fmt;
use std::str::FromStr;

use half::f16;

/// What a K/V cache stores per element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 4 bytes; exact.
    #[default]
    F32,
    /// 2 bytes; IEEE binary16, rounded to nearest even on write.
    F16,
}

impl KvDtype {
    /// Every dtype, in the order the CLI lists them.
    pub const ALL: [KvDtype; 2] = [KvDtype::F32, KvDtype::F16];

    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    /// `"f32"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
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
            .ok_or_else(|| format!("unknown KV cache dtype {s:?} (expected f32 or f16)"))
    }
}

mod sealed {
    /// Seals [`super::KvElem`]: only `f32` and `f16` implement it.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// An element type of the paged K/V store: `f32` or `f16` (sealed).
pub trait KvElem: sealed::Sealed + Copy + Default + Send + Sync + fmt::Debug + 'static {
    const DTYPE: KvDtype;
    /// This type's nearest value to `x` (round to nearest, ties to even).
    fn from_f32(x: f32) -> Self;
    /// Exact widening.
    fn to_f32(self) -> f32;
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
}

/// `buf` viewed as elements of `T` (as many as its bytes hold): the tile gather's scratch is
/// f32, whatever the store's element type.
pub(crate) fn cast_buf<T: KvElem>(buf: &mut [f32]) -> &mut [T] {
    const { assert!(std::mem::size_of::<T>() <= 4 && std::mem::align_of::<T>() <= 4) };
    let n = std::mem::size_of_val(buf) / std::mem::size_of::<T>();
    // SAFETY: `T` is f32 or f16 (the sealed trait): plain bits, every pattern valid, alignment
    // at most f32's; the view covers exactly the bytes of `buf` and borrows it mutably.
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
        assert!("bf16".parse::<KvDtype>().is_err());
        assert_eq!(KvDtype::F16.bytes() * 2, KvDtype::F32.bytes());
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
        assert_eq!(f16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
        // 1 + 3·2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9.
        let x = 1.0 + 3.0 * 2f32.powi(-11);
        assert_eq!(<f16 as KvElem>::from_f32(x).to_f32(), 1.0 + 2f32.powi(-9));
    }
}
