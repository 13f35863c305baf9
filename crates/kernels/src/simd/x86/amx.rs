//! AMX (Advanced Matrix Extensions) matmul of [Rows16](crate::quant::rows16) weights (Q4_0,
//! Q4_1, Q5_0, Q8_0, Q4_K) against A16 activations, for calls with many activation rows
//! (prefill, large decode batches) — **bit-identical** to the AVX-512 VNNI Rows16 kernel
//! ([`super::rows16`]).
//!
//! Why int8 tiles can compute the A16 dot exactly: an A16 quant `q` has 12 bits
//! ([`crate::quant::A16_QMAX`]), so it is `16·h + l` with `h = q >> 4` an i8 and
//! `l = q & 15`. For the 4-bit formats (Q4_0's `w` in `-8..=7`, Q4_1's and Q4_K's in
//! `0..=15`) `16·w` still fits a byte, and one full-depth product of the activation tile
//! `[h | l]` (64 bytes a row) and the weight tile `[16·w ; w]` gives
//! `Σ h·16w + Σ l·w = Σ q·w`, the block's exact integer sum: `tdpbssd` (signed weights) or
//! `tdpbsud` (unsigned), then one 1 KiB tile store ([`Digits`]). Q5_0 and Q8_0, whose `16·w`
//! does not fit, take two half-depth products `Σ h·w` and `Σ l·w` into two tiles and the fold
//! sums `(Σ h·w << 4) + Σ l·w`. Either way the result is the `sumi` the VNNI kernel gets from
//! `vpdpwssd`. The f32 side then repeats that kernel's operations in its order, block by
//! block: `acc = fma(f32(sumi), d_w · d_a, acc)`, and for Q4_1 `acc = fma(m_w, s_a, acc)`
//! (Q4_K: each 32-column sub-block is such a block, of scale `d · sc` and offset `−dmin · m`).
//! So a row's result does not depend on whether it ran here or on the VNNI kernel, on its
//! batch, or on the thread count.
//!
//! Data layout, built per call:
//! * activations ([`split_a16`]): for each tile of 16 rows and each block, the 16 rows' `h`
//!   and `l` bytes (64 a row), `d_a` (16 f32) and `s_a` (16 f32) — [`ACT_TILE_BYTES`]; rows
//!   past the last are zero;
//! * weights: per 16-row group, each group-block becomes a `B` tile (byte `4n + j` of row
//!   `k4` is column `4·k4 + j` of weight row `n`, the quad layout the tile instructions take;
//!   Q4_0's and Q5_0's quants with their bias removed, Q5_0's fifth bits ORed in; the fused
//!   formats' 16 rows are `16·w` then `w`), its 16 scales as f32 and, for Q4_1 and Q4_K, its
//!   16 offsets — built once per group into a per-thread buffer ([`AmxFmt`]) and used by
//!   every row tile.
//!
//! Per row tile and weight group the blocks run as a three-stage pipeline: block `b`'s
//! products are issued (into alternate tile sets), then block `b − 1`'s sums are stored (its
//! product is done by then, so the store does not wait on the one just issued), then block
//! `b − 2` is folded into 16 zmm accumulators. Measured on the development Xeon: while a tile
//! product runs, 512-bit FP operations issue at half rate (one a cycle), so the fold — four
//! FP operations a row and block (three for the formats without an offset) — and the tiles barely overlap: per 16 × 16 block on one
//! core, ~16 ns of tile work and ~12 ns of fold (BENCHMARKS.md). Every task loads its tile configuration
//! ([`FUSED_CFG`] or [`SPLIT_CFG`]) and releases the tiles when done. The process must have
//! asked Linux for the tile state ([`request_permission`]) before any of this runs.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::rows16::{Fmt16, R16Q4_K, Z512, k4_scales};
use crate::quant::GgmlType;
use crate::quant::rows16::{self, GROUP};

