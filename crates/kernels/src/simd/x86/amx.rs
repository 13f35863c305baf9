//! AMX (Advanced Matrix Extensions) matmul of [Rows16](crate::quant::rows16) weights (Q4_0,
//! Q4_1, Q5_0, Q8_0, Q4_K) against A16 activations, for calls with many activation rows
//! (prefill, large decode batches) — **bit-identical** to the AVX-512 VNNI Rows16 kernel
//! ([`super::rows16`]).
//!
//! Why int8 tiles can compute a 16-bit dot exactly: an A16 quant `q` (i16) is
//! `256 · hi + lo` with `hi = q >> 8` (i8) and `lo = q & 0xFF` (u8). Per block of 32 columns,
//! `tdpbssd` gives `Σ w · hi` (i8 × i8) and `tdpbusd` gives `Σ w · lo` (u8 × i8), both exact
//! in i32, for 16 activation rows × 16 weight rows at once; `(Σ w·hi << 8) + Σ w·lo` is the
//! block's exact integer sum, the same `sumi` the VNNI kernel gets from `vpdpwssd`. The f32
//! side then repeats that kernel's operations in its order, block by block:
//! `acc = fma(f32(sumi), d_w · d_a, acc)`, and for Q4_1 `acc = fma(m_w, s_a, acc)` (Q4_K: each
//! 32-column sub-block is such a block, of scale `d · sc` and offset `−dmin · m`). So a row's
//! result does not depend on whether it ran here or on the VNNI kernel, on its batch, or on the
//! thread count.
//!
//! Data layout, built per call:
//! * activations ([`split_a16`]): for each tile of 16 rows and each block, the 16 rows' `hi`
//!   bytes (512), `lo` bytes (512), `d_a` (16 f32) and `s_a` (16 f32) — [`ACT_TILE_BYTES`];
//!   rows past the last are zero;
//! * weights: per 16-row group, each group-block becomes a `B` tile of 8 rows × 64 bytes
//!   (byte `4n + j` of row `k4` is column `4·k4 + j` of weight row `n`, the quad layout the
//!   tile instructions take; Q4_0's and Q5_0's quants with their bias removed, Q5_0's fifth
//!   bits ORed in), its 16 scales as f32 and, for Q4_1 and Q4_K, its 16 offsets — built once
//!   per group into a per-thread buffer ([`AmxFmt`]) and used by every row tile.
//!
//! Tiles: `tmm0/tmm1` and `tmm2/tmm3` are the (hi, lo) sums of alternate blocks (so the AMX
//! unit could run a block while the vector units fold the previous one — measured on the
//! development Xeons, they do not overlap: per block of 16 × 16 outputs the two 1 KiB tile
//! stores take ~22 ns, the fold's ~6 vector operations a row ~11 ns, one after the other;
//! BENCHMARKS.md), `tmm4/tmm5` the activation hi/lo tiles, `tmm6` the weight tile. Every task
//! loads the tile configuration ([`TILECFG`]) and releases the tiles when done. The process must
//! have asked Linux for the tile state ([`request_permission`]) before any of this runs.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::rows16::{Fmt16, R16Q4_K, Z512, k4_scales};
use crate::quant::GgmlType;
use crate::quant::rows16::{self, GROUP};

/// Activation rows per tile.
pub const TILE_M: usize = 16;
/// Bytes of one activation tile-block: `hi` (16 × 32), `lo` (16 × 32), `d` and `s` (16 f32
/// each).
pub const ACT_TILE_BYTES: usize = 2 * TILE_M * 32 + 2 * TILE_M * 4;
/// Bytes of one weight tile-block in the per-thread buffer: the `B` tile (8 × 64), the row
/// scales and the row offsets (16 f32 each).
const W_TILE_BYTES: usize = 512 + 2 * GROUP * 4;

/// Weight groups whose tiles are built and run together against every row tile (their tiles,
/// `BATCH_GROUPS · nb · 640` bytes, stay in cache beside one row tile's activations).
const BATCH_GROUPS: usize = 4;
/// Blocks the tile instructions run ahead of the fold of their sums.
const LEAD: usize = 1;
/// Sums buffers in the ring (one per block in flight).
const RING: usize = LEAD + 1;

