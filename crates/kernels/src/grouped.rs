//! Grouped matmuls: one weight per run of input rows, every group in one pool job — a
//! mixture-of-experts layer, where each expert multiplies only the tokens routed to it.
//!
//! Run one [`matmul`](crate::matmul::matmul) per expert, a layer costs a pool job per expert
//! and weight (a quantization pass, a claim loop and a join), and at every join the threads
//! that finished wait for the one still on its last chunk — most of a decode step's experts
//! have one or two rows, so the joins are a real share of the time. Here the input rows of
//! all groups are quantized once, and the pool's tasks are (group, chunk of weight rows)
//! pairs across every group: a thread that finishes one expert's chunk takes the next one's,
//! and the layer's experts cost one join per weight.
//!
//! A group's rows are a contiguous run ([`matmul_grouped`], [`matmul_silu_mul_grouped`]: the
//! tokens routed to an expert) or every `H`-th row ([`matmul_per_head`]: head `h` of each
//! token of a `[T, H, k]` input — MLA's per-head absorbed projections, one small weight per
//! head). Groups must share the weights' shape; each output row is bit-identical to the
//! group's own [`matmul`](crate::matmul::matmul) or
//! [`matmul_silu_mul`](crate::glu::matmul_silu_mul) on its rows — the same kernel on the same
//! tiles of weight rows and groups of token rows (`tests/grouped.rs`). A group whose weights
//! the integer path cannot take with the others (float weights, another activation format, or
//! the AMX tier's tiles, which want 32+ rows of one matrix) runs on its own through those
//! functions instead, before the shared job (its rows gathered into a thread-local buffer
//! when they are not contiguous).

use std::cell::RefCell;
use std::ops::Range;

use crate::dispatch::{DotKernel, Kernels, kernels};
use crate::glu::{Fused, matmul_silu_mul_with};
use crate::matmul::{ActRows, Part, QMatrix, chunk_rows, matmul_with, with_quantized};
use crate::pool::{SyncPtr, ThreadPool, global};

thread_local! {
    /// A strided group run alone: its input rows gathered, then its output rows.
    static GATHER: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// A group's rows of the input and the output: `first + i * step` for `i < len`.
#[derive(Clone, Copy, Debug)]
struct Rows {
    first: usize,
    len: usize,
    step: usize,
}

impl Rows {
    /// The contiguous run `r` (panics if it is reversed).
    fn run(r: Range<usize>) -> Rows {
        assert!(r.start <= r.end, "a group's rows {r:?} are not ascending");
        Rows {
            first: r.start,
            len: r.end - r.start,
            step: 1,
        }
    }

    /// One past the last row (`first` when empty).
    fn end(&self) -> usize {
        self.first + self.len.saturating_sub(1) * self.step + usize::from(self.len > 0)
    }
}

/// What a group multiplies its rows by.
#[derive(Clone, Copy)]
enum Op<'w> {
    /// `y = x · wᵀ`.
    Matmul(QMatrix<'w>),
    /// `y = silu(x · gateᵀ) ⊙ (x · upᵀ)`.
    SiluMul(QMatrix<'w>, QMatrix<'w>),
}

/// How the shared job runs one group's rows: a matmul part or the fused gate/up pass.
enum Job<'w> {
    Matmul(Part<'w>),
    SiluMul(Fused<'w>),
}

impl<'w> Op<'w> {
    /// The first (or only) matrix: its shape is the group's.
    fn w(&self) -> &QMatrix<'w> {
        match self {
            Op::Matmul(w) | Op::SiluMul(w, _) => w,
        }
    }

    /// The shared job's plan for this group, if the integer path takes it beside groups whose
    /// kernel quantizes activations like `like` (any, for `None`).
    fn job(
        &self,
        kernels: &Kernels,
        like: Option<&DotKernel>,
        n_rows: usize,
        threads: usize,
    ) -> Option<Job<'w>> {
        let same = |k: &DotKernel| like.is_none_or(|l| l.act == k.act && l.layout == k.layout);
        match *self {
            Op::Matmul(w) => {
                #[cfg(target_arch = "x86_64")]
                if crate::matmul::amx_for(kernels, &[w], n_rows).is_some() {
                    return None;
                }
                let kern = kernels.matmul_kernel_for(&w).filter(same)?;
                Some(Job::Matmul(Part::new(w, kern, 0, threads)))
            }
            Op::SiluMul(gate, up) => {
                #[cfg(target_arch = "x86_64")]
                if crate::matmul::amx_for(kernels, &[gate, up], n_rows).is_some() {
                    return None;
                }
                let kg = kernels.matmul_kernel_for(&gate).filter(same)?;
                let ku = kernels.matmul_kernel_for(&up).filter(same)?;
                (gate.row_align() == up.row_align())
                    .then(|| Job::SiluMul(Fused::new(gate, up, kg, ku, threads)))
            }
        }
    }

    /// The group on its own, through the ungrouped functions.
    fn run_alone(&self, pool: &ThreadPool, kernels: &Kernels, x: &[f32], out: &mut [f32]) {
        match self {
            Op::Matmul(w) => matmul_with(pool, kernels, x, w, out),
            Op::SiluMul(gate, up) => matmul_silu_mul_with(pool, kernels, x, gate, up, out),
        }
    }

    /// [`Op::run_alone`] on `rows` of `x` `[·, k]` into the same rows of `out` `[·, n]`.
    fn run_rows_alone(
        &self,
        pool: &ThreadPool,
        kernels: &Kernels,
        rows: Rows,
        x: &[f32],
        out: &mut [f32],
    ) {
        let (n, k) = (self.w().rows, self.w().cols);
        if rows.step == 1 {
            let (a, b) = (rows.first, rows.end());
            return self.run_alone(pool, kernels, &x[a * k..b * k], &mut out[a * n..b * n]);
        }
        GATHER.with_borrow_mut(|(xs, os)| {
            xs.clear();
            for i in 0..rows.len {
                let r = rows.first + i * rows.step;
                xs.extend_from_slice(&x[r * k..(r + 1) * k]);
            }
            os.resize(rows.len * n, 0.0);
            self.run_alone(pool, kernels, xs, os);
            for (i, o) in os.chunks_exact(n).enumerate() {
                let r = rows.first + i * rows.step;
                out[r * n..(r + 1) * n].copy_from_slice(o);
            }
        });
    }
}

