//! The two ends of every architecture's forward pass, on the shared [`Workspace`] buffers:
//! [`embed_batch`] (per-token bookkeeping, embedding rows, RoPE angles) and [`lm_head`] (the
//! final norm of only the rows whose logits the chunks want, then the LM head matmul).
//!
//! Both are row-wise, so a token's embedding and logits never depend on the rest of the
//! batch; neither allocates once the workspace has seen the batch shape.

use tokenmill_kernels::matmul::QMatrix;
use tokenmill_kernels::ops::{rms_norm, rope_cos_sin};

use crate::batch::SeqChunk;
use crate::profile::{OpKind, start, stop};
use crate::workspace::{Workspace, resize};

/// Fills `ws.tok_pos` (chunk index, position per token), `ws.x = embd[token]` `[T, hidden]`
/// and `ws.rope_cs` `[T, 2 · inv_freq.len()]` (RoPE angles, cos and sin scaled by `mscale`,
/// shared by every layer and head); returns `T`, the batch's token count.
pub(crate) fn embed_batch(
    chunks: &[SeqChunk<'_>],
    embd: &QMatrix<'_>,
    inv_freq: &[f32],
    mscale: f32,
    ws: &mut Workspace,
) -> usize {
    let t = start(&ws.profile);
    ws.tok_pos.clear();
    for (ci, c) in chunks.iter().enumerate() {
        ws.tok_pos
            .extend((0..c.tokens.len()).map(|i| (ci, c.start_pos + i)));
    }
    let (n_tok, h, rope_dim) = (ws.tok_pos.len(), embd.cols, 2 * inv_freq.len());
    let x = resize(&mut ws.x, n_tok * h);
    for (row, &id) in x
        .chunks_exact_mut(h)
        .zip(chunks.iter().flat_map(|c| c.tokens))
    {
        embd.dequantize_row_into(id as usize, row);
    }
    let cs = resize(&mut ws.rope_cs, n_tok * rope_dim);
    for (cs, &(_, pos)) in cs.chunks_exact_mut(rope_dim).zip(&ws.tok_pos) {
        rope_cos_sin(pos, inv_freq, mscale, cs);
    }
    stop(&mut ws.profile, OpKind::Embed, t);
    n_tok
}

/// Final norm and LM head, only for the rows the chunks ask for: `ws.sel` `[R, hidden]` is
/// `rms_norm(ws.x[row]) · norm` for each wanted row in chunk order, then `head(sel, logits)`
/// fills `ws.logits` `[R, vocab]`, which is returned. `Hidden` chunks get the final norm of
/// every token in `ws.hidden` instead.
pub(crate) fn lm_head<'w>(
    chunks: &[SeqChunk<'_>],
    norm: &[f32],
    eps: f32,
    vocab: usize,
    ws: &'w mut Workspace,
    head: impl FnOnce(&[f32], &mut [f32]),
) -> &'w mut [f32] {
    let h = norm.len();
    let t = start(&ws.profile);
    let n_rows: usize = chunks.iter().map(|c| c.n_logits()).sum();
    let sel = resize(&mut ws.sel, n_rows * h);
    let (mut r, mut t0) = (0, 0);
    for c in chunks {
        let len = c.tokens.len();
        for i in t0 + len - c.n_logits()..t0 + len {
            let out = &mut sel[r * h..(r + 1) * h];
            rms_norm(&ws.x[i * h..(i + 1) * h], norm, eps, out);
            r += 1;
        }
        t0 += len;
    }
    let n_hidden: usize = chunks.iter().map(|c| c.n_hidden()).sum();
    let hidden = resize(&mut ws.hidden, n_hidden * h);
    let (mut r, mut t0) = (0, 0);
    for c in chunks {
        for i in t0..t0 + c.n_hidden() {
            let out = &mut hidden[r * h..(r + 1) * h];
            rms_norm(&ws.x[i * h..(i + 1) * h], norm, eps, out);
            r += 1;
        }
        t0 += c.tokens.len();
    }
    let logits = resize(&mut ws.logits, n_rows * vocab);
    head(sel, logits);
    stop(&mut ws.profile, OpKind::LmHead, t);
    logits
}