/// Activation rows per tile.
pub const TILE_M: usize = 16;
/// Bytes of one activation tile-block: 16 rows of `h` (32 bytes) then `l` (32 bytes), then
/// `d` and `s` (16 f32 each).
pub const ACT_TILE_BYTES: usize = TILE_M * 64 + 2 * TILE_M * 4;
/// Offset of the row scales `d` in an activation tile-block (the sums `s` follow).
const ACT_D: usize = TILE_M * 64;

/// Weight groups whose tiles are built and run together against every row tile (their tiles
/// stay in cache beside one row tile's activations).
const BATCH_GROUPS: usize = 4;
/// Sums buffers in the ring: one being stored, one being folded.
const RING: usize = 2;

/// Offset of an A16 block's quants (after `d: f32, s: f32`).
const A16_QS: usize = 8;
const A16_BYTES: usize = crate::quant::A16_BYTES;

/// A tile configuration (palette 1).
#[repr(C, align(64))]
struct TileCfg([u8; 64]);

/// The configuration with tiles `i < 8` of `rows[i]` rows of `colsb[i]` bytes (0: unused).
const fn tile_cfg(colsb: [u16; 8], rows: [u8; 8]) -> TileCfg {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut i = 0;
    while i < 8 {
        c[16 + 2 * i] = colsb[i] as u8;
        c[16 + 2 * i + 1] = (colsb[i] >> 8) as u8;
        c[48 + i] = rows[i];
        i += 1;
    }
    TileCfg(c)
}

/// Fused formats: tiles 0-1 are 16 × 16 i32 sums, 4-5 the 16 × 64-byte `[h | l]` activation
/// tiles and 6-7 the 16 × 64-byte `[16·w ; w]` weight tiles (one of each per tile set, so the
/// next block's loads need not wait for the product reading the last ones).
static FUSED_CFG: TileCfg = tile_cfg(
    [64, 64, 0, 0, 64, 64, 64, 64],
    [16, 16, 0, 0, 16, 16, 16, 16],
);

