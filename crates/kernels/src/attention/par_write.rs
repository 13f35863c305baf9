//! A batch's cache writes across the thread pool, one task per cache block.
//!
//! A batch's tokens write their K/V at distinct slots, but a block's slots share cache lines
//! (K is stored transposed: one line holds a dim of sixteen slots), so the split is by block:
//! the tokens that land in one block are a run, and a task owns the run's block and its rows
//! of the batch's projections ([`PagedKvMut::par_runs`]). Within a task the writes are
//! [`PagedKvMut::write_at`]'s, so the cache holds the same bits as after writing the tokens
//! one by one on the caller.

use crate::attention::{KvElem, PagedKvMut, RopeAt};
use crate::kv_elem::K_SCALE_GROUPS;
use crate::pool::{SyncPtr, ThreadPool};

/// Tokens `t0..t1` of a batch, all writing into cache block `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRun {
    pub block: u32,
    pub t0: u32,
    pub t1: u32,
}

/// Write access to one block of a [`PagedKvMut`] (its task's own).
pub struct BlockMut<'a, T> {
    kv: PagedKvMut<'a, T>,
}

impl<T: KvElem> BlockMut<'_, T> {
    /// [`PagedKvMut::write`] of one token at slot `slot` of this block.
    pub fn write(&mut self, slot: usize, k: &[f32], v: &[f32], rope: Option<RopeAt<'_>>) {
        self.kv.write_at(0, slot, k, v, rope);
    }
}