impl Job<'_> {
    fn kernel(&self) -> &DotKernel {
        match self {
            Job::Matmul(p) => &p.kern,
            Job::SiluMul(f) => f.gate_kernel(),
        }
    }
}

/// For each group `g < n_groups`, with `(rows, w) = group(g)`: `out[r] = x[r] · wᵀ` for the
/// input rows `r` in `rows`. `x` is `[n_rows, k]` and `out` `[n_rows, n]` for every group's
/// `w` of `n × k`; rows in no group are left as they are. On the global pool and kernels.
///
/// # Panics
///
/// If the groups' shapes differ, their row ranges are not ascending and disjoint within
/// `x`, or a length does not fit.
pub fn matmul_grouped<'w>(
    x: &[f32],
    out: &mut [f32],
    n_groups: usize,
    group: impl Fn(usize) -> (Range<usize>, QMatrix<'w>) + Sync,
) {
    matmul_grouped_with(global(), kernels(), x, out, n_groups, group);
}

/// [`matmul_grouped`] on an explicit pool and kernel table.
pub fn matmul_grouped_with<'w>(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    out: &mut [f32],
    n_groups: usize,
    group: impl Fn(usize) -> (Range<usize>, QMatrix<'w>) + Sync,
) {
    let group = |g| {
        let (rows, w) = group(g);
        (Rows::run(rows), Op::Matmul(w))
    };
    grouped(pool, kernels, x, out, n_groups, &group);
}

/// `out[t][h] = x[t][h] · w_hᵀ` for every token `t` and head `h < n_heads`, with `w_h =
/// w(h)`: `x` is `[T, n_heads, k]` and `out` `[T, n_heads, n]` for every head's `w_h` of
/// `n × k` (a batched matmul over heads, each head its own weight). On the global pool and
/// kernels.
///
/// # Panics
///
/// If the heads' shapes differ or a length does not fit.
pub fn matmul_per_head<'w>(
    x: &[f32],
    out: &mut [f32],
    n_heads: usize,
    w: impl Fn(usize) -> QMatrix<'w> + Sync,
) {
    matmul_per_head_with(global(), kernels(), x, out, n_heads, w);
}

/// [`matmul_per_head`] on an explicit pool and kernel table.
pub fn matmul_per_head_with<'w>(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    out: &mut [f32],
    n_heads: usize,
    w: impl Fn(usize) -> QMatrix<'w> + Sync,
) {
    if n_heads == 0 {
        return;
    }
    let k = w(0).cols;
    let n_tok = x.len().checked_div(n_heads * k).unwrap_or(0);
    assert_eq!(x.len(), n_tok * n_heads * k, "x is not [T, {n_heads}, {k}]");
    let group = |h| {
        let rows = Rows {
            first: h,
            len: n_tok,
            step: n_heads,
        };
        (rows, Op::Matmul(w(h)))
    };
    grouped(pool, kernels, x, out, n_heads, &group);
}