/// Split formats: tiles 0-3 are 16 × 16 i32 sums, 4-5 the 16 × 32-byte `h` and `l`
/// activation tiles, 6 the 8 × 64-byte weight tile.
static SPLIT_CFG: TileCfg = tile_cfg(
    [64, 64, 64, 64, 32, 32, 64, 0],
    [16, 16, 16, 16, 16, 16, 8, 0],
);

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
/// at `dst` (`m_tiles · nb` [`ACT_TILE_BYTES`] blocks, `m_tiles = n_rows.div_ceil(16)`): each
/// quant `q` as its digits `h = q >> 4` (i8) and `l = q & 15`; the rows of the last tile past
/// `n_rows` are zero.
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
                    let h = _mm512_cvtepi16_epi8(_mm512_srai_epi16(q, 4));
                    let l = _mm512_cvtepi16_epi8(_mm512_and_si512(q, _mm512_set1_epi16(15)));
                    _mm256_storeu_si256(tb.add(r * 64).cast(), h);
                    _mm256_storeu_si256(tb.add(r * 64 + 32).cast(), l);
                    std::ptr::copy_nonoverlapping(blk, tb.add(ACT_D + r * 4), 4);
                    std::ptr::copy_nonoverlapping(blk.add(4), tb.add(ACT_D + 64 + r * 4), 4);
                } else {
                    _mm512_storeu_si512(tb.add(r * 64).cast(), _mm512_setzero_si512());
                    tb.add(ACT_D + r * 4)
                        .cast::<[u8; 4]>()
                        .write_unaligned([0; 4]);
                    tb.add(ACT_D + 64 + r * 4)
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

/// How a format's block product meets the activations' two digits `q = 16·h + l`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Digits {
    /// One full-depth product, `tdpbssd`: `A = [h | l]` against `B = [16·w ; w]`, for weights
    /// in `-8..=7` (Q4_0), whose `16·w` is an i8.
    FusedSigned,
    /// The same with `tdpbsud` (signed `A`, unsigned `B`), for weights in `0..=15` (Q4_1,
    /// Q4_K), whose `16·w` is a u8.
    FusedUnsigned,
    /// Two half-depth products `Σ h·w` and `Σ l·w` in two tiles, stored both and summed as
    /// `(Σ h·w << 4) + Σ l·w` by the fold: weights too wide for `16·w` to fit a byte (Q5_0,
    /// Q8_0).
    Split,
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
    /// How the block product is formed.
    const DIGITS: Digits;
    /// Bytes of the `B` tile: `[16·w ; w]` (16 × 64) when fused, `w` (8 × 64) when split.
    const TILE_B: usize = if matches!(Self::DIGITS, Digits::Split) {
        512
    } else {
        1024
    };
    /// Writes block `b` of the group at `wg` into `dst` (`TILE_B + 128` bytes): the `B` tile,
    /// the scales, and the offsets where the format has them.
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
/// ORed in above it first; with `sixteen`, the same tile times 16 there too (each byte's low
/// four bits moved up: `16·w` modulo 256, which is `16·w` itself for the fused formats).
#[inline(always)]
unsafe fn nibble_tile(
    qs: *const u8,
    hbits: Option<*const u8>,
    add: i8,
    tile: *mut u8,
    sixteen: Option<*mut u8>,
) {
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
            let (lo, hi) = (
                _mm512_permutexvar_epi16(idx, lo),
                _mm512_permutexvar_epi16(idx, hi),
            );
            _mm512_storeu_si512(tile.add(64 * k4).cast(), lo);
            _mm512_storeu_si512(tile.add(64 * (4 + k4)).cast(), hi);
            if let Some(t16) = sixteen {
                // A 16-bit shift carries a byte's top bits into its neighbour: mask them off.
                let high4 = _mm512_set1_epi8(0xF0u8 as i8);
                let (lo, hi) = (_mm512_slli_epi16(lo, 4), _mm512_slli_epi16(hi, 4));
                _mm512_storeu_si512(t16.add(64 * k4).cast(), _mm512_and_si512(lo, high4));
                _mm512_storeu_si512(t16.add(64 * (4 + k4)).cast(), _mm512_and_si512(hi, high4));
            }
        }
    }
}

impl<F: Fmt16> AmxFmt for F {
    const BYTES32: usize = F::BYTES;
    const HAS_M: bool = F::HAS_M;
    // Q4_0's nibbles less 8 are signed, Q4_1's are unsigned; Q5_0 and Q8_0 are too wide.
    const DIGITS: Digits = match (F::NIBBLES && !F::HBITS, F::SUB8) {
        (true, true) => Digits::FusedSigned,
        (true, false) => Digits::FusedUnsigned,
        (false, _) => Digits::Split,
    };

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
                if Self::DIGITS == Digits::Split {
                    nibble_tile(qs, hbits, add, dst, None);
                } else {
                    nibble_tile(qs, hbits, add, dst.add(512), Some(dst));
                }
            } else {
                let idx = pair_index();
                for k4 in 0..8 {
                    let x = _mm512_loadu_si512(qs.add(64 * k4).cast());
                    _mm512_storeu_si512(dst.add(64 * k4).cast(), _mm512_permutexvar_epi16(idx, x));
                }
            }
            let scales = dst.add(Self::TILE_B).cast::<f32>();
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
    const DIGITS: Digits = Digits::FusedUnsigned;

    /// Sub-block `b % 8` of group-block `b / 8`: its nibbles as Q4_1's, scale `d · sc` and
    /// offset `−dmin · m` (the VNNI kernel adds `dmin·m · (−s_a)`; the product is the same).
    #[inline(always)]
    unsafe fn build_block(wg: *const u8, b: usize, dst: *mut u8) {
        unsafe {
            let (wb, j) = (wg.add(b / 8 * Q4_K_BYTES), b % 8);
            let qs = wb.add(rows16::quants_offset(GgmlType::Q4_K) + j * rows16::Q4_K_SUB_BYTES);
            nibble_tile(qs, None, 0, dst.add(512), Some(dst));
            let (dsc, dm) = k4_scales::<Z512>(wb, j);
            let scales = dst.add(Self::TILE_B).cast::<f32>();
            _mm512_storeu_ps(scales, dsc);
            // −dm by flipping the sign bit: (−dm)·s_a is then exactly dm·(−s_a), signed zeros
            // included.
            let neg = _mm512_xor_si512(_mm512_castps_si512(dm), _mm512_set1_epi32(i32::MIN));
            _mm512_storeu_ps(scales.add(GROUP), _mm512_castsi512_ps(neg));
        }
    }
}

