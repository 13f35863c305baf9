//! SwiGLU's first half in one pass: `out = silu(x · gateᵀ) ⊙ (x · upᵀ)` (Shazeer, "GLU
//! Variants Improve Transformer", <https://arxiv.org/abs/2002.05202>).
//!
//! Fused path (gate and up quantized, same activation format — every real model): the
//! activations are quantized once ([`crate::matmul`]'s buffer); each task owns a range of the
//! `ffn_hidden` outputs and, per tile of rows and group of up to the kernel's `max_rows` tokens, computes
//! the gate tile and the up tile into a small stack buffer with the tier's dot kernels, then
//! writes `silu(g) · u` straight into `out`. The `[T, 2 · ffn_hidden]` gate/up intermediate
//! never reaches memory, and each weight tile is read while its partner is still in cache.
//!
//! Otherwise (float weights, mixed formats) it falls back to two [`matmul`](crate::matmul::matmul)s into a
//! thread-local buffer and one [`Kernels::silu_mul`]. Both paths are bit-identical to the
//! unfused composition: the same dot per output, then the same vector SiLU per element.

use std::cell::RefCell;

use crate::dispatch::{DotKernel, Kernels, kernels};
use crate::matmul::{ActRows, QMatrix, chunk_rows, matmul_with, with_quantized};
use crate::pool::{SyncPtr, ThreadPool, global};
use crate::simd::MAX_ROWS_16;

/// Most rows of a fused tile (the stack buffers hold `MAX_ROWS_16 × TILE_ROWS` outputs each).
const TILE_ROWS: usize = 64;
/// Target bytes of gate + up weight rows per tile (fits L1 alongside the activations).
const TILE_BYTES: usize = 16 * 1024;

