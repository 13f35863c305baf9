//! Causal attention over a paged KV cache.
//!
//! K and V of one layer are stored as blocks of `block_size` token slots, each slot holding
//! `kv_dim = n_kv_heads * head_dim` values. A sequence's `block_table` lists its blocks in
//! order, so position `p` lives in block `block_table[p / block_size]`, slot `p % block_size`.
//!
//! The plain tier here walks the context once per (query, head) with an online softmax
//! (running max and sum, as in FlashAttention, <https://arxiv.org/abs/2205.14135>) so no score
//! buffer is needed. Grouped-query attention maps query head `h` to KV head
//! `h / (n_heads / n_kv_heads)`.

/// One layer's paged K/V storage, `[num_blocks, block_size, kv_dim]` each.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub block_size: usize,
    pub kv_dim: usize,
}

impl PagedKv<'_> {
    fn slot(&self, block_table: &[u32], pos: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        (block * self.block_size + pos % self.block_size) * self.kv_dim
    }
}

/// Head geometry of an attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier of q·k, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// Attention of one query token at position `n_ctx - 1`, attending to positions `0..n_ctx`.
///
/// `q` and `out` are `[n_heads, head_dim]`; positions `0..n_ctx` must already be written to
/// `kv` through `block_table`.
pub fn attend(
    q: &[f32],
    kv: &PagedKv<'_>,
    block_table: &[u32],
    n_ctx: usize,
    shape: &AttnShape,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let group = shape.n_heads / shape.n_kv_heads;
    debug_assert_eq!(q.len(), shape.n_heads * hd);
    debug_assert_eq!(out.len(), shape.n_heads * hd);
    for h in 0..shape.n_heads {
        let qh = &q[h * hd..(h + 1) * hd];
        let acc = &mut out[h * hd..(h + 1) * hd];
        acc.fill(0.0);
        let kv_off = (h / group) * hd;
        let mut max = f32::NEG_INFINITY;
        let mut sum = 0f32;
        for p in 0..n_ctx {
            let base = kv.slot(block_table, p) + kv_off;
            let s = crate::matmul::dot(qh, &kv.k[base..base + hd]) * shape.scale;
            let vrow = &kv.v[base..base + hd];
            if s > max {
                let corr = (max - s).exp();
                sum *= corr;
                for a in acc.iter_mut() {
                    *a *= corr;
                }
                max = s;
            }
            let w = (s - max).exp();
            sum += w;
            for (a, &v) in acc.iter_mut().zip(vrow) {
                *a += w * v;
            }
        }
        let inv = 1.0 / sum;
        for a in acc.iter_mut() {
            *a *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: materialise scores, softmax, weighted sum, over a contiguous cache.
    fn attend_ref(q: &[f32], k: &[f32], v: &[f32], n_ctx: usize, s: &AttnShape) -> Vec<f32> {
        let (hd, kvd) = (s.head_dim, s.n_kv_heads * s.head_dim);
        let group = s.n_heads / s.n_kv_heads;
        let mut out = vec![0f32; s.n_heads * hd];
        for h in 0..s.n_heads {
            let kh = (h / group) * hd;
            let mut scores: Vec<f32> = (0..n_ctx)
                .map(|p| {
                    (0..hd)
                        .map(|d| q[h * hd + d] * k[p * kvd + kh + d])
                        .sum::<f32>()
                        * s.scale
                })
                .collect();
            crate::ops::softmax(&mut scores);
            for (p, w) in scores.iter().enumerate() {
                for d in 0..hd {
                    out[h * hd + d] += w * v[p * kvd + kh + d];
                }
            }
        }
        out
    }

    #[test]
    fn paged_matches_contiguous_reference() {
        let shape = AttnShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 8,
            scale: 0.35,
        };
        let kvd = 16;
        let (block_size, n_ctx) = (4, 11);
        let val = |i: usize, m: usize| ((i * m) % 17) as f32 / 8.0 - 1.0;
        let k: Vec<f32> = (0..n_ctx * kvd).map(|i| val(i, 7)).collect();
        let v: Vec<f32> = (0..n_ctx * kvd).map(|i| val(i, 5)).collect();
        let q: Vec<f32> = (0..48).map(|i| val(i, 3)).collect();
        // Scatter the contiguous cache into blocks 5, 1, 3 of a 6-block pool.
        let table = [5u32, 1, 3];
        let mut pk = vec![f32::NAN; 6 * block_size * kvd];
        let mut pv = pk.clone();
        for p in 0..n_ctx {
            let dst = (table[p / block_size] as usize * block_size + p % block_size) * kvd;
            pk[dst..dst + kvd].copy_from_slice(&k[p * kvd..(p + 1) * kvd]);
            pv[dst..dst + kvd].copy_from_slice(&v[p * kvd..(p + 1) * kvd]);
        }
        let kv = PagedKv {
            k: &pk,
            v: &pv,
            block_size,
            kv_dim: kvd,
        };
        let mut out = vec![0f32; 48];
        attend(&q, &kv, &table, n_ctx, &shape, &mut out);
        let want = attend_ref(&q, &k, &v, n_ctx, &shape);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