/// Issues block `b`'s tile products into tile set `SET` (0 or 1; fused: `tmm0` or `tmm1`,
/// split: `tmm0/tmm1` or `tmm2/tmm3`).
#[inline(always)]
unsafe fn issue<F: AmxFmt, const SET: usize>(act: *const u8, wt: *const u8) {
    macro_rules! fused {
        ($op:literal, $c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tileloadd tmm", $a, ", [{a} + {s64}]"),
                concat!("tileloadd tmm", $b, ", [{w} + {s64}]"),
                concat!("tilezero tmm", $c),
                concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b),
                a = in(reg) act,
                w = in(reg) wt,
                s64 = in(reg) 64usize,
                options(nostack, preserves_flags),
            )
        };
    }
    macro_rules! split {
        ($hi:literal, $lo:literal) => {
            asm!(
                "tileloadd tmm4, [{a} + {s64}]",
                "tileloadd tmm5, [{a} + {s64} + 32]",
                "tileloadd tmm6, [{w} + {s64}]",
                concat!("tilezero tmm", $hi),
                concat!("tilezero tmm", $lo),
                concat!("tdpbssd tmm", $hi, ", tmm4, tmm6"),
                concat!("tdpbssd tmm", $lo, ", tmm5, tmm6"),
                a = in(reg) act,
                w = in(reg) wt,
                s64 = in(reg) 64usize,
                options(nostack, preserves_flags),
            )
        };
    }
    // SAFETY: the tiles read 1 KiB at `act` and the format's `B` tile at `wt` (the caller's
    // buffers); the format's tile configuration is loaded.
    unsafe {
        match (F::DIGITS, SET) {
            (Digits::FusedSigned, 0) => fused!("tdpbssd", "0", "4", "6"),
            (Digits::FusedSigned, _) => fused!("tdpbssd", "1", "5", "7"),
            (Digits::FusedUnsigned, 0) => fused!("tdpbsud", "0", "4", "6"),
            (Digits::FusedUnsigned, _) => fused!("tdpbsud", "1", "5", "7"),
            (Digits::Split, 0) => split!("0", "1"),
            (Digits::Split, _) => split!("2", "3"),
        }
    }
}

