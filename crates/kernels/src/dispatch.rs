//! The kernel table: CPU features detected **once**, kernels chosen into function pointers.
//!
//! As ggml's three tiers (reference `ggml-quants.c`, generic `ggml-cpu/quants.c`, SIMD
//! `ggml-cpu/arch/x86/quants.c`) selected once at load: [`kernels()`] detects the best
//! [`Tier`] on first use (a `OnceLock`) and every op after that is an indirect call through
//! the returned [`Kernels`]. `is_x86_feature_detected!` is only ever evaluated by
//! [`Tier::is_supported`], i.e. when a table is built — never per op.
//!
//! Soundness: the SIMD entry points are `unsafe` because they need their tier's CPU features.
//! A [`Kernels`] value can only be made by [`Kernels::new`], which checks
//! [`Tier::is_supported`] first, so every function pointer inside is safe to call on this CPU
//! and the safe methods here check the buffer lengths the raw kernels rely on.
//!
//! | weight type | scalar | AVX2 / AVX-VNNI / AVX-512 VNNI |
//! |---|---|---|
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 · A16 (matmul) | reference | SIMD, up to 4 activation rows per weight block |
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 · Q8_0/Q8_1 (ggml) | reference | SIMD, up to 4 activation rows per weight block |
//! | Rows16 Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K · A16 (matmul) | reference | SIMD, 16 weight rows a register, up to 8 activation rows |
//! | Q4_K, Q5_K, Q6_K · Q8_K (ggml) | reference | SIMD, bit-identical to the reference |
//! | Q2_K, Q3_K | reference | reference |
//! | A16, Q8_0, Q8_1 activation quantizers | reference | SIMD, byte-identical |
//! | Q8_K activation quantizer | reference | reference |
//! | f32 dot | scalar | FMA |
//! | attention tile / merge (head dim a multiple of the lanes), f32, f16, bf16 or int8 K/V | reference | AVX2 + F16C (8 lanes) / AVX-512 F (16 lanes, AVX-512 tier) |
//! | SiLU-gated product | reference | AVX2 / AVX-512 F |
//!
//! The AMX tier is the AVX-512 VNNI tier plus matmuls of Rows16 weights (Q4_0, Q4_1, Q5_0, Q8_0
//! and Q4_K; not Q6_K, whose 16-column sub-blocks stay on the VNNI kernels) on AMX int8 tiles
//! for calls of 32 or more activation rows (`matmul::AMX_MIN_ROWS`), bit-identical to the VNNI
//! kernels (`simd/x86/amx.rs`).

use std::sync::OnceLock;

use crate::kv_elem::KvElem;
use crate::qmatrix::{Layout, QMatrix};
use crate::quant::GgmlType;
use crate::quant::rows16::GROUP;
use crate::simd::attn::{AccRows, AttnMergeFn, AttnTile, AttnTileFn, DotRows};
use crate::simd::{MAX_ROWS, MAX_ROWS_16, TierFns, scalar};

/// A kernel tier, from the most portable to the fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Plain Rust: the reference twins. Every CPU.
    Scalar,
    /// AVX2 + FMA + F16C, `maddubs`/`madd` integer dots.
    Avx2,
    /// [`Tier::Avx2`] with AVX-VNNI `vpdpbusd` (VEX encoded; Alder Lake, Zen 5 ...).
    AvxVnni,
    /// AVX-512 F + BW + VL + VNNI (and AVX2 + FMA + F16C): EVEX `vpdpbusd`.
    Avx512Vnni,
    /// [`Tier::Avx512Vnni`] plus AMX-TILE + AMX-INT8 (Sapphire Rapids and later), with the
    /// tile state granted by Linux: matmuls of many activation rows on int8 tiles.
    Amx,
}

impl Tier {
    /// Every tier, fastest first.
    pub const ALL: [Tier; 5] = [
        Tier::Amx,
        Tier::Avx512Vnni,
        Tier::AvxVnni,
        Tier::Avx2,
        Tier::Scalar,
    ];

