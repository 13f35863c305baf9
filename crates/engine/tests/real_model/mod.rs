//! Shared by the engine tests that run the real default model: an engine over it, the
//! scheduler settings and request parameters they use, and the HF fixture's prompts.

#![allow(dead_code)]

use serde_json::Value;
use tokenmill_engine::{
    EngineHandle, KvDtype, ModelRunner, RequestParams, SamplingParams, SchedulerConfig, start,
};
use tokenmill_gguf::GgufFile;
use tokenmill_model::LlamaModel;

/// A running engine over the default model with `config` and an f32 KV cache.
pub fn engine(config: SchedulerConfig) -> EngineHandle {
    engine_with(config, KvDtype::F32)
}

/// A running engine over the default model with `config` and a KV cache of `dtype`.
pub fn engine_with(config: SchedulerConfig, dtype: KvDtype) -> EngineHandle {
    let model =
        LlamaModel::load(GgufFile::open(tokenmill_testutil::model_path()).unwrap()).unwrap();
    let runner = ModelRunner::with_kv_dtype(model, &config, dtype);
    start(runner, config).unwrap().0
}

/// Exactly `max_tokens` out (EOS ignored), sampled with `sampling`.
pub fn params(max_tokens: usize, sampling: SamplingParams) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling,
        ..RequestParams::default()
    }
}

/// Room for 16 sequences of up to 2048 tokens in 256 blocks.
pub fn small_config() -> SchedulerConfig {
    SchedulerConfig {
        num_blocks: 256,
        max_num_seqs: 16,
        max_num_batched_tokens: 512,
        max_model_len: 2048,
        ..SchedulerConfig::default()
    }
}

/// Prompts of the HF greedy fixture (varied lengths: 5 to ~40 tokens).
pub fn fixture_prompts() -> Vec<Vec<u32>> {
    let path = tokenmill_testutil::fixtures_dir("smollm2").join("greedy.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids = |c: &Value| {
        c["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"].as_array().unwrap().iter().map(ids).collect()
}
