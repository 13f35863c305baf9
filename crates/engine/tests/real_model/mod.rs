//! Shared by the engine tests that run the real default model: an engine over it and the
//! request parameters they use.

#![allow(dead_code)]

use tokenmill_engine::{
    EngineHandle, ModelRunner, RequestParams, SamplingParams, SchedulerConfig, start,
};
use tokenmill_gguf::GgufFile;
use tokenmill_model::LlamaModel;

/// A running engine over the default model with `config`.
pub fn engine(config: SchedulerConfig) -> EngineHandle {
    let model =
        LlamaModel::load(GgufFile::open(tokenmill_testutil::model_path()).unwrap()).unwrap();
    let runner = ModelRunner::new(model, &config);
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