thread_local! {
    /// Gate and up outputs of the fallback path, `[2, n_tokens, n]`.
    static GATE_UP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[t][n] = silu(Σ_k x[t][k] · gate[n][k]) · Σ_k x[t][k] · up[n][k]`, on the global pool
/// and kernels. `out` is `[n_tokens, gate.rows]`.
///
/// Panics if the matrices differ in shape or a length does not fit.
pub fn matmul_silu_mul(x: &[f32], gate: &QMatrix<'_>, up: &QMatrix<'_>, out: &mut [f32]) {
    matmul_silu_mul_with(global(), kernels(), x, gate, up, out);
}

/// [`matmul_silu_mul`] on an explicit pool and kernel table.
pub fn matmul_silu_mul_with(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    gate: &QMatrix<'_>,
    up: &QMatrix<'_>,
    out: &mut [f32],
) {
    let (n, k) = (gate.rows, gate.cols);
    assert!(up.rows == n && up.cols == k, "gate and up shapes differ");
    let n_tokens = x.len().checked_div(k).unwrap_or(0);
    assert_eq!(out.len(), n_tokens * n, "out is not [{n_tokens}, {n}]");
    let kern = (
        kernels.matmul_kernel_for(gate),
        kernels.matmul_kernel_for(up),
    );
    let (Some(kg), Some(ku)) = kern else {
        return unfused(pool, kernels, x, gate, up, out);
    };
    #[cfg(target_arch = "x86_64")]
    if crate::matmul::amx_for(kernels, &[*gate, *up], n_tokens).is_some() {
        return on_tiles(pool, kernels, x, gate, up, n_tokens, out);
    }
    if kg.act != ku.act || gate.row_align() != up.row_align() || k == 0 || n_tokens == 0 {
        return unfused(pool, kernels, x, gate, up, out);
    }
    assert_eq!(x.len(), n_tokens * k, "x is not whole rows of {k}");
    assert!(k.is_multiple_of(kg.block_size));
    assert!(
        gate.data.len() >= gate.stored_rows() * gate.row_bytes()
            && up.data.len() >= up.stored_rows() * up.row_bytes()
    );
    let fused = Fused::new(*gate, *up, kg, ku, pool.num_threads());
    let out_ptr = SyncPtr(out.as_mut_ptr());
    with_quantized(pool, &kg, x, k, |act, a_row| {
        pool.parallel_for(n.div_ceil(fused.chunk), |task| {
            let r0 = task * fused.chunk;
            let r1 = n.min(r0 + fused.chunk);
            let act = ActRows {
                data: act,
                stride: a_row,
                n: n_tokens,
            };
            // SAFETY: columns r0..r1 of `out` ([n_tokens, n]) belong to this task alone;
            // `out` stays mutably borrowed for the whole call.
            unsafe { fused.rows(kernels, r0, r1, act, out_ptr.get(), n) };
        });
    });
}

/// The fused pass over quantized gate and up weights of one activation format: how its rows
/// are chunked and tiled, and [`Fused::rows`], one task's work.
#[derive(Clone, Copy)]
pub(crate) struct Fused<'a> {
    gate: QMatrix<'a>,
    up: QMatrix<'a>,
    kg: DotKernel,
    ku: DotKernel,
    /// Weight rows per pool task.
    pub(crate) chunk: usize,
    /// Weight rows per tile.
    tile: usize,
}

impl<'a> Fused<'a> {
    /// Gate and up (same shape, same activation format and row alignment) with their
    /// kernels, chunked for `threads`.
    pub(crate) fn new(
        gate: QMatrix<'a>,
        up: QMatrix<'a>,
        kg: DotKernel,
        ku: DotKernel,
        threads: usize,
    ) -> Fused<'a> {
        let align = gate.row_align();
        let chunk = chunk_rows(gate.rows, threads, align);
        let tile = (TILE_BYTES / (gate.row_bytes() + up.row_bytes()).max(1))
            .next_multiple_of(align)
            .clamp(1, TILE_ROWS);
        Fused {
            gate,
            up,
            kg,
            ku,
            chunk,
            tile,
        }
    }

    /// The gate's kernel (its activation format is the pass's).
    pub(crate) fn gate_kernel(&self) -> &DotKernel {
        &self.kg
    }

    /// Rows `r0..r1` of the gate and up weights against the activation rows `act`
    /// (quantized for the gate's kernel): `out[i * out_stride + r] = silu(g) · u` for
    /// activation row `i`.
    ///
    /// # Safety
    ///
    /// `out` is valid for writes of those indices, which nobody else accesses during the call.
    pub(crate) unsafe fn rows(
        &self,
        kernels: &Kernels,
        r0: usize,
        r1: usize,
        act: ActRows<'_>,
        out: *mut f32,
        out_stride: usize,
    ) {
        let Fused {
            gate, up, kg, ku, ..
        } = self;
        let nb = gate.cols / kg.block_size;
        let (a_row, n_tokens) = (act.stride, act.n);
        let max_rows = kg.max_rows.min(ku.max_rows);
        let mut g = [[0f32; TILE_ROWS]; MAX_ROWS_16];
        let mut u = [[0f32; TILE_ROWS]; MAX_ROWS_16];
        let mut tile0 = r0;
        while tile0 < r1 {
            let tile1 = r1.min(tile0 + self.tile);
            let nt = tile1 - tile0;
            let (wg, wu) = (gate.rows_bytes(tile0, tile1), up.rows_bytes(tile0, tile1));
            for t0 in (0..n_tokens).step_by(max_rows) {
                let na = max_rows.min(n_tokens - t0);
                let a = &act.data[t0 * a_row..];
                kg.dot_tile_into(nb, wg, nt, a, a_row, na, g.as_flattened_mut(), TILE_ROWS);
                ku.dot_tile_into(nb, wu, nt, a, a_row, na, u.as_flattened_mut(), TILE_ROWS);
                for j in 0..na {
                    // SAFETY: out[(t0 + j) * out_stride + tile0 ..][..nt]: the caller's indices.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(out.add((t0 + j) * out_stride + tile0), nt)
                    };
                    kernels.silu_mul(&g[j][..nt], &u[j][..nt], o);
                }
            }
            tile0 = tile1;
        }
    }
}

/// On the AMX tier's tiles: gate and up as one fused matmul into `[n_tokens, 2 · n]` (the
/// tiles want every activation row against each weight group, which the row-tiled fused path
/// above does not give them), then the SiLU pass over token rows on the pool.
#[cfg(target_arch = "x86_64")]
fn on_tiles(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    gate: &QMatrix<'_>,
    up: &QMatrix<'_>,
    n_tokens: usize,
    out: &mut [f32],
) {
    let n = gate.rows;
    if n == 0 {
        return;
    }
    GATE_UP.with_borrow_mut(|buf| {
        if buf.len() < 2 * out.len() {
            buf.resize(2 * out.len(), 0.0);
        }
        let gu = &mut buf[..2 * out.len()];
        crate::matmul::matmul_multi_with(pool, kernels, x, &[*gate, *up], gu);
        let gu = &*gu;
        let rows_per_task = n_tokens.div_ceil(pool.num_threads() * 2).max(1);
        crate::pool::parallel_chunks_mut(pool, out, rows_per_task * n, |i, o| {
            for (j, o) in o.chunks_exact_mut(n).enumerate() {
                let t = i * rows_per_task + j;
                let (g, u) = gu[t * 2 * n..(t + 1) * 2 * n].split_at(n);
                kernels.silu_mul(g, u, o);
            }
        });
    });
}

/// Two matmuls and one SiLU pass (float or mixed-format weights).
fn unfused(
    pool: &ThreadPool,
    kernels: &Kernels,
    x: &[f32],
    gate: &QMatrix<'_>,
    up: &QMatrix<'_>,
    out: &mut [f32],
) {
    let len = out.len();
    GATE_UP.with_borrow_mut(|buf| {
        if buf.len() < 2 * len {
            buf.resize(2 * len, 0.0);
        }
        let (g, u) = buf[..2 * len].split_at_mut(len);
        matmul_with(pool, kernels, x, gate, g);
        matmul_with(pool, kernels, x, up, u);
        kernels.silu_mul(g, u, out);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::Tier;
    use crate::quant::GgmlType;
    use crate::quant::testing::{SplitMix64, random_weight_row};

    fn weights(rng: &mut SplitMix64, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        (0..rows)
            .flat_map(|_| random_weight_row(rng, ty, cols))
            .collect()
    }

    /// Fused equals `silu_mul(matmul(gate), matmul(up))` bit for bit, every tier, odd shapes.
    #[test]
    fn fused_matches_unfused_composition() {
        let mut rng = SplitMix64::new(5);
        let pool = ThreadPool::new(3);
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::F32,
        ] {
            let k = if ty.block_size() == 256 { 512 } else { 96 };
            for (n_tok, n) in [(1, 7), (3, 100), (9, 257)] {
                let (wg, wu) = (weights(&mut rng, ty, n, k), weights(&mut rng, ty, n, k));
                let gate = QMatrix::new(ty, n, k, &wg);
                let up = QMatrix::new(ty, n, k, &wu);
                let x: Vec<f32> = (0..n_tok * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
                assert_fused_is_unfused(&pool, &x, &gate, &up);
            }
        }
    }

    /// On every supported tier, with 12- and 8-bit activations: fused equals the two matmuls
    /// and one SiLU pass, bit for bit.
    fn assert_fused_is_unfused(pool: &ThreadPool, x: &[f32], gate: &QMatrix<'_>, up: &QMatrix<'_>) {
        let len = x.len() / gate.cols * gate.rows;
        for (tier, a8) in Tier::supported()
            .into_iter()
            .flat_map(|t| [(t, false), (t, true)])
        {
            let kern = Kernels::new(tier).unwrap().with_a8(a8);
            let mut fused = vec![f32::NAN; len];
            matmul_silu_mul_with(pool, &kern, x, gate, up, &mut fused);
            let (mut g, mut u) = (vec![0f32; len], vec![0f32; len]);
            matmul_with(pool, &kern, x, gate, &mut g);
            matmul_with(pool, &kern, x, up, &mut u);
            let mut want = vec![0f32; len];
            kern.silu_mul(&g, &u, &mut want);
            assert!(
                fused == want,
                "{} {tier} a8 {a8} {}x{}",
                gate.ty,
                len / gate.rows,
                gate.rows
            );
        }
    }

    /// The same on Rows16 weights with enough token rows for the AMX tier's tiles (where the
    /// CPU has them; the other tiers run their fused path).
    #[test]
    fn rows16_fused_matches_unfused_composition_on_every_tier() {
        use crate::qmatrix::PackedMatrix;
        let mut rng = SplitMix64::new(6);
        let pool = ThreadPool::new(2);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let k = 96;
            for (n_tok, n) in [(16, 48), (33, 100)] {
                let (wg, wu) = (weights(&mut rng, ty, n, k), weights(&mut rng, ty, n, k));
                let gate = PackedMatrix::pack(&QMatrix::new(ty, n, k, &wg)).unwrap();
                let up = PackedMatrix::pack(&QMatrix::new(ty, n, k, &wu)).unwrap();
                let (gate, up) = (gate.view(), up.view());
                let x: Vec<f32> = (0..n_tok * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
                assert_fused_is_unfused(&pool, &x, &gate, &up);
            }
        }
    }
}