    /// The tier called `name` ([`Tier::name`]).
    pub fn from_name(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether this CPU has the tier's features (runs feature detection: call it when building
    /// a table, not per op).
    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                Tier::Scalar => true,
                Tier::Avx2 => avx2,
                Tier::AvxVnni => avx2 && has!("avxvnni"),
                Tier::Avx512Vnni => {
                    avx2 && has!("avx512f")
                        && has!("avx512bw")
                        && has!("avx512vl")
                        && has!("avx512vnni")
                }
                Tier::Amx => Tier::Avx512Vnni.is_supported() && amx_status().is_ok(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Tier::Scalar
        }
    }

    /// The fastest tier this CPU supports.
    pub fn best() -> Tier {
        Tier::ALL
            .into_iter()
            .find(|t| t.is_supported())
            .unwrap_or(Tier::Scalar)
    }

    /// Every tier this CPU supports, fastest first (for differential tests and benchmarks).
    pub fn supported() -> Vec<Tier> {
        Tier::ALL.into_iter().filter(|t| t.is_supported()).collect()
    }

    /// A short lowercase name (`"avx512-vnni"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::AvxVnni => "avx-vnni",
            Tier::Avx512Vnni => "avx512-vnni",
            Tier::Amx => "amx",
        }
    }

    /// Why the AMX tier is unavailable on this machine, or `Ok` when it is.
    pub fn amx_status() -> Result<(), &'static str> {
        amx_status()
    }
}

/// The AMX int8 tile unit's ceiling on the calling thread, in multiply-adds per second: full-size
/// `tdpbusd` on register-resident tiles for about `min` (best of three), or `None` where the AMX
/// tier cannot run. What a kernel could reach if tile loads, stores and the vector side cost
/// nothing — the roof `profile report` sets the integer matmuls against on an AMX machine.
pub fn amx_int8_peak_macs(min: std::time::Duration) -> Option<f64> {
    amx_status().ok()?;
    #[cfg(target_arch = "x86_64")]
    {
        use crate::simd::x86::amx::{PEAK_MACS_PER_OP, tdpbusd_rounds};
        let mut best = 0f64;
        for _ in 0..3 {
            let (t, mut rounds) = (std::time::Instant::now(), 0u64);
            while t.elapsed() < min / 3 || rounds == 0 {
                // SAFETY: amx_status() said the CPU has AMX-INT8 and Linux granted the tiles.
                unsafe { tdpbusd_rounds(10_000) };
                rounds += 10_000;
            }
            let macs = (rounds * 4 * PEAK_MACS_PER_OP) as f64;
            best = best.max(macs / t.elapsed().as_secs_f64());
        }
        Some(best)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Whether the AMX tier can run: the CPU reports AMX-TILE and AMX-INT8 and Linux granted this
/// process the tile state (asked once, on first call); else why not.
fn amx_status() -> Result<(), &'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        static STATUS: OnceLock<Result<(), &'static str>> = OnceLock::new();
        *STATUS.get_or_init(|| {
            if !crate::simd::x86::amx::cpu_has_amx_int8() {
                Err("the CPU reports no AMX-TILE/AMX-INT8")
            } else if !crate::simd::x86::amx::request_permission() {
                Err("Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")
            } else {
                Ok(())
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Err("not an x86-64 CPU")
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An activation format an integer dot product takes: ggml's Q8_0 / Q8_1 / Q8_K (the
/// `vec_dot_type` partners, bit-compatible with ggml), tokenmill's 12-bit-in-i16
/// [A16](crate::quant::a16), which `matmul` uses for the 32-element weight formats, or the
/// opt-in 8-bit [A8](crate::quant::a8) of the Rows16 weights ([`Kernels::with_a8`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ActFormat {
    Q8_0,
    Q8_1,
    Q8_K,
    A16,
    A8,
}

impl ActFormat {
    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            ActFormat::Q8_K => crate::quant::QK_K,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            ActFormat::Q8_0 => 34,
            ActFormat::Q8_1 => 36,
            ActFormat::Q8_K => 292,
            ActFormat::A16 => crate::quant::A16_BYTES,
            ActFormat::A8 => crate::quant::A8_BYTES,
        }
    }

    /// Bytes of the activation blocks that meet one block of weight type `ty` (several A16
    /// blocks of 32 per k-quant block of 256).
    pub const fn block_bytes_per(self, ty: GgmlType) -> usize {
        ty.block_size() / self.block_size() * self.block_bytes()
    }

    /// ggml's partner of weight type `ty` (`GgmlType::vec_dot_type`), if any.
    pub fn ggml_partner(ty: GgmlType) -> Option<ActFormat> {
        match ty.vec_dot_type()? {
            GgmlType::Q8_0 => Some(ActFormat::Q8_0),
            GgmlType::Q8_1 => Some(ActFormat::Q8_1),
            GgmlType::Q8_K => Some(ActFormat::Q8_K),
            _ => None,
        }
    }

    /// The format `matmul` quantizes activations to for weight type `ty`: A16 for the
    /// 32-element formats, Q8_K for the k-quants; `None` for float weights.
    pub fn for_matmul(ty: GgmlType) -> Option<ActFormat> {
        match ActFormat::ggml_partner(ty)? {
            ActFormat::Q8_K => Some(ActFormat::Q8_K),
            _ => Some(ActFormat::A16),
        }
    }

    /// The dequantized values of activation bytes `a` (whole blocks), for tests.
    pub fn dequantize(self, a: &[u8], dst: &mut [f32]) {
        match self {
            ActFormat::Q8_0 => crate::quant::dequantize_row(GgmlType::Q8_0, a, dst),
            ActFormat::Q8_1 => crate::quant::dequantize_row(GgmlType::Q8_1, a, dst),
            ActFormat::Q8_K => crate::quant::dequantize_row(GgmlType::Q8_K, a, dst),
            ActFormat::A16 => crate::quant::dequantize_row_a16(crate::quant::a16_blocks(a), dst),
            ActFormat::A8 => crate::quant::dequantize_row_a8(crate::quant::a8_blocks(a), dst),
        }
    }
}

/// One tier's kernels. Only exists for tiers this CPU supports (see the module docs).
#[derive(Clone, Copy)]
pub struct Kernels {
    tier: Tier,
    fns: TierFns,
    /// Rows16 weights with an A8 kernel on this tier take 8-bit activations ([`Self::with_a8`]).
    a8: bool,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").field("tier", &self.tier).finish()
    }
}

static KERNELS: OnceLock<Kernels> = OnceLock::new();

/// The process-wide kernel table of the best tier this CPU supports, detected on first call.
pub fn kernels() -> &'static Kernels {
    KERNELS.get_or_init(|| Kernels::new(Tier::best()).expect("the best tier is supported"))
}

