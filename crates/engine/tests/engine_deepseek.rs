//! The tiny DeepSeek V2 model (MLA over the latent cache, MoE) served through the engine:
//! greedy tokens must equal the HF reference's and the direct forward's, alone and with 16
//! requests batched, and the runner's KV storage must hold exactly the latent row per token.

use serde_json::Value;
use tokenmill_engine::{
    ModelRunner, RequestParams, RequestStream, SamplingParams, SchedulerConfig, StreamEvent, start,
};
use tokenmill_model::deepseek::DeepSeekModel;
use tokenmill_testutil::ids;

fn model() -> (DeepSeekModel, Value) {
    let dir = tokenmill_testutil::fixtures_dir("deepseek").join("v2");
    let fx = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    (
        DeepSeekModel::load_hf_dir(&dir).unwrap(),
        serde_json::from_str(&fx).unwrap(),
    )
}

fn config() -> SchedulerConfig {
    SchedulerConfig {
        num_blocks: 128,
        block_size: 4,
        max_num_seqs: 16,
        max_num_batched_tokens: 64,
        max_model_len: 128,
        ..SchedulerConfig::default()
    }
}

fn collect(mut s: RequestStream) -> Vec<u32> {
    let mut tokens = Vec::new();
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token(t) => tokens.push(t.token),
            StreamEvent::PromptLogprobs { .. } | StreamEvent::Embedding(_) => {}
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    tokens
}

#[test]
fn engine_greedy_matches_reference_alone_and_batched() {
    let (m, fx) = model();
    let prompt = ids(&fx["input_ids"]);
    let want = ids(&fx["greedy_ids"]);
    let runner = ModelRunner::new(m, &config());
    assert_eq!(runner.kv_bytes_per_token(), 3 * (16 + 4) * 4);
    let (h, _thread) = start(runner, config()).unwrap();
    // Published for metrics: layers × (kv_lora_rank + qk_rope_head_dim) f32 values.
    assert_eq!(h.stats().kv_bytes_per_token, 3 * (16 + 4) * 4);
    let p = RequestParams {
        max_tokens: Some(want.len()),
        ignore_eos: true,
        sampling: SamplingParams::greedy(),
        ..RequestParams::default()
    };
    assert_eq!(collect(h.submit(prompt.clone(), p.clone())), want);
    // 16 requests at once (prompts of different lengths): each must match its own alone run.
    let prompts: Vec<Vec<u32>> = (0..16).map(|i| prompt[..4 + i % 12].to_vec()).collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|pr| collect(h.submit(pr.clone(), p.clone())))
        .collect();
    let streams: Vec<RequestStream> = prompts
        .iter()
        .map(|pr| h.submit(pr.clone(), p.clone()))
        .collect();
    let batched: Vec<Vec<u32>> = streams.into_iter().map(collect).collect();
    assert_eq!(batched, alone);
}
