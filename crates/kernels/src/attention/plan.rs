//! Planning one [`super::attention`] call: how each chunk is cut into tasks, where split
//! decode rows keep their partial states, and how large each thread's task buffer is — all in
//! an [`AttnScratch`] that only grows.
//!
//! Segment boundaries ([`segments`]) are a function of a row's context length alone (never of
//! the batch or the thread count): the determinism of the module docs rests on it.

use super::{AttnSeqs, AttnShape, KEY_TILE};
use crate::pool::global;

/// Fewest keys per decode segment: below this a context is one segment.
pub const SEG_MIN_KEYS: usize = 64;
/// Most segments a decode row's context is split into.
pub const MAX_SEGS: usize = 8;
/// Query rows (tokens × grouped heads) a prefill task aims for.
const PREFILL_ROWS: usize = 48;
/// Decode tasks (rows × KV heads) per pool thread from which each task takes a whole context.
const WHOLE_CONTEXT_TASKS: usize = 4;

/// The segments of a decode row with `n_ctx` keys: `(count, tiles per segment)`. Segment `i`
/// covers key tiles `i · tps .. min((i + 1) · tps, ceil(n_ctx / KEY_TILE))`.
pub fn segments(n_ctx: usize) -> (usize, usize) {
    let tiles = n_ctx.div_ceil(KEY_TILE).max(1);
    let wanted = n_ctx.div_ceil(SEG_MIN_KEYS).clamp(1, MAX_SEGS);
    let tps = tiles.div_ceil(wanted);
    (tiles.div_ceil(tps), tps)
}

/// How one chunk is cut into tasks.
#[derive(Clone, Copy, Debug)]
pub(super) enum Mode {
    /// One query token: `n_seg` context segments of `tps` tiles, `per_task` consecutive
    /// segments a task ([`Mode::decode_tasks`] per KV head); partial states at slots
    /// `part0 + head · n_seg + segment` when `n_seg > 1`.
    Decode {
        n_seg: usize,
        tps: usize,
        per_task: usize,
        part0: usize,
    },
    /// Tiles of `q_tile` query tokens, `n_qt` of them.
    Prefill { q_tile: usize, n_qt: usize },
}

impl Mode {
    /// Tasks per KV head of a decode chunk: `ceil(n_seg / per_task)` (0 for a prefill one).
    pub(super) fn decode_tasks(&self) -> usize {
        match *self {
            Mode::Decode {
                n_seg, per_task, ..
            } => n_seg.div_ceil(per_task),
            Mode::Prefill { .. } => 0,
        }
    }
}

/// One chunk's plan.
#[derive(Clone, Copy, Debug)]
pub(super) struct SeqPlan {
    /// First task of the chunk.
    pub(super) task0: usize,
    /// Tasks of the chunk.
    pub(super) n_tasks: usize,
    /// Row of the chunk's first token in `q` and `out`.
    pub(super) q_row: usize,
    pub(super) n_q: usize,
    pub(super) start_pos: usize,
    pub(super) mode: Mode,
}

/// Reusable planning, partial-state and task buffers of [`super::attention`] (grow-only).
#[derive(Debug, Default)]
pub struct AttnScratch {
    pub(super) plan: Vec<SeqPlan>,
    /// Partial states of split decode rows, `[slots, 2 + head_dim]`: `m`, `l`, `acc`.
    pub(super) parts: Vec<f32>,
    /// One task buffer per pool thread, `[threads, TaskSize::floats]`.
    pub(super) arena: Vec<f32>,
    /// Per-row key counts and per-token segment ends of each thread's task,
    /// `[threads, TaskSize::words]`.
    pub(super) arena_rows: Vec<u32>,
}

/// The size of one thread's task buffer for a shape.
#[derive(Clone, Copy, Debug)]
pub(super) struct TaskSize {
    pub(super) floats: usize,
    pub(super) words: usize,
}