/// Fixes the process-wide tier before first use (e.g. a `--kernels scalar` debugging switch).
/// Returns `false` if the tier is unsupported or the table was already initialised with
/// another tier.
pub fn init_kernels(tier: Tier) -> bool {
    init_kernels_with(tier, false)
}

/// Fixes the process-wide tier and activation precision ([`Kernels::with_a8`]) before first
/// use. Returns `false` if the tier is unsupported or the table was already initialised
/// otherwise.
pub fn init_kernels_with(tier: Tier, a8: bool) -> bool {
    match Kernels::new(tier) {
        Some(k) => {
            let k = KERNELS.get_or_init(|| k.with_a8(a8));
            k.tier == tier && k.a8 == a8
        }
        None => false,
    }
}

/// A dot kernel resolved for one (weight type, activation format) pair: what a matmul looks up
/// once and then calls per tile of (weight rows × up to [`MAX_ROWS`] activation rows).
#[derive(Clone, Copy)]
pub struct DotKernel {
    f: crate::simd::DotTileFn,
    /// Elements per block.
    pub block_size: usize,
    /// Bytes per weight block.
    pub w_block_bytes: usize,
    /// The activation format.
    pub act: ActFormat,
    /// Bytes of activation blocks per weight block ([`ActFormat::block_bytes_per`]).
    pub a_block_bytes: usize,
    /// The weight layout the kernel reads.
    pub layout: Layout,
    /// Most activation rows per tile call ([`MAX_ROWS`], or [`MAX_ROWS_16`] for Rows16).
    pub max_rows: usize,
    quantize: crate::simd::QuantizeFn,
}

