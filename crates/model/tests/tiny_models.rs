//! Architecture coverage on tiny random-weight models (F32 GGUFs made from HF transformers
//! models by `scripts/golden/make_tiny_models.py`): Llama, Llama 3 RoPE scaling
//! (`rope_freqs.weight`), Qwen2 (QKV bias, NeoX RoPE) and Mistral.
//!
//! Logits must match the HF fp32 reference at every position, greedy continuations must be
//! identical, and results must not depend on how the tokens are batched: chunked prefill
//! and several sequences in one batch give the same logits as one whole-prompt pass.

mod common;

use common::{floats, greedy, logits_chunked, worst_rel};
use serde_json::Value;
use tokenmill_gguf::GgufFile;
use tokenmill_model::{KvCache, LlamaModel, LogitsWanted, SeqChunk, Workspace};
use tokenmill_testutil::ids;

const MODELS: [&str; 4] = ["llama", "llama3-rope", "qwen2", "mistral"];

fn load(name: &str) -> (LlamaModel, Value) {
    let dir = tokenmill_testutil::fixtures_dir("tiny");
    let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
    let file = GgufFile::open(dir.join(format!("{name}.gguf"))).unwrap();
    (
        LlamaModel::load(file).unwrap(),
        serde_json::from_str(&json).unwrap(),
    )
}

#[test]
fn logits_match_hf_reference() {
    for name in MODELS {
        let (model, fx) = load(name);
        let input = ids(&fx["input_ids"]);
        let got = logits_chunked(&model, &input, input.len());
        let worst = worst_rel(&got, &floats(&fx["logits"]));
        assert!(worst < 1e-4, "{name}: max relative logit error {worst}");
    }
}

#[test]
fn greedy_matches_hf_reference() {
    for name in MODELS {
        let (model, fx) = load(name);
        let want = ids(&fx["greedy_ids"]);
        let got = greedy(&model, &ids(&fx["input_ids"]), want.len());
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn chunked_prefill_matches_whole_prompt() {
    for name in MODELS {
        let (model, fx) = load(name);
        let input = ids(&fx["input_ids"]);
        let whole = logits_chunked(&model, &input, input.len());
        for chunk in [1, 3, 5] {
            let parts = logits_chunked(&model, &input, chunk);
            let worst = whole
                .iter()
                .zip(&parts)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-4, "{name}: chunk {chunk} differs by {worst}");
        }
    }
}

#[test]
fn batched_sequences_match_separate_runs() {
    let (model, fx) = load("qwen2");
    let vocab = model.config().vocab_size;
    let input = ids(&fx["input_ids"]);
    let (a, b) = (&input[..11], &input[4..]);
    let alone_a = logits_chunked(&model, a, a.len());
    let alone_b = logits_chunked(&model, b, b.len());
    // Both prompts in one batch, sharing one cache with disjoint blocks.
    let mut kv = KvCache::new(model.config(), 8, 4);
    let (ta, tb) = ([6u32, 0, 2], [1u32, 7, 3, 5]);
    let mut ws = Workspace::default();
    let chunks = [
        SeqChunk {
            tokens: a,
            start_pos: 0,
            block_table: &ta,
            logits: LogitsWanted::All,
        },
        SeqChunk {
            tokens: b,
            start_pos: 0,
            block_table: &tb,
            logits: LogitsWanted::Last,
        },
    ];
    let got = model.forward(&chunks, &mut kv, &mut ws).unwrap();
    assert_eq!(got.len(), (a.len() + 1) * vocab);
    let diff = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max)
    };
    assert!(diff(&got[..a.len() * vocab], &alone_a) < 1e-4);
    assert!(diff(&got[a.len() * vocab..], &alone_b[(b.len() - 1) * vocab..]) < 1e-4);
}

#[test]
fn bad_batches_are_rejected() {
    let (model, _) = load("llama");
    let mut kv = KvCache::new(model.config(), 2, 4);
    let mut ws = Workspace::default();
    let table = [0u32, 1];
    let oov = SeqChunk {
        tokens: &[300],
        start_pos: 0,
        block_table: &table,
        logits: LogitsWanted::Last,
    };
    assert!(model.forward(&[oov], &mut kv, &mut ws).is_err());
    let long = SeqChunk {
        tokens: &[1; 9],
        start_pos: 0,
        block_table: &table,
        logits: LogitsWanted::Last,
    };
    assert!(model.forward(&[long], &mut kv, &mut ws).is_err());
    let bad_block = SeqChunk {
        tokens: &[1],
        start_pos: 0,
        block_table: &[5],
        logits: LogitsWanted::Last,
    };
    assert!(model.forward(&[bad_block], &mut kv, &mut ws).is_err());
}