impl TaskSize {
    pub(super) fn of(shape: &AttnShape) -> TaskSize {
        let q_tile = prefill_q_tile(shape);
        let rows = q_tile * shape.group();
        let hd = shape.head_dim;
        // Prefill: q, acc, total acc; m, l, total m, total l; a gathered K and V tile; key
        // counts per row, segment lengths and ends per token. (A decode task needs less:
        // `group <= rows`.)
        TaskSize {
            floats: 3 * rows * hd + 4 * rows + 2 * KEY_TILE * hd,
            words: rows + 2 * q_tile,
        }
    }
}

/// Query tokens per prefill task (at most).
fn prefill_q_tile(shape: &AttnShape) -> usize {
    (PREFILL_ROWS / shape.group()).max(1)
}

/// Query tokens per task of a chunk of `n_q` tokens on `threads` threads: [`prefill_q_tile`],
/// or fewer where the chunk would otherwise give the pool fewer than two tasks per thread —
/// a speculative verification chunk (a decode and its few drafts) is one tile of
/// [`prefill_q_tile`] tokens per KV head, which leaves threads idle (3 tasks on 2 threads).
/// The tile size never changes a result: every row runs through the kernel on its own.
fn chunk_q_tile(shape: &AttnShape, n_q: usize, threads: usize) -> usize {
    let tile = prefill_q_tile(shape);
    let want_tiles = (2 * threads).div_ceil(shape.n_kv_heads);
    if n_q.div_ceil(tile) >= want_tiles {
        return tile;
    }
    n_q.div_ceil(want_tiles).clamp(1, tile)
}

impl AttnScratch {
    /// Scratch that never grows for batches of up to `max_seqs` chunks, on the global pool.
    pub fn new(shape: &AttnShape, max_seqs: usize) -> AttnScratch {
        let size = TaskSize::of(shape);
        let threads = global().num_threads();
        AttnScratch {
            plan: Vec::with_capacity(max_seqs),
            parts: Vec::with_capacity(max_seqs * shape.n_heads * MAX_SEGS * (2 + shape.head_dim)),
            arena: vec![0.0; threads * size.floats],
            arena_rows: vec![0; threads * size.words],
        }
    }

    /// Plans the batch; returns (tasks, partial slots).
    pub(super) fn plan<S: AttnSeqs + ?Sized>(
        &mut self,
        seqs: &S,
        shape: &AttnShape,
        threads: usize,
    ) -> (usize, usize) {
        self.plan.clear();
        // With enough decode rows to keep the pool busy, a task runs all of its (sequence, KV
        // head)'s segments in a row: its K/V stream stays prefetched across segment ends
        // instead of starting cold once per segment. A few rows split their segments
        // across tasks, so that one long context still runs on every thread.
        let decode_rows = (0..seqs.num_seqs())
            .filter(|&i| seqs.seq(i).n_q == 1)
            .count();
        let whole = decode_rows * shape.n_kv_heads >= WHOLE_CONTEXT_TASKS * threads;
        let (mut task0, mut q_row, mut part0) = (0, 0, 0);
        for i in 0..seqs.num_seqs() {
            let s = seqs.seq(i);
            let (mode, n_tasks) = if s.n_q == 1 {
                let (n_seg, tps) = segments(s.start_pos + 1);
                let per_task = if whole { n_seg } else { 1 };
                let mode = Mode::Decode {
                    n_seg,
                    tps,
                    per_task,
                    part0,
                };
                if n_seg > 1 {
                    part0 += shape.n_heads * n_seg;
                }
                (mode, shape.n_kv_heads * mode.decode_tasks())
            } else {
                let q_tile = chunk_q_tile(shape, s.n_q, threads);
                let n_qt = s.n_q.div_ceil(q_tile);
                (Mode::Prefill { q_tile, n_qt }, shape.n_kv_heads * n_qt)
            };
            self.plan.push(SeqPlan {
                task0,
                n_tasks,
                q_row,
                n_q: s.n_q,
                start_pos: s.start_pos,
                mode,
            });
            task0 += n_tasks;
            q_row += s.n_q;
        }
        (task0, part0)
    }
}