impl DotKernel {
    /// Checks the read side of a tile: `n_w` contiguous weight rows of `nb` blocks in `w`
    /// (whole groups for Rows16), `n_a` activation rows of `nb` blocks at stride `a_stride`
    /// in `a`.
    #[inline]
    fn check_inputs(&self, nb: usize, w: &[u8], n_w: usize, a: &[u8], a_stride: usize, n_a: usize) {
        assert!((1..=self.max_rows).contains(&n_a), "{n_a} activation rows");
        let stored = match self.layout {
            Layout::Ggml => n_w,
            Layout::Rows16 => n_w.div_ceil(GROUP) * GROUP,
        };
        assert_eq!(
            w.len(),
            stored * nb * self.w_block_bytes,
            "weight rows bytes"
        );
        assert!(
            a_stride >= nb * self.a_block_bytes
                && a.len() >= (n_a - 1) * a_stride + nb * self.a_block_bytes,
            "activation rows"
        );
    }

    /// The tile `out[j * out_stride + i] = vec_dot(w_i, a_j)` for `i < n_w`, `j < n_a`: `w`
    /// holds `n_w` contiguous weight rows of `nb` blocks, activation row `j` starts at
    /// `a[j * a_stride..]`.
    ///
    /// Panics if an input length does not fit or `n_a` is not in `1..=MAX_ROWS`.
    ///
    /// # Safety
    ///
    /// `out` must be valid for writes at every `j * out_stride + i` above, and no other
    /// thread may access those elements during the call. (A raw pointer, so tasks can write
    /// disjoint columns of one output matrix.)
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dot_tile(
        &self,
        nb: usize,
        w: &[u8],
        n_w: usize,
        a: &[u8],
        a_stride: usize,
        n_a: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        self.check_inputs(nb, w, n_w, a, a_stride, n_a);
        let rows_per_stride = match self.layout {
            Layout::Ggml => 1,
            Layout::Rows16 => GROUP,
        };
        let tile = crate::simd::Tile {
            nb,
            w: w.as_ptr(),
            w_stride: rows_per_stride * nb * self.w_block_bytes,
            n_w,
            a: a.as_ptr(),
            a_stride,
            n_a,
            out,
            out_stride,
        };
        // SAFETY: inputs checked above, outputs guaranteed by the caller; `Kernels::new`
        // checked the tier's CPU features.
        unsafe { (self.f)(&tile) }
    }

    /// `out[j] = vec_dot(w, a_j)` for `j < out.len()` (`1..=MAX_ROWS` rows), where `w` is one
    /// weight row of `nb` blocks and activation row `j` starts at `a[j * a_stride..]`.
    ///
    /// Panics if a length does not fit `nb` blocks.
    #[inline]
    pub fn dot_rows(&self, nb: usize, w: &[u8], a: &[u8], a_stride: usize, out: &mut [f32]) {
        // SAFETY: one weight row, so the outputs are `out[j]`, `j < out.len()`, and `out` is
        // borrowed mutably.
        unsafe { self.dot_tile(nb, w, 1, a, a_stride, out.len(), out.as_mut_ptr(), 1) }
    }

    /// The tile of [`dot_tile`](Self::dot_tile) into `out` (`[n_a, out_stride]` row-major,
    /// `out_stride >= n_w`). Panics on mismatched lengths.
    #[allow(clippy::too_many_arguments)]
    pub fn dot_tile_into(
        &self,
        nb: usize,
        w: &[u8],
        n_w: usize,
        a: &[u8],
        a_stride: usize,
        n_a: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        assert!(out_stride >= n_w && out.len() >= (n_a.max(1) - 1) * out_stride + n_w);
        // SAFETY: every `j * out_stride + i` is inside `out` (checked), borrowed mutably.
        unsafe { self.dot_tile(nb, w, n_w, a, a_stride, n_a, out.as_mut_ptr(), out_stride) }
    }

    /// Quantizes `x` (`nb` blocks of `block_size` values) into `y` (`nb · a_block_bytes`
    /// bytes).
    ///
    /// Panics if the lengths do not match.
    #[inline]
    pub fn quantize(&self, x: &[f32], y: &mut [u8]) {
        assert_eq!(x.len() % self.block_size, 0);
        assert_eq!(x.len() / self.block_size * self.a_block_bytes, y.len());
        // SAFETY: lengths checked above; `Kernels::new` checked the tier's CPU features.
        unsafe { (self.quantize)(x, y) }
    }
}

