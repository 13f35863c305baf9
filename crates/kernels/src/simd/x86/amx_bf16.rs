//! AMX bf16 matmul of [Rows16](crate::quant::rows16) weights (Q4_0, Q4_1, Q8_0) against f32
//! activations — the faster, *not* batch-invariant alternative to the exact int8 kernel of
//! [`super::amx`], run by the `amx-bf16` tier only (never chosen by default).
//!
//! Each f32 operand is split into two bf16 halves, `v ≈ hi + lo` with `hi = bf16(v)` and
//! `lo = bf16(v − hi)` (16 significant bits, a relative error ≤ 2⁻¹⁷), and the product takes
//! three `tdpbf16ps` passes, `x_hi·w_hi + x_lo·w_hi + x_hi·w_lo` (the dropped `x_lo·w_lo` is
//! ≤ 2⁻¹⁶ of the product), accumulated in f32 inside the tiles over the whole row. The weights
//! are the exact f32 values the reference dequantizer gives (`d·q`, `d·q + m`), converted per
//! 16-row group into tiles once per call. No per-block scale step remains, which is what bounds
//! the exact int8 kernel.
//!
//! Numerics: within `~2⁻¹⁵` of `Σ|x·w|` of the f32 product with the unquantized activations
//! (better than A16 activations' `amax / 32767` per element), but rounded differently from
//! the A16 kernels, so a row's result depends on whether its call had enough rows for the
//! tiles (batch invariance holds only between calls that both take them).
//!
//! Tiles (all 16 rows × 64 bytes): `tmm0-3` the f32 sums of (2 row tiles × 2 weight groups),
//! `tmm4/5` the activation tiles of the two row tiles, `tmm6/7` the weight tiles of the two
//! groups.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::rows16::Fmt16;
use crate::quant::rows16::GROUP;

/// Activation rows per tile.
pub const TILE_M: usize = 16;
/// Bytes of one activation tile-block: the `hi` and `lo` tiles of 16 rows × 32 bf16.
pub const ACT_TILE_BYTES: usize = 2 * 1024;
/// Bytes of one weight tile-block: the `hi` and `lo` tiles of 16 column pairs × 16 rows × 2.
const W_TILE_BYTES: usize = 2 * 1024;

#[repr(C, align(64))]
struct TileCfg([u8; 64]);

/// Palette 1, tiles 0-7 all 16 rows × 64 bytes.
static TILECFG: TileCfg = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut i = 0;
    while i < 8 {
        c[16 + 2 * i] = 64;
        c[48 + i] = 16;
        i += 1;
    }
    TileCfg(c)
};

/// The AMX bf16 job over one Rows16 matrix (as [`super::amx::AmxJob`], with activations in
/// this module's tile layout).
#[derive(Clone, Copy, Debug)]
pub struct Bf16Job {
    pub nb: usize,
    pub w: *const u8,
    pub rows: usize,
    pub act: *const u8,
    pub n_rows: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// Runs groups `g0..g1` of the job for every activation row.
///
/// # Safety
///
/// As [`super::amx::AmxGroupsFn`].
pub type Bf16GroupsFn = unsafe fn(job: &Bf16Job, g0: usize, g1: usize);

/// Splits f32 rows into the tile layout: `x` holds `n_rows` rows of `nb · 32` values, `dst`
/// `n_rows.div_ceil(16) · nb` tile-blocks.
///
/// # Safety
///
/// `x` readable for the rows, `dst` writable for the tiles, AVX-512 F + BW + BF16 here.
pub type Bf16SplitFn = unsafe fn(x: *const f32, n_rows: usize, nb: usize, dst: *mut u8);

thread_local! {
    static WTILES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// 16 bf16 as f32.
#[inline(always)]
unsafe fn widen(h: __m256i) -> __m512 {
    unsafe { _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) }
}

/// `(hi, lo)` bf16 halves of 32 f32 (`a` then `b`), in order. (No closures in this module's
/// hot code: they would not inherit the callers' target features.)
#[inline(always)]
unsafe fn halves(a: __m512, b: __m512) -> (__m512i, __m512i) {
    unsafe {
        let hi: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
        let ha = widen(_mm512_castsi512_si256(hi));
        let hb = widen(_mm512_extracti64x4_epi64::<1>(hi));
        let lo: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(
            _mm512_sub_ps(b, hb),
            _mm512_sub_ps(a, ha),
        ));
        (hi, lo)
    }
}

