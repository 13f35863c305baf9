//! Matrix multiplication with weights in their native (quantized) format.
//!
//! `matmul(x, w, out)` computes `out[t][n] = Σ_k x[t][k] · w[n][k]` — activations `x` are
//! row-major `[n_tokens, k]` f32, the weight is `[n, k]` in any [`GgmlType`] (ggml stores a
//! linear layer's weight as `n` rows of `k` elements), and `out` is `[n_tokens, n]`.
//!
//! Quantized weights (the integer path, shaped like ggml's `mul_mat`):
//! 1. the activation rows are quantized once per call into the format of the weight's kernel
//!    ([`Kernels::matmul_kernel_for`](crate::dispatch::Kernels::matmul_kernel_for)) —
//!    12-bit-in-i16 [A16](crate::quant::a16) for the 32-element and Rows16 weight formats
//!    (8-bit [A8](crate::quant::a8) for Rows16 under `--activation-bits 8`), Q8_K for the
//!    k-quants in GGUF layout — in a
//!    thread-local buffer that only grows (no allocation after warm-up), in parallel for
//!    prefill-sized inputs;
//! 2. the weight rows are split into chunks, claimed by the threads of the [`ThreadPool`]
//!    (two chunks per thread: a slow thread does not hold up the rest, and few chunks start
//!    few cold weight streams);
//! 3. inside a chunk, a tile of weight rows (~16 KiB, L1-resident) is swept against the token
//!    rows in groups of the kernel's `max_rows`: each weight block is decoded once per group
//!    by the tier's [`DotKernel`], and the tile is reused by every group while it is in cache.
//!    Rows16 weights ([`PackedMatrix`], what the model loads Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K as) take kernels
//!    that advance 16 rows per instruction; their chunks and tiles are whole groups.
//!
//! Float weights (F32/F16/BF16): from 16 token rows up (prefill), through the `gemm` crate —
//! tiles of ~256 KiB of weight rows on a fixed grid, converted to f32 into a thread-local
//! buffer (F16/BF16, or misaligned F32) or read in place (F32), each multiplied with all token
//! rows by one single-threaded `gemm` call; below that (decode), each weight row converted once
//! and dotted with every token row by the tier's f32 dot (no allocation: `gemm` allocates its
//! packing buffers).
//!
//! Numerics: A16 keeps each activation within half a step of `amax / 2047` of its block of 32
//! (ggml's 8-bit Q8_0/Q8_1 activations, a step of `amax / 127`, moved the default model's
//! top-1 logprobs by up to ~0.3 against the fp32 reference; A16's 12 bits by ~0.014). Every tier
//! quantizes identically (byte-for-byte) and sums exactly in integers, so tiers differ only in
//! f32 accumulation order; an output never depends on the thread count or the chunking.
//! The k-quants still pair with 8-bit Q8_K (no k-quant model is on the golden path yet).
//!
//! [`matmul`] uses the global pool and kernel table ([`crate::pool::global`],
//! [`crate::dispatch::kernels`]); [`matmul_with`] takes them explicitly.

use std::cell::RefCell;

use crate::dispatch::{DotKernel, Kernels, kernels};
use crate::pool::{SyncPtr, ThreadPool, global, parallel_chunks_mut};
pub use crate::qmatrix::{Layout, PackedMatrix, QMatrix};
use crate::quant::GgmlType;
#[cfg(target_arch = "x86_64")]
use crate::quant::rows16::GROUP;

/// Target bytes of the weight tile swept against each group of token rows (fits L1).
const TILE_BYTES: usize = 16 * 1024;
/// Row chunks per thread: two, so that a late or slow thread still leaves the others work to
/// claim, and few, because each chunk's weight stream starts cold (the kernels request it
/// ahead only once it runs). On Zen 5, 2 rather than 8 made single-stream decode 1.2× faster
/// (tg128 385 → 460–520 tok/s) and 16-sequence decode 1.05×, prefill unchanged; 1 was as
/// fast as 2, 4 in between (BENCHMARKS.md).
const CHUNKS_PER_THREAD: usize = 2;
/// Fewest weight rows per chunk.
const MIN_CHUNK_ROWS: usize = 16;
/// f32 elements of the weight tile the float path converts and hands to `gemm` (256 KiB).
const FLOAT_TILE: usize = 64 * 1024;
/// Fewest token rows the float path hands to `gemm`; fewer take the row-dot path.
const GEMM_MIN_TOKENS: usize = 16;
/// Longest float-path row converted on the stack by the row-dot path.
const STACK_ROW: usize = 4096;