/// Offset of an A16 block's quants (after `d: f32, s: f32`).
const A16_QS: usize = 8;
const A16_BYTES: usize = crate::quant::A16_BYTES;

/// The tile configuration (palette 1): tiles 0-3 are 16 × 16 i32 sums, 4-5 the 16 × 32-byte
/// activation tiles, 6 the 8 × 64-byte weight tile.
#[repr(C, align(64))]
struct TileCfg([u8; 64]);

static TILECFG: TileCfg = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let colsb: [u16; 7] = [64, 64, 64, 64, 32, 32, 64];
    let rows: [u8; 7] = [16, 16, 16, 16, 16, 16, 8];
    let mut i = 0;
    while i < 7 {
        c[16 + 2 * i] = colsb[i] as u8;
        c[16 + 2 * i + 1] = (colsb[i] >> 8) as u8;
        c[48 + i] = rows[i];
        i += 1;
    }
    TileCfg(c)
};

/// Asks Linux for permission to use the AMX tile data state in this process
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); whether it was granted. Without it
/// the first tile instruction would kill the process with SIGILL.
pub fn request_permission() -> bool {
    #[cfg(target_os = "linux")]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: the arch_prctl system call with these arguments only changes which extended
        // states the kernel lets this process use; it reads and writes no user memory.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Whether this CPU reports AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25).
pub fn cpu_has_amx_int8() -> bool {
    // CPUID is available on every x86-64 CPU.
    let max = __cpuid(0).eax;
    if max < 7 {
        return false;
    }
    // Leaf 7 exists (checked).
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Splits `n_rows` A16 rows of `nb` blocks (`a_row` bytes apart at `a`) into the tile layout
/// at `dst` (`m_tiles · nb` [`ACT_TILE_BYTES`] blocks, `m_tiles = n_rows.div_ceil(16)`); the
/// rows of the last tile past `n_rows` are zero.
///
/// # Safety
///
/// `a` readable for the rows, `dst` writable for the tiles, AVX-512 F + BW on this CPU.
#[inline(always)]
pub unsafe fn split_a16(a: *const u8, a_row: usize, n_rows: usize, nb: usize, dst: *mut u8) {
    unsafe {
        let m_tiles = n_rows.div_ceil(TILE_M);
        for m in 0..m_tiles * TILE_M {
            let (t, r) = (m / TILE_M, m % TILE_M);
            for b in 0..nb {
                let tb = dst.add((t * nb + b) * ACT_TILE_BYTES);
                if m < n_rows {
                    let blk = a.add(m * a_row + b * A16_BYTES);
                    let q = _mm512_loadu_si512(blk.add(A16_QS).cast());
                    let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16(q, 8));
                    let lo = _mm512_cvtepi16_epi8(q);
                    _mm256_storeu_si256(tb.add(r * 32).cast(), hi);
                    _mm256_storeu_si256(tb.add(512 + r * 32).cast(), lo);
                    std::ptr::copy_nonoverlapping(blk, tb.add(1024 + r * 4), 4);
                    std::ptr::copy_nonoverlapping(blk.add(4), tb.add(1088 + r * 4), 4);
                } else {
                    _mm256_storeu_si256(tb.add(r * 32).cast(), _mm256_setzero_si256());
                    _mm256_storeu_si256(tb.add(512 + r * 32).cast(), _mm256_setzero_si256());
                    tb.add(1024 + r * 4)
                        .cast::<[u8; 4]>()
                        .write_unaligned([0; 4]);
                    tb.add(1088 + r * 4)
                        .cast::<[u8; 4]>()
                        .write_unaligned([0; 4]);
                }
            }
        }
    }
}

/// One AMX matmul job over one Rows16 matrix: `out[m * out_stride + g * 16 + n]` for every
/// activation row `m < n_rows` and weight row `g * 16 + n < rows`.
#[derive(Clone, Copy, Debug)]
pub struct AmxJob {
    /// Blocks of 32 columns.
    pub nb: usize,
    /// The weight groups: group `g` at `w + g * nb * F::BYTES32` ([`AmxFmt`]).
    pub w: *const u8,
    /// Real weight rows (the last group may be partial).
    pub rows: usize,
    /// The activations in the tile layout of [`split_a16`].
    pub act: *const u8,
    /// Real activation rows.
    pub n_rows: usize,
    /// The first output of the matrix's column 0, and the stride between activation rows.
    pub out: *mut f32,
    pub out_stride: usize,
}

/// Runs the groups `g0..g1` of `job` for every activation row.
///
/// # Safety
///
/// The job's pointers valid as [`AmxJob`] says, the outputs of those groups touched by no one
/// else during the call, AVX-512 F + BW + VL + AMX-INT8 on this CPU and the tile permission
/// granted ([`request_permission`]).
pub type AmxGroupsFn = unsafe fn(job: &AmxJob, g0: usize, g1: usize);

/// Activation tile-block splitter: [`split_a16`] as a table entry.
///
/// # Safety
///
/// As [`split_a16`].
pub type AmxSplitFn = unsafe fn(a: *const u8, a_row: usize, n_rows: usize, nb: usize, dst: *mut u8);

thread_local! {
    /// The weight tiles of the group being run, per thread (grows only).
    static WTILES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A Rows16 weight format the AMX kernel takes: how one 32-column block of a group becomes a
/// `B` tile of int8 weights, 16 f32 scales and (for formats with an offset) 16 f32 offsets —
/// the same per-block `(d_w, m_w)` the VNNI kernel applies, so the fold repeats its operations.
pub trait AmxFmt {
    /// Bytes of a group per 32 columns: group `g` of a matrix of `nb` such blocks starts
    /// `g · nb · BYTES32` bytes in.
    const BYTES32: usize;
    /// Whether the fold adds `m_w · s_a` (Q4_1, Q4_K).
    const HAS_M: bool;
    /// Writes block `b` of the group at `wg` into `dst` (`W_TILE_BYTES`): the `B` tile
    /// (512 bytes), the scales, and the offsets where the format has them.
    ///
    /// # Safety
    ///
    /// `wg` holds the group's `b + 1` first blocks, `dst` is writable, AVX-512 F + BW + VL.
    unsafe fn build_block(wg: *const u8, b: usize, dst: *mut u8);
}

/// The word index that interleaves the 16-bit words of two 32-byte chunks (`x[0..16]` from the
/// first, `x[16..32]` from the second): words `n` of both end up side by side.
#[inline(always)]
unsafe fn pair_index() -> __m512i {
    let idx: [u16; 32] = std::array::from_fn(|i| ((i % 2) * 16 + i / 2) as u16);
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// Writes the `B` tile of 32 columns of 16 rows of nibbles in the Rows16 Q4 layout at `qs`
/// into `tile`: each nibble `+ add`, and with `hbits` (Q5_0's fifth-bit planes) the fifth bit
/// ORed in above it first.
#[inline(always)]
unsafe fn nibble_tile(qs: *const u8, hbits: Option<*const u8>, add: i8, tile: *mut u8) {
    unsafe {
        let idx = pair_index();
        let low4 = _mm512_set1_epi8(0x0F);
        let one = _mm512_set1_epi8(1);
        for k4 in 0..4 {
            // Chunks 2·k4 and 2·k4 + 1 hold column pairs 2·k4, 2·k4 + 1 (low nibbles) and
            // 8 pairs further (high nibbles): tile rows k4 and 4 + k4.
            let x = _mm512_loadu_si512(qs.add(64 * k4).cast());
            let mut lo = _mm512_and_si512(x, low4);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
            if let Some(planes) = hbits {
                // Both chunks read plane k4 / 2: chunk c's bits are 2 (c % 4) (low nibbles)
                // and 2 (c % 4) + 1 (high nibbles); shifts under 8 keep each byte's own bits.
                let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    planes.add(2 * GROUP * (k4 / 2)).cast(),
                ));
                let s0 = (4 * (k4 % 2)) as i16;
                let s =
                    _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16(s0), _mm512_set1_epi16(s0 + 2));
                let b_lo = _mm512_and_si512(_mm512_srlv_epi16(h, s), one);
                let b_hi = _mm512_and_si512(
                    _mm512_srlv_epi16(h, _mm512_add_epi16(s, _mm512_set1_epi16(1))),
                    one,
                );
                lo = _mm512_or_si512(lo, _mm512_slli_epi16(b_lo, 4));
                hi = _mm512_or_si512(hi, _mm512_slli_epi16(b_hi, 4));
            }
            if add != 0 {
                lo = _mm512_add_epi8(lo, _mm512_set1_epi8(add));
                hi = _mm512_add_epi8(hi, _mm512_set1_epi8(add));
            }
            _mm512_storeu_si512(tile.add(64 * k4).cast(), _mm512_permutexvar_epi16(idx, lo));
            _mm512_storeu_si512(
                tile.add(64 * (4 + k4)).cast(),
                _mm512_permutexvar_epi16(idx, hi),
            );
        }
    }
}