impl<'a, T: KvElem + Send> PagedKvMut<'a, T> {
    /// Runs `f(run, rows, block)` for every run of `runs` on `pool`: `rows` are the run's rows
    /// of `rows` (`[T, row_len]`, rows `t0..t1`) and `block` writes the run's cache block.
    ///
    /// The runs must be ascending, disjoint token ranges inside `rows`, each writing a block
    /// that the store's K, V (and, for int8, scale) arrays all hold (panics otherwise). If any
    /// two runs name the same block, all the runs go one after the other on the caller instead
    /// (`scratch`, reused, holds the sorted block ids).
    pub fn par_runs<F>(
        &mut self,
        pool: &ThreadPool,
        rows: &mut [f32],
        row_len: usize,
        runs: &[BlockRun],
        scratch: &mut Vec<u32>,
        f: F,
    ) where
        F: Fn(&BlockRun, &mut [f32], BlockMut<'_, T>) + Sync,
    {
        let (block_len, n_scales) = (self.layout.block_len(), self.layout.block_scales());
        let n_k_scales = K_SCALE_GROUPS * n_scales;
        let scaled = T::SCALED;
        // Blocks every array holds: the tasks below slice them unchecked.
        let mut n_blocks = self.k.len().min(self.v.len()) / block_len.max(1);
        if scaled {
            n_blocks = n_blocks
                .min(self.k_scale.len() / n_k_scales.max(1))
                .min(self.v_scale.len() / n_scales.max(1));
        }
        let mut end = 0;
        for r in runs {
            assert!(end <= r.t0 && r.t0 < r.t1, "runs not ascending: {runs:?}");
            assert!(
                (r.block as usize) < n_blocks,
                "block {} of {n_blocks}",
                r.block
            );
            end = r.t1;
        }
        assert!(end as usize * row_len <= rows.len(), "runs past the rows");
        scratch.clear();
        scratch.extend(runs.iter().map(|r| r.block));
        scratch.sort_unstable();
        let distinct = scratch.windows(2).all(|w| w[0] != w[1]);
        let (kp, vp) = (SyncPtr(self.k.as_mut_ptr()), SyncPtr(self.v.as_mut_ptr()));
        let (ksp, vsp) = (
            SyncPtr(self.k_scale.as_mut_ptr()),
            SyncPtr(self.v_scale.as_mut_ptr()),
        );
        let rp = SyncPtr(rows.as_mut_ptr());
        let layout = self.layout;
        let task = |i: usize| {
            let r = &runs[i];
            let b = r.block as usize;
            let (t0, t1) = (r.t0 as usize, r.t1 as usize);
            // SAFETY: `self` and `rows` stay mutably borrowed for the whole call. Run `i`
            // touches rows `t0..t1` (disjoint from every other run's: ascending, checked) and
            // block `b`'s K, V and scale ranges (inside the store: checked), which no other
            // run touches while tasks run in parallel (distinct blocks, checked; otherwise
            // the runs go one at a time).
            let (run_rows, block) = unsafe {
                let scales = |p: SyncPtr<f32>, n: usize| {
                    if scaled {
                        std::slice::from_raw_parts_mut(p.get().add(b * n), n)
                    } else {
                        &mut []
                    }
                };
                (
                    std::slice::from_raw_parts_mut(rp.get().add(t0 * row_len), (t1 - t0) * row_len),
                    BlockMut {
                        kv: PagedKvMut {
                            k: std::slice::from_raw_parts_mut(
                                kp.get().add(b * block_len),
                                block_len,
                            ),
                            v: std::slice::from_raw_parts_mut(
                                vp.get().add(b * block_len),
                                block_len,
                            ),
                            k_scale: scales(ksp, n_k_scales),
                            v_scale: scales(vsp, n_scales),
                            layout,
                        },
                    },
                )
            };
            f(r, run_rows, block);
        };
        if distinct && runs.len() > 1 {
            pool.parallel_for(runs.len(), task);
        } else {
            (0..runs.len()).for_each(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::KvLayout;
    use crate::ops::{RopeStyle, rope_cos_sin};

    /// Writes `n` tokens (rows of `[k | v]`) at positions `0..n` of `table` through `par_runs`
    /// (runs cut at block ends) and one by one through `write`: the same bits, for f32 and
    /// int8 stores, with and without RoPE, and with a repeated block (run on the caller).
    #[test]
    fn runs_write_what_write_writes() {
        let lay = KvLayout {
            block_size: 4,
            n_kv_heads: 2,
            head_dim: 8,
        };
        let kv_dim = lay.kv_dim();
        let n = 11;
        let rows: Vec<f32> = (0..n * 2 * kv_dim)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let cs: Vec<Vec<f32>> = (0..n)
            .map(|p| {
                let mut c = vec![0f32; 8];
                rope_cos_sin(p, &[1.0, 0.3, 0.1, 0.01], 1.0, &mut c);
                c
            })
            .collect();
        let pool = ThreadPool::new(3);
        for table in [[3u32, 0, 2], [1, 1, 1]] {
            let runs: Vec<BlockRun> = (0..n.div_ceil(4))
                .map(|b| BlockRun {
                    block: table[b],
                    t0: (4 * b) as u32,
                    t1: (4 * b + 4).min(n) as u32,
                })
                .collect();
            for rope in [false, true] {
                let at = |p: usize| {
                    rope.then(|| RopeAt {
                        cos_sin: &cs[p],
                        style: RopeStyle::NeoX,
                    })
                };
                let check = |int8: bool| {
                    let len = 4 * lay.block_len();
                    let ns = 4 * lay.block_scales();
                    let mut bufs = [0, 1].map(|_| {
                        (
                            vec![0f32; len],
                            vec![0f32; len],
                            vec![0i8; len],
                            vec![0i8; len],
                        )
                    });
                    let mut scales =
                        [0, 1].map(|_| (vec![0f32; K_SCALE_GROUPS * ns], vec![0f32; ns]));
                    let mut scratch = Vec::new();
                    for (which, ((k, v, k8, v8), (ks, vs))) in
                        bufs.iter_mut().zip(scales.iter_mut()).enumerate()
                    {
                        let mut src = rows.clone();
                        macro_rules! go {
                            ($kv:expr) => {{
                                let mut kv = $kv;
                                if which == 0 {
                                    for (p, row) in src.chunks_exact(2 * kv_dim).enumerate() {
                                        let (kr, vr) = row.split_at(kv_dim);
                                        kv.write(&table, p, kr, vr, at(p));
                                    }
                                } else {
                                    kv.par_runs(
                                        &pool,
                                        &mut src,
                                        2 * kv_dim,
                                        &runs,
                                        &mut scratch,
                                        |r, rows, mut blk| {
                                            for (i, row) in
                                                rows.chunks_exact(2 * kv_dim).enumerate()
                                            {
                                                let p = r.t0 as usize + i;
                                                let (kr, vr) = row.split_at(kv_dim);
                                                blk.write(p % 4, kr, vr, at(p));
                                            }
                                        },
                                    );
                                }
                            }};
                        }
                        if int8 {
                            go!(PagedKvMut {
                                k: &mut k8[..],
                                v: &mut v8[..],
                                k_scale: &mut ks[..],
                                v_scale: &mut vs[..],
                                layout: lay,
                            });
                        } else {
                            go!(PagedKvMut::new(&mut k[..], &mut v[..], lay));
                        }
                    }
                    assert!(
                        bufs[0] == bufs[1],
                        "table {table:?} rope {rope} int8 {int8}"
                    );
                    assert!(scales[0] == scales[1], "table {table:?} rope {rope} scales");
                };
                check(false);
                check(true);
            }
        }
    }

    /// A block the K array holds but the V or scale arrays do not is refused, as the serial
    /// `write` refuses it, rather than written past their ends.
    #[test]
    fn a_block_past_any_array_of_the_store_is_refused() {
        let lay = KvLayout {
            block_size: 4,
            n_kv_heads: 1,
            head_dim: 4,
        };
        let (len, ns) = (2 * lay.block_len(), 2 * lay.block_scales());
        let runs = [BlockRun {
            block: 1,
            t0: 0,
            t1: 1,
        }];
        let pool = ThreadPool::new(2);
        let short = |k: usize, v: usize, ks: usize, vs: usize| {
            let (mut kb, mut vb) = (vec![0i8; k], vec![0i8; v]);
            let (mut ksb, mut vsb) = (vec![0f32; ks], vec![0f32; vs]);
            let mut kv = PagedKvMut {
                k: &mut kb[..],
                v: &mut vb[..],
                k_scale: &mut ksb[..],
                v_scale: &mut vsb[..],
                layout: lay,
            };
            let mut rows = vec![0f32; 2 * lay.kv_dim()];
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                kv.par_runs(
                    &pool,
                    &mut rows,
                    2 * lay.kv_dim(),
                    &runs,
                    &mut Vec::new(),
                    |_, _, _| {},
                )
            }))
            .is_ok()
        };
        let kns = K_SCALE_GROUPS * ns;
        assert!(short(len, len, kns, ns));
        assert!(!short(len, len / 2, kns, ns), "short V");
        assert!(!short(len, len, kns / 2, ns), "short K scales");
        assert!(!short(len, len, kns, ns / 2), "short V scales");
    }
}
