//! The int4 matmul kernel and its reference twin.
//!
//! `out[t, r] = Σ_k x[t, k] * W[k, r]` for `x: [m, cols]`, `out: [m, rows]`.
//!
//! [`matmul`] (see the parent module doc for the layout):
//! 1. gathers the activation rows into storage order through `perm` (act-order only);
//! 2. computes each activation row's group sums `Σ_{j ∈ g} x[t, j]`;
//! 3. splits the weight rows over the thread pool ([`TILE_ROWS`] per task) and runs the row
//!    kernel chosen once ([`Int4Kernel::best`]: AVX2 + FMA or scalar, identical structure):
//!    per weight row and group, unpacks 8
//!    nibbles at a time to f32 and accumulates them against **every** activation row in
//!    8-lane accumulators (the unpacked weights are reused `m` times), then adds
//!    `scale * acc - min * group_sum` per activation row;
//! 4. writes `out` (row-major `[m, rows]`) from the per-task `[rows, m]` results.
//!
//! [`matmul_ref`] dequantizes each weight row to f32 in input order with
//! [`Int4Matrix::dequantize_row`] and takes a sequential f32 dot: the differential tests
//! compare the two with an error budget of a few f32 ulps of the row's `Σ |x w|`.
//!
//! Allocation: `matmul` allocates its scratch (gathered activations, group sums, the
//! transposed result) per call; the model-facing integration can hoist these into a workspace.

use super::Int4Matrix;
use crate::dispatch::{Tier, kernels};
use crate::pool::{self, parallel_chunks_mut};

/// Weight rows per pool task (a task's results are `[TILE_ROWS, m]`).
pub const TILE_ROWS: usize = 16;

/// The implementations of the row kernel (step 3 of the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Kernel {
    /// Plain Rust, 8-lane f32 accumulators (vectorized by the compiler where it can).
    Scalar,
    /// AVX2 + FMA intrinsics (`simd::x86::int4`).
    Avx2,
}

impl Int4Kernel {
    /// Every implementation.
    pub const ALL: [Int4Kernel; 2] = [Int4Kernel::Scalar, Int4Kernel::Avx2];

    /// Whether this CPU runs it: AVX2 + FMA come with every SIMD tier of the kernel table,
    /// whose detection ran once ([`crate::dispatch::kernels`]).
    pub fn is_supported(self) -> bool {
        match self {
            Int4Kernel::Scalar => true,
            Int4Kernel::Avx2 => cfg!(target_arch = "x86_64") && kernels().tier() != Tier::Scalar,
        }
    }

    /// The fastest supported implementation.
    pub fn best() -> Int4Kernel {
        if Int4Kernel::Avx2.is_supported() {
            Int4Kernel::Avx2
        } else {
            Int4Kernel::Scalar
        }
    }
}

/// `out = x · Wᵀ` in the reference way: dequantize, then an f32 dot per element.
pub fn matmul_ref(x: &[f32], w: &Int4Matrix, out: &mut [f32]) {
    let (k, n) = (w.cols(), w.rows());
    assert!(x.len().is_multiple_of(k) && out.len() == x.len() / k * n);
    let mut row = vec![0f32; k];
    for r in 0..n {
        w.dequantize_row(r, &mut row);
        for (t, xt) in x.chunks_exact(k).enumerate() {
            out[t * n + r] = xt.iter().zip(&row).map(|(a, b)| a * b).sum();
        }
    }
}

/// `out = x · Wᵀ` with the fastest int4 kernel, weight rows split across the global pool.
/// `x: [m, cols]`, `out: [m, rows]`.
pub fn matmul(x: &[f32], w: &Int4Matrix, out: &mut [f32]) {
    matmul_with(Int4Kernel::best(), x, w, out);
}