/// Stores the sums of tile set `SET` at `c`: fused, the 16 × 16 i32 block sums (1 KiB);
/// split, the `h` sums then the `l` sums (1 KiB each).
#[inline(always)]
unsafe fn store<F: AmxFmt, const SET: usize>(c: *mut i32) {
    macro_rules! store {
        ($($t:literal, $off:literal),+) => {
            asm!(
                $(concat!("tilestored [{c} + {s64} + ", $off, "], tmm", $t),)+
                c = in(reg) c,
                s64 = in(reg) 64usize,
                options(nostack, preserves_flags),
            )
        };
    }
    // SAFETY: the tiles write the sums at `c` (the caller's buffer).
    unsafe {
        match (F::DIGITS, SET) {
            (Digits::Split, 0) => store!("0", "0", "1", "1024"),
            (Digits::Split, _) => store!("2", "0", "3", "1024"),
            (_, 0) => store!("0", "0"),
            (_, _) => store!("1", "0"),
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
        let scales = wt.add(F::TILE_B);
        let dw = _mm512_loadu_ps(scales.cast());
        let mw = if F::HAS_M {
            _mm512_loadu_ps(scales.add(64).cast())
        } else {
            _mm512_setzero_ps()
        };
        let da = act.add(ACT_D).cast::<f32>();
        let sa = act.add(ACT_D + 64).cast::<f32>();
        for (r, acc) in acc.iter_mut().enumerate() {
            let sumi = if F::DIGITS == Digits::Split {
                let h = _mm512_loadu_si512(c.add(16 * r).cast());
                let l = _mm512_loadu_si512(c.add(256 + 16 * r).cast());
                _mm512_add_epi32(_mm512_slli_epi32(h, 4), l)
            } else {
                _mm512_loadu_si512(c.add(16 * r).cast())
            };
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
        let w_bytes = F::TILE_B + 2 * GROUP * 4;
        // c: a ring of RING blocks' sums, 2 KiB each (a fused block uses the first half).
        #[repr(C, align(64))]
        struct Sums([i32; RING * 512]);
        let mut c = Sums([0; RING * 512]);
        let c = c.0.as_mut_ptr();
        WTILES.with_borrow_mut(|wtiles| {
            let bytes = BATCH_GROUPS * nb * w_bytes + 64;
            if wtiles.len() < bytes {
                wtiles.resize(bytes, 0);
            }
            // Tile rows of 64 bytes: start the buffer on a cache line.
            let wt0 = wtiles.as_mut_ptr();
            let wt0 = wt0.add(wt0.align_offset(64));
            let cfg = if F::DIGITS == Digits::Split {
                &SPLIT_CFG
            } else {
                &FUSED_CFG
            };
            asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, preserves_flags));
            for gb in (g0..g1).step_by(BATCH_GROUPS) {
                let n_groups = (g1 - gb).min(BATCH_GROUPS);
                for g in 0..n_groups {
                    let (wg, wt) = (
                        job.w.add((gb + g) * nb * F::BYTES32),
                        wt0.add(g * nb * w_bytes),
                    );
                    for b in 0..nb {
                        F::build_block(wg, b, wt.add(b * w_bytes));
                    }
                }
                // Row tiles outer: one row tile's activations (nb tile-blocks) stay in cache
                // while each group of the batch passes over them.
                for t in 0..m_tiles {
                    let act = job.act.add(t * nb * ACT_TILE_BYTES);
                    let rows = (job.n_rows - t * TILE_M).min(TILE_M);
                    for g in 0..n_groups {
                        let wt = wt0.add(g * nb * w_bytes);
                        let at = |b: usize| (act.add(b * ACT_TILE_BYTES), wt.add(b * w_bytes));
                        let mut acc = [_mm512_setzero_ps(); TILE_M];
                        // A three-stage pipeline over the blocks: block b's products are
                        // issued (in tile set b % 2) before block b - 1's sums are stored, so
                        // a store does not wait on the product just issued, and the vector
                        // units fold block b - 2 while the tile unit works.
                        for b in 0..nb + 2 {
                            if b < nb {
                                let (a1, w1) = at(b);
                                if b % 2 == 0 {
                                    issue::<F, 0>(a1, w1);
                                } else {
                                    issue::<F, 1>(a1, w1);
                                }
                            }
                            if (1..=nb).contains(&b) {
                                let sums = c.add(512 * ((b - 1) % RING));
                                if b % 2 == 1 {
                                    store::<F, 0>(sums);
                                } else {
                                    store::<F, 1>(sums);
                                }
                            }
                            if b >= 2 {
                                let (a0, w0) = at(b - 2);
                                fold::<F>(&mut acc, c.add(512 * ((b - 2) % RING)), a0, w0);
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
