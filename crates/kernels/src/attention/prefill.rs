//! Prefill tasks: one tile of query tokens × one KV head (all its grouped query heads),
//! swept over the causal context one [`KEY_TILE`] of keys at a time (FlashAttention,
//! <https://arxiv.org/abs/2205.14135>, with the query tile as the outer block).
//!
//! Rows are `token × grouped head`, token-major. At key tile `k`, the rows that still see a
//! key are a suffix (rows of later tokens see more keys); each row's key count inside the
//! diagonal tile is its own (`n_valid`), so the causal mask costs nothing outside it.
//!
//! Each row carries two states: the current segment's and the merged total. At the end of
//! each of the row's decode segments ([`super::segments`] of its context length) the segment
//! is folded into the total — a copy for the first, a merge after — exactly as
//! [`super::decode`] folds its partial states, so both paths produce the same bits.

use super::{Ctx, KEY_TILE, Mode};
use crate::attention::{AttnSeqs, KvElem, segments};
use crate::simd::attn::AttnTile;

/// Runs query tile `qt` of chunk `s` for KV head `g`.
pub(super) fn task<S: AttnSeqs + ?Sized, T: KvElem>(
    ctx: &Ctx<'_, S, T>,
    s: usize,
    g: usize,
    qt: usize,
) {
    let p = &ctx.plan[s];
    let Mode::Prefill { q_tile, .. } = p.mode else {
        unreachable!("a prefill task of a decode chunk")
    };
    let table = ctx.seqs.seq(s).block_table;
    let (hd, grp) = (ctx.shape.head_dim, ctx.shape.group());
    let t0 = qt * q_tile;
    let n_tok = q_tile.min(p.n_q - t0);
    let rows = n_tok * grp;
    // Position of the tile's first token.
    let pos0 = p.start_pos + t0;
    let n_f = 3 * rows * hd + 4 * rows + 2 * KEY_TILE * hd;
    ctx.scratch(n_f, rows + 2 * n_tok, |f, u| {
        // q, acc, tot_acc: [rows, hd]; m, l, tot_m, tot_l: [rows]; gather: [2, KEY_TILE, hd].
        let (q, f) = f.split_at_mut(rows * hd);
        let (acc, f) = f.split_at_mut(rows * hd);
        let (tot_acc, f) = f.split_at_mut(rows * hd);
        let (m, f) = f.split_at_mut(rows);
        let (l, f) = f.split_at_mut(rows);
        let (tot_m, f) = f.split_at_mut(rows);
        let (tot_l, gather) = f.split_at_mut(rows);
        // n_valid: [rows]; per token, the tiles of its segments and the tile ending the
        // current one (no division per tile).
        let (n_valid, u) = u.split_at_mut(rows);
        let (seg_tiles, seg_end) = u.split_at_mut(n_tok);
        for t in 0..n_tok {
            for hr in 0..grp {
                let r = t * grp + hr;
                ctx.load_q(p.q_row + t0 + t, g * grp + hr, &mut q[r * hd..(r + 1) * hd]);
            }
            let n_ctx = pos0 + t + 1;
            let tps = segments(n_ctx).1;
            seg_tiles[t] = tps as u32;
            seg_end[t] = tps.min(n_ctx.div_ceil(KEY_TILE)) as u32 - 1;
        }
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        acc.fill(0.0);
        let n_tiles = (pos0 + n_tok).div_ceil(KEY_TILE);
        // The K/V stream prefetched as a decode task's is (see `super::decode`): a
        // verification chunk's few rows leave it nearly as memory-bound as a decode
        // (`attention/verify6_b1_ctx400_30_layers` 75–85 → 58–59 µs, A/B rounds; with the
        // next tile also requested into L1, 68–70 µs and the in-cache `verify6_b1_ctx320`
        // 15% slower).
        ctx.kv.prefetch_tile(table, g, 0);
        ctx.kv.prefetch_tile(table, g, 1);
        for tile in 0..n_tiles {
            if tile + 2 < n_tiles {
                ctx.kv.prefetch_tile(table, g, tile + 2);
            }
            let k0 = tile * KEY_TILE;
            // Tokens before `first` (positions < k0) see no key of this tile.
            let first = k0.saturating_sub(pos0);
            let r0 = first * grp;
            for t in first..n_tok {
                let nv = (pos0 + t + 1 - k0).min(KEY_TILE) as u32;
                n_valid[t * grp..(t + 1) * grp].fill(nv);
            }
            let src = ctx
                .kv
                .tile(table, g, tile, n_valid[rows - 1] as usize, gather);
            let step = AttnTile {
                head_dim: hd,
                n_rows: rows - r0,
                q: q[r0 * hd..].as_ptr(),
                kt: src.kt,
                kt_stride: src.kt_stride,
                v: src.v,
                v_stride: src.v_stride,
                k_scale: src.k_scale,
                v_scale: src.v_scale,
                n_valid: n_valid[r0..].as_ptr(),
                m: m[r0..].as_mut_ptr(),
                l: l[r0..].as_mut_ptr(),
                acc: acc[r0 * hd..].as_mut_ptr(),
            };
            // SAFETY: q, n_valid and the states are `rows - r0` rows of this thread's scratch;
            // `src` points into the cache (bounds checked by `tile`) or into `gather`; every
            // n_valid is in 1..=KEY_TILE (the row's position is at least k0).
            unsafe { ctx.kern.tile(&step) };
            for t in first..n_tok {
                if seg_end[t] as usize != tile {
                    continue;
                }
                // End of one of this token's segments: fold it into the total, reset it.
                let (tps, last) = (seg_tiles[t] as usize, (pos0 + t + 1).div_ceil(KEY_TILE) - 1);
                seg_end[t] = (tile + tps).min(last) as u32;
                for r in t * grp..(t + 1) * grp {
                    let seg = &mut acc[r * hd..(r + 1) * hd];
                    let tot = &mut tot_acc[r * hd..(r + 1) * hd];
                    if tile < tps {
                        tot_m[r] = m[r];
                        tot_l[r] = l[r];
                        tot.copy_from_slice(seg);
                    } else {
                        ctx.kern
                            .merge(&mut tot_m[r], &mut tot_l[r], tot, m[r], l[r], seg);
                    }
                    m[r] = f32::NEG_INFINITY;
                    l[r] = 0.0;
                    seg.fill(0.0);
                }
            }
        }
        for t in 0..n_tok {
            for hr in 0..grp {
                let r = t * grp + hr;
                // SAFETY: (token row, head) pairs of this query tile and KV head belong to
                // this task alone.
                unsafe {
                    ctx.finish(
                        p.q_row + t0 + t,
                        g * grp + hr,
                        &tot_acc[r * hd..(r + 1) * hd],
                        tot_l[r],
                    )
                };
            }
        }
    });
}