impl<F: Fmt16> AmxFmt for F {
    const BYTES32: usize = F::BYTES;
    const HAS_M: bool = F::HAS_M;

    #[inline(always)]
    unsafe fn build_block(wg: *const u8, b: usize, dst: *mut u8) {
        unsafe {
            let wb = wg.add(b * F::BYTES);
            let qs = wb.add(F::QS);
            if F::NIBBLES {
                let hbits = F::HBITS.then(|| wb.add(rows16::Q5_0_HBITS));
                // Q4_0 stores its nibbles + 8, Q5_0 its five-bit quants + 16.
                let add = match (F::SUB8, F::HBITS) {
                    (true, _) => -8,
                    (_, true) => -16,
                    _ => 0,
                };
                nibble_tile(qs, hbits, add, dst);
            } else {
                let idx = pair_index();
                for k4 in 0..8 {
                    let x = _mm512_loadu_si512(qs.add(64 * k4).cast());
                    _mm512_storeu_si512(dst.add(64 * k4).cast(), _mm512_permutexvar_epi16(idx, x));
                }
            }
            let scales = dst.add(512).cast::<f32>();
            _mm512_storeu_ps(scales, _mm512_cvtph_ps(_mm256_loadu_si256(wb.cast())));
            if F::HAS_M {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(2 * GROUP).cast()));
                _mm512_storeu_ps(scales.add(GROUP), m);
            }
        }
    }
}