thread_local! {
    /// Quantized activation rows of the current matmul on this (calling) thread.
    static ACT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The float path's tile of weight rows converted to f32, per thread (grows only).
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The AMX path's activations in its tile layout, on the calling thread (grows only).
    #[cfg(target_arch = "x86_64")]
    static AMX_ACT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Fewest activation rows the AMX tier's matmul takes (fewer run on its AVX-512 VNNI kernels).
/// Measured in the model (`bench-model --batch 16,24,32,48`, both tiers, BENCHMARKS.md): with
/// one row tile the tiles cannot amortise building a group's weight tiles (a third to a half
/// of the call at 16 rows), and every matmul of the default model ran 0.76-0.89× the VNNI
/// kernels' speed at 16 and 24 rows; from 32 rows each ran at 1.03-1.14×.
pub const AMX_MIN_ROWS: usize = 32;

/// How the `n` weight rows are cut into tasks and tiles.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    chunk: usize,
    n_tasks: usize,
    tile: usize,
}

/// Weight rows per pool task for `n` rows on `threads` threads, a multiple of `align` (a
/// Rows16 group, or 1): what `matmul`, the fused gate/up pass and the grouped matmuls (which
/// need one chunk for all their groups) cut a weight into.
pub(crate) fn chunk_rows(n: usize, threads: usize, align: usize) -> usize {
    let chunk = if threads <= 1 {
        n
    } else {
        n.div_ceil(threads * CHUNKS_PER_THREAD).max(MIN_CHUNK_ROWS)
    };
    chunk.next_multiple_of(align).max(align)
}

impl Plan {
    /// Chunks and tiles start at multiples of `align` rows (a Rows16 group, or 1).
    fn new(n: usize, row_bytes: usize, threads: usize, align: usize) -> Plan {
        let chunk = chunk_rows(n, threads, align);
        let tile = (TILE_BYTES / row_bytes.max(1)).next_multiple_of(align);
        let tile = tile.clamp(1, chunk.max(1));
        Plan {
            chunk,
            n_tasks: n.div_ceil(chunk),
            tile,
        }
    }
}

/// `out[t][n] = Σ_k x[t][k] · w[n][k]` for `t < n_tokens`, on the global pool and kernels.
///
/// `x.len() == n_tokens * w.cols`, `out.len() == n_tokens * w.rows`.
pub fn matmul(x: &[f32], w: &QMatrix<'_>, out: &mut [f32]) {
    matmul_with(global(), kernels(), x, w, out);
}

/// [`matmul`] on an explicit pool and kernel table.
pub fn matmul_with(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    w: &QMatrix<'_>,
    out: &mut [f32],
) {
    matmul_multi_with(pool, kernels, x, std::slice::from_ref(w), out);
}

/// Most matrices one [`matmul_multi`] call takes.
pub const MAX_PARTS: usize = 4;

