//! Embedding requests on the real default model: the pooled final hidden states match HF
//! transformers (`tests/fixtures/smollm2/embeddings.json`, fp32 on the same weights), and
//! do not depend on batching, chunked prefill, prefix-cache hits or preemption.

mod real_model;

use real_model::{engine, fixture_prompts, params, small_config};
use serde_json::Value;
use tokenmill_engine::{
    EngineHandle, Pooling, RequestParams, RequestStream, SamplingParams, SchedulerConfig,
    StreamEvent,
};

fn pooled(kind: Pooling) -> RequestParams {
    RequestParams {
        pooling: Some(kind),
        ..RequestParams::default()
    }
}

/// The one event an embedding request yields: its vector, then the stream ends.
fn vector(mut s: RequestStream) -> Vec<f32> {
    let v = match s.blocking_next() {
        Some(StreamEvent::Embedding(v)) => v,
        other => panic!("expected an embedding, got {other:?}"),
    };
    assert!(s.blocking_next().is_none(), "nothing follows the embedding");
    v
}

fn embed_all(h: &EngineHandle, prompts: &[Vec<u32>], kind: Pooling) -> Vec<Vec<f32>> {
    let streams: Vec<RequestStream> = prompts
        .iter()
        .map(|p| h.submit(p.clone(), pooled(kind)))
        .collect();
    streams.into_iter().map(vector).collect()
}

fn normalized(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (a, b) = (normalized(a), normalized(b));
    a.iter().zip(&b).map(|(x, y)| x * y).sum()
}

/// Largest element difference between two lists of vectors, relative to the largest element.
fn max_rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let scale = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
            d / scale
        })
        .fold(0.0, f32::max)
}

#[test]
fn embeddings_match_hf_transformers() {
    let path = tokenmill_testutil::fixtures_dir("smollm2").join("embeddings.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let h = engine(small_config());
    for case in fixture["cases"].as_array().unwrap() {
        let ids = tokenmill_testutil::ids(&case["input_ids"]);
        for (kind, key) in [(Pooling::Mean, "mean"), (Pooling::Last, "last")] {
            let reference: Vec<f32> = case[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let got = vector(h.submit(ids.clone(), pooled(kind)));
            assert_eq!(got.len(), reference.len(), "the model's hidden size");
            let cos = cosine(&got, &reference);
            let name = case["name"].as_str().unwrap();
            assert!(cos > 0.99999, "{name} {key}: cosine {cos} with HF");
        }
    }
}

#[test]
fn embeddings_do_not_depend_on_batching_chunking_or_the_prefix_cache() {
    let prompts = fixture_prompts();
    for kind in [Pooling::Mean, Pooling::Last] {
        // Alone, without the prefix cache.
        let plain = engine(SchedulerConfig {
            enable_prefix_caching: false,
            ..small_config()
        });
        let alone: Vec<Vec<f32>> = prompts
            .iter()
            .map(|p| vector(plain.submit(p.clone(), pooled(kind))))
            .collect();
        drop(plain);

        // All at once, among generation requests decoding on the same steps, with the
        // prefix cache on and every prompt already cached once (`Last` may reuse blocks;
        // `Mean` must not, and computes every token).
        let h = engine(small_config());
        let warm = embed_all(&h, &prompts, kind);
        let decodes: Vec<RequestStream> = prompts
            .iter()
            .map(|p| h.submit(p.clone(), params(16, SamplingParams::greedy())))
            .collect();
        let batched = embed_all(&h, &prompts, kind);
        drop(decodes);
        assert!(max_rel_diff(&warm, &alone) < 1e-4, "{kind:?}: all at once");
        assert!(
            max_rel_diff(&batched, &alone) < 1e-4,
            "{kind:?}: among decodes, cached"
        );
        drop(h);

        // Chunked prefill: 4 tokens per request step (prompts up to ~40 tokens), and a KV
        // cache so small that the batch preempts (recomputing from the start).
        let chunked = engine(SchedulerConfig {
            long_prefill_token_threshold: Some(4),
            enable_prefix_caching: false,
            ..small_config()
        });
        let got = embed_all(&chunked, &prompts, kind);
        assert!(max_rel_diff(&got, &alone) < 1e-4, "{kind:?}: chunked");
        drop(chunked);
        let tight = engine(SchedulerConfig {
            num_blocks: 4,
            max_num_batched_tokens: 64,
            long_prefill_token_threshold: Some(8),
            enable_prefix_caching: false,
            ..small_config()
        });
        let got = embed_all(&tight, &prompts, kind);
        assert!(max_rel_diff(&got, &alone) < 1e-4, "{kind:?}: preempted");
        assert!(
            tight.stats().scheduler.num_preemptions > 0,
            "the tight cache preempted"
        );
    }
}

#[test]
fn an_embedding_request_frees_its_blocks_and_rejects_what_cannot_fit() {
    let h = engine(SchedulerConfig {
        num_blocks: 4,
        block_size: 16,
        ..small_config()
    });
    let ok = vector(h.submit(vec![1; 64], pooled(Pooling::Mean)));
    assert_eq!(ok.len(), 576);
    // Its blocks were freed: the next one of the whole cache's size runs too.
    vector(h.submit(vec![2; 64], pooled(Pooling::Last)));
    let mut s = h.submit(vec![1; 65], pooled(Pooling::Mean));
    assert!(
        matches!(s.blocking_next(), Some(StreamEvent::Error(_))),
        "65 tokens do not fit 4 blocks of 16"
    );
}