/// Bytes of a Rows16 Q4_K group-block (256 columns of 16 rows).
const Q4_K_BYTES: usize = GROUP * 144;

impl AmxFmt for R16Q4_K {
    const BYTES32: usize = Q4_K_BYTES / 8;
    const HAS_M: bool = true;

    /// Sub-block `b % 8` of group-block `b / 8`: its nibbles as Q4_1's, scale `d · sc` and
    /// offset `−dmin · m` (the VNNI kernel adds `dmin·m · (−s_a)`; the product is the same).
    #[inline(always)]
    unsafe fn build_block(wg: *const u8, b: usize, dst: *mut u8) {
        unsafe {
            let (wb, j) = (wg.add(b / 8 * Q4_K_BYTES), b % 8);
            let qs = wb.add(rows16::quants_offset(GgmlType::Q4_K) + j * rows16::Q4_K_SUB_BYTES);
            nibble_tile(qs, None, 0, dst);
            let (dsc, dm) = k4_scales::<Z512>(wb, j);
            let scales = dst.add(512).cast::<f32>();
            _mm512_storeu_ps(scales, dsc);
            // −dm by flipping the sign bit: (−dm)·s_a is then exactly dm·(−s_a), signed zeros
            // included.
            let neg = _mm512_xor_si512(_mm512_castps_si512(dm), _mm512_set1_epi32(i32::MIN));
            _mm512_storeu_ps(scales.add(GROUP), _mm512_castsi512_ps(neg));
        }
    }
}