/// Several matrices over the same input, their outputs side by side: with `ws` of `n_i` rows,
/// `out` is `[n_tokens, Σ n_i]` and `out[t][c_i + n] = Σ_k x[t][k] · w_i[n][k]`, where
/// `c_i = Σ_{j < i} n_j` (Q/K/V as one matmul).
///
/// When every matrix takes the same activation format
/// ([`ActFormat::for_matmul`](crate::dispatch::ActFormat::for_matmul)), the
/// activations are quantized once and one pool job covers the rows of every matrix — what a
/// matmul over the concatenated weights does, without copying them (and also for mixed weight
/// types that share a format, e.g. a Q6_K `attn_v` beside Q4_K `attn_q`/`attn_k`). Otherwise
/// each matrix runs as its own matmul into its columns. Each output is bit-identical to a
/// plain [`matmul`] of its matrix.
///
/// Panics if the matrices do not share `cols`, there are more than [`MAX_PARTS`], or a
/// length does not fit.
pub fn matmul_multi(x: &[f32], ws: &[QMatrix<'_>], out: &mut [f32]) {
    matmul_multi_with(global(), kernels(), x, ws, out);
}

/// [`matmul_multi`] on an explicit pool and kernel table.
pub fn matmul_multi_with(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    ws: &[QMatrix<'_>],
    out: &mut [f32],
) {
    assert!((1..=MAX_PARTS).contains(&ws.len()), "{} matrices", ws.len());
    let k = ws[0].cols;
    let n_total: usize = ws.iter().map(|w| w.rows).sum();
    if k == 0 {
        out.fill(0.0);
        return;
    }
    assert_eq!(x.len() % k, 0, "x is not whole rows of {k}");
    let n_tokens = x.len() / k;
    assert_eq!(
        out.len(),
        n_tokens * n_total,
        "out is not [{n_tokens}, {n_total}]"
    );
    for w in ws {
        assert_eq!(w.cols, k, "matrices of different widths");
        assert_eq!(k % w.ty.block_size(), 0, "{k} columns of {}", w.ty);
        assert!(
            w.data.len() >= w.stored_rows() * w.row_bytes(),
            "weight bytes"
        );
    }
    if n_tokens == 0 || n_total == 0 {
        return;
    }
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let mut parts = [None; MAX_PARTS];
    let mut col = 0;
    for (p, w) in parts.iter_mut().zip(ws) {
        *p = kernels
            .matmul_kernel_for(w)
            .map(|kern| Part::new(*w, kern, col, pool.num_threads()));
        col += w.rows;
    }
    let fused = parts[..ws.len()]
        .iter()
        .all(|p| p.is_some_and(|p| Some(p.kern.act) == parts[0].map(|p0| p0.kern.act)));
    if fused {
        // Every part is `Some`; entries past `ws.len()` repeat the last (and are not run).
        let parts: [Part<'_>; MAX_PARTS] =
            std::array::from_fn(|i| parts[i.min(ws.len() - 1)].expect("fused parts"));
        #[cfg(target_arch = "x86_64")]
        if let Some(amx) = amx_for(kernels, ws, n_tokens) {
            // SAFETY: as below.
            unsafe {
                matmul_amx(
                    pool,
                    &amx,
                    &parts[..ws.len()],
                    x,
                    out_ptr,
                    n_tokens,
                    n_total,
                )
            };
            return;
        }
        // SAFETY: `out` is [n_tokens, n_total] and mutably borrowed for the whole call.
        unsafe { matmul_quantized(pool, &parts[..ws.len()], x, out_ptr, n_tokens, n_total) };
        return;
    }
    let mut col = 0;
    for (p, w) in parts.iter().zip(ws) {
        // SAFETY: as above; each call writes its own columns `col..col + w.rows`.
        unsafe {
            match p {
                Some(p) => {
                    matmul_quantized(pool, std::slice::from_ref(p), x, out_ptr, n_tokens, n_total)
                }
                None if x.len() / k < GEMM_MIN_TOKENS => {
                    matmul_float_rows(pool, kernels, x, w, out_ptr, n_total, col)
                }
                None => matmul_float(pool, x, w, out_ptr, n_total, col),
            }
        }
        col += w.rows;
    }
}

/// One matrix of a fused matmul: its kernel, first output column and row plan.
#[derive(Clone, Copy)]
pub(crate) struct Part<'a> {
    pub(crate) w: QMatrix<'a>,
    pub(crate) kern: DotKernel,
    pub(crate) col: usize,
    plan: Plan,
}

/// Quantizes the activation rows `x` (`n_tokens` rows of `k`) for `kern` into this thread's
/// activation buffer, and runs `f(act, a_row)` on it (`a_row` bytes per row).
pub(crate) fn with_quantized<R>(
    pool: &ThreadPool,
    kern: &DotKernel,
    x: &[f32],
    k: usize,
    f: impl FnOnce(&[u8], usize) -> R,
) -> R {
    let n_tokens = x.len() / k;
    let a_row = k / kern.block_size * kern.a_block_bytes;
    ACT.with_borrow_mut(|buf| {
        if buf.len() < n_tokens * a_row {
            buf.resize(n_tokens * a_row, 0);
        }
        // act: [n_tokens, a_row] bytes of activation blocks.
        let act = &mut buf[..n_tokens * a_row];
        quantize_rows(pool, kern, x, k, act, a_row);
        f(act, a_row)
    })
}

/// The integer path (module docs, steps 1-3) over the rows of every part, which share one
/// activation format: `out[t * out_stride + part.col + r]`.
///
/// # Safety
///
/// `out` is valid for writes of `[n_tokens, out_stride]`, every part's columns lie inside a
/// row, no two parts overlap, and nobody else accesses those columns during the call.
unsafe fn matmul_quantized(
    pool: &ThreadPool,
    parts: &[Part<'_>],
    x: &[f32],
    out: SyncPtr<f32>,
    n_tokens: usize,
    out_stride: usize,
) {
    let k = parts[0].w.cols;
    with_quantized(pool, &parts[0].kern, x, k, |act, a_row| {
        let n_tasks: usize = parts.iter().map(|p| p.plan.n_tasks).sum();
        pool.parallel_for(n_tasks, |task| {
            let (part, r0, r1) = task_rows(parts, task);
            // SAFETY: rows r0..r1 of this part belong to this task alone; `out` is the
            // caller's [n_tokens, out_stride].
            let act = ActRows {
                data: act,
                stride: a_row,
                n: n_tokens,
            };
            unsafe { part.dot_rows(r0, r1, act, out.get(), out_stride) };
        });
    });
}

impl<'a> Part<'a> {
    /// Part `w` with `kern`, written from output column `col`, its rows chunked for `threads`.
    pub(crate) fn new(w: QMatrix<'a>, kern: DotKernel, col: usize, threads: usize) -> Part<'a> {
        let plan = Plan::new(w.rows, w.row_bytes(), threads, w.row_align());
        Part { w, kern, col, plan }
    }

    /// Rows `r0..r1` of the weight against the quantized activation rows `act`, into
    /// `out[i * out_stride + self.col + r]` for activation row `i` (module docs, step 3).
    ///
    /// # Safety
    ///
    /// `out` is valid for writes at those indices, and nobody else accesses them during the
    /// call; `act` holds rows quantized for `self.kern`.
    pub(crate) unsafe fn dot_rows(
        &self,
        r0: usize,
        r1: usize,
        act: ActRows<'_>,
        out: *mut f32,
        out_stride: usize,
    ) {
        let Part { w, kern, col, plan } = self;
        let nb = w.cols / kern.block_size;
        let mut tile0 = r0;
        while tile0 < r1 {
            let tile1 = r1.min(tile0 + plan.tile);
            // tile: weight rows tile0..tile1 (and a Rows16 group's padding rows).
            let tile = w.rows_bytes(tile0, tile1);
            for t0 in (0..act.n).step_by(kern.max_rows) {
                let na = kern.max_rows.min(act.n - t0);
                // SAFETY: the tile writes out[(t0 + j) * out_stride + col + r] for j < na and
                // tile0 <= r < tile1: the caller's rows and columns.
                unsafe {
                    kern.dot_tile(
                        nb,
                        tile,
                        tile1 - tile0,
                        &act.data[t0 * act.stride..],
                        act.stride,
                        na,
                        out.add(t0 * out_stride + col + tile0),
                        out_stride,
                    );
                }
            }
            tile0 = tile1;
        }
    }
}

/// Quantized activation rows a task reads: row `i < n` starts at `data[i * stride..]`.
#[derive(Clone, Copy)]
pub(crate) struct ActRows<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) stride: usize,
    pub(crate) n: usize,
}

/// The part that task `task` of a pool job over `parts` (the parts' plans' tasks, in order)
/// covers, and its rows `r0..r1` there.
fn task_rows<'a>(parts: &[Part<'a>], mut task: usize) -> (Part<'a>, usize, usize) {
    let mut pi = 0;
    while task >= parts[pi].plan.n_tasks {
        task -= parts[pi].plan.n_tasks;
        pi += 1;
    }
    let p = parts[pi];
    let r0 = task * p.plan.chunk;
    (p, r0, p.w.rows.min(r0 + p.plan.chunk))
}