/// The attention kernels of one head dimension (see [`Kernels::attention`]).
#[derive(Clone, Copy)]
pub(crate) struct AttnKernels<T = f32> {
    tile: AttnTileFn<T>,
    merge: AttnMergeFn,
    head_dim: usize,
}

impl<T> AttnKernels<T> {
    /// One online-softmax tile step.
    ///
    /// # Safety
    ///
    /// The pointers of `t` as [`AttnTile`] documents them, and its state not accessed by
    /// anyone else during the call. (`t.head_dim` is checked.)
    #[inline]
    pub(crate) unsafe fn tile(&self, t: &AttnTile<T>) {
        assert_eq!(t.head_dim, self.head_dim, "attention head dim");
        // SAFETY: pointers guaranteed by the caller; the head dim is one this table's
        // kernel supports (`Kernels::attention`), on a CPU with its features.
        unsafe { (self.tile)(t) }
    }

    /// Folds the partial state `(m, l, acc)` into `(dst_m, dst_l, dst_acc)`.
    #[inline]
    pub(crate) fn merge(
        &self,
        dst_m: &mut f32,
        dst_l: &mut f32,
        dst_acc: &mut [f32],
        m: f32,
        l: f32,
        acc: &[f32],
    ) {
        assert!(dst_acc.len() == self.head_dim && acc.len() == self.head_dim);
        // SAFETY: lengths checked; supported head dim on a CPU with the tier's features.
        unsafe { (self.merge)(dst_m, dst_l, dst_acc, m, l, acc) }
    }
}

impl Kernels {
    /// The table of `tier`, or `None` if this CPU lacks its features.
    pub fn new(tier: Tier) -> Option<Kernels> {
        if !tier.is_supported() {
            return None;
        }
        let fns = match tier {
            Tier::Scalar => scalar::fns(),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 => crate::simd::x86::tiers::avx2::fns(),
            #[cfg(target_arch = "x86_64")]
            Tier::AvxVnni => crate::simd::x86::tiers::avx_vnni::fns(),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512Vnni => crate::simd::x86::tiers::avx512_vnni::fns(),
            #[cfg(target_arch = "x86_64")]
            Tier::Amx => crate::simd::x86::tiers::amx_int8::fns(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only the scalar tier is supported off x86-64"),
        };
        Some(Kernels {
            tier,
            fns,
            a8: false,
        })
    }

    /// This table's tier.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The AMX matmul kernels (the AMX tier only).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn amx(&self) -> Option<crate::simd::AmxFns> {
        self.fns.amx
    }

    /// The integer dot kernel of weight type `ty` against activation format `act`, or `None`
    /// if there is none (float weights; A16 with a k-quant, but for the scalar tier's Q4_K —
    /// the reference of its Rows16 kernels; Q8 with the wrong partner).
    pub fn dot_kernel(&self, ty: GgmlType, act: ActFormat) -> Option<DotKernel> {
        let f = if act == ActFormat::A16 {
            self.fns.dots_a16[ty as usize]?
        } else if act == ActFormat::A8 {
            return None;
        } else if ActFormat::ggml_partner(ty) == Some(act) {
            self.fns.dots[ty as usize]?
        } else {
            return None;
        };
        Some(DotKernel {
            f,
            block_size: ty.block_size(),
            w_block_bytes: ty.type_size(),
            act,
            a_block_bytes: act.block_bytes_per(ty),
            layout: Layout::Ggml,
            max_rows: MAX_ROWS,
            quantize: self.quantizer(act),
        })
    }

