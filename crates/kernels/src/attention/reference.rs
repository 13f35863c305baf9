//! The plain reference of [`super::attention`]: scores materialised, an exact softmax in
//! f64, one query row and head at a time, keys and values widened from the store's element
//! type (an int8 row times its scale). For differential tests; slow and allocating.

use super::{AttnSeq, AttnShape, KvElem, PagedKv};

/// Causal attention of `seqs` as [`super::attention`] defines it, `[T, n_heads · head_dim]`.
pub fn attention_ref<T: KvElem>(
    q: &[f32],
    q_stride: usize,
    kv: &PagedKv<'_, T>,
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
) -> Vec<f32> {
    let (hd, grp) = (shape.head_dim, shape.group());
    let mut out = Vec::new();
    let (mut k, mut v) = (vec![0f32; hd], vec![0f32; hd]);
    let mut row = 0;
    for s in seqs {
        for t in 0..s.n_q {
            let n_ctx = s.start_pos + t + 1;
            for h in 0..shape.n_heads {
                let qh = &q[row * q_stride + h * hd..][..hd];
                let scores: Vec<f64> = (0..n_ctx)
                    .map(|p| {
                        kv.read_k(s.block_table, p, h / grp, &mut k);
                        let dot: f64 = qh.iter().zip(&k).map(|(&a, &b)| a as f64 * b as f64).sum();
                        dot * shape.scale as f64
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = w.iter().sum();
                let mut acc = vec![0f64; hd];
                for (p, w) in w.iter().enumerate() {
                    kv.read_v(s.block_table, p, h / grp, &mut v);
                    for (a, &v) in acc.iter_mut().zip(&v) {
                        *a += w / sum * v as f64;
                    }
                }
                out.extend(acc.iter().map(|&a| a as f32));
            }
            row += 1;
        }
    }
    out
}