/// Runs block `b`'s tiles into the tile pair `SET` (0: tmm0/tmm1, 1: tmm2/tmm3) and stores the
/// two 16 × 16 i32 sums at `c` (hi sums, then lo sums, 1 KiB each).
#[inline(always)]
unsafe fn block_tiles<const SET: usize>(act: *const u8, wt: *const u8, c: *mut i32) {
    macro_rules! block {
        ($hi:literal, $lo:literal) => {
            asm!(
                "tileloadd tmm4, [{a} + {s32}]",
                "tileloadd tmm5, [{a} + {s32} + 512]",
                "tileloadd tmm6, [{w} + {s64}]",
                concat!("tilezero tmm", $hi),
                concat!("tilezero tmm", $lo),
                concat!("tdpbssd tmm", $hi, ", tmm4, tmm6"),
                concat!("tdpbusd tmm", $lo, ", tmm5, tmm6"),
                concat!("tilestored [{c} + {s64}], tmm", $hi),
                concat!("tilestored [{c} + {s64} + 1024], tmm", $lo),
                a = in(reg) act,
                w = in(reg) wt,
                c = in(reg) c,
                s32 = in(reg) 32usize,
                s64 = in(reg) 64usize,
                options(nostack, preserves_flags),
            )
        };
    }
    // SAFETY: the tiles read 1 KiB at `act`, 512 bytes at `wt` and write 2 KiB at `c` (the
    // caller's buffers); the tile configuration is loaded.
    unsafe {
        if SET == 0 {
            block!("0", "1");
        } else {
            block!("2", "3");
        }
    }
}

/// Folds one block's sums at `c` into the 16 rows' accumulators, as the VNNI kernel does.
#[inline(always)]
unsafe fn fold<F: AmxFmt>(
    acc: &mut [__m512; TILE_M],
    c: *const i32,
    act: *const u8,
    wt: *const u8,
) {
    unsafe {
        let dw = _mm512_loadu_ps(wt.add(512).cast());
        let mw = if F::HAS_M {
            _mm512_loadu_ps(wt.add(512 + 64).cast())
        } else {
            _mm512_setzero_ps()
        };
        let da = act.add(1024).cast::<f32>();
        let sa = act.add(1088).cast::<f32>();
        for (r, acc) in acc.iter_mut().enumerate() {
            let hi = _mm512_loadu_si512(c.add(16 * r).cast());
            let lo = _mm512_loadu_si512(c.add(256 + 16 * r).cast());
            let sumi = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
            let s = _mm512_mul_ps(dw, _mm512_set1_ps(da.add(r).read_unaligned()));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), s, *acc);
            if F::HAS_M {
                *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa.add(r).read_unaligned()), *acc);
            }
        }
    }
}

