//! The golden checks of the real default model against the HF transformers fixtures
//! (`scripts/golden/`), shared by `golden_smollm2.rs` (12-bit activations) and
//! `golden_smollm2_a8.rs` (8-bit).

use serde_json::Value;
use tokenmill_gguf::GgufFile;
use tokenmill_model::{KvCache, KvDtype, LlamaModel, LogitsWanted, SeqChunk, Workspace};
use tokenmill_testutil::ids;

fn load(name: &str) -> Value {
    let path = tokenmill_testutil::fixtures_dir("smollm2").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn model() -> LlamaModel {
    LlamaModel::load(GgufFile::open(tokenmill_testutil::model_path()).unwrap()).unwrap()
}

/// `[(id, logprob)]` of a fixture top-5 list.
fn top5(v: &Value) -> Vec<(u32, f32)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
        .collect()
}

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    logits.iter().map(|l| l - lse).collect()
}

fn top_k(lp: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
    idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]));
    idx.truncate(k);
    idx
}

fn table(kv: &KvCache) -> Vec<u32> {
    (0..kv.num_blocks() as u32).collect()
}

/// Teacher forcing with a KV cache of `dtype`: top-1 agreement at least `min_rate`, the
/// reference top-1's logprob within `max_delta` everywhere.
pub fn teacher_forced(dtype: KvDtype, min_rate: f64, max_delta: f32) {
    let model = model();
    let vocab = model.config().vocab_size;
    let fixture = load("teacher_forced.json");
    let (mut agree, mut total, mut worst) = (0usize, 0usize, 0f32);
    for case in fixture["cases"].as_array().unwrap() {
        let input = ids(&case["input_ids"]);
        let mut kv = KvCache::with_dtype(model.config(), input.len().div_ceil(16), 16, dtype);
        let bt = table(&kv);
        let mut ws = Workspace::default();
        let chunk = SeqChunk {
            tokens: &input,
            start_pos: 0,
            block_table: &bt,
            logits: LogitsWanted::All,
        };
        let logits = model.forward(&[chunk], &mut kv, &mut ws).unwrap();
        for (pos, reference) in case["top5"].as_array().unwrap().iter().enumerate() {
            let reference = top5(reference);
            let lp = log_softmax(&logits[pos * vocab..(pos + 1) * vocab]);
            total += 1;
            agree += (top_k(&lp, 1)[0] == reference[0].0) as usize;
            worst = worst.max((lp[reference[0].0 as usize] - reference[0].1).abs());
        }
    }
    let rate = agree as f64 / total as f64;
    eprintln!(
        "teacher forcing ({dtype} KV): top-1 agreement {agree}/{total} = {rate:.4}, max |Δ top-1 logprob| = {worst:.5}"
    );
    assert!(rate >= min_rate, "top-1 agreement {rate}");
    assert!(worst <= max_delta, "top-1 logprob differs by {worst}");
}

/// Greedy continuations with a KV cache of `dtype`.
pub fn greedy(dtype: KvDtype) {
    let model = model();
    let vocab = model.config().vocab_size;
    let fixture = load("greedy.json");
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    let mut identical = 0;
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids"]);
        let ref_top5: Vec<Vec<(u32, f32)>> =
            case["top5"].as_array().unwrap().iter().map(top5).collect();
        let n_blocks = (prompt.len() + want.len()).div_ceil(16);
        let mut kv = KvCache::with_dtype(model.config(), n_blocks, 16, dtype);
        let bt = table(&kv);
        let mut ws = Workspace::default();
        let mut got = Vec::new();
        let mut our_top5 = Vec::new();
        for i in 0..want.len() {
            let (tokens, start_pos) = match got.last() {
                None => (&prompt[..], 0),
                Some(t) => (std::slice::from_ref(t), prompt.len() + i - 1),
            };
            let step = SeqChunk {
                tokens,
                start_pos,
                block_table: &bt,
                logits: LogitsWanted::Last,
            };
            let logits = model.forward(&[step], &mut kv, &mut ws).unwrap();
            let top = top_k(&log_softmax(&logits[..vocab]), 5);
            got.push(top[0]);
            our_top5.push(top);
        }
        match got.iter().zip(&want).position(|(a, b)| a != b) {
            None => identical += 1,
            Some(j) => {
                let name = case["name"].as_str().unwrap();
                assert!(
                    ref_top5[j].iter().any(|e| e.0 == got[j]) && our_top5[j].contains(&want[j]),
                    "{name}: step {j}: ours {} (top-5 {:?}) vs reference {} (top-5 {:?})",
                    got[j],
                    our_top5[j],
                    want[j],
                    ref_top5[j]
                );
                eprintln!("{name}: diverges at step {j} within each other's top-5");
            }
        }
    }
    eprintln!(
        "greedy ({dtype} KV): {identical}/{} continuations identical",
        cases.len()
    );
}