/// [`Bf16SplitFn`]'s body.
///
/// # Safety
///
/// As [`Bf16SplitFn`].
#[inline(always)]
pub unsafe fn split(x: *const f32, n_rows: usize, nb: usize, dst: *mut u8) {
    unsafe {
        let m_tiles = n_rows.div_ceil(TILE_M);
        for m in 0..m_tiles * TILE_M {
            let (t, r) = (m / TILE_M, m % TILE_M);
            for b in 0..nb {
                let tb = dst.add((t * nb + b) * ACT_TILE_BYTES);
                let (hi, lo) = if m < n_rows {
                    let p = x.add(m * nb * 32 + b * 32);
                    halves(_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                } else {
                    (_mm512_setzero_si512(), _mm512_setzero_si512())
                };
                _mm512_storeu_si512(tb.add(64 * r).cast(), hi);
                _mm512_storeu_si512(tb.add(1024 + 64 * r).cast(), lo);
            }
        }
    }
}

/// The lane pattern `j ↦ j / 2 + 8·h` of one half chunk (rows of its 16 (row, pair) lanes).
#[inline(always)]
unsafe fn per_lane(v: __m512, h: usize) -> __m512 {
    let idx: [u32; 16] = std::array::from_fn(|j| (j / 2 + 8 * h) as u32);
    unsafe { _mm512_permutexvar_ps(_mm512_loadu_si512(idx.as_ptr().cast()), v) }
}

/// Converts one group (`nb` group-blocks at `wg`) to weight tile-blocks at `dst`.
#[inline(always)]
unsafe fn build_group<F: Fmt16>(wg: *const u8, nb: usize, dst: *mut u8) {
    unsafe {
        for b in 0..nb {
            let wb = wg.add(b * F::BYTES);
            let qs = wb.add(F::QS);
            let tile = dst.add(b * W_TILE_BYTES);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb.cast()));
            let dv = [per_lane(d, 0), per_lane(d, 1)];
            let mv = if F::HAS_M {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(2 * GROUP).cast()));
                [per_lane(m, 0), per_lane(m, 1)]
            } else {
                [_mm512_setzero_ps(); 2]
            };
            if F::NIBBLES {
                let low4 = _mm512_set1_epi32(0x0F);
                for c in 0..8 {
                    let x0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.add(32 * c).cast()));
                    let x1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.add(32 * c + 16).cast()));
                    let (l0, l1) = (_mm512_and_si512(x0, low4), _mm512_and_si512(x1, low4));
                    let (h0, h1) = (_mm512_srli_epi32(x0, 4), _mm512_srli_epi32(x1, 4));
                    weight_row::<F>([l0, l1], dv, mv, tile, c);
                    weight_row::<F>([h0, h1], dv, mv, tile, 8 + c);
                }
            } else {
                for c in 0..16 {
                    let x0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(qs.add(32 * c).cast()));
                    let x1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(qs.add(32 * c + 16).cast()));
                    weight_row::<F>([x0, x1], dv, mv, tile, c);
                }
            }
        }
    }
}

/// Writes tile row `k2` (32 (row, column) lanes) of a weight tile-block from its raw quants
/// `q` (lanes of rows 0-7, then 8-15): the reference dequantization `d·q` (`d·(q − 8)` for
/// Q4_0, `d·q + m` for Q4_1, all exact but the last's one rounding), split into bf16 halves.
#[inline(always)]
unsafe fn weight_row<F: Fmt16>(
    q: [__m512i; 2],
    dv: [__m512; 2],
    mv: [__m512; 2],
    tile: *mut u8,
    k2: usize,
) {
    unsafe {
        let mut w = [_mm512_setzero_ps(); 2];
        for h in 0..2 {
            let qi = if F::SUB8 {
                _mm512_sub_epi32(q[h], _mm512_set1_epi32(8))
            } else {
                q[h]
            };
            let qf = _mm512_cvtepi32_ps(qi);
            w[h] = if F::HAS_M {
                _mm512_fmadd_ps(qf, dv[h], mv[h])
            } else {
                _mm512_mul_ps(qf, dv[h])
            };
        }
        let (hi, lo) = halves(w[0], w[1]);
        _mm512_storeu_si512(tile.add(64 * k2).cast(), hi);
        _mm512_storeu_si512(tile.add(1024 + 64 * k2).cast(), lo);
    }
}