    /// The kernel `matmul` runs for `w`: by its type and [`Layout`] (Rows16 weights take the
    /// Rows16 kernels, against A16 — or A8 where [`Self::with_a8`] asked for it and this tier
    /// has the kernel), or `None` for float weights.
    pub fn matmul_kernel_for(&self, w: &QMatrix<'_>) -> Option<DotKernel> {
        match w.layout {
            Layout::Ggml => self.matmul_kernel(w.ty),
            Layout::Rows16 => {
                let a8 = self.fns.dots_rows16_a8[w.ty as usize].filter(|_| self.a8);
                let (f, act) = match a8 {
                    Some(f) => (f, ActFormat::A8),
                    None => (self.fns.dots_rows16[w.ty as usize]?, ActFormat::A16),
                };
                Some(DotKernel {
                    f,
                    block_size: w.ty.block_size(),
                    w_block_bytes: w.ty.type_size(),
                    act,
                    a_block_bytes: act.block_bytes_per(w.ty),
                    layout: Layout::Rows16,
                    max_rows: MAX_ROWS_16,
                    quantize: self.quantizer(act),
                })
            }
        }
    }

    /// This table with 8-bit [A8](crate::quant::a8) activations for the Rows16 weights that
    /// have an A8 kernel on its tier (`a8`), or A16 for all (the default): twice the integer
    /// multiply-adds per instruction, at a 16× coarser quantization step
    /// (`--activation-bits 8`). The AMX tiles take A16 only, so on the AMX tier an A8 matmul
    /// runs on the AVX-512 VNNI kernels at every row count (batch invariance stays; whether
    /// that beats the tiles is not measured).
    pub fn with_a8(mut self, a8: bool) -> Kernels {
        self.a8 = a8;
        self
    }

    /// Whether [`Self::with_a8`] asked for 8-bit activations.
    pub fn a8(&self) -> bool {
        self.a8
    }

    /// Whether some Rows16 weight type takes A8 on this table (8-bit activations asked for,
    /// and kernels for them on this tier).
    pub fn runs_a8(&self) -> bool {
        self.a8 && self.fns.dots_rows16_a8.iter().any(Option::is_some)
    }