/// [`matmul`] with a chosen implementation. Panics if `kernel` is not supported here.
pub fn matmul_with(kernel: Int4Kernel, x: &[f32], w: &Int4Matrix, out: &mut [f32]) {
    assert!(
        kernel.is_supported(),
        "{kernel:?} is not supported on this CPU"
    );
    let (k, n) = (w.cols(), w.rows());
    debug_assert!(x.len().is_multiple_of(k) && out.len() == x.len() / k * n);
    let m = x.len() / k;
    if m == 0 {
        return;
    }
    // xs: [m, k] in storage order.
    let gathered: Vec<f32>;
    let xs: &[f32] = match &w.perm {
        None => x,
        Some(perm) => {
            gathered = x
                .chunks_exact(k)
                .flat_map(|xt| perm.iter().map(move |&p| xt[p as usize]))
                .collect();
            &gathered
        }
    };
    let (gs, ng) = (w.group_size, w.n_groups());
    // gsum: [m, ng]
    let gsum: Vec<f32> = xs.chunks_exact(gs).map(|g| g.iter().sum()).collect();
    // out_t: [n, m]
    let mut out_t = vec![0f32; n * m];
    parallel_chunks_mut(pool::global(), &mut out_t, TILE_ROWS * m, |task, chunk| {
        let (r0, r1) = (task * TILE_ROWS, task * TILE_ROWS + chunk.len() / m);
        let qs = &w.qs[r0 * k / 2..r1 * k / 2];
        let (scales, mins) = (&w.scales[r0 * ng..r1 * ng], &w.mins[r0 * ng..r1 * ng]);
        match kernel {
            Int4Kernel::Scalar => dot_rows_scalar(qs, scales, mins, k, gs, xs, &gsum, chunk),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `is_supported` checked AVX2 + FMA above; the slices have the shapes
            // `dot_rows_avx2` needs (rows r0..r1 of the matrix's invariant layout).
            Int4Kernel::Avx2 => unsafe {
                crate::simd::x86::int4::dot_rows_avx2(qs, scales, mins, k, gs, xs, &gsum, chunk)
            },
            #[cfg(not(target_arch = "x86_64"))]
            Int4Kernel::Avx2 => unreachable!("checked by is_supported"),
        }
    });
    for (r, col) in out_t.chunks_exact(m).enumerate() {
        for (t, &v) in col.iter().enumerate() {
            out[t * n + r] = v;
        }
    }
}

/// `dst[i * m + t] = Σ_j xs[t, j] * W[j, row i]` (storage order) for the chunk's rows: `qs`
/// `[rows, k / 2]`, `scales`/`mins` `[rows, ng]`, `xs` `[m, k]`, `gsum` `[m, ng]`.
#[allow(clippy::too_many_arguments)]
fn dot_rows_scalar(
    qs: &[u8],
    scales: &[f32],
    mins: &[f32],
    k: usize,
    gs: usize,
    xs: &[f32],
    gsum: &[f32],
    dst: &mut [f32],
) {
    let (ng, m) = (k / gs, xs.len() / k);
    let mut acc = vec![[0f32; 8]; m];
    for (r, out) in dst.chunks_exact_mut(m).enumerate() {
        let row = &qs[r * k / 2..(r + 1) * k / 2];
        out.fill(0.0);
        for g in 0..ng {
            acc.fill([0.0; 8]);
            for j0 in (g * gs..(g + 1) * gs).step_by(8) {
                let b4 = &row[j0 / 2..j0 / 2 + 4];
                // w8: storage columns j0 .. j0 + 8 (low nibble first).
                let w8: [f32; 8] =
                    std::array::from_fn(|i| f32::from((b4[i / 2] >> (4 * (i % 2))) & 0xF));
                for (a, xt) in acc.iter_mut().zip(xs.chunks_exact(k)) {
                    let x8 = &xt[j0..j0 + 8];
                    for i in 0..8 {
                        a[i] += w8[i] * x8[i];
                    }
                }
            }
            let (scale, min) = (scales[r * ng + g], mins[r * ng + g]);
            for (t, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
                let dot = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
                *o += scale * dot - min * gsum[t * ng + g];
            }
        }
    }
}