/// For each group `g < n_groups`, with `(rows, gate, up) = group(g)`: `out[r] = silu(x[r] ·
/// gateᵀ) ⊙ (x[r] · upᵀ)` for the input rows `r` in `rows` (SwiGLU's first half, as
/// [`matmul_silu_mul`](crate::glu::matmul_silu_mul)). Shapes and panics as [`matmul_grouped`].
pub fn matmul_silu_mul_grouped<'w>(
    x: &[f32],
    out: &mut [f32],
    n_groups: usize,
    group: impl Fn(usize) -> (Range<usize>, QMatrix<'w>, QMatrix<'w>) + Sync,
) {
    matmul_silu_mul_grouped_with(global(), kernels(), x, out, n_groups, group);
}

/// [`matmul_silu_mul_grouped`] on an explicit pool and kernel table.
pub fn matmul_silu_mul_grouped_with<'w>(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    out: &mut [f32],
    n_groups: usize,
    group: impl Fn(usize) -> (Range<usize>, QMatrix<'w>, QMatrix<'w>) + Sync,
) {
    let group = |g| {
        let (rows, gate, up) = group(g);
        (Rows::run(rows), Op::SiluMul(gate, up))
    };
    grouped(pool, kernels, x, out, n_groups, &group);
}

/// The shared body of the grouped functions (module docs). Groups are contiguous runs
/// (`step` 1), ascending and disjoint, or interleaved: group `g` of `n_groups` is rows `g`,
/// `g + n_groups`, … (`step == n_groups`).
fn grouped<'w>(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    out: &mut [f32],
    n_groups: usize,
    group: &(dyn Fn(usize) -> (Rows, Op<'w>) + Sync),
) {
    if n_groups == 0 {
        return;
    }
    let (n, k) = {
        let w = *group(0).1.w();
        (w.rows, w.cols)
    };
    if k == 0 {
        return;
    }
    assert_eq!(x.len() % k, 0, "x is not whole rows of {k}");
    let n_rows = x.len() / k;
    assert_eq!(out.len(), n_rows * n, "out is not [{n_rows}, {n}]");
    let threads = pool.num_threads();
    // Check every group; run those the shared job cannot take; find the shared job's kernel.
    let mut like: Option<DotKernel> = None;
    let mut chunk = 0;
    let mut end = 0;
    for g in 0..n_groups {
        let (rows, op) = group(g);
        let w = op.w();
        assert!(
            (w.rows, w.cols) == (n, k),
            "group {g} is {}x{}, not {n}x{k}",
            w.rows,
            w.cols
        );
        let disjoint = match rows.step {
            1 => end <= rows.first,
            step => step == n_groups && rows.first == g,
        };
        assert!(
            disjoint && rows.end() <= n_rows,
            "group {g}'s rows {rows:?} are not ascending and disjoint in {n_rows} rows"
        );
        end = rows.end();
        if rows.len == 0 {
            continue;
        }
        match op.job(kernels, like.as_ref(), rows.len, threads) {
            Some(job) if like.is_none() => {
                like = Some(*job.kernel());
                // The same cut as each group's own matmul (one layout: one alignment).
                chunk = chunk_rows(n, threads, w.row_align());
            }
            Some(_) => {}
            None => op.run_rows_alone(pool, kernels, rows, x, out),
        }
    }
    let Some(like) = like else { return };
    let per_group = n.div_ceil(chunk);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    with_quantized(pool, &like, x, k, |act, a_row| {
        pool.parallel_for(n_groups * per_group, |task| {
            let (rows, op) = group(task / per_group);
            if rows.len == 0 {
                return;
            }
            // A group that ran alone above gets `None` here too: the same checks, in order.
            let Some(job) = op.job(kernels, Some(&like), rows.len, threads) else {
                return;
            };
            let r0 = task % per_group * chunk;
            let r1 = n.min(r0 + chunk);
            let act = ActRows {
                data: &act[rows.first * a_row..],
                stride: rows.step * a_row,
                n: rows.len,
            };
            // SAFETY: the group's output rows (disjoint from every other group's, checked
            // above) in columns r0..r1 belong to this task alone; `out` is [n_rows, n] and
            // stays mutably borrowed for the whole call.
            unsafe {
                let (o, stride) = (out_ptr.get().add(rows.first * n), rows.step * n);
                match job {
                    Job::Matmul(p) => p.dot_rows(r0, r1, act, o, stride),
                    Job::SiluMul(f) => f.rows(kernels, r0, r1, act, o, stride),
                }
            }
        });
    });
}