    /// The Rows16 weight types that run against A16 although [`Self::with_a8`] asked for
    /// 8-bit activations: those without an A8 kernel on this tier (Q8_0 on the 256-bit
    /// tiers); every Rows16 type where A8 was not asked for.
    pub fn rows16_types_at_12_bits(&self) -> Vec<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .filter(|&ty| crate::quant::rows16::supports(ty))
            .filter(|&ty| !self.a8 || self.fns.dots_rows16_a8[ty as usize].is_none())
            .collect()
    }

    /// The kernel `matmul` uses for weight type `ty` (activation format
    /// [`ActFormat::for_matmul`]), or `None` for float weights.
    pub fn matmul_kernel(&self, ty: GgmlType) -> Option<DotKernel> {
        self.dot_kernel(ty, ActFormat::for_matmul(ty)?)
    }

    fn quantizer(&self, act: ActFormat) -> crate::simd::QuantizeFn {
        match act {
            ActFormat::Q8_0 => self.fns.quantize_q8_0,
            ActFormat::Q8_1 => self.fns.quantize_q8_1,
            ActFormat::Q8_K => self.fns.quantize_q8_K,
            ActFormat::A16 => self.fns.quantize_a16,
            ActFormat::A8 => self.fns.quantize_a8,
        }
    }

    /// `vec_dot(w, a)` of one weight row of `n` elements of type `ty` with one activation row
    /// `a` in format `act`.
    ///
    /// Panics if there is no such kernel or the lengths do not match `n`.
    pub fn vec_dot(&self, ty: GgmlType, act: ActFormat, n: usize, w: &[u8], a: &[u8]) -> f32 {
        let k = self.dot_kernel(ty, act).expect("a kernel for this pair");
        assert_eq!(n % k.block_size, 0, "{n} elements of {ty}");
        let nb = n / k.block_size;
        assert_eq!(a.len(), nb * k.a_block_bytes, "activation bytes");
        let mut out = [0f32];
        k.dot_rows(nb, w, a, a.len(), &mut out);
        out[0]
    }

    /// Quantizes `x` into activation format `act`, bytes `y`. Panics on mismatched lengths.
    pub fn quantize_act(&self, act: ActFormat, x: &[f32], y: &mut [u8]) {
        assert_eq!(x.len() % act.block_size(), 0);
        assert_eq!(x.len() / act.block_size() * act.block_bytes(), y.len());
        // SAFETY: lengths checked above; `Kernels::new` checked the tier's CPU features.
        unsafe { self.quantizer(act)(x, y) }
    }

    /// The attention kernels for heads of `head_dim` over a K/V store of `T`: this tier's
    /// when `head_dim` is a multiple of its lanes, else the scalar tier's (chosen per call
    /// site, once per layer call: every row of a model then takes the same kernel).
    pub(crate) fn attention<T: KvElem>(&self, head_dim: usize) -> AttnKernels<T> {
        let (tile, merge) = if head_dim.is_multiple_of(self.fns.attn_lanes) {
            (self.fns.attn_tile_for::<T>(), self.fns.attn_merge)
        } else {
            let s = scalar::fns();
            (s.attn_tile_for::<T>(), s.attn_merge)
        };
        AttnKernels {
            tile,
            merge,
            head_dim,
        }
    }

    /// `out = silu(gate) · up` element-wise. Panics on unequal lengths.
    #[inline]
    pub fn silu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        assert!(gate.len() == up.len() && up.len() == out.len());
        // SAFETY: lengths checked above; `Kernels::new` checked the tier's CPU features.
        unsafe { (self.fns.silu_mul)(gate, up, out) }
    }

    /// One online-softmax step over a row of raw scores, in base 2 (see
    /// [`SoftmaxStepFn`](crate::simd::attn::SoftmaxStepFn)): the first `valid` of `s` become
    /// the weights `2^(scale·s − m')`, the rest 0; `m`, `l` are updated and the factor the
    /// row's output is to be scaled by is returned. Panics if `valid > s.len()`.
    #[inline]
    pub fn softmax_step(
        &self,
        s: &mut [f32],
        valid: usize,
        scale: f32,
        m: &mut f32,
        l: &mut f32,
    ) -> f32 {
        assert!(valid <= s.len(), "{valid} valid scores of {}", s.len());
        // SAFETY: length checked above; `Kernels::new` checked the tier's CPU features.
        unsafe { (self.fns.softmax_step)(s, valid, scale, m, l) }
    }

    /// `o[h][c] += Σ_{j<n} p[h·p_stride + j] · x[j·x_stride + c]` for every row `h` and
    /// column `c` of `o` (row-major `[s.rows, s.cols]`; see [`AccRows`]). Panics if a slice is
    /// too short for the shape.
    #[inline]
    pub fn acc_rows(&self, s: &AccRows, o: &mut [f32], p: &[f32], x: &[f32]) {
        assert!(o.len() >= s.rows * s.cols, "o is shorter than rows × cols");
        if s.rows == 0 || s.cols == 0 || s.n == 0 {
            return;
        }
        assert!(p.len() >= (s.rows - 1) * s.p_stride + s.n, "p is too short");
        assert!(x.len() >= (s.n - 1) * s.x_stride + s.cols, "x is too short");
        // SAFETY: lengths checked above; `Kernels::new` checked the tier's CPU features.
        unsafe { (self.fns.acc_rows)(s, o, p, x) }
    }

    /// `s[i·s_stride + j] = Σ_c q[i·q_stride + c] · k[j·k_stride + c]` for every row `i` and
    /// key `j` of the shape (see [`DotRows`]). Panics if a slice is too short for the shape.
    #[inline]
    pub fn dot_rows(&self, d: &DotRows, s: &mut [f32], q: &[f32], k: &[f32]) {
        if d.rows == 0 || d.n == 0 {
            return;
        }
        assert!(s.len() >= (d.rows - 1) * d.s_stride + d.n, "s is too short");
        assert!(
            q.len() >= (d.rows - 1) * d.q_stride + d.cols,
            "q is too short"
        );
        assert!(k.len() >= (d.n - 1) * d.k_stride + d.cols, "k is too short");
        // SAFETY: lengths checked above; `Kernels::new` checked the tier's CPU features.
        unsafe { (self.fns.dot_rows)(d, s, q, k) }
    }

    /// f32 dot product of two equal-length slices (panics otherwise).
    #[inline]
    pub fn dot_f32(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        // SAFETY: equal lengths; `Kernels::new` checked the tier's CPU features.
        unsafe { (self.fns.dot_f32)(a, b) }
    }
}
