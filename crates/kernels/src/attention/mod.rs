//! Causal attention of a batch of sequence chunks over a paged KV cache: tiled online softmax
//! for prefill (FlashAttention, <https://arxiv.org/abs/2205.14135>) and split-context
//! decoding (Flash-Decoding, <https://crfm.stanford.edu/2023/10/12/flashdecoding.html>), on
//! the global thread pool and the dispatch table's SIMD tier.
//!
//! [`attention`] takes the queries of every token of a batch (`[T, n_heads · head_dim]`,
//! already rotated), the layer's [`PagedKv`] (each chunk's keys and values already written,
//! see [`PagedKvMut::write`]) and the chunks ([`AttnSeqs`]: token count, first position, block
//! table). A query at position `p` attends to positions `0..=p` of its own sequence.
//!
//! **Work split.** Grouped-query heads that share a KV head are always processed together, so
//! each key/value tile is loaded once for the whole group. A chunk of one token (a decode
//! step) is cut into (`decode`) tasks of (sequence, KV head, context segment) — or, when the
//! batch's decode rows alone keep the pool busy, of (sequence, KV head) running its segments
//! in a row, so its K/V stream stays prefetched: each segment yields a partial
//! `(max, sum, acc)` and a second pass merges them. Longer chunks are cut
//! into (`prefill`) tasks of (sequence, KV head, tile of query tokens) that sweep the
//! context tile by tile, keeping the query tile's running state in L1. Both pools of tasks are
//! claimed dynamically by the pool's threads, heaviest first, so batch 1 and batch 32 both
//! keep every core busy.
//!
//! **Determinism.** A row's result must not depend on how the batch was formed — batched,
//! alone, chunked prefill or decode must give the same greedy tokens. So segment boundaries
//! depend only on the row's own context length ([`segments`]): never on the thread count or
//! the batch; the prefill path walks the same [`KEY_TILE`]-aligned tiles and merges at the
//! same segment boundaries as the decode path, and both run each row through the same kernel
//! in the canonical order documented in the private `simd::attn` module. The two paths are therefore bit-identical
//! (`tests/attention.rs` checks it), and so are all thread counts.
//!
//! **Memory.** No allocation per call once warm: task plans, split partials and the threads'
//! task buffers (query tile, states, gathered K/V tiles for block sizes that are not a
//! multiple of [`KEY_TILE`]) live in an [`AttnScratch`] that only grows
//! ([`AttnScratch::new`] sizes it for a batch limit up front). Each thread taking part in a
//! call claims one task buffer (slot) on its first task, so the arena holds one per pool
//! thread and its size never depends on which threads happened to run.

mod decode;
mod paged;
mod par_write;
mod plan;
mod prefill;
pub mod reference;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub use crate::kv_elem::{K_SCALE_GROUPS, KvDtype, KvElem, quantize_int8_row};
pub use crate::simd::attn::{AccRows, DotRows, KEY_TILE};
pub use half::f16;
pub use paged::{KvLayout, PagedKv, PagedKvMut, RopeAt};
pub use par_write::{BlockMut, BlockRun};
pub use plan::{AttnScratch, MAX_SEGS, SEG_MIN_KEYS, segments};

use crate::dispatch::{AttnKernels, Kernels, kernels};
use crate::pool::{SyncPtr, ThreadPool, global};
use plan::{Mode, SeqPlan, TaskSize};

/// Calls with less work (query rows × keys × head dim, ~4 µs on one core: a single decode of
/// SmolLM2's 9 heads over ~110 keys) run on the caller. Above it two threads win even for one
/// decode row: 26.4 → 18.0 µs at 320 keys (`cargo bench -p tokenmill-kernels --bench kernels
/// -- attention/decode_b1`), and more where the K/V comes from memory.
const INLINE_WORK: usize = 1 << 16;

/// Head geometry of an attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier of q·k, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

