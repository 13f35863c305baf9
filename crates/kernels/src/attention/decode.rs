//! Decode tasks: one query token, one KV head (all its grouped query heads), one segment of
//! the context (Flash-Decoding, <https://crfm.stanford.edu/2023/10/12/flashdecoding.html>) —
//! or, when the batch has rows enough to keep every thread busy, all of its segments one
//! after the other, so that the K/V stream stays prefetched across segment ends.
//!
//! A row whose context is a single segment ([`super::segments`]) is finished by its task.
//! Otherwise each task leaves a partial `(m, l, acc)` per head in its own slots of the
//! scratch, and [`combine`] folds a row's segments in order — a copy of the first, then
//! merges — and writes `acc / l`. That fold is the one [`super::prefill`] performs as it
//! crosses the same segment boundaries, so the two paths agree bit for bit.

use super::{Ctx, KEY_TILE, Mode};
use crate::attention::{AttnSeqs, KvElem};
use crate::simd::attn::AttnTile;

/// Runs task `task` of decode chunk `s` for KV head `g`: segments
/// `task · per_task .. (task + 1) · per_task` of its context, one after the other.
pub(super) fn task<S: AttnSeqs + ?Sized, T: KvElem>(
    ctx: &Ctx<'_, S, T>,
    s: usize,
    g: usize,
    task: usize,
) {
    let p = &ctx.plan[s];
    let Mode::Decode {
        n_seg,
        tps,
        per_task,
        part0,
        ..
    } = p.mode
    else {
        unreachable!("a decode task of a prefill chunk")
    };
    let table = ctx.seqs.seq(s).block_table;
    let (hd, grp) = (ctx.shape.head_dim, ctx.shape.group());
    let n_ctx = p.start_pos + 1;
    let n_tiles = n_ctx.div_ceil(KEY_TILE);
    let segs = task * per_task..((task + 1) * per_task).min(n_seg);
    // The task's tiles: its K/V stream, prefetched one tile ahead across segment ends.
    let end = (segs.end * tps).min(n_tiles);
    ctx.scratch(
        2 * grp * hd + 2 * grp + 2 * KEY_TILE * hd,
        grp,
        |f, n_valid| {
            // q, acc: [grp, hd]; m, l: [grp]; gather: [2, KEY_TILE, hd].
            let (q, f) = f.split_at_mut(grp * hd);
            let (acc, f) = f.split_at_mut(grp * hd);
            let (m, f) = f.split_at_mut(grp);
            let (l, gather) = f.split_at_mut(grp);
            for hr in 0..grp {
                ctx.load_q(p.q_row, g * grp + hr, &mut q[hr * hd..(hr + 1) * hd]);
            }
            // The K/V (8 KiB tiles of scattered blocks) come from memory, which the hardware
            // prefetchers do not follow across blocks: while a tile is computed, the one
            // after next is requested into L2. At 32 sequences × 192 keys over 30 layers'
            // cache (`attention/decode_b32_ctx192_30_layers`) that took the call from 809 to
            // 602 µs with the next tile also requested into L1 (medians of 6 interleaved
            // runs; 3 and 4 tiles ahead: 635, 670), and to 480–590 µs without the L1 requests
            // (A/B rounds 510–690 with them). Requesting every tile into L1 up front stalls
            // on the line fill buffers before any compute starts.
            let first = segs.start * tps;
            ctx.kv.prefetch_tile(table, g, first);
            ctx.kv.prefetch_tile(table, g, first + 1);
            for seg in segs {
                m.fill(f32::NEG_INFINITY);
                l.fill(0.0);
                acc.fill(0.0);
                for tile in seg * tps..((seg + 1) * tps).min(n_tiles) {
                    if tile + 2 < end {
                        ctx.kv.prefetch_tile(table, g, tile + 2);
                    }
                    let nv = (n_ctx - tile * KEY_TILE).min(KEY_TILE);
                    n_valid.fill(nv as u32);
                    let src = ctx.kv.tile(table, g, tile, nv, gather);
                    let step = AttnTile {
                        head_dim: hd,
                        n_rows: grp,
                        q: q.as_ptr(),
                        kt: src.kt,
                        kt_stride: src.kt_stride,
                        v: src.v,
                        v_stride: src.v_stride,
                        k_scale: src.k_scale,
                        v_scale: src.v_scale,
                        n_valid: n_valid.as_ptr(),
                        m: m.as_mut_ptr(),
                        l: l.as_mut_ptr(),
                        acc: acc.as_mut_ptr(),
                    };
                    // SAFETY: q, n_valid and the states are `grp` rows of this thread's
                    // scratch; `src` points into the cache (bounds checked by `tile`) or into
                    // `gather`; the tile has 1..=KEY_TILE valid keys.
                    unsafe { ctx.kern.tile(&step) };
                }
                for hr in 0..grp {
                    let h = g * grp + hr;
                    let row_acc = &acc[hr * hd..(hr + 1) * hd];
                    if n_seg == 1 {
                        // SAFETY: head h of this token belongs to this task alone (one
                        // segment).
                        unsafe { ctx.finish(p.q_row, h, row_acc, l[hr]) };
                        continue;
                    }
                    let slot = part0 + h * n_seg + seg;
                    // SAFETY: slot (head h, segment seg) of this chunk is written by this
                    // task alone, inside `parts` (sized for every slot of the plan).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(ctx.parts.get().add(slot * (2 + hd)), 2 + hd)
                    };
                    dst[0] = m[hr];
                    dst[1] = l[hr];
                    dst[2..].copy_from_slice(row_acc);
                }
            }
        },
    );
}

/// Folds the partial states of decode chunk `s` (if it was split) and writes its output.
pub(super) fn combine<S: AttnSeqs + ?Sized, T: KvElem>(ctx: &Ctx<'_, S, T>, s: usize) {
    let p = &ctx.plan[s];
    let Mode::Decode { n_seg, part0, .. } = p.mode else {
        return;
    };
    if n_seg == 1 {
        return;
    }
    let hd = ctx.shape.head_dim;
    let stride = 2 + hd;
    // SAFETY: the chunk's slots `part0 .. part0 + n_heads · n_seg` are inside `parts` and
    // touched by this call alone; the decode tasks that wrote them have finished.
    let slots = unsafe {
        std::slice::from_raw_parts_mut(
            ctx.parts.get().add(part0 * stride),
            ctx.shape.n_heads * n_seg * stride,
        )
    };
    for (h, head) in slots.chunks_exact_mut(n_seg * stride).enumerate() {
        let (tot, rest) = head.split_at_mut(stride);
        let (tot_ml, tot_acc) = tot.split_at_mut(2);
        let [tot_m, tot_l] = tot_ml else {
            unreachable!()
        };
        for part in rest.chunks_exact(stride) {
            ctx.kern
                .merge(tot_m, tot_l, tot_acc, part[0], part[1], &part[2..]);
        }
        // SAFETY: head h of this token is written by this call alone.
        unsafe { ctx.finish(p.q_row, h, tot_acc, *tot_l) };
    }
}
