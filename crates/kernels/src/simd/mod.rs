//! The kernel tiers behind [`crate::dispatch::Kernels`]: the portable scalar tier
//! ([`scalar`], wrapping the reference twins of [`crate::quant::dot`]) and, on x86-64, the
//! AVX2 / AVX-VNNI / AVX-512 VNNI tiers ([`x86`]). The float kernels of attention and the SiLU
//! gate have their scalar twins in [`attn`].
//!
//! Every tier exports the same raw kernel shapes, [`DotTileFn`] and [`QuantizeFn`]; the
//! dispatch table stores them as function pointers, chosen once by CPU feature detection. The
//! raw kernels are `unsafe fn`s over raw pointers so the hot loop pays no bounds checks; the
//! table's safe wrappers check the lengths once per call.
//!
//! Invariants every tier keeps (the differential tests in `tests/simd_dot.rs` check them):
//! * integer sums are exact: a SIMD kernel may only differ from the reference twin in the order
//!   and grouping of its f32 accumulation;
//! * the activation quantizers are byte-identical to the reference quantizers of
//!   [`crate::quant::q8`], so every tier sees the same quantized activations;
//! * activation quants lie in `-127..=127` (the quantizers never produce -128), which the
//!   `maddubs` sign trick relies on.

pub mod attn;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// Most activation rows one tile kernel call handles: the kernels decode a weight block once
/// and dot it with up to this many activation rows, so prefill reuses each decoded block.
pub const MAX_ROWS: usize = 4;

/// Most activation rows one [Rows16](crate::quant::rows16) tile kernel call handles (their
/// register blocking keeps twice as many rows in flight).
pub const MAX_ROWS_16: usize = 8;