/// The AMX kernels a matmul of `ws` over `n_tokens` activation rows runs on, if any: on the
/// AMX tier, from [`AMX_MIN_ROWS`] rows, when every matrix is Rows16 of a type they cover.
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_for(
    kernels: &Kernels,
    ws: &[QMatrix<'_>],
    n_tokens: usize,
) -> Option<crate::simd::AmxFns> {
    let amx = kernels.amx()?;
    let covered = ws
        .iter()
        .all(|w| w.layout == Layout::Rows16 && amx.groups[w.ty as usize].is_some())
        // The tiles take A16 only; an A8 weight stays on the VNNI kernels.
        && ws.iter().all(|w| {
            kernels
                .matmul_kernel_for(w)
                .is_some_and(|k| k.act == crate::dispatch::ActFormat::A16)
        });
    (n_tokens >= AMX_MIN_ROWS && covered).then_some(amx)
}

/// The AMX tier's integer path: the activations quantized to A16 as for the other tiers,
/// split into the tile layout once ([`crate::simd::x86::amx`]), then the parts' weight groups
/// claimed by the pool's threads in the chunks of each part's plan, every group run against
/// every activation row. Bit-identical to [`matmul_quantized`] on the AVX-512 VNNI kernels.
///
/// # Safety
///
/// As [`matmul_quantized`]; every part is Rows16 of a type `amx.groups` has.
#[cfg(target_arch = "x86_64")]
unsafe fn matmul_amx(
    pool: &ThreadPool,
    amx: &crate::simd::AmxFns,
    parts: &[Part<'_>],
    x: &[f32],
    out: SyncPtr<f32>,
    n_tokens: usize,
    out_stride: usize,
) {
    use crate::simd::x86::amx::{ACT_TILE_BYTES, AmxJob, TILE_M};
    let k = parts[0].w.cols;
    // Blocks of 32 columns (a Q4_K block is eight of them, each with its own A16 block).
    let nb = k / crate::quant::QK;
    with_quantized(pool, &parts[0].kern, x, k, |act, a_row| {
        AMX_ACT.with_borrow_mut(|buf| {
            let m_tiles = n_tokens.div_ceil(TILE_M);
            let bytes = m_tiles * nb * ACT_TILE_BYTES;
            if buf.len() < bytes {
                buf.resize(bytes, 0);
            }
            // Whole row tiles per task.
            let per_task = m_tiles.div_ceil(pool.num_threads() * 2);
            parallel_chunks_mut(
                pool,
                &mut buf[..bytes],
                per_task * nb * ACT_TILE_BYTES,
                |i, dst| {
                    let t0 = i * per_task * TILE_M;
                    let rows = (n_tokens - t0).min(per_task * TILE_M);
                    // SAFETY: `act` holds rows t0..t0 + rows of a_row bytes, `dst` the tile layout
                    // of exactly those rows' tiles; the table exists only on a CPU with the AMX
                    // tier's features.
                    unsafe {
                        (amx.split)(
                            act[t0 * a_row..].as_ptr(),
                            a_row,
                            rows,
                            nb,
                            dst.as_mut_ptr(),
                        )
                    };
                },
            );
            let tiles = SyncPtr(buf.as_mut_ptr());
            let n_tasks: usize = parts.iter().map(|p| p.plan.n_tasks).sum();
            pool.parallel_for(n_tasks, |task| {
                let (Part { w, col, .. }, r0, r1) = task_rows(parts, task);
                let job = AmxJob {
                    nb,
                    w: w.data.as_ptr(),
                    rows: w.rows,
                    act: tiles.get().cast_const(),
                    n_rows: n_tokens,
                    // SAFETY: column `col` of row 0 is inside `out` (the caller's contract).
                    out: unsafe { out.get().add(col) },
                    out_stride,
                };
                let groups = amx.groups[w.ty as usize].expect("checked by the caller");
                // SAFETY: rows r0..r1 (whole groups: the plan is aligned to them) of this part
                // belong to this task alone; the weights hold every stored group, the tiles
                // every activation row; the AMX tier's CPU features and tile permission were
                // checked when the table was made.
                unsafe { groups(&job, r0 / GROUP, r1.div_ceil(GROUP)) };
            });
        });
    });
}

/// Quantizes the `x.len() / k` rows of `x` into `act` (`a_row` bytes each), in parallel for
/// prefill-sized inputs.
fn quantize_rows(
    pool: &ThreadPool,
    kern: &DotKernel,
    x: &[f32],
    k: usize,
    act: &mut [u8],
    a_row: usize,
) {
    let n_tokens = x.len() / k;
    let threads = pool.num_threads();
    if n_tokens < 2 * threads || n_tokens * k < 16 * 1024 {
        for (xr, ar) in x.chunks_exact(k).zip(act.chunks_exact_mut(a_row)) {
            kern.quantize(xr, ar);
        }
        return;
    }
    let rows_per_task = n_tokens.div_ceil(threads * 2);
    parallel_chunks_mut(pool, act, rows_per_task * a_row, |i, chunk| {
        let x = &x[i * rows_per_task * k..];
        for (xr, ar) in x.chunks_exact(k).zip(chunk.chunks_exact_mut(a_row)) {
            kern.quantize(xr, ar);
        }
    });
}

/// The float path for a few token rows (decode): each weight row is converted to f32 once
/// (on the stack up to `STACK_ROW` columns) and dotted with every token row by the tier's f32
/// dot — memory-bound like a GEMV, and free of the allocations `gemm` makes for its packing
/// buffers, so decode steps stay allocation-free on float weights too.
///
/// # Safety
///
/// As [`matmul_quantized`], for columns `col..col + w.rows`.
unsafe fn matmul_float_rows(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    w: &QMatrix<'_>,
    out: SyncPtr<f32>,
    out_stride: usize,
    col: usize,
) {
    let (n, k) = (w.rows, w.cols);
    let plan = Plan::new(n, w.row_bytes(), pool.num_threads(), 1);
    pool.parallel_for(plan.n_tasks, |task| {
        let r0 = task * plan.chunk;
        let r1 = n.min(r0 + plan.chunk);
        let rows = |row: &mut [f32]| {
            for r in r0..r1 {
                w.dequantize_row_into(r, row);
                for (t, xt) in x.chunks_exact(k).enumerate() {
                    let v = kernels.dot_f32(xt, row);
                    // SAFETY: column `col + r` belongs to this task alone, inside `out` by
                    // the caller's contract.
                    unsafe { *out.get().add(t * out_stride + col + r) = v };
                }
            }
        };
        if k <= STACK_ROW {
            rows(&mut [0f32; STACK_ROW][..k]);
        } else {
            ROW.with_borrow_mut(|row| {
                row.resize(k, 0.0);
                rows(&mut row[..k]);
            });
        }
    });
}

/// The float path for many token rows (prefill): tiles of weight rows as f32, each
/// multiplied with every token row by one `gemm` call, into `out[t * out_stride + col + r]`.
///
/// # Safety
///
/// As [`matmul_quantized`], for columns `col..col + w.rows`.
unsafe fn matmul_float(
    pool: &ThreadPool,
    x: &[f32],
    w: &QMatrix<'_>,
    out: SyncPtr<f32>,
    out_stride: usize,
    col: usize,
) {
    let (n, k) = (w.rows, w.cols);
    let n_tokens = x.len() / k;
    // F32 weights whose bytes are f32-aligned are read in place; other float types (and a
    // misaligned F32 tensor) are converted a tile of rows at a time. Tiles lie on a fixed grid
    // of `tile_rows` whatever the thread count, so every output is computed by the same `gemm`
    // call shape (and summation order) on any pool.
    let in_place = w.ty == GgmlType::F32 && w.data.as_ptr().align_offset(4) == 0;
    let tile_rows = (FLOAT_TILE / k).max(1);
    pool.parallel_for(n.div_ceil(tile_rows), |task| {
        let t0 = task * tile_rows;
        let t1 = n.min(t0 + tile_rows);
        ROW.with_borrow_mut(|buf| {
            // tile: weight rows t0..t1 as f32, [t1 - t0, k] row-major.
            let tile: &[f32] = if in_place {
                let bytes = &w.data[t0 * k * 4..t1 * k * 4];
                // SAFETY: f32-aligned (checked above), a whole number of f32s, and every bit
                // pattern is a valid f32.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), (t1 - t0) * k) }
            } else {
                if buf.len() < tile_rows * k {
                    buf.resize(tile_rows * k, 0.0);
                }
                for (r, row) in (t0..t1).zip(buf.chunks_exact_mut(k)) {
                    w.dequantize_row_into(r, row);
                }
                &buf[..(t1 - t0) * k]
            };
            // SAFETY: out[t * out_stride + col + r] for t < n_tokens, t0 <= r < t1: inside
            // `out` and in columns of this task alone (the caller's contract); `x` is
            // [n_tokens, k] and `tile` [t1 - t0, k], both row-major.
            unsafe {
                gemm_f32(
                    n_tokens,
                    t1 - t0,
                    k,
                    x,
                    tile,
                    out.get().add(col + t0),
                    out_stride,
                )
            };
        });
    });
}

/// `dst[t * dst_stride + r] = Σ_j x[t][j] · w[r][j]` for `t < m`, `r < n` with the `gemm`
/// crate (its own runtime-dispatched, cache-blocked f32 kernels), on the calling thread.
///
/// # Safety
///
/// `dst` is valid for writes at every index above; `x.len() >= m * k`, `w.len() >= n * k`.
unsafe fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    x: &[f32],
    w: &[f32],
    dst: *mut f32,
    dst_stride: usize,
) {
    debug_assert!(x.len() >= m * k && w.len() >= n * k);
    // dst (m × n, row stride dst_stride) = x (m × k, row-major) · wᵀ (k × n: element (j, r)
    // is w[r * k + j], so column stride k, row stride 1).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_stride as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// f32 dot product (the table's tier: FMA on x86-64 with AVX2).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    kernels().dot_f32(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_matrix(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        (0..rows * cols)
            .flat_map(|i| {
                ((((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
                    .to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn matches_naive_f32_product_on_odd_shapes() {
        for (t, n, k) in [(1, 1, 1), (3, 7, 5), (2, 17, 33), (5, 9, 64), (6, 200, 40)] {
            let data = f32_matrix(n, k, 7);
            let w = QMatrix::new(GgmlType::F32, n, k, &data);
            let x: Vec<f32> = (0..t * k).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
            let mut out = vec![0f32; t * n];
            matmul(&x, &w, &mut out);
            let wf: Vec<f32> = data
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            for ti in 0..t {
                for ni in 0..n {
                    let want: f32 = (0..k).map(|j| x[ti * k + j] * wf[ni * k + j]).sum();
                    let got = out[ti * n + ni];
                    assert!(
                        (want - got).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{want} vs {got}"
                    );
                }
            }
        }
    }

    #[test]
    fn from_f32_views_the_same_matrix_as_its_le_bytes() {
        let (n, k) = (5, 7);
        let data = f32_matrix(n, k, 3);
        let wf: Vec<f32> = data
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let x: Vec<f32> = (0..2 * k).map(|i| i as f32 * 0.25 - 1.0).collect();
        let (mut a, mut b) = (vec![0f32; 2 * n], vec![0f32; 2 * n]);
        matmul(&x, &QMatrix::new(GgmlType::F32, n, k, &data), &mut a);
        matmul(&x, &QMatrix::from_f32(n, k, &wf), &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn plan_covers_every_row() {
        for n in [1, 15, 16, 17, 576, 49152] {
            for threads in [1, 2, 3, 16] {
                for align in [1, 16] {
                    let p = Plan::new(n, 360, threads, align);
                    assert!(p.n_tasks * p.chunk >= n && (p.n_tasks - 1) * p.chunk < n);
                    assert!(p.tile >= 1 && p.tile <= p.chunk);
                    assert!(
                        p.chunk.is_multiple_of(align)
                            && (p.tile.is_multiple_of(align) || p.tile == p.chunk)
                    );
                }
            }
        }
    }
}
