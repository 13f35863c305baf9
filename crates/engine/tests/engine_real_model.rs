//! The engine on the real default model: batching, chunking, preemption and prefix caching
//! must not change what a request generates.

mod real_model;

use real_model::{engine, engine_with, fixture_prompts, params, small_config};
use tokenmill_engine::{
    EngineHandle, FinishReason, KvDtype, RequestParams, RequestStream, SamplingParams,
    SchedulerConfig, StreamEvent,
};

/// Collects a stream's tokens; checks it ends with `Length`.
fn collect(mut s: RequestStream) -> (Vec<u32>, usize) {
    let (mut tokens, mut cached) = (Vec::new(), 0);
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token(t) => {
                // The queue time comes with the first token only.
                assert!(t.queue_time.is_none() || tokens.is_empty());
                tokens.push(t.token);
                cached = t.num_cached_tokens;
                if let Some(r) = t.finish_reason {
                    assert_eq!(r, FinishReason::Length);
                }
            }
            StreamEvent::PromptLogprobs { .. } | StreamEvent::Embedding(_) => {}
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    (tokens, cached)
}

fn run_all(h: &EngineHandle, prompts: &[Vec<u32>], p: &RequestParams) -> Vec<Vec<u32>> {
    let streams: Vec<RequestStream> = prompts
        .iter()
        .map(|pr| h.submit(pr.clone(), p.clone()))
        .collect();
    streams.into_iter().map(|s| collect(s).0).collect()
}

#[test]
fn greedy_output_is_the_same_alone_batched_chunked_and_preempted() {
    same_alone_batched_chunked_and_preempted(KvDtype::F32);
}

/// The same with the 16-bit cache the commands default to: K/V are rounded as they are written
/// and attention reads every key from the cache, so chunking and recompute change nothing.
#[test]
fn greedy_output_is_the_same_alone_batched_chunked_and_preempted_with_f16_kv_cache() {
    same_alone_batched_chunked_and_preempted(KvDtype::F16);
}

fn same_alone_batched_chunked_and_preempted(dtype: KvDtype) {
    let engine = |config| engine_with(config, dtype);
    let prompts: Vec<Vec<u32>> = fixture_prompts().into_iter().cycle().take(16).collect();
    let p = params(24, SamplingParams::greedy());
    // Alone: one request at a time.
    let h = engine(small_config());
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|pr| collect(h.submit(pr.clone(), p.clone())).0)
        .collect();
    // All 16 at once, staggered: half now, half after the first ones started decoding.
    let mut streams: Vec<RequestStream> = prompts[..8]
        .iter()
        .map(|pr| h.submit(pr.clone(), p.clone()))
        .collect();
    let mut first = streams.remove(0);
    let mut batched = vec![Vec::new()];
    for _ in 0..3 {
        if let Some(StreamEvent::Token(t)) = first.blocking_next() {
            batched[0].push(t.token);
        }
    }
    streams.extend(
        prompts[8..]
            .iter()
            .map(|pr| h.submit(pr.clone(), p.clone())),
    );
    batched[0].extend(collect(first).0);
    batched.extend(streams.into_iter().map(|s| collect(s).0));
    assert_eq!(batched, alone, "batched != alone");
    drop(h);

    // Chunked prefill with a 4-token budget per request step (prompts up to ~40 tokens).
    let chunked = engine(SchedulerConfig {
        long_prefill_token_threshold: Some(4),
        enable_prefix_caching: false,
        ..small_config()
    });
    assert_eq!(run_all(&chunked, &prompts, &p), alone, "chunked != alone");
    drop(chunked);

    // A KV cache too small for all 16: requests get preempted and recomputed.
    let tight = engine(SchedulerConfig {
        num_blocks: 24,
        enable_prefix_caching: false,
        ..small_config()
    });
    assert_eq!(run_all(&tight, &prompts, &p), alone, "preempted != alone");
    let stats = tight.stats();
    assert!(
        stats.scheduler.num_preemptions > 0,
        "no preemption happened: {stats:?}"
    );
}

