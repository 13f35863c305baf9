//! A global allocator that counts allocations while counting is on, and the decode-step
//! driver both zero-allocation tests count over. Each test binary that uses it installs it (`#[global_allocator] static GLOBAL:
//! Counting = Counting;`) and must hold exactly one test, so no other test allocates while it
//! counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokenmill_model::{LogitsWanted, SeqChunk};

pub struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations made while `f` runs.
pub fn allocations_during(f: impl FnOnce()) -> usize {
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    f();
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCATIONS.load(Ordering::SeqCst)
}

/// A batch of `B` sequences prefilled with `prompts` in one forward, then greedy decode
/// steps: `forward` runs the chunks and writes into its last argument each sequence's next
/// token, read from the logits row its second argument names. After `warm_up` decode steps,
/// returns the allocations of the next `steps`.
///
/// With `drafts > 0` each step is a speculative verification: a sequence's chunk is its next
/// token and `drafts` draft tokens, with every row's logits, and it accepts a varying number
/// of them (`(step + s) % (drafts + 1)`): its position moves past those only, so the next step
/// rewrites the KV of the rejected ones, as the engine's rollback does.
pub fn decode_step_allocations<const B: usize>(
    prompts: &[Vec<u32>],
    tables: &[Vec<u32>],
    drafts: usize,
    warm_up: usize,
    steps: usize,
    mut forward: impl FnMut(&[SeqChunk<'_>], &[usize; B], &mut [u32; B]),
) -> usize {
    assert_eq!((prompts.len(), tables.len()), (B, B));
    let mut next = [0u32; B];
    let prefill: [SeqChunk; B] = std::array::from_fn(|s| SeqChunk {
        tokens: &prompts[s],
        start_pos: 0,
        block_table: &tables[s],
        logits: LogitsWanted::Last,
    });
    forward(&prefill, &std::array::from_fn(|s| s), &mut next);
    let mut pos: [usize; B] = std::array::from_fn(|s| prompts[s].len());
    // Chunk tokens, rewritten in place each step (allocated before counting).
    let mut tokens: Vec<Vec<u32>> = vec![vec![0; 1 + drafts]; B];
    let logits = if drafts > 0 {
        LogitsWanted::All
    } else {
        LogitsWanted::Last
    };
    let mut step_no = 0;
    let mut step = |next: &mut [u32; B], pos: &mut [usize; B]| {
        for (s, t) in tokens.iter_mut().enumerate() {
            t[0] = next[s];
            for (i, d) in t[1..].iter_mut().enumerate() {
                *d = (next[s] + i as u32 + 1) % 64;
            }
        }
        let accepted: [usize; B] = std::array::from_fn(|s| (step_no + s) % (drafts + 1));
        let rows: [usize; B] = std::array::from_fn(|s| s * (1 + drafts) + accepted[s]);
        let chunks: [SeqChunk; B] = std::array::from_fn(|s| SeqChunk {
            tokens: &tokens[s],
            start_pos: pos[s],
            block_table: &tables[s],
            logits,
        });
        forward(&chunks, &rows, next);
        for (p, a) in pos.iter_mut().zip(accepted) {
            *p += 1 + a;
        }
        step_no += 1;
    };
    for _ in 0..warm_up {
        step(&mut next, &mut pos);
    }
    allocations_during(|| {
        for _ in 0..steps {
            step(&mut next, &mut pos);
        }
    })
}
