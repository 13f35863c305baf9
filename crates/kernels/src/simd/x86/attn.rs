//! AVX2 and AVX-512 attention tiles, merge and SiLU gate: the SIMD twins of
//! [`crate::simd::attn`], generic over an f32 vector type ([`F32s`]: eight lanes of `__m256`
//! or sixteen of `__m512`) and instantiated by the tier entry points of [`super::tiers`].
//!
//! Layout of one tile step ([`tile`]), for a block of up to `R` query rows at a time (four
//! on AVX-512; two on AVX2, three when they are the whole step, as a decode row's three
//! grouped heads):
//! * **scores**: the [`KEY_TILE`] keys of the tile are `KV` vectors wide (`KV · N == 16`);
//!   per row, four accumulator chains (one per quarter of `head_dim`) of `KV` vectors each,
//!   fed by broadcasting one query element against one transposed key row — no horizontal
//!   sums, and `4 · R · KV` independent FMA chains (8 to 16) to hide FMA latency. With
//!   sixteen registers (AVX2) the rows of a block sum their chains two at a time (one at a
//!   time for three rows), so that a block's rows share each key load without spilling;
//! * **softmax**: mask lanes past `n_valid` to `-inf`, tile max, [`F32s::exp2`] (a degree-6
//!   polynomial after range reduction, evaluated by Estrin's scheme to shorten the dependency
//!   chain, flushed to zero below `2^-64` — see [`EXP2_FLUSH`]), lane sum;
//! * **values**: blocks of `head_dim` vectors per row held in registers while the tile's
//!   value rows stream by, one FMA per (key, vector); rows of a block share each loaded value
//!   vector. Four vectors a row; eight for a lone row (four FMA chains would wait on their
//!   latency), two for three rows on AVX2 (twelve would spill).
//!
//! Each row's operations are exactly those of the canonical order of [`crate::simd::attn`]
//! (with FMAs where the scalar tier multiplies then adds), whatever `R` and however rows are
//! grouped; `head_dim` must be a multiple of `N` (the dispatch table falls back to the scalar
//! tier otherwise).
//!
//! Keys and values come from a store of f32, f16, bf16 or int8 ([`LoadKv`]: a plain load,
//! F16C / AVX-512 `vcvtph2ps`, for bf16 a zero-extension to 32 bits and a shift by 16, for
//! int8 a sign-extension and a conversion); the widening is exact, so the 16-bit kernels are
//! the f32 kernel over the rounded cache, bit for bit. Over int8 the scales are applied where
//! `E::SCALED` says: to the score chains and to the probabilities.
//!
//! As everywhere in `x86`, these bodies are `#[inline(always)]` without target features and
//! use no closures; they are compiled only inside the `#[target_feature]` entry points.

use std::arch::x86_64::*;

use half::{bf16, f16};

use crate::kv_elem::KvElem;
use crate::simd::attn::{AccRows, AttnTile, DotRows, EXP2_FLUSH, KEY_TILE, exp2 as scalar_exp2};