/// A tile of integer dot products: `n_w` weight rows × `n_a` activation rows
/// (`1 <= n_a <= MAX_ROWS`), as raw pointers — what one [`DotTileFn`] call computes:
/// `out[j * out_stride + i] = vec_dot(w_i, a_j)`, where weight row `i` is `nb` weight blocks at
/// `w + i * w_stride` bytes and activation row `j` is `nb` activation blocks at
/// `a + j * a_stride` bytes.
#[derive(Clone, Copy, Debug)]
pub struct Tile {
    pub nb: usize,
    pub w: *const u8,
    pub w_stride: usize,
    pub n_w: usize,
    pub a: *const u8,
    pub a_stride: usize,
    pub n_a: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

impl Tile {
    /// Stores the results `o` (one per activation row) of weight row `i`.
    ///
    /// # Safety
    ///
    /// As [`DotTileFn`]: the outputs of the tile are valid for writes.
    #[inline(always)]
    pub unsafe fn store(&self, i: usize, o: &[f32]) {
        for (j, &v) in o.iter().enumerate() {
            // SAFETY: the caller guarantees the tile's outputs are writable.
            unsafe { *self.out.add(j * self.out_stride + i) = v };
        }
    }
}

/// Computes a [`Tile`]. The weight-row loop runs inside the tier's kernel, so per-row costs
/// (an indirect call, length checks) are paid once per tile.
///
/// # Safety
///
/// Every weight row of the tile must be valid for reads of `nb` weight blocks, every
/// activation row for reads of `nb` activation blocks, every output valid for writes and not
/// accessed by anyone else during the call; `1 <= n_a <= MAX_ROWS`; and the CPU must support
/// the tier's features.
pub type DotTileFn = unsafe fn(t: &Tile);

/// Quantizes a row of f32 activations into the bytes of `x.len() / block_size` blocks of an
/// activation format.
///
/// # Safety
///
/// `x.len()` must be a multiple of the block size, `y.len()` exactly the bytes of
/// `x.len() / block_size` blocks, and the CPU must support the tier's features.
pub type QuantizeFn = unsafe fn(x: &[f32], y: &mut [u8]);

/// f32 dot product of two equal-length slices.
///
/// # Safety
///
/// `a.len() == b.len()`, and the CPU must support the tier's features.
pub type DotF32Fn = unsafe fn(a: &[f32], b: &[f32]) -> f32;

/// One tier's kernels, as plain function pointers (see [`crate::dispatch::Kernels`], which
/// only hands a table out on a CPU that has the tier's features).
#[derive(Clone, Copy)]
#[allow(non_snake_case)]
pub struct TierFns {
    /// Integer dot kernel against ggml's activation partner (`GgmlType::vec_dot_type`), by
    /// weight type (`GgmlType as usize`); `None` for the float types and the activation-only
    /// formats.
    pub dots: [Option<DotTileFn>; 15],
    /// Integer dot kernel against A16 activations ([`crate::quant::a16`]), by weight type;
    /// the 32-element formats have one, and the scalar tier's Q4_K and Q6_K (the references of
    /// its Rows16 kernels).
    pub dots_a16: [Option<DotTileFn>; 15],
    /// Integer dot kernel of [Rows16](crate::quant::rows16) weights against A16 activations,
    /// by weight type (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K). Its [`Tile`]'s `w_stride` is the bytes of
    /// a group of 16 rows, and `n_a` may go up to [`MAX_ROWS_16`].
    pub dots_rows16: [Option<DotTileFn>; 15],
    /// Integer dot kernel of Rows16 weights against A8 activations ([`crate::quant::a8`]), by
    /// weight type, every Rows16 format: the scalar tier's references and the AVX-512 VNNI
    /// kernels; the 256-bit tiers have none (their weights run against A16). Tiles as
    /// [`Self::dots_rows16`].
    pub dots_rows16_a8: [Option<DotTileFn>; 15],
    /// A16 activation quantizer.
    pub quantize_a16: QuantizeFn,
    /// A8 activation quantizer.
    pub quantize_a8: QuantizeFn,
    /// Q8_0 activation quantizer.
    pub quantize_q8_0: QuantizeFn,
    /// Q8_1 activation quantizer.
    pub quantize_q8_1: QuantizeFn,
    /// Q8_K activation quantizer.
    pub quantize_q8_K: QuantizeFn,
    /// f32 dot product.
    pub dot_f32: DotF32Fn,
    /// One attention tile step ([`attn::AttnTileFn`]), for head dims that are a multiple of
    /// `attn_lanes`.
    pub attn_tile: attn::AttnTileFn,
    /// The same over an f16 K/V store.
    pub attn_tile_f16: attn::AttnTileFn<half::f16>,
    /// The same over a bf16 K/V store.
    pub attn_tile_bf16: attn::AttnTileFn<half::bf16>,
    /// The same over an int8 K/V store (with its row scales).
    pub attn_tile_i8: attn::AttnTileFn<i8>,
    /// Merge of two partial attention states, same head dims.
    pub attn_merge: attn::AttnMergeFn,
    /// The f32 lanes of the attention kernels (1 for the scalar tier: any head dim).
    pub attn_lanes: usize,
    /// SiLU-gated product.
    pub silu_mul: attn::SiluMulFn,
    /// Small `O += P · X` over strided rows (MLA's latent accumulation).
    pub acc_rows: attn::AccRowsFn,
    /// Small `S = Q · Kᵀ` over strided rows (MLA's scores).
    pub dot_rows: attn::DotRowsFn,
    /// One online-softmax step over a row of scores (MLA's attention).
    pub softmax_step: attn::SoftmaxStepFn,
    /// The AMX matmul of Rows16 weights (the AMX tier only).
    #[cfg(target_arch = "x86_64")]
    pub amx: Option<AmxFns>,
}

/// The AMX tier's matmul kernels ([`x86::amx`]): the activation splitter and, by weight type,
/// the group runner of Rows16 weights (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub struct AmxFns {
    pub split: x86::amx::AmxSplitFn,
    pub groups: [Option<x86::amx::AmxGroupsFn>; 15],
}

impl TierFns {
    /// The attention tile kernel over a K/V store of `E` (`attn_tile`, `attn_tile_f16`,
    /// `attn_tile_bf16` or `attn_tile_i8`).
    pub fn attn_tile_for<E: crate::kv_elem::KvElem>(&self) -> attn::AttnTileFn<E> {
        use std::any::Any;
        // `KvElem` is sealed to f32, f16, bf16 and i8, so one of the downcasts succeeds.
        let f32_tile: &dyn Any = &self.attn_tile;
        let f16_tile: &dyn Any = &self.attn_tile_f16;
        let bf16_tile: &dyn Any = &self.attn_tile_bf16;
        let i8_tile: &dyn Any = &self.attn_tile_i8;
        *f32_tile
            .downcast_ref::<attn::AttnTileFn<E>>()
            .or_else(|| f16_tile.downcast_ref::<attn::AttnTileFn<E>>())
            .or_else(|| bf16_tile.downcast_ref::<attn::AttnTileFn<E>>())
            .or_else(|| i8_tile.downcast_ref::<attn::AttnTileFn<E>>())
            .expect("KvElem is implemented for f32, f16, bf16 and i8 only")
    }
}
