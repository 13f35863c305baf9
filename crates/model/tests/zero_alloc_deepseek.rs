//! Zero allocation per DeepSeek decode step: after warm-up, decode steps of a batch on the
//! tiny DeepSeek V2 (softmax routing) and V3 (sigmoid + bias, group-limited) models allocate
//! nothing — not the MLA attention over the latent cache, not routing or the grouped expert
//! pass, not the workspace, not the kernels' scratch, not the thread pool.
//!
//! The same kind of test as `zero_alloc.rs` (a second binary: a counting global allocator
//! must be its binary's only test, so no other test allocates concurrently). Each model (HF
//! folder and llama.cpp GGUF): four sequences prefilled with different prompt lengths in one
//! batch, a few warm-up decode steps, then `STEPS` counted decode steps of the whole batch,
//! with scattered block tables, block sizes 16 and 4 over an f32 latent cache and 16 over an
//! f16 one. With the random weights the tokens of
//! a step pick different experts, and how many tokens each expert gets changes from step to
//! step (shown by the unit test `deepseek::tests::decode_tokens_spread_over_experts`), so the
//! grouped pass's varying shapes are among the counted steps.

mod counting_alloc;

use counting_alloc::{Counting, decode_step_allocations};

use tokenmill_model::KvDtype;
use tokenmill_model::deepseek::DeepSeekModel;
use tokenmill_testutil::argmax;

#[global_allocator]
static GLOBAL: Counting = Counting;

const B: usize = 4;
const WARM_UP: usize = 3;
const STEPS: usize = 24;

/// Allocations during `STEPS` decode steps of a 4-sequence batch on `model`, its latent cache
/// of `dtype` rows.
fn decode_allocations(model: &DeepSeekModel, block_size: usize, dtype: KvDtype) -> usize {
    let vocab = model.config().vocab_size;
    // Prompts cross the attention's 32-key tiles at different points.
    let prompt_lens = [5, 31, 50, 97];
    let max_len = prompt_lens.iter().max().unwrap() + WARM_UP + STEPS;
    let per_seq = max_len.div_ceil(block_size);
    let mut kv = model.kv_cache_with_dtype(B * per_seq, block_size, dtype);
    // Sequence s owns blocks s, s + B, s + 2B, ... (interleaved, not contiguous).
    let tables: Vec<Vec<u32>> = (0..B)
        .map(|s| (0..per_seq).map(|i| (i * B + s) as u32).collect())
        .collect();
    let prompts: Vec<Vec<u32>> = prompt_lens
        .iter()
        .enumerate()
        .map(|(s, &n)| (0..n).map(|i| ((i * 31 + s * 7) % vocab) as u32).collect())
        .collect();
    let mut ws = model.workspace(prompt_lens.iter().sum(), B);
    decode_step_allocations::<B>(
        &prompts,
        &tables,
        0,
        WARM_UP,
        STEPS,
        |chunks, rows, next| {
            let logits = model.forward(chunks, &mut kv, &mut ws).unwrap();
            for (n, r) in next.iter_mut().zip(rows) {
                *n = argmax(&logits[r * vocab..][..vocab]);
            }
        },
    )
}

#[test]
fn decode_steps_allocate_nothing() {
    let root = tokenmill_testutil::fixtures_dir("deepseek");
    let mut failures = Vec::new();
    for name in ["v2", "v3"] {
        let dir = root.join(name);
        let models = [
            ("folder", DeepSeekModel::load_hf_dir(&dir).unwrap()),
            (
                "gguf",
                DeepSeekModel::load_gguf(&dir.join("model.f32.gguf")).unwrap(),
            ),
        ];
        for (form, model) in &models {
            for (block_size, dtype) in [
                (16, KvDtype::F32),
                (4, KvDtype::F32),
                (16, KvDtype::F16),
                (16, KvDtype::BF16),
            ] {
                let n = decode_allocations(model, block_size, dtype);
                eprintln!(
                    "{name} {form}, block size {block_size}, {dtype} latent cache: {n} allocations in {STEPS} steps"
                );
                if n != 0 {
                    failures.push(format!("{name}/{form}/{block_size}/{dtype}: {n}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "allocations during decode: {failures:?}"
    );
}