/// One block's three passes into the sums of (`MT` row tiles × `NG` groups).
#[inline(always)]
unsafe fn block<const MT: usize, const NG: usize>(a: [*const u8; 2], w: [*const u8; 2]) {
    unsafe {
        macro_rules! ld {
            ($t:literal, $p:expr) => {
                asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}]"), p = in(reg) $p,
                    s = in(reg) 64usize, options(nostack, preserves_flags))
            };
        }
        macro_rules! dp {
            ($c:literal, $a:literal, $b:literal) => {
                asm!(
                    concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
                    options(nostack, preserves_flags)
                )
            };
        }
        // x_hi · w_hi
        ld!("4", a[0]);
        ld!("6", w[0]);
        dp!("0", "4", "6");
        if NG == 2 {
            ld!("7", w[1]);
            dp!("1", "4", "7");
        }
        if MT == 2 {
            ld!("5", a[1]);
            dp!("2", "5", "6");
            if NG == 2 {
                dp!("3", "5", "7");
            }
        }
        // x_lo · w_hi
        ld!("4", a[0].add(1024));
        dp!("0", "4", "6");
        if NG == 2 {
            dp!("1", "4", "7");
        }
        if MT == 2 {
            ld!("5", a[1].add(1024));
            dp!("2", "5", "6");
            if NG == 2 {
                dp!("3", "5", "7");
            }
        }
        // x_hi · w_lo
        ld!("4", a[0]);
        ld!("6", w[0].add(1024));
        dp!("0", "4", "6");
        if NG == 2 {
            ld!("7", w[1].add(1024));
            dp!("1", "4", "7");
        }
        if MT == 2 {
            ld!("5", a[1]);
            dp!("2", "5", "6");
            if NG == 2 {
                dp!("3", "5", "7");
            }
        }
    }
}

/// Blocks per K chunk: the chunk's weight tiles of a group pair (`2 · KC · 2` KiB) stay in L1
/// while every row tile pair passes over them.
const KC: usize = 6;

/// Row tiles `t..t + MT` × groups `g, g + 1` (`NG` of them real; weight tiles of the chunk at
/// `wt`), blocks `b0..b1`: the sums loaded from `c` (first chunk: zeroed), every block's three
/// passes run, the sums stored back (`c`: the pair of row tiles' 2 × 2 sums tiles, 4 KiB).
#[inline(always)]
unsafe fn chunk<const MT: usize, const NG: usize>(
    job: &Bf16Job,
    t: usize,
    wt: [*const u8; 2],
    b0: usize,
    b1: usize,
    c: *mut f32,
) {
    unsafe {
        let nb = job.nb;
        if b0 == 0 {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, preserves_flags)
            );
        } else {
            asm!(
                "tileloadd tmm0, [{c} + {s}]",
                "tileloadd tmm1, [{c} + {s} + 1024]",
                "tileloadd tmm2, [{c} + {s} + 2048]",
                "tileloadd tmm3, [{c} + {s} + 3072]",
                c = in(reg) c, s = in(reg) 64usize, options(nostack, preserves_flags),
            );
        }
        for b in b0..b1 {
            let a = [
                job.act.add((t * nb + b) * ACT_TILE_BYTES),
                job.act.add(((t + MT - 1) * nb + b) * ACT_TILE_BYTES),
            ];
            let w = [
                wt[0].add(b * W_TILE_BYTES),
                wt[NG - 1].add(b * W_TILE_BYTES),
            ];
            block::<MT, NG>(a, w);
        }
        asm!(
            "tilestored [{c} + {s}], tmm0",
            "tilestored [{c} + {s} + 1024], tmm1",
            "tilestored [{c} + {s} + 2048], tmm2",
            "tilestored [{c} + {s} + 3072], tmm3",
            c = in(reg) c, s = in(reg) 64usize, options(nostack, preserves_flags),
        );
    }
}