impl AttnShape {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Values per query token, `n_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}

/// One chunk of consecutive query tokens of one sequence.
#[derive(Clone, Copy, Debug)]
pub struct AttnSeq<'a> {
    /// Query tokens, at positions `start_pos..start_pos + n_q`.
    pub n_q: usize,
    pub start_pos: usize,
    /// The sequence's blocks, covering at least `start_pos + n_q` positions.
    pub block_table: &'a [u32],
}

/// The chunks of a batch, in query-row order (a trait so callers need not build a list).
pub trait AttnSeqs: Sync {
    fn num_seqs(&self) -> usize;
    fn seq(&self, i: usize) -> AttnSeq<'_>;
}

impl AttnSeqs for [AttnSeq<'_>] {
    fn num_seqs(&self) -> usize {
        self.len()
    }

    fn seq(&self, i: usize) -> AttnSeq<'_> {
        self[i]
    }
}

/// What every task of one call reads, and where it writes.
struct Ctx<'a, S: ?Sized, T> {
    q: &'a [f32],
    q_stride: usize,
    kv: &'a PagedKv<'a, T>,
    seqs: &'a S,
    plan: &'a [SeqPlan],
    shape: AttnShape,
    /// `scale · log2(e)`: the kernels work in base 2.
    q_scale: f32,
    kern: AttnKernels<T>,
    /// `[T, q_dim]`; each task writes its own rows × heads.
    out: SyncPtr<f32>,
    /// Partial states, `[slots, 2 + head_dim]`; each decode task writes its own slots.
    parts: SyncPtr<f32>,
    /// The threads' task buffers, `[threads, size.floats]` and `[threads, size.words]`.
    arena: SyncPtr<f32>,
    arena_rows: SyncPtr<u32>,
    size: TaskSize,
    threads: usize,
    /// This call's id, and the next free task buffer.
    job: u64,
    next_slot: AtomicUsize,
}

impl<S: AttnSeqs + ?Sized, T: KvElem> Ctx<'_, S, T> {
    /// Runs task `t`: finds its chunk (tasks are numbered chunk by chunk).
    fn run(&self, t: usize) {
        let s = self.plan.partition_point(|p| p.task0 <= t) - 1;
        let p = &self.plan[s];
        let local = t - p.task0;
        debug_assert!(local < p.n_tasks);
        let n_kv = self.shape.n_kv_heads;
        match p.mode {
            Mode::Decode { .. } => {
                let n_tasks = p.mode.decode_tasks();
                decode::task(self, s, local / n_tasks, local % n_tasks)
            }
            // Heaviest (last) query tiles first, every KV head of one tile next to each other.
            Mode::Prefill { n_qt, .. } => {
                prefill::task(self, s, local % n_kv, n_qt - 1 - local / n_kv)
            }
        }
    }

    /// The query of token row `row`, head `h`.
    fn q_row(&self, row: usize, h: usize) -> &[f32] {
        let hd = self.shape.head_dim;
        &self.q[row * self.q_stride + h * hd..][..hd]
    }

    /// Writes `acc / l` to token row `row`, head `h` of the output.
    ///
    /// # Safety
    ///
    /// No other task writes (row, h) during the call.
    unsafe fn finish(&self, row: usize, h: usize, acc: &[f32], l: f32) {
        let hd = self.shape.head_dim;
        let inv = 1.0 / l;
        // SAFETY: (row, h) is inside `out` ([T, q_dim], checked by `attention_with`) and
        // written by this task alone (the caller's contract).
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                self.out.get().add(row * self.shape.q_dim() + h * hd),
                hd,
            )
        };
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = a * inv;
        }
    }

    /// `dst = q · q_scale`, chain-interleaved as the kernels read it (element
    /// `c · hd / 4 + i` at `4 · i + c`).
    fn load_q(&self, row: usize, h: usize, dst: &mut [f32]) {
        let quarter = self.shape.head_dim / 4;
        let src = self.q_row(row, h);
        let (s0, rest) = src.split_at(quarter);
        let (s1, rest) = rest.split_at(quarter);
        let (s2, s3) = rest.split_at(quarter);
        // Written in order, four elements at a time (the strided stores of a loop per
        // quarter cost ~5% of a 512-token prefill's attention).
        for (i, d) in dst.chunks_exact_mut(4).enumerate() {
            d[0] = s0[i] * self.q_scale;
            d[1] = s1[i] * self.q_scale;
            d[2] = s2[i] * self.q_scale;
            d[3] = s3[i] * self.q_scale;
        }
    }
}

/// Ids of [`attention`] calls, so a thread knows whether it already holds a slot of this one.
static NEXT_JOB: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (call id, slot) of the last call this thread took part in.
    static SLOT: Cell<(u64, usize)> = const { Cell::new((u64::MAX, 0)) };
}

impl<S: AttnSeqs + ?Sized, T> Ctx<'_, S, T> {
    /// Runs `f` on this thread's task buffer of this call: `n_f` floats and `n_u` words
    /// (within [`TaskSize`]).
    fn scratch<R>(&self, n_f: usize, n_u: usize, f: impl FnOnce(&mut [f32], &mut [u32]) -> R) -> R {
        let slot = SLOT.with(|c| match c.get() {
            (job, slot) if job == self.job => slot,
            _ => {
                let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
                c.set((self.job, slot));
                slot
            }
        });
        // At most one slot per thread of the pool (the caller and its workers).
        assert!(slot < self.threads && n_f <= self.size.floats && n_u <= self.size.words);
        // SAFETY: slot `slot` of the arena (sized for `threads` slots by `attention_with`) is
        // used by this thread alone during this call, and a thread runs one task at a time.
        let (fs, us) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.arena.get().add(slot * self.size.floats), n_f),
                std::slice::from_raw_parts_mut(
                    self.arena_rows.get().add(slot * self.size.words),
                    n_u,
                ),
            )
        };
        f(fs, us)
    }
}

/// Causal attention of a batch, on the global pool and kernels. `q` holds token row `t` at
/// `q[t * q_stride..][..n_heads * head_dim]` (rows in chunk order, `T = Σ n_q`), `out` is
/// `[T, n_heads * head_dim]`. The cache's element type is f32, f16, bf16 or int8 ([`KvElem`]).
///
/// Panics if a shape or length does not fit (the head dim must be a multiple of 4), or a block
/// table does not cover its chunk.
pub fn attention<S: AttnSeqs + ?Sized, T: KvElem>(
    q: &[f32],
    q_stride: usize,
    kv: &PagedKv<'_, T>,
    seqs: &S,
    shape: &AttnShape,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attention_with(
        global(),
        kernels(),
        q,
        q_stride,
        kv,
        seqs,
        shape,
        scratch,
        out,
    );
}

/// [`attention`] on an explicit pool and kernel table.
#[allow(clippy::too_many_arguments)]
pub fn attention_with<S: AttnSeqs + ?Sized, T: KvElem>(
    pool: &ThreadPool,
    kernels: &Kernels,
    q: &[f32],
    q_stride: usize,
    kv: &PagedKv<'_, T>,
    seqs: &S,
    shape: &AttnShape,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let (hd, q_dim) = (shape.head_dim, shape.q_dim());
    assert!(shape.n_kv_heads > 0 && shape.n_heads.is_multiple_of(shape.n_kv_heads));
    assert!(kv.layout.n_kv_heads == shape.n_kv_heads && kv.layout.head_dim == hd);
    assert!(
        hd > 0 && hd.is_multiple_of(4),
        "head dim {hd} is not a multiple of 4"
    );
    let n_rows: usize = (0..seqs.num_seqs()).map(|i| seqs.seq(i).n_q).sum();
    assert_eq!(out.len(), n_rows * q_dim, "out is not [{n_rows}, {q_dim}]");
    assert!(q_stride >= q_dim && (n_rows == 0 || q.len() >= (n_rows - 1) * q_stride + q_dim));
    for i in 0..seqs.num_seqs() {
        let s = seqs.seq(i);
        let covered = s.block_table.len() * kv.layout.block_size;
        assert!(covered >= s.start_pos + s.n_q, "block table of chunk {i}");
    }
    let (size, threads) = (TaskSize::of(shape), pool.num_threads());
    let (n_tasks, n_slots) = scratch.plan(seqs, shape, threads);
    let AttnScratch {
        plan,
        parts,
        arena,
        arena_rows,
    } = scratch;
    if parts.capacity() < n_slots * (2 + hd) {
        // Room for every decode row of this batch at its most segments, so a growing context
        // does not grow the buffer again.
        let n_decode = plan.iter().filter(|p| p.n_q == 1).count();
        let most = n_decode * shape.n_heads * MAX_SEGS * (2 + hd);
        parts.reserve_exact(most.max(n_slots * (2 + hd)) - parts.len());
    }
    parts.resize(n_slots * (2 + hd), 0.0);
    if cfg!(debug_assertions) {
        // A slot the combine pass reads but no task wrote shows up as NaN in tests.
        parts.fill(f32::NAN);
    }
    if arena.len() < threads * size.floats {
        arena.resize(threads * size.floats, 0.0);
    }
    if arena_rows.len() < threads * size.words {
        arena_rows.resize(threads * size.words, 0);
    }
    let ctx = Ctx {
        q,
        q_stride,
        kv,
        seqs,
        plan,
        shape: *shape,
        q_scale: shape.scale * std::f32::consts::LOG2_E,
        kern: kernels.attention::<T>(hd),
        out: SyncPtr(out.as_mut_ptr()),
        parts: SyncPtr(parts.as_mut_ptr()),
        arena: SyncPtr(arena.as_mut_ptr()),
        arena_rows: SyncPtr(arena_rows.as_mut_ptr()),
        size,
        threads,
        job: NEXT_JOB.fetch_add(1, Ordering::Relaxed),
        next_slot: AtomicUsize::new(0),
    };
    // Work in (query row × key × head dim) units; small calls (a short single-sequence
    // decode step) run on the caller: handing ~1 µs tasks to the pool costs more than it
    // saves, and exposes the step to a descheduled worker on a busy machine.
    let work: usize = plan
        .iter()
        .map(|p| p.n_q * shape.n_heads * (p.start_pos + p.n_q) * hd)
        .sum();
    if work < INLINE_WORK {
        (0..n_tasks).for_each(|t| ctx.run(t));
        (0..plan.len()).for_each(|s| decode::combine(&ctx, s));
        return;
    }
    pool.parallel_for(n_tasks, |t| ctx.run(t));
    if n_slots > 0 {
        pool.parallel_for(plan.len(), |s| decode::combine(&ctx, s));
    }
}
