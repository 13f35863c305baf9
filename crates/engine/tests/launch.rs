//! The engine's front door on the real default model: what an [`EngineConfig`] resolves to
//! (KV blocks from the memory budget, `max_model_len` from the context and the KV cache, the
//! errors for settings that can never work), and a launched engine serving a request.

use tokenmill_engine::{
    Batching, EngineConfig, EngineError, KvCacheMemory, KvDtype, RequestParams, StreamEvent, launch,
};
use tokenmill_model::Model;

fn model() -> Model {
    Model::open(&tokenmill_testutil::model_path()).unwrap()
}

fn invalid(config: &EngineConfig, model: &Model) -> String {
    match config.scheduler_config(model) {
        Err(EngineError::InvalidConfig(m)) => m,
        other => panic!("expected an invalid configuration, got {other:?}"),
    }
}

#[test]
fn defaults_resolve_to_the_models_context_and_the_kv_budget() {
    let model = model();
    let (c, warnings) = EngineConfig::default().scheduler_config(&model).unwrap();
    // SmolLM2: 23040 KV bytes per token in f16 (the default); 1 GiB / (16 · 23040) = 2912
    // blocks.
    assert_eq!((c.num_blocks, c.block_size), (2912, 16));
    assert_eq!(c.max_model_len, model.context_length());
    assert_eq!((c.max_num_seqs, c.max_num_batched_tokens), (64, 2048));
    assert!(c.enable_prefix_caching && c.enable_chunked_prefill);
    assert!(warnings.is_empty(), "{warnings:?}");
    let f32 = EngineConfig {
        kv_cache_dtype: KvDtype::F32,
        ..EngineConfig::default()
    };
    assert_eq!(f32.scheduler_config(&model).unwrap().0.num_blocks, 2912 / 2);
}

#[test]
fn max_model_len_above_the_context_is_an_error_and_above_the_kv_cache_is_lowered() {
    let model = model();
    let ctx = model.context_length();
    let over = EngineConfig {
        max_model_len: Some(ctx + 1),
        ..EngineConfig::default()
    };
    let msg = invalid(&over, &model);
    assert!(
        msg.contains("--max-model-len") && msg.contains(&ctx.to_string()),
        "{msg}"
    );

    // 64 MiB of f16 hold 182 blocks of 16 tokens: 2912 tokens, fewer than the context.
    let small = EngineConfig {
        kv_cache_memory: KvCacheMemory::Bytes(64 << 20),
        ..EngineConfig::default()
    };
    let (c, warnings) = small.scheduler_config(&model).unwrap();
    assert_eq!((c.num_blocks, c.max_model_len), (182, 2912));
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("lowered from") && warnings[0].contains("2912"));
    let set = EngineConfig {
        max_model_len: Some(1000),
        ..small
    };
    let (c, warnings) = set.scheduler_config(&model).unwrap();
    assert_eq!(c.max_model_len, 1000);
    assert!(warnings.is_empty());
}

#[test]
fn settings_that_can_never_work_are_errors() {
    let model = model();
    let zero_block = EngineConfig {
        block_size: 0,
        ..EngineConfig::default()
    };
    assert!(invalid(&zero_block, &model).contains("--block-size"));
    let tiny_kv = EngineConfig {
        kv_cache_memory: KvCacheMemory::Bytes(1024),
        ..EngineConfig::default()
    };
    assert!(invalid(&tiny_kv, &model).contains("holds no KV block"));
    let budget_below_seqs = EngineConfig {
        max_num_batched_tokens: 8,
        max_num_seqs: 16,
        ..EngineConfig::default()
    };
    assert!(invalid(&budget_below_seqs, &model).contains("max_num_batched_tokens"));
}

#[test]
fn a_launched_engine_runs_what_its_config_resolved_to() {
    let model = model();
    let config = EngineConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        kv_cache_memory: KvCacheMemory::Bytes(16 << 20),
        batching: Batching::Static {
            max_wait: tokenmill_engine::STATIC_BATCH_MAX_WAIT,
        },
        ..EngineConfig::default()
    };
    let (expected, _) = config.scheduler_config(&model).unwrap();
    let launched = launch(&config, model).unwrap();
    assert_eq!(launched.config, expected);
    assert_eq!(launched.handle.config(), &expected);
    assert_eq!(launched.kv_bytes_per_token, 46080 / 2, "f16 by default");
    assert_eq!(
        launched.warnings.len(),
        1,
        "16 MiB hold fewer tokens than the context"
    );
    let params = RequestParams {
        max_tokens: Some(3),
        ignore_eos: true,
        ..RequestParams::default()
    };
    let mut stream = launched.handle.submit(vec![1, 2, 3, 4], params);
    let mut tokens = 0;
    while let Some(ev) = stream.blocking_next() {
        match ev {
            StreamEvent::Token(_) => tokens += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(tokens, 3);
}