/// Stores the finished sums `c` of row tiles `t..t + 2` × groups `g, g + 1` (the real rows
/// and columns only).
#[inline(always)]
unsafe fn store_sums(job: &Bf16Job, t: usize, g: usize, c: *const f32) {
    unsafe {
        let m_tiles = job.n_rows.div_ceil(TILE_M);
        for i in 0..2usize.min(m_tiles - t) {
            let rows = (job.n_rows - (t + i) * TILE_M).min(TILE_M);
            for j in 0..2 {
                let gg = g + j;
                if gg * GROUP >= job.rows {
                    continue;
                }
                let n_valid = (job.rows - gg * GROUP).min(GROUP);
                let mask = ((1u32 << n_valid) - 1) as u16;
                let s = c.add((2 * i + j) * 256);
                for r in 0..rows {
                    let o = job
                        .out
                        .add(((t + i) * TILE_M + r) * job.out_stride + gg * GROUP);
                    _mm512_mask_storeu_ps(o, mask, _mm512_loadu_ps(s.add(16 * r)));
                }
            }
        }
    }
}

thread_local! {
    /// The sums of every row tile pair of the group pair being run, per thread (grows only).
    static SUMS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`Bf16GroupsFn`]'s body for weight format `F`: group pairs, and for each, K chunks outer,
/// row tile pairs inner.
///
/// # Safety
///
/// As [`Bf16GroupsFn`].
#[inline(always)]
pub unsafe fn groups<F: Fmt16>(job: &Bf16Job, g0: usize, g1: usize) {
    unsafe {
        let nb = job.nb;
        let m_tiles = job.n_rows.div_ceil(TILE_M);
        let pairs = m_tiles.div_ceil(2);
        WTILES.with_borrow_mut(|wtiles| {
            SUMS.with_borrow_mut(|sums| {
                let bytes = 2 * nb * W_TILE_BYTES + 64;
                if wtiles.len() < bytes {
                    wtiles.resize(bytes, 0);
                }
                if sums.len() < pairs * 1024 + 16 {
                    sums.resize(pairs * 1024 + 16, 0.0);
                }
                let wt0 = wtiles.as_mut_ptr();
                let wt0 = wt0.add(wt0.align_offset(64));
                let c0 = sums.as_mut_ptr();
                let c0 = c0.add(c0.align_offset(64));
                asm!("ldtilecfg [{}]", in(reg) TILECFG.0.as_ptr(), options(nostack, preserves_flags));
                for g in (g0..g1).step_by(2) {
                    let two_g = g + 1 < g1;
                    build_group::<F>(job.w.add(g * nb * F::BYTES), nb, wt0);
                    if two_g {
                        let w1 = wt0.add(nb * W_TILE_BYTES);
                        build_group::<F>(job.w.add((g + 1) * nb * F::BYTES), nb, w1);
                    }
                    let wt = [wt0.cast_const(), wt0.add(nb * W_TILE_BYTES).cast_const()];
                    for b0 in (0..nb).step_by(KC) {
                        let b1 = nb.min(b0 + KC);
                        for p in 0..pairs {
                            let (t, c) = (2 * p, c0.add(p * 1024));
                            match (t + 1 < m_tiles, two_g) {
                                (true, true) => chunk::<2, 2>(job, t, wt, b0, b1, c),
                                (true, false) => chunk::<2, 1>(job, t, wt, b0, b1, c),
                                (false, true) => chunk::<1, 2>(job, t, wt, b0, b1, c),
                                (false, false) => chunk::<1, 1>(job, t, wt, b0, b1, c),
                            }
                        }
                    }
                    for p in 0..pairs {
                        store_sums(job, 2 * p, g, c0.add(p * 1024));
                    }
                }
                asm!("tilerelease", options(nostack, preserves_flags));
            });
        });
    }
}
