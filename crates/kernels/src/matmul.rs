//! Matrix multiplication with weights in their native (quantized) format.
//!
//! `matmul(x, w, out)` computes `out[t][n] = Σ_k x[t][k] · w[n][k]` — activations `x` are
//! row-major `[n_tokens, k]` f32, the weight is `[n, k]` in any [`GgmlType`] (ggml stores a
//! linear layer's weight as `n` rows of `k` elements), and `out` is `[n_tokens, n]`.
//!
//! Quantized weights (the integer path, shaped like ggml's `mul_mat`):
//! 1. the activation rows are quantized once per call into the format of
//!    [`ActFormat::for_matmul`](crate::dispatch::ActFormat::for_matmul) — 16-bit
//!    [A16](crate::quant::a16) for the 32-element weight formats, Q8_K for the k-quants — in a
//!    thread-local buffer that only grows (no allocation after warm-up), in parallel for
//!    prefill-sized inputs;
//! 2. the weight rows are split into chunks, claimed by the threads of the [`ThreadPool`]
//!    (about eight chunks per thread, so both cores stay busy for `n` as small as a few
//!    hundred and a slow thread does not hold up the rest);
//! 3. inside a chunk, a tile of weight rows (~16 KiB, L1-resident) is swept against the token
//!    rows in groups of [`MAX_ROWS`]: each weight block is decoded once per group by the
//!    tier's [`DotKernel`], and the tile is reused by every group while it is in cache.
//!
//! Float weights (F32/F16/BF16) take a float path: each weight row is dequantized to f32 into
//! a thread-local buffer and dotted with every token row by the tier's f32 dot.
//!
//! Numerics: A16 keeps each activation within half a step of `amax / 32767` of its block of 32
//! (ggml's 8-bit Q8_0/Q8_1 activations, a step of `amax / 127`, moved the default model's
//! top-1 logprobs by up to ~0.3 against the fp32 reference; A16 by ~0.001). Every tier
//! quantizes identically (byte-for-byte) and sums exactly in integers, so tiers differ only in
//! f32 accumulation order; an output never depends on the thread count or the chunking.
//! The k-quants still pair with 8-bit Q8_K (no k-quant model is on the golden path yet).
//!
//! [`matmul`] uses the global pool and kernel table ([`crate::pool::global`],
//! [`crate::dispatch::kernels`]); [`matmul_with`] takes them explicitly.

use std::cell::RefCell;

use crate::dispatch::{DotKernel, Kernels, kernels};
use crate::pool::{SyncPtr, ThreadPool, global, parallel_chunks_mut};
use crate::quant::{GgmlType, dequantize_row};
use crate::simd::MAX_ROWS;

/// A weight matrix view: `rows` rows of `cols` elements of type `ty`, packed as in GGUF.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// The packed bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Dequantizes row `r` into `dst` (`dst.len() == cols`).
    pub fn dequantize_row_into(&self, r: usize, dst: &mut [f32]) {
        dequantize_row(self.ty, self.row(r), dst);
    }
}

/// Target bytes of the weight tile swept against each group of token rows (fits L1).
const TILE_BYTES: usize = 16 * 1024;
/// Row chunks per thread: enough to balance uneven threads, few enough to keep claims cheap.
const CHUNKS_PER_THREAD: usize = 8;
/// Fewest weight rows per chunk.
const MIN_CHUNK_ROWS: usize = 16;