/// [`AmxGroupsFn`] for weight format `F` (the body of the tier's entry point).
///
/// # Safety
///
/// As [`AmxGroupsFn`].
#[inline(always)]
pub unsafe fn groups<F: AmxFmt>(job: &AmxJob, g0: usize, g1: usize) {
    unsafe {
        let nb = job.nb;
        let m_tiles = job.n_rows.div_ceil(TILE_M);
        // c: a ring of RING blocks' (hi, lo) sums, 2 KiB each.
        #[repr(C, align(64))]
        struct Sums([i32; RING * 512]);
        let mut c = Sums([0; RING * 512]);
        let c = c.0.as_mut_ptr();
        WTILES.with_borrow_mut(|wtiles| {
            let bytes = BATCH_GROUPS * nb * W_TILE_BYTES + 64;
            if wtiles.len() < bytes {
                wtiles.resize(bytes, 0);
            }
            // Tile rows of 64 bytes: start the buffer on a cache line.
            let wt0 = wtiles.as_mut_ptr();
            let wt0 = wt0.add(wt0.align_offset(64));
            asm!("ldtilecfg [{}]", in(reg) TILECFG.0.as_ptr(), options(nostack, preserves_flags));
            for gb in (g0..g1).step_by(BATCH_GROUPS) {
                let n_groups = (g1 - gb).min(BATCH_GROUPS);
                for g in 0..n_groups {
                    let (wg, wt) = (
                        job.w.add((gb + g) * nb * F::BYTES32),
                        wt0.add(g * nb * W_TILE_BYTES),
                    );
                    for b in 0..nb {
                        F::build_block(wg, b, wt.add(b * W_TILE_BYTES));
                    }
                }
                // Row tiles outer: one row tile's activations (nb tile-blocks) stay in cache
                // while each group of the batch passes over them.
                for t in 0..m_tiles {
                    let act = job.act.add(t * nb * ACT_TILE_BYTES);
                    let rows = (job.n_rows - t * TILE_M).min(TILE_M);
                    for g in 0..n_groups {
                        let wt = wt0.add(g * nb * W_TILE_BYTES);
                        let at = |b: usize| (act.add(b * ACT_TILE_BYTES), wt.add(b * W_TILE_BYTES));
                        let mut acc = [_mm512_setzero_ps(); TILE_M];
                        // The tiles run LEAD blocks ahead of the fold, in alternate tile pairs
                        // and a ring of sums buffers, so the AMX unit works while the vector
                        // units fold. (Leads of 2 and 3 measured the same as 1.)
                        for b in 0..nb + LEAD {
                            if b < nb {
                                let (a1, w1) = at(b);
                                let sums = c.add(512 * (b % RING));
                                if b % 2 == 0 {
                                    block_tiles::<0>(a1, w1, sums);
                                } else {
                                    block_tiles::<1>(a1, w1, sums);
                                }
                            }
                            if b >= LEAD {
                                let (a0, w0) = at(b - LEAD);
                                fold::<F>(&mut acc, c.add(512 * ((b - LEAD) % RING)), a0, w0);
                            }
                        }
                        let g = gb + g;
                        let n_valid = (job.rows - g * GROUP).min(GROUP);
                        let mask = ((1u32 << n_valid) - 1) as u16;
                        for (r, acc) in acc.iter().enumerate().take(rows) {
                            let o = job.out.add((t * TILE_M + r) * job.out_stride + g * GROUP);
                            _mm512_mask_storeu_ps(o, mask, *acc);
                        }
                    }
                }
            }
            asm!("tilerelease", options(nostack, preserves_flags));
        });
    }
}

/// Full-size tiles (palette 1): tiles 0-3 are 16 × 16 i32 sums, 4 a 16 × 64-byte `A`, 5 a
/// 16 × 64-byte `B` — the shape of one `tdpbusd` at its most work (16 × 16 × 64).
static PEAK_TILECFG: TileCfg = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut i = 0;
    while i < 6 {
        c[16 + 2 * i] = 64;
        c[48 + i] = 16;
        i += 1;
    }
    TileCfg(c)
};

/// Multiply-adds one `tdpbusd` does at full tile size.
pub const PEAK_MACS_PER_OP: u64 = 16 * 16 * 64;

/// Runs `4 · rounds` full-size `tdpbusd` on register-resident tiles (four independent sums, so
/// they do not wait on each other): the tile unit's int8 ceiling, with no memory traffic. The
/// result is discarded.
///
/// # Safety
///
/// AMX-TILE + AMX-INT8 on this CPU and the tile permission granted ([`request_permission`]).
#[target_feature(enable = "avx512f")]
pub unsafe fn tdpbusd_rounds(rounds: u64) {
    let bytes = [0x5Au8; 1024];
    // SAFETY: the configuration and the 1 KiB of bytes are valid for the tile loads; the loop
    // touches only tiles and the counter register.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) PEAK_TILECFG.0.as_ptr(), options(nostack, preserves_flags));
        asm!(
            "tileloadd tmm4, [{z} + {s}]",
            "tileloadd tmm5, [{z} + {s}]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tdpbusd tmm0, tmm4, tmm5",
            "tdpbusd tmm1, tmm4, tmm5",
            "tdpbusd tmm2, tmm4, tmm5",
            "tdpbusd tmm3, tmm4, tmm5",
            "dec {n}",
            "jnz 2b",
            z = in(reg) bytes.as_ptr(),
            s = in(reg) 64usize,
            n = inout(reg) rounds.max(1) => _,
            options(nostack),
        );
        asm!("tilerelease", options(nostack, preserves_flags));
    }
}