/// An f32 SIMD vector, as much of it as the attention kernels need.
pub trait F32s: Copy {
    /// Lanes.
    const N: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn sub(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn div(a: Self, b: Self) -> Self;
    unsafe fn max(a: Self, b: Self) -> Self;
    /// `a · b + c`, one rounding.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `2^x` per lane, 0 below [`EXP2_FLUSH`], saturating at `2^127`.
    unsafe fn exp2(self) -> Self;
    unsafe fn hsum(self) -> f32;
    unsafe fn hmax(self) -> f32;
    /// Lane 0.
    unsafe fn first(self) -> f32;
    /// Lanes `i` with `first + i >= n` replaced by `-inf`.
    unsafe fn mask_from(self, first: usize, n: usize) -> Self;
}

// 2^f = Σ (f ln2)^k / k! on [-0.5, 0.5]: relative error below 1.2e-7 at degree 6.
const EXP2_C: [f32; 6] = [
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
];

/// Eight lanes (AVX2 + FMA).
#[derive(Clone, Copy)]
pub struct F32x8(__m256);

impl F32s for F32x8 {
    const N: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { F32x8(_mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { F32x8(_mm256_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { F32x8(_mm256_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        unsafe { F32x8(_mm256_add_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        unsafe { F32x8(_mm256_sub_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        unsafe { F32x8(_mm256_mul_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        unsafe { F32x8(_mm256_div_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        unsafe { F32x8(_mm256_max_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        unsafe { F32x8(_mm256_fmadd_ps(a.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn exp2(self) -> Self {
        unsafe {
            let x = _mm256_min_ps(
                _mm256_max_ps(self.0, _mm256_set1_ps(EXP2_FLUSH)),
                _mm256_set1_ps(127.0),
            );
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let f = _mm256_sub_ps(x, n);
            // Estrin: 1 + c0 f + f²(c1 + c2 f) + f⁴(c3 + c4 f + c5 f²), depth 4.
            let f2 = _mm256_mul_ps(f, f);
            let f4 = _mm256_mul_ps(f2, f2);
            let a = _mm256_fmadd_ps(_mm256_set1_ps(EXP2_C[0]), f, _mm256_set1_ps(1.0));
            let b = _mm256_fmadd_ps(_mm256_set1_ps(EXP2_C[2]), f, _mm256_set1_ps(EXP2_C[1]));
            let c = _mm256_fmadd_ps(_mm256_set1_ps(EXP2_C[4]), f, _mm256_set1_ps(EXP2_C[3]));
            let c = _mm256_fmadd_ps(_mm256_set1_ps(EXP2_C[5]), f2, c);
            let p = _mm256_fmadd_ps(f4, c, _mm256_fmadd_ps(f2, b, a));
            let e = _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n));
            let r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
            let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, _mm256_set1_ps(EXP2_FLUSH));
            F32x8(_mm256_blendv_ps(r, _mm256_setzero_ps(), tiny))
        }
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        unsafe { super::common::hsum_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        unsafe {
            let v = self.0;
            let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_max_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    unsafe fn first(self) -> f32 {
        unsafe { _mm256_cvtss_f32(self.0) }
    }
    #[inline(always)]
    unsafe fn mask_from(self, first: usize, n: usize) -> Self {
        unsafe {
            let valid = n.saturating_sub(first).min(8) as f32;
            let iota = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
            let keep = _mm256_cmp_ps::<_CMP_LT_OQ>(iota, _mm256_set1_ps(valid));
            F32x8(_mm256_blendv_ps(
                _mm256_set1_ps(f32::NEG_INFINITY),
                self.0,
                keep,
            ))
        }
    }
}

/// Loads `N` keys or values of a K/V store of element type `E` as one f32 vector (the one
/// place the attention kernels differ by element type; the widening is exact).
pub trait LoadKv<E>: F32s {
    /// Lanes `p[0..N]`, widened to f32.
    unsafe fn load_kv(p: *const E) -> Self;
}

impl LoadKv<f32> for F32x8 {
    #[inline(always)]
    unsafe fn load_kv(p: *const f32) -> Self {
        unsafe { Self::load(p) }
    }
}

impl LoadKv<f16> for F32x8 {
    /// F16C `vcvtph2ps ymm, m128`.
    #[inline(always)]
    unsafe fn load_kv(p: *const f16) -> Self {
        unsafe { F32x8(_mm256_cvtph_ps(_mm_loadu_si128(p.cast()))) }
    }
}

impl LoadKv<bf16> for F32x8 {
    /// Eight bf16 zero-extended to 32 bits and shifted into the top half: the f32 whose
    /// high 16 bits they are (AVX2 `vpmovzxwd` + `vpslld`).
    #[inline(always)]
    unsafe fn load_kv(p: *const bf16) -> Self {
        unsafe {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            F32x8(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide)))
        }
    }
}

impl LoadKv<i8> for F32x8 {
    /// Eight int8 quants sign-extended and converted (AVX2 `vpmovsxbd` + `vcvtdq2ps`; exact).
    #[inline(always)]
    unsafe fn load_kv(p: *const i8) -> Self {
        unsafe {
            F32x8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                p.cast(),
            ))))
        }
    }
}

impl LoadKv<f32> for F32x16 {
    #[inline(always)]
    unsafe fn load_kv(p: *const f32) -> Self {
        unsafe { Self::load(p) }
    }
}

impl LoadKv<f16> for F32x16 {
    /// AVX-512 F `vcvtph2ps zmm, m256`.
    #[inline(always)]
    unsafe fn load_kv(p: *const f16) -> Self {
        unsafe { F32x16(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
    }
}

impl LoadKv<bf16> for F32x16 {
    /// Sixteen bf16 widened as on AVX2, in one register (AVX-512 F).
    #[inline(always)]
    unsafe fn load_kv(p: *const bf16) -> Self {
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            F32x16(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide)))
        }
    }
}

impl LoadKv<i8> for F32x16 {
    /// Sixteen int8 quants, as on AVX2, in one register (AVX-512 F).
    #[inline(always)]
    unsafe fn load_kv(p: *const i8) -> Self {
        unsafe {
            F32x16(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.cast(),
            ))))
        }
    }
}

/// Sixteen lanes (AVX-512 F).
#[derive(Clone, Copy)]
pub struct F32x16(__m512);

impl F32s for F32x16 {
    const N: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { F32x16(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { F32x16(_mm512_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { F32x16(_mm512_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        unsafe { F32x16(_mm512_add_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        unsafe { F32x16(_mm512_sub_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        unsafe { F32x16(_mm512_mul_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        unsafe { F32x16(_mm512_div_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        unsafe { F32x16(_mm512_max_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        unsafe { F32x16(_mm512_fmadd_ps(a.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn exp2(self) -> Self {
        unsafe {
            let x = _mm512_min_ps(
                _mm512_max_ps(self.0, _mm512_set1_ps(EXP2_FLUSH)),
                _mm512_set1_ps(127.0),
            );
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let f = _mm512_sub_ps(x, n);
            // Estrin: 1 + c0 f + f²(c1 + c2 f) + f⁴(c3 + c4 f + c5 f²), depth 4.
            let f2 = _mm512_mul_ps(f, f);
            let f4 = _mm512_mul_ps(f2, f2);
            let a = _mm512_fmadd_ps(_mm512_set1_ps(EXP2_C[0]), f, _mm512_set1_ps(1.0));
            let b = _mm512_fmadd_ps(_mm512_set1_ps(EXP2_C[2]), f, _mm512_set1_ps(EXP2_C[1]));
            let c = _mm512_fmadd_ps(_mm512_set1_ps(EXP2_C[4]), f, _mm512_set1_ps(EXP2_C[3]));
            let c = _mm512_fmadd_ps(_mm512_set1_ps(EXP2_C[5]), f2, c);
            let p = _mm512_fmadd_ps(f4, c, _mm512_fmadd_ps(f2, b, a));
            let r = _mm512_scalef_ps(p, n);
            let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, _mm512_set1_ps(EXP2_FLUSH));
            F32x16(_mm512_mask_blend_ps(tiny, r, _mm512_setzero_ps()))
        }
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        unsafe { _mm512_reduce_add_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        unsafe { _mm512_reduce_max_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn first(self) -> f32 {
        unsafe { _mm512_cvtss_f32(self.0) }
    }
    #[inline(always)]
    unsafe fn mask_from(self, first: usize, n: usize) -> Self {
        unsafe {
            let valid = n.saturating_sub(first).min(16);
            let keep = ((1u32 << valid) - 1) as __mmask16;
            F32x16(_mm512_mask_blend_ps(
                keep,
                _mm512_set1_ps(f32::NEG_INFINITY),
                self.0,
            ))
        }
    }
}

/// Calls the block phase `f::<S, E, KV, n>(args)` for a run-time row count `n` (1 to 4): each
/// count is its own monomorphized body, its row loops unrolled over registers.
macro_rules! by_rows {
    ($n:expr, $f:ident::<$($g:ty),*>($($a:expr),*)) => {
        match $n {
            1 => $f::<$($g),*, 1>($($a),*),
            2 => $f::<$($g),*, 2>($($a),*),
            3 => $f::<$($g),*, 3>($($a),*),
            _ => $f::<$($g),*, 4>($($a),*),
        }
    };
}

/// One [`AttnTile`] step over a K/V store of `E` (f32, f16, bf16 or int8): a step of at most
/// `R1` rows as one block, else rows in pipelined blocks of up to `R` (`R <= R1 <= 4`), keys
/// `KV` vectors wide (`KV · S::N` must be [`KEY_TILE`]). Larger blocks share each key and
/// value load among more rows and overlap the rows' softmax dependency chains (max, `exp2`,
/// sums: the latency that bounds a decode tile step). On AVX2, two-row blocks measured 1.25×
/// one-row blocks in a 512-token prefill, and a decode step's three grouped heads 1.07–1.09×
/// as one block rather than two + one; three-row pipelined blocks spill (the next block's scores
/// stay live across this block's values).
///
/// The blocks are software-pipelined: the next block's scores are issued before this block's
/// values, and its softmax after them. A block's values wait on its softmax chain; issued
/// straight after it (scores, softmax, values, block by block), they filled the reorder
/// window while the chain ran, and prefill tile steps spent 42% of their samples in the
/// softmax. Rows are independent, so every row's operations stay those of the canonical
/// order. (Two key tiles per call, pipelined the same way for a decode row's one block,
/// measured no faster in batched decode: its K/V stream is bound by memory.)
///
/// # Safety
///
/// As [`crate::simd::attn::AttnTileFn`]; `head_dim` a multiple of `S::N`.
#[inline(always)]
pub unsafe fn tile<S: LoadKv<E>, E: KvElem, const KV: usize, const R: usize, const R1: usize>(
    t: &AttnTile<E>,
) {
    debug_assert_eq!(KV * S::N, KEY_TILE);
    debug_assert_eq!(t.head_dim % S::N, 0);
    debug_assert!((1..=4).contains(&R) && (R..=4).contains(&R1));
    let Some(mut cur) = next_block::<E, R>(t, None) else {
        return;
    };
    unsafe {
        if t.n_rows <= R1 {
            // One block (a decode row's grouped heads): nothing to overlap, and one
            // monomorphized body keeps its scores and probabilities in registers.
            by_rows!(t.n_rows, one_block::<S, E, KV>(t));
            return;
        }
        let mut st = Block::<S, KV>::new();
        by_rows!(cur.n, scores::<S, E, KV>(t, cur.r0, &mut st.s));
        by_rows!(cur.n, softmax::<S, E, KV>(t, cur.r0, &mut st));
        loop {
            let next = next_block::<E, R>(t, Some(cur));
            if let Some(x) = next {
                by_rows!(x.n, scores::<S, E, KV>(t, x.r0, &mut st.s));
            }
            by_rows!(cur.n, values::<S, E, KV>(t, cur.r0, &st));
            let Some(x) = next else {
                break;
            };
            by_rows!(x.n, softmax::<S, E, KV>(t, x.r0, &mut st));
            cur = x;
        }
    }
}

/// A step whose rows are one block of `R`: scores, softmax, values.
#[inline(always)]
unsafe fn one_block<S: LoadKv<E>, E: KvElem, const KV: usize, const R: usize>(t: &AttnTile<E>) {
    unsafe {
        let mut st = Block::<S, KV>::new();
        scores::<S, E, KV, R>(t, 0, &mut st.s);
        softmax::<S, E, KV, R>(t, 0, &mut st);
        values::<S, E, KV, R>(t, 0, &st);
    }
}

/// A block of rows: `n` (1 to 4) rows from `r0`, the `b`-th block of the step.
#[derive(Clone, Copy)]
struct BlockAt {
    b: usize,
    r0: usize,
    n: usize,
}

/// The block after `cur` (the first one for `None`). Blocks are as even as `R` allows (9
/// rows: 3 + 3 + 3, not 4 + 4 + 1): a lone row shares no key load and leaves its softmax
/// chain's latency bare.
#[inline(always)]
fn next_block<E, const R: usize>(t: &AttnTile<E>, cur: Option<BlockAt>) -> Option<BlockAt> {
    let (b, r0) = match cur {
        Some(c) => (c.b + 1, c.r0 + c.n),
        None => (0, 0),
    };
    let blocks = t.n_rows.div_ceil(R);
    if b >= blocks {
        return None;
    }
    let n = (t.n_rows - r0).div_ceil(blocks - b);
    Some(BlockAt { b, r0, n })
}

/// The state passed between the phases of a block of up to four rows: scores (four chains
/// summed, lanes past `n_valid` masked), then probabilities, `acc`'s correction and key
/// counts.
struct Block<S, const KV: usize> {
    s: [[S; KV]; 4],
    p: [[f32; KEY_TILE]; 4],
    corr: [f32; 4],
    n_valid: [usize; 4],
}

impl<S: F32s, const KV: usize> Block<S, KV> {
    #[inline(always)]
    unsafe fn new() -> Self {
        Block {
            s: [[unsafe { S::zero() }; KV]; 4],
            p: [[0.0; KEY_TILE]; 4],
            corr: [1.0; 4],
            n_valid: [0; 4],
        }
    }
}

/// Scores of rows `r0..r0 + R`: four chains per row over the quarters of head_dim (over int8,
/// each times its keys' scales of that quarter), summed `(c0 + c1) + (c2 + c3)`, lanes past
/// the row's `n_valid` masked to `-inf`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scores<S: LoadKv<E>, E: KvElem, const KV: usize, const R: usize>(
    t: &AttnTile<E>,
    r0: usize,
    out: &mut [[S; KV]; 4],
) {
    // Chains summed a pass at a time: with sixteen registers (`N == 8`), more than one
    // row's four chains spill, so rows take the chains in pairs (one by one for three rows).
    // A row's arithmetic is the same either way.
    if S::N == 8 && R == 2 {
        unsafe { scores_in::<S, E, KV, R, 2>(t, r0, out) }
    } else if S::N == 8 && R > 2 {
        unsafe { scores_in::<S, E, KV, R, 1>(t, r0, out) }
    } else {
        unsafe { scores_in::<S, E, KV, R, 4>(t, r0, out) }
    }
}

/// [`scores`] with `CP` of the four chains (1, 2 or 4) summed a pass at a time.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scores_in<S: LoadKv<E>, E: KvElem, const KV: usize, const R: usize, const CP: usize>(
    t: &AttnTile<E>,
    r0: usize,
    out: &mut [[S; KV]; 4],
) {
    let hd = t.head_dim;
    let quarter = hd / 4;
    unsafe {
        // Each row's chains, after the pass that sums them (scaled over int8).
        let mut done = [[[S::zero(); KV]; 4]; R];
        for pass in 0..4 / CP {
            let mut c = [[[S::zero(); KV]; CP]; R];
            for i in 0..quarter {
                for cc in 0..CP {
                    let d = (pass * CP + cc) * quarter + i;
                    let kp = t.kt.add(d * t.kt_stride);
                    let mut kv = [S::zero(); KV];
                    for (k, kv) in kv.iter_mut().enumerate() {
                        *kv = S::load_kv(kp.add(k * S::N));
                    }
                    for (rr, c) in c.iter_mut().enumerate() {
                        let q = S::splat(*t.q.add((r0 + rr) * hd + 4 * i + pass * CP + cc));
                        for k in 0..KV {
                            c[cc][k] = S::fma(q, kv[k], c[cc][k]);
                        }
                    }
                }
            }
            for rr in 0..R {
                for cc in 0..CP {
                    let ch = pass * CP + cc;
                    for k in 0..KV {
                        done[rr][ch][k] = if E::SCALED {
                            S::mul(
                                c[rr][cc][k],
                                S::load(t.k_scale.add(ch * t.kt_stride + k * S::N)),
                            )
                        } else {
                            c[rr][cc][k]
                        };
                    }
                }
            }
        }
        for rr in 0..R {
            let nv = *t.n_valid.add(r0 + rr) as usize;
            let c = &done[rr];
            for k in 0..KV {
                out[rr][k] = S::add(S::add(c[0][k], c[1][k]), S::add(c[2][k], c[3][k]))
                    .mask_from(k * S::N, nv);
            }
        }
    }
}

/// Online softmax of rows `r0..r0 + R` from their scores in `st.s`: updates `m` and `l`,
/// leaves each row's probabilities, correction of `acc` and key count in `st`.
#[inline(always)]
unsafe fn softmax<S: F32s, E: KvElem, const KV: usize, const R: usize>(
    t: &AttnTile<E>,
    r0: usize,
    st: &mut Block<S, KV>,
) {
    unsafe {
        for rr in 0..R {
            let row = r0 + rr;
            st.n_valid[rr] = *t.n_valid.add(row) as usize;
            let s = &st.s[rr];
            let mut mx = s[0];
            for s in &s[1..] {
                mx = S::max(mx, *s);
            }
            let m_old = *t.m.add(row);
            let m_new = m_old.max(mx.hmax());
            st.corr[rr] = S::splat(m_old - m_new).exp2().first();
            let mn = S::splat(m_new);
            let mut sum = S::zero();
            for (k, s) in s.iter().enumerate() {
                let pk = S::sub(*s, mn).exp2();
                // The value update's weight: times the value's scale over an int8 store.
                let pv = if E::SCALED {
                    S::mul(pk, S::load(t.v_scale.add(k * S::N)))
                } else {
                    pk
                };
                pv.store(st.p[rr].as_mut_ptr().add(k * S::N));
                sum = if k == 0 { pk } else { S::add(sum, pk) };
            }
            *t.l.add(row) = *t.l.add(row) * st.corr[rr] + sum.hsum();
            *t.m.add(row) = m_new;
        }
    }
}

/// Values of rows `r0..r0 + R`, in blocks of four vectors of head_dim.
#[inline(always)]
unsafe fn values<S: LoadKv<E>, E: KvElem, const KV: usize, const R: usize>(
    t: &AttnTile<E>,
    r0: usize,
    st: &Block<S, KV>,
) {
    let common = st.n_valid[..R].iter().copied().min().unwrap_or(0);
    let nvec = t.head_dim / S::N;
    let mut b = 0;
    unsafe {
        // A lone row holds eight vectors: four FMA chains would stall on their latency.
        if R == 1 {
            while b + 8 <= nvec {
                pv_block::<S, E, R, 8>(t, r0, b, &st.p, &st.corr, &st.n_valid, common);
                b += 8;
            }
        }
        // Three rows of four vectors spill sixteen registers.
        if S::N == 8 && R > 2 {
            while b + 2 <= nvec {
                pv_block::<S, E, R, 2>(t, r0, b, &st.p, &st.corr, &st.n_valid, common);
                b += 2;
            }
        }
        while b + 4 <= nvec {
            pv_block::<S, E, R, 4>(t, r0, b, &st.p, &st.corr, &st.n_valid, common);
            b += 4;
        }
        while b < nvec {
            pv_block::<S, E, R, 1>(t, r0, b, &st.p, &st.corr, &st.n_valid, common);
            b += 1;
        }
    }
}

/// `acc = acc · corr + Σ_j p_j v_j` for vectors `b..b + DB` of `head_dim`, rows `r0..r0 + R`.
// Index loops over the register arrays: fully unrolled, and no closures (module docs).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn pv_block<S: LoadKv<E>, E: KvElem, const R: usize, const DB: usize>(
    t: &AttnTile<E>,
    r0: usize,
    b: usize,
    p: &[[f32; KEY_TILE]; 4],
    corr: &[f32; 4],
    n_valid: &[usize; 4],
    common: usize,
) {
    let hd = t.head_dim;
    unsafe {
        let mut a = [[S::zero(); DB]; R];
        for rr in 0..R {
            let ap = t.acc.add((r0 + rr) * hd + b * S::N);
            for (x, a) in a[rr].iter_mut().enumerate() {
                *a = S::load(ap.add(x * S::N));
                if corr[rr] != 1.0 {
                    *a = S::mul(*a, S::splat(corr[rr]));
                }
            }
        }
        for j in 0..common {
            let vp = t.v.add(j * t.v_stride + b * S::N);
            let mut v = [S::zero(); DB];
            for (x, v) in v.iter_mut().enumerate() {
                *v = S::load_kv(vp.add(x * S::N));
            }
            for rr in 0..R {
                let pj = S::splat(p[rr][j]);
                for x in 0..DB {
                    a[rr][x] = S::fma(pj, v[x], a[rr][x]);
                }
            }
        }
        for rr in 0..R {
            for j in common..n_valid[rr] {
                let vp = t.v.add(j * t.v_stride + b * S::N);
                let pj = S::splat(p[rr][j]);
                for x in 0..DB {
                    a[rr][x] = S::fma(pj, S::load_kv(vp.add(x * S::N)), a[rr][x]);
                }
            }
            let ap = t.acc.add((r0 + rr) * hd + b * S::N);
            for (x, a) in a[rr].iter().enumerate() {
                a.store(ap.add(x * S::N));
            }
        }
    }
}

/// The merge of [`crate::simd::attn::AttnMergeFn`].
///
/// # Safety
///
/// Equal `acc` lengths, a multiple of `S::N`.
#[inline(always)]
pub unsafe fn merge<S: F32s>(
    dst_m: &mut f32,
    dst_l: &mut f32,
    dst_acc: &mut [f32],
    m: f32,
    l: f32,
    acc: &[f32],
) {
    debug_assert_eq!(dst_acc.len(), acc.len());
    debug_assert_eq!(acc.len() % S::N, 0);
    unsafe {
        let mx = dst_m.max(m);
        let a = S::splat(*dst_m - mx).exp2().first();
        let b = S::splat(m - mx).exp2().first();
        *dst_l = *dst_l * a + l * b;
        *dst_m = mx;
        let (va, vb) = (S::splat(a), S::splat(b));
        let (d, s) = (dst_acc.as_mut_ptr(), acc.as_ptr());
        let mut i = 0;
        while i + S::N <= acc.len() {
            S::fma(S::load(s.add(i)), vb, S::mul(S::load(d.add(i)), va)).store(d.add(i));
            i += S::N;
        }
    }
}

/// `out = gate / (1 + 2^(-gate · log2 e)) · up`; the tail goes through one padded vector, so
/// every element takes the same operations.
///
/// # Safety
///
/// Equal lengths.
#[inline(always)]
pub unsafe fn silu_mul<S: F32s>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len().min(up.len()).min(out.len());
    unsafe {
        let (g, u, o) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr());
        let mut i = 0;
        while i + S::N <= n {
            silu_mul_vec::<S>(g.add(i), u.add(i), o.add(i));
            i += S::N;
        }
        if i < n {
            let mut buf = [[0f32; 16]; 3];
            let rest = n - i;
            std::ptr::copy_nonoverlapping(g.add(i), buf[0].as_mut_ptr(), rest);
            std::ptr::copy_nonoverlapping(u.add(i), buf[1].as_mut_ptr(), rest);
            let [bg, bu, bo] = &mut buf;
            silu_mul_vec::<S>(bg.as_ptr(), bu.as_ptr(), bo.as_mut_ptr());
            std::ptr::copy_nonoverlapping(bo.as_ptr(), o.add(i), rest);
        }
    }
}

#[inline(always)]
unsafe fn silu_mul_vec<S: F32s>(g: *const f32, u: *const f32, o: *mut f32) {
    unsafe {
        let gv = S::load(g);
        let e = S::mul(gv, S::splat(-std::f32::consts::LOG2_E)).exp2();
        let silu = S::div(gv, S::add(S::splat(1.0), e));
        S::mul(silu, S::load(u)).store(o);
    }
}

/// [`crate::simd::attn::AccRowsFn`] on `S`: blocks of 4 output rows × 2 vectors of columns
/// stay in registers across the `n` keys, so each loaded vector of `x` feeds 4 FMAs (and `o`
/// is loaded and stored once per block, not once per key). Rows past the last block of 4 go
/// one at a time; columns past the last pair of vectors one vector, then one value, at a time.
///
/// # Safety
///
/// As [`crate::simd::attn::AccRowsFn`].
#[inline(always)]
pub unsafe fn acc_rows<S: F32s>(s: &AccRows, o: &mut [f32], p: &[f32], x: &[f32]) {
    let (o, p, x) = (o.as_mut_ptr(), p.as_ptr(), x.as_ptr());
    let mut h = 0;
    // SAFETY: every offset stays within the bounds the caller guarantees.
    unsafe {
        while h + 4 <= s.rows {
            acc_row_block::<S, 4>(s, o, p, x, h);
            h += 4;
        }
        while h < s.rows {
            acc_row_block::<S, 1>(s, o, p, x, h);
            h += 1;
        }
    }
}

/// Rows `h..h + H` of [`acc_rows`], every column.
#[inline(always)]
unsafe fn acc_row_block<S: F32s, const H: usize>(
    s: &AccRows,
    o: *mut f32,
    p: *const f32,
    x: *const f32,
    h: usize,
) {
    let mut c = 0;
    unsafe {
        while c + 2 * S::N <= s.cols {
            acc_block::<S, H, 2>(s, o, p, x, h, c);
            c += 2 * S::N;
        }
        while c + S::N <= s.cols {
            acc_block::<S, H, 1>(s, o, p, x, h, c);
            c += S::N;
        }
        for hh in h..h + H {
            for cc in c..s.cols {
                let mut v = *o.add(hh * s.cols + cc);
                for j in 0..s.n {
                    v += *p.add(hh * s.p_stride + j) * *x.add(j * s.x_stride + cc);
                }
                *o.add(hh * s.cols + cc) = v;
            }
        }
    }
}

/// Rows `h..h + H` × columns `c..c + V · S::N` of [`acc_rows`], in registers over the keys.
#[inline(always)]
unsafe fn acc_block<S: F32s, const H: usize, const V: usize>(
    s: &AccRows,
    o: *mut f32,
    p: *const f32,
    x: *const f32,
    h: usize,
    c: usize,
) {
    unsafe {
        let at = |i: usize, v: usize| o.add((h + i) * s.cols + c + v * S::N);
        let mut acc: [[S; V]; H] =
            std::array::from_fn(|i| std::array::from_fn(|v| S::load(at(i, v))));
        for j in 0..s.n {
            let xr = x.add(j * s.x_stride + c);
            let xv: [S; V] = std::array::from_fn(|v| S::load(xr.add(v * S::N)));
            for (i, a) in acc.iter_mut().enumerate() {
                let pv = S::splat(*p.add((h + i) * s.p_stride + j));
                for (av, &xvv) in a.iter_mut().zip(&xv) {
                    *av = S::fma(pv, xvv, *av);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (v, av) in a.iter().enumerate() {
                av.store(at(i, v));
            }
        }
    }
}

/// [`crate::simd::attn::DotRowsFn`] on `S`: blocks of 4 rows × `J` keys (4 on 16-lane
/// vectors, 2 on 8-lane ones, so the accumulators fit the register file) are summed in
/// registers along the columns, so each loaded vector of `q` feeds `J` FMAs and each of `k`
/// feeds 4; one horizontal sum per output, then the column tail one value at a time. Rows past
/// the last block of 4 go one at a time, keys past the last block one at a time.
///
/// # Safety
///
/// As [`crate::simd::attn::DotRowsFn`].
#[inline(always)]
pub unsafe fn dot_rows<S: F32s>(d: &DotRows, s: &mut [f32], q: &[f32], k: &[f32]) {
    let (s, q, k) = (s.as_mut_ptr(), q.as_ptr(), k.as_ptr());
    // SAFETY: every offset stays within the bounds the caller guarantees.
    unsafe {
        let mut i = 0;
        while i + 4 <= d.rows {
            if S::N >= 16 {
                dot_row_block::<S, 4, 4>(d, s, q, k, i);
            } else {
                dot_row_block::<S, 4, 2>(d, s, q, k, i);
            }
            i += 4;
        }
        while i < d.rows {
            dot_row_block::<S, 1, 4>(d, s, q, k, i);
            i += 1;
        }
    }
}

/// Rows `i..i + R` of [`dot_rows`], every key, `J` keys a block.
#[inline(always)]
unsafe fn dot_row_block<S: F32s, const R: usize, const J: usize>(
    d: &DotRows,
    s: *mut f32,
    q: *const f32,
    k: *const f32,
    i: usize,
) {
    let mut j = 0;
    unsafe {
        while j + J <= d.n {
            dot_block::<S, R, J>(d, s, q, k, i, j);
            j += J;
        }
        while j < d.n {
            dot_block::<S, R, 1>(d, s, q, k, i, j);
            j += 1;
        }
    }
}

/// Outputs `(i..i + R) × (j..j + J)` of [`dot_rows`], summed in registers over the columns.
#[inline(always)]
unsafe fn dot_block<S: F32s, const R: usize, const J: usize>(
    d: &DotRows,
    s: *mut f32,
    q: *const f32,
    k: *const f32,
    i: usize,
    j: usize,
) {
    unsafe {
        let qr = |r: usize| q.add((i + r) * d.q_stride);
        let kr = |jj: usize| k.add((j + jj) * d.k_stride);
        let mut acc: [[S; J]; R] = [[S::zero(); J]; R];
        let mut c = 0;
        while c + S::N <= d.cols {
            let kv: [S; J] = std::array::from_fn(|jj| S::load(kr(jj).add(c)));
            for (r, a) in acc.iter_mut().enumerate() {
                let qv = S::load(qr(r).add(c));
                for (av, &kvv) in a.iter_mut().zip(&kv) {
                    *av = S::fma(qv, kvv, *av);
                }
            }
            c += S::N;
        }
        for (r, a) in acc.iter().enumerate() {
            for (jj, av) in a.iter().enumerate() {
                let mut v = av.hsum();
                for cc in c..d.cols {
                    v += *qr(r).add(cc) * *kr(jj).add(cc);
                }
                *s.add((i + r) * d.s_stride + j + jj) = v;
            }
        }
    }
}

/// [`crate::simd::attn::SoftmaxStepFn`]: the scaling and max `S::N` lanes at a time, then
/// [`F32s::exp2`] and the sum (lane tree, then the tail's keys in order through the scalar
/// [`exp2`](crate::simd::attn::exp2)).
///
/// # Safety
///
/// As [`crate::simd::attn::SoftmaxStepFn`].
#[inline(always)]
pub unsafe fn softmax_step<S: F32s>(
    s: &mut [f32],
    valid: usize,
    scale: f32,
    m: &mut f32,
    l: &mut f32,
) -> f32 {
    let (keys, future) = s.split_at_mut(valid);
    future.fill(0.0);
    if keys.is_empty() {
        return 1.0;
    }
    let (p, n) = (keys.as_mut_ptr(), keys.len());
    let full = n / S::N * S::N;
    // SAFETY: every offset is below `n`, the length of `keys`.
    unsafe {
        let sc = S::splat(scale);
        let mut mx = S::splat(f32::NEG_INFINITY);
        for i in (0..full).step_by(S::N) {
            let v = S::mul(S::load(p.add(i)), sc);
            v.store(p.add(i));
            mx = S::max(mx, v);
        }
        let mut m_new = mx.hmax().max(*m);
        for j in full..n {
            *p.add(j) *= scale;
            m_new = m_new.max(*p.add(j));
        }
        let mv = S::splat(m_new);
        let mut sum = S::zero();
        for i in (0..full).step_by(S::N) {
            let e = S::sub(S::load(p.add(i)), mv).exp2();
            e.store(p.add(i));
            sum = S::add(sum, e);
        }
        let mut total = sum.hsum();
        for j in full..n {
            *p.add(j) = scalar_exp2(*p.add(j) - m_new);
            total += *p.add(j);
        }
        let corr = scalar_exp2(*m - m_new);
        *l = *l * corr + total;
        *m = m_new;
        corr
    }
}