thread_local! {
    /// Quantized activation rows of the current matmul on this (calling) thread.
    static ACT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// One dequantized weight row for the float path, per thread.
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// How the `n` weight rows are cut into tasks and tiles.
#[derive(Clone, Copy, Debug)]
struct Plan {
    chunk: usize,
    n_tasks: usize,
    tile: usize,
}

impl Plan {
    fn new(n: usize, row_bytes: usize, threads: usize) -> Plan {
        let chunk = if threads <= 1 {
            n
        } else {
            n.div_ceil(threads * CHUNKS_PER_THREAD).max(MIN_CHUNK_ROWS)
        };
        let tile = (TILE_BYTES / row_bytes.max(1)).clamp(1, chunk.max(1));
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
    let (n, k) = (w.rows, w.cols);
    if k == 0 {
        out.fill(0.0);
        return;
    }
    assert_eq!(x.len() % k, 0, "x is not whole rows of {k}");
    let n_tokens = x.len() / k;
    assert_eq!(out.len(), n_tokens * n, "out is not [{n_tokens}, {n}]");
    assert_eq!(k % w.ty.block_size(), 0, "{k} columns of {}", w.ty);
    assert!(w.data.len() >= n * w.row_bytes(), "weight bytes");
    if n_tokens == 0 || n == 0 {
        return;
    }
    match kernels.matmul_kernel(w.ty) {
        Some(kern) => matmul_quantized(pool, &kern, x, w, out, n_tokens),
        None => matmul_float(pool, kernels, x, w, out),
    }
}

/// The integer path (module docs, steps 1-3).
fn matmul_quantized(
    pool: &ThreadPool,
    kern: &DotKernel,
    x: &[f32],
    w: &QMatrix<'_>,
    out: &mut [f32],
    n_tokens: usize,
) {
    let (n, k) = (w.rows, w.cols);
    let nb = k / kern.block_size;
    let a_row = nb * kern.a_block_bytes;
    ACT.with_borrow_mut(|buf| {
        if buf.len() < n_tokens * a_row {
            buf.resize(n_tokens * a_row, 0);
        }
        // act: [n_tokens, a_row] bytes of activation blocks.
        let act = &mut buf[..n_tokens * a_row];
        quantize_rows(pool, kern, x, k, act, a_row);
        let act = &*act;
        let row_bytes = w.row_bytes();
        let plan = Plan::new(n, row_bytes, pool.num_threads());
        let out_ptr = SyncPtr(out.as_mut_ptr());
        pool.parallel_for(plan.n_tasks, |task| {
            let r0 = task * plan.chunk;
            let r1 = n.min(r0 + plan.chunk);
            let mut tile0 = r0;
            while tile0 < r1 {
                let tile1 = r1.min(tile0 + plan.tile);
                // tile: weight rows tile0..tile1, [tile1 - tile0, row_bytes].
                let tile = &w.data[tile0 * row_bytes..tile1 * row_bytes];
                for t0 in (0..n_tokens).step_by(MAX_ROWS) {
                    let na = MAX_ROWS.min(n_tokens - t0);
                    // SAFETY: the tile writes out[(t0 + j) * n + r] for j < na and
                    // tile0 <= r < tile1: inside `out` ([n_tokens, n]), in columns r0..r1 that
                    // belong to this task alone, while `out` stays mutably borrowed until
                    // `parallel_for` returns.
                    unsafe {
                        kern.dot_tile(
                            nb,
                            tile,
                            tile1 - tile0,
                            &act[t0 * a_row..],
                            a_row,
                            na,
                            out_ptr.get().add(t0 * n + tile0),
                            n,
                        );
                    }
                }
                tile0 = tile1;
            }
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

/// The float path: each weight row dequantized to f32 once, dotted with every token row.
fn matmul_float(pool: &ThreadPool, kernels: &Kernels, x: &[f32], w: &QMatrix<'_>, out: &mut [f32]) {
    let (n, k) = (w.rows, w.cols);
    let plan = Plan::new(n, w.row_bytes(), pool.num_threads());
    let out_ptr = SyncPtr(out.as_mut_ptr());
    pool.parallel_for(plan.n_tasks, |task| {
        let r0 = task * plan.chunk;
        let r1 = n.min(r0 + plan.chunk);
        ROW.with_borrow_mut(|row| {
            row.resize(k, 0.0);
            for r in r0..r1 {
                w.dequantize_row_into(r, row);
                for (t, xt) in x.chunks_exact(k).enumerate() {
                    let v = kernels.dot_f32(xt, row);
                    // SAFETY: as in `matmul_quantized`: column `r` belongs to this task alone.
                    unsafe { *out_ptr.get().add(t * n + r) = v };
                }
            }
        });
    });
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
            let w = QMatrix {
                ty: GgmlType::F32,
                rows: n,
                cols: k,
                data: &data,
            };
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
    fn plan_covers_every_row() {
        for n in [1, 15, 16, 17, 576, 49152] {
            for threads in [1, 2, 3, 16] {
                let p = Plan::new(n, 360, threads);
                assert!(p.n_tasks * p.chunk >= n && (p.n_tasks - 1) * p.chunk < n);
                assert!(p.tile >= 1 && p.tile <= p.chunk);
            }
        }
    }
}
