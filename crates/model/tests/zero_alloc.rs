//! Zero allocation per decode step: after warm-up, decode steps of a batch allocate nothing —
//! not the forward pass, not its workspace, not the kernels' scratch, not the thread pool.
//!
//! A counting global allocator (this test binary's only test, so no other test allocates
//! concurrently) counts every allocation while a flag is set. Each model: four sequences
//! prefilled with different prompt lengths in one batch, a few warm-up decode steps, then
//! `STEPS` counted decode steps of the whole batch, whose contexts cross decode-segment
//! boundaries (64 and 128 keys) on the way — so the split attention's partial buffers must
//! already be large enough. Block tables are scattered, and both block sizes that hold whole
//! key tiles (16) and ones that do not (4, the gather path) are covered, with f32 and f16 KV
//! caches — and each also with speculative verification steps (every sequence's next token
//! and its drafts, all rows' logits, a varying number accepted and the rest rewritten): 4
//! drafts on the quantized default model, 2 on the float-weight tiny fixtures (whose matmuls
//! hand 16 rows and more to `gemm`, which allocates its packing buffers).

mod counting_alloc;

use counting_alloc::{Counting, decode_step_allocations};

use tokenmill_gguf::GgufFile;
use tokenmill_model::{KvCache, KvDtype, LlamaModel};

#[global_allocator]
static GLOBAL: Counting = Counting;

const B: usize = 4;
const WARM_UP: usize = 3;
const STEPS: usize = 24;

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Allocations during `STEPS` decode steps of a 4-sequence batch on `model`, with a KV cache
/// of `dtype`; with `drafts`, each step verifies that many drafts per sequence.
fn decode_allocations(
    model: &LlamaModel,
    block_size: usize,
    dtype: KvDtype,
    drafts: usize,
) -> usize {
    let cfg = model.config();
    let vocab = cfg.vocab_size;
    // Prompts end just before 64 and 128 keys, so the counted steps cross both boundaries.
    let prompt_lens = [5, 50, 60, 120];
    let max_len = prompt_lens.iter().max().unwrap() + (WARM_UP + STEPS) * (1 + drafts);
    let per_seq = max_len.div_ceil(block_size);
    let mut kv = KvCache::with_dtype(cfg, B * per_seq, block_size, dtype);
    // Sequence s owns blocks s, s + B, s + 2B, ... (interleaved, not contiguous).
    let tables: Vec<Vec<u32>> = (0..B)
        .map(|s| (0..per_seq).map(|i| (i * B + s) as u32).collect())
        .collect();
    let prompts: Vec<Vec<u32>> = prompt_lens
        .iter()
        .enumerate()
        .map(|(s, &n)| (0..n).map(|i| ((i * 31 + s * 7) % vocab) as u32).collect())
        .collect();
    // Logit rows as the engine's runner sizes them: one per draft too.
    let mut ws = model.workspace(128 + 64, B * (1 + drafts));
    decode_step_allocations::<B>(
        &prompts,
        &tables,
        drafts,
        WARM_UP,
        STEPS,
        |chunks, rows, next| {
            let logits = model.forward(chunks, &mut kv, &mut ws).unwrap();
            for (n, r) in next.iter_mut().zip(rows) {
                *n = argmax(&logits[r * vocab..(r + 1) * vocab]);
            }
        },
    )
}

#[test]
fn decode_steps_allocate_nothing() {
    let dir = tokenmill_testutil::fixtures_dir("tiny");
    let mut failures = Vec::new();
    for name in ["llama", "qwen2", "llama3-rope", "mistral"] {
        let model =
            LlamaModel::load(GgufFile::open(dir.join(format!("{name}.gguf"))).unwrap()).unwrap();
        for block_size in [16, 4] {
            for dtype in KvDtype::ALL {
                // These fixtures have float weights: 16 rows or more go to `gemm`, whose
                // packing buffers allocate (a prefill-sized batch), so 4 × (1 + 2) rows here.
                for drafts in [0, 2] {
                    let n = decode_allocations(&model, block_size, dtype, drafts);
                    eprintln!(
                        "{name}, block size {block_size}, {dtype} KV, {drafts} drafts: {n} \
                         allocations in {STEPS} steps"
                    );
                    if n != 0 {
                        failures.push(format!("{name}/{block_size}/{dtype}/{drafts}: {n}"));
                    }
                }
            }
        }
    }
    let model =
        LlamaModel::load(GgufFile::open(tokenmill_testutil::model_path()).unwrap()).unwrap();
    for dtype in KvDtype::ALL {
        for drafts in [0, 4] {
            let n = decode_allocations(&model, 16, dtype, drafts);
            eprintln!(
                "SmolLM2-135M Q4_1, block size 16, {dtype} KV, {drafts} drafts: {n} allocations \
                 in {STEPS} steps"
            );
            if n != 0 {
                failures.push(format!("smollm2/{dtype}/{drafts}: {n}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "allocations during decode: {failures:?}"
    );
}