/// Static batching's pad rows (prompts padded to the longest, finished members decoding at the
/// batch's position on the scratch block) must not touch any real sequence: each request
/// generates what it generates alone.
#[test]
fn static_batching_pads_do_not_change_any_output() {
    let prompts: Vec<Vec<u32>> = fixture_prompts().into_iter().cycle().take(6).collect();
    let lengths = [3, 24, 9, 17, 1, 30];
    let alone_engine = engine(small_config());
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .zip(lengths)
        .map(|(pr, n)| {
            collect(alone_engine.submit(pr.clone(), params(n, SamplingParams::greedy()))).0
        })
        .collect();
    drop(alone_engine);
    let h = engine(SchedulerConfig {
        batching: tokenmill_engine::Batching::Static {
            max_wait: std::time::Duration::from_secs(5),
        },
        max_num_seqs: prompts.len(),
        ..small_config()
    });
    let streams: Vec<RequestStream> = prompts
        .iter()
        .zip(lengths)
        .map(|(pr, n)| h.submit(pr.clone(), params(n, SamplingParams::greedy())))
        .collect();
    let batched: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).0).collect();
    assert_eq!(batched, alone, "static batch != alone");
    assert!(batched.iter().zip(lengths).all(|(t, n)| t.len() == n));
}

#[test]
fn prefix_cache_hit_skips_cached_tokens_and_changes_nothing() {
    let h = engine(small_config());
    // A 70-token prompt: four full blocks of 16 can be cached.
    let prompt: Vec<u32> = fixture_prompts().concat().into_iter().take(70).collect();
    let p = params(16, SamplingParams::greedy());
    let (first, cached_first) = collect(h.submit(prompt.clone(), p.clone()));
    let (second, cached_second) = collect(h.submit(prompt.clone(), p.clone()));
    assert_eq!(cached_first, 0);
    assert_eq!(cached_second, 64);
    assert_eq!(first, second);
    assert!(h.stats().scheduler.prefix_cache.hit_tokens >= 64);
}

#[test]
fn copies_of_a_prompt_submitted_together_share_its_blocks_and_agree() {
    // Like an `n = 3` request: the copies join the first one's prefill step and read the
    // blocks it writes in that very forward pass.
    let prompt: Vec<u32> = fixture_prompts().concat().into_iter().take(70).collect();
    let p = params(16, SamplingParams::greedy());
    let (alone, _) = collect(engine(small_config()).submit(prompt.clone(), p.clone()));
    let h = engine(small_config());
    let streams: Vec<_> = (0..3)
        .map(|_| h.submit(prompt.clone(), p.clone()))
        .collect();
    let results: Vec<(Vec<u32>, usize)> = streams.into_iter().map(collect).collect();
    let cached: Vec<usize> = results.iter().map(|r| r.1).collect();
    assert_eq!(cached, [0, 64, 64]);
    for (tokens, _) in &results {
        assert_eq!(tokens, &alone);
    }
}

#[test]
fn seeded_sampling_is_reproducible_in_any_batch() {
    let h = engine(small_config());
    let prompts = fixture_prompts();
    let sampling = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(1234),
        ..SamplingParams::default()
    };
    let p = params(20, sampling);
    let alone = collect(h.submit(prompts[1].clone(), p.clone())).0;
    // The same request among others with different seeds.
    let others: Vec<RequestStream> = prompts
        .iter()
        .enumerate()
        .map(|(i, pr)| {
            let s = SamplingParams {
                temperature: 1.0,
                seed: Some(i as u64),
                ..SamplingParams::default()
            };
            h.submit(pr.clone(), params(20, s))
        })
        .collect();
    let again = collect(h.submit(prompts[1].clone(), p.clone())).0;
    drop(others);
    assert_eq!(alone, again);
}

#[test]
fn dropping_a_stream_aborts_and_frees_its_blocks() {
    let h = engine(small_config());
    let p = params(1000, SamplingParams::greedy());
    let mut s = h.submit(fixture_prompts()[0].clone(), p);
    for i in 0..2 {
        let Some(StreamEvent::Token(t)) = s.blocking_next() else {
            panic!("no token")
        };
        assert_eq!(
            t.queue_time.is_some(),
            i == 0,
            "queue time on the first token only"
        );
    }
    drop(s);
    // A later request runs to completion; afterwards nothing holds blocks.
    let (out, _) = collect(h.submit(
        fixture_prompts()[1].clone(),
        params(4, SamplingParams::greedy()),
    ));
    assert_eq!(out.len(), 4);
    let stats = h.stats().scheduler;
    assert_eq!(stats.num_running + stats.num_waiting, 0, "{stats:?}");
    assert_eq!(stats.num_free_blocks, stats.num_blocks, "{stats:?}");
}

#[test]
fn impossible_requests_are_rejected_with_an_error() {
    let h = engine(small_config());
    let mut s = h.submit(vec![1; 100], params(4000, SamplingParams::greedy()));
    assert!(matches!(s.blocking_next(), Some(StreamEvent::Error(_))));
    assert!(s.blocking_next().is_none());
    let mut s = h.submit(vec![], params(4, SamplingParams::greedy()));
    assert!(matches!(s.blocking_next(), Some(StreamEvent::Error(_))));
}
