//! Targeted scheduler behaviours, each driven through the fake runner (`common`), whose
//! outputs are a pure function of the token sequence: every case also checks that the outputs
//! equal the reference generation of each request alone.

mod common;

use std::time::Duration;

use common::{Driver, params, params_exact, tokens};
use tokenmill_engine::{
    Batching, EngineError, PadChunk, Request, RequestId, RequestParams, Scheduler, SchedulerConfig,
    SchedulingPolicy,
};
use tokenmill_model::LogitsWanted;

fn cfg(
    block_size: usize,
    num_blocks: usize,
    budget: usize,
    max_num_seqs: usize,
) -> SchedulerConfig {
    SchedulerConfig {
        block_size,
        num_blocks,
        max_num_batched_tokens: budget,
        max_num_seqs,
        max_model_len: 256,
        ..Default::default()
    }
}

#[test]
fn chunked_prefill_splits_a_long_prompt_and_the_last_chunk_samples() {
    let mut d = Driver::new(cfg(4, 64, 16, 4));
    d.keep_log = true;
    let prompt = tokens(1, 40);
    d.submit(1, prompt.clone(), params_exact(5));
    d.run_to_completion(100);
    d.check_against_reference();
    let chunks: Vec<_> = d
        .log
        .iter()
        .map(|o| {
            let c = &o.chunks[0];
            (c.start_pos, c.num_tokens, c.logits, c.sample)
        })
        .collect();
    use LogitsWanted::{Last, None};
    assert_eq!(
        &chunks[..4],
        &[
            (0, 16, None, false),
            (16, 16, None, false),
            (32, 8, Last, true),
            (40, 1, Last, true),
        ]
    );
    // Same output without chunking (one 40-token chunk).
    let mut whole = Driver::new(SchedulerConfig {
        enable_chunked_prefill: false,
        ..cfg(4, 64, 256, 4)
    });
    whole.keep_log = true;
    whole.submit(1, prompt, params_exact(5));
    whole.run_to_completion(100);
    assert_eq!(whole.log[0].chunks[0].num_tokens, 40);
    assert_eq!(
        whole.tracks[&RequestId(1)].output,
        d.tracks[&RequestId(1)].output
    );
}

#[test]
fn long_prefill_threshold_caps_chunks_and_decodes_are_not_stalled() {
    let mut d = Driver::new(SchedulerConfig {
        long_prefill_token_threshold: Some(8),
        ..cfg(4, 64, 64, 4)
    });
    d.keep_log = true;
    d.submit(1, tokens(1, 4), params_exact(30));
    d.step();
    d.submit(2, tokens(2, 50), params_exact(3));
    d.run_to_completion(200);
    d.check_against_reference();
    for o in &d.log {
        assert!(o.chunks.iter().all(|c| c.num_tokens <= 8));
        // Request 1 decodes every step while request 2 is being prefilled.
        if o.chunks
            .iter()
            .any(|c| c.req_id == RequestId(2) && !c.sample)
        {
            assert!(o.chunks.iter().any(|c| c.req_id == RequestId(1)));
        }
    }
}

fn preemption_case(enable_prefix_caching: bool) {
    // 12 blocks of 4: each request needs 8 blocks at its longest; two cannot both finish.
    let mut d = Driver::new(SchedulerConfig {
        enable_prefix_caching,
        ..cfg(4, 12, 64, 4)
    });
    d.keep_log = true;
    d.submit(1, tokens(1, 10), params_exact(22));
    d.submit(2, tokens(2, 10), params_exact(22));
    d.run_to_completion(500);
    d.check_against_reference();
    let stats = d.sched.stats();
    assert!(stats.num_preemptions > 0);
    // FCFS preempts the later request, which later recomputes prompt + output so far.
    let preempt_step = d.log.iter().position(|o| !o.preempted.is_empty()).unwrap();
    assert_eq!(d.log[preempt_step].preempted, vec![RequestId(2)]);
    let resumed = d.log[preempt_step + 1..]
        .iter()
        .flat_map(|o| o.chunks.iter())
        .find(|c| c.req_id == RequestId(2))
        .unwrap();
    assert!(resumed.num_tokens > 1, "recompute runs more than one token");
    if enable_prefix_caching {
        assert!(resumed.start_pos > 0, "its own cached blocks are reused");
    } else {
        assert_eq!(resumed.start_pos, 0);
    }
    assert_eq!(stats.num_free_blocks, 12);
}

#[test]
fn preemption_frees_blocks_and_recompute_gives_identical_output() {
    preemption_case(false);
    preemption_case(true);
}

#[test]
fn priority_policy_admits_and_preempts_by_priority() {
    let mut d = Driver::new(SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        ..cfg(4, 12, 64, 1)
    });
    d.keep_log = true;
    let with_priority = |p: i32| RequestParams {
        priority: p,
        ..params_exact(3)
    };
    d.submit(1, tokens(1, 4), with_priority(5));
    d.submit(2, tokens(2, 4), with_priority(1));
    d.submit(3, tokens(3, 4), with_priority(3));
    d.run_to_completion(100);
    d.check_against_reference();
    let firsts: Vec<_> = [1, 2, 3]
        .map(|i| d.tracks[&RequestId(i)].first_step.unwrap())
        .into();
    assert!(firsts[1] < firsts[2] && firsts[2] < firsts[0], "{firsts:?}");

    // Preemption picks the lowest priority (highest value) running request.
    let mut d = Driver::new(SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        ..cfg(4, 12, 64, 4)
    });
    d.keep_log = true;
    let long = |p: i32| RequestParams {
        priority: p,
        ..params_exact(22)
    };
    d.submit(1, tokens(1, 10), long(0));
    d.submit(2, tokens(2, 10), long(9));
    d.submit(
        3,
        tokens(3, 4),
        RequestParams {
            priority: 1,
            ..params_exact(2)
        },
    );
    d.run_to_completion(500);
    d.check_against_reference();
    let victims: Vec<_> = d.log.iter().flat_map(|o| o.preempted.clone()).collect();
    assert!(!victims.is_empty());
    assert!(victims.iter().all(|&v| v == RequestId(2)), "{victims:?}");
}

#[test]
fn prefix_cache_hit_skips_cached_tokens_with_identical_output() {
    let mut d = Driver::new(cfg(4, 64, 64, 4));
    d.keep_log = true;
    let prompt = tokens(7, 40);
    d.submit(1, prompt.clone(), params(8));
    d.run_to_completion(100);
    // The same prompt again: 9 of 10 full blocks hit (the last token is always recomputed).
    d.submit(2, prompt.clone(), params(8));
    // A longer prompt sharing all 40 tokens: all 10 blocks hit.
    let mut longer = prompt.clone();
    longer.extend(tokens(8, 5));
    d.submit(3, longer, params(8));
    let first = d.log.len();
    d.run_to_completion(200);
    d.check_against_reference();
    let start = |id: u64| {
        d.log[first..]
            .iter()
            .flat_map(|o| o.chunks.iter())
            .find(|c| c.req_id == RequestId(id))
            .unwrap()
            .start_pos
    };
    assert_eq!((start(2), start(3)), (36, 40));
    assert_eq!(d.tracks[&RequestId(2)].num_cached_tokens, 36);
    assert_eq!(d.tracks[&RequestId(3)].num_cached_tokens, 40);
    assert_eq!(
        d.tracks[&RequestId(2)].output,
        d.tracks[&RequestId(1)].output
    );
    let s = d.sched.stats().prefix_cache;
    assert_eq!((s.num_requests, s.query_tokens, s.hit_tokens), (3, 125, 76));

    // With caching off, nothing hits.
    let mut off = Driver::new(SchedulerConfig {
        enable_prefix_caching: false,
        ..cfg(4, 64, 64, 4)
    });
    off.submit(1, prompt.clone(), params(8));
    off.run_to_completion(100);
    off.submit(2, prompt, params(8));
    off.run_to_completion(200);
    assert_eq!(off.tracks[&RequestId(2)].num_cached_tokens, 0);
    assert_eq!(
        off.tracks[&RequestId(2)].output,
        d.tracks[&RequestId(1)].output
    );
}

#[test]
fn same_prompt_in_one_step_shares_the_blocks_being_filled() {
    // Three copies of a prompt arrive together (an `n = 3` request): the first computes the
    // prompt, the other two are admitted in the same step on its nine full blocks (the last
    // token is always computed) and compute only their last token.
    let mut d = Driver::new(cfg(4, 64, 64, 4));
    d.keep_log = true;
    let prompt = tokens(7, 38);
    for id in 1..=3 {
        d.submit(id, prompt.clone(), params(8));
    }
    let free_before = d.sched.stats().num_free_blocks;
    d.step();
    let first = &d.log[0];
    let starts: Vec<(u64, usize, usize)> = first
        .chunks
        .iter()
        .map(|c| (c.req_id.0, c.start_pos, c.num_tokens))
        .collect();
    assert_eq!(starts, [(1, 0, 38), (2, 36, 2), (3, 36, 2)]);
    // 10 blocks for the first copy, 1 own block for each sibling.
    assert_eq!(free_before - d.sched.stats().num_free_blocks, 12);
    assert_eq!(d.tracks[&RequestId(3)].num_cached_tokens, 36);
    d.run_to_completion(100);
    d.check_against_reference();
    let out = |id: u64| d.tracks[&RequestId(id)].output.clone();
    assert_eq!((out(2), out(3)), (out(1), out(1)));
}

#[test]
fn cached_blocks_are_evicted_least_recently_freed_first_tail_first() {
    // 6 blocks of 4. A, B, C (8-token prompts, 1 output token) each leave 2 cached blocks.
    let mut d = Driver::new(cfg(4, 6, 64, 4));
    let prompts: Vec<_> = (0..3).map(|i| tokens(100 + i, 8)).collect();
    for (i, p) in prompts.iter().enumerate() {
        d.submit(i as u64, p.clone(), params_exact(1));
        d.run_to_completion(100);
    }
    assert_eq!(d.sched.kv().pool().num_cached(), 6);
    // Free list (least recently freed first): a1 a0 b1 b0 c1 c0 (each request frees its tail
    // first). D (unrelated, 4 tokens + 1 output) needs 1 block: it evicts a1, A's tail.
    d.submit(10, tokens(200, 4), params_exact(1));
    d.run_to_completion(100);
    // Probes: the prompt plus one token, so every full block of it may hit.
    let probe = |d: &mut Driver, id: u64, p: &[u32]| {
        let mut p = p.to_vec();
        p.push(1);
        d.submit(id, p, params_exact(1));
        d.run_to_completion(100);
        d.tracks[&RequestId(id)].num_cached_tokens
    };
    // A's head block survived its tail; this probe needs 2 fresh blocks: it evicts B's.
    assert_eq!(probe(&mut d, 20, &prompts[0]), 4);
    // C, freed after B, is still fully cached; B is gone.
    assert_eq!(probe(&mut d, 22, &prompts[2]), 8);
    assert_eq!(probe(&mut d, 21, &prompts[1]), 0);
    d.check_against_reference();
}

#[test]
fn never_fitting_requests_are_rejected_at_submission() {
    let mut s = Scheduler::new(cfg(4, 8, 64, 4)).unwrap();
    let req = |id: u64, n: usize, p: RequestParams| Request::new(RequestId(id), tokens(id, n), p);
    // Needs 10 + 30 - 1 = 39 slots = 10 blocks > 8.
    assert!(matches!(
        s.add_request(req(1, 10, params(30))),
        Err(EngineError::ExceedsKvCache {
            needed_blocks: 10,
            num_blocks: 8,
            ..
        })
    ));
    assert!(matches!(
        s.add_request(req(2, 200, params(100))),
        Err(EngineError::ExceedsMaxModelLen { .. })
    ));
    assert!(matches!(
        s.add_request(req(3, 0, params(1))),
        Err(EngineError::EmptyPrompt(_))
    ));
    assert!(matches!(
        s.add_request(req(4, 3, params(0))),
        Err(EngineError::ZeroMaxTokens(_))
    ));
    // max_tokens = None takes what the model length leaves, which must also fit the cache.
    let unbounded = RequestParams {
        max_tokens: None,
        ..Default::default()
    };
    assert!(s.add_request(req(5, 3, unbounded)).is_err());
    // Exactly fitting is accepted, a duplicate id is not; nothing wedges the queue.
    assert!(s.add_request(req(6, 10, params(23))).is_ok());
    assert_eq!(
        s.add_request(req(6, 10, params(1))),
        Err(EngineError::DuplicateRequest(RequestId(6)))
    );
    assert_eq!(s.num_waiting(), 1);
    // Invalid configurations are refused too.
    for bad in [
        SchedulerConfig {
            max_num_batched_tokens: 2,
            max_num_seqs: 4,
            ..cfg(4, 8, 64, 4)
        },
        SchedulerConfig {
            enable_chunked_prefill: false,
            ..cfg(4, 8, 64, 4)
        },
        SchedulerConfig {
            block_size: 0,
            ..cfg(4, 8, 64, 4)
        },
    ] {
        assert!(matches!(
            Scheduler::new(bad),
            Err(EngineError::InvalidConfig(_))
        ));
    }
}

#[test]
fn abort_frees_blocks_at_the_next_schedule() {
    let mut d = Driver::new(cfg(4, 16, 64, 4));
    d.submit(1, tokens(1, 10), params_exact(20));
    d.submit(2, tokens(2, 10), params_exact(20));
    d.step();
    d.step();
    let used = 16 - d.sched.kv().num_free_blocks();
    assert!(used > 0);
    d.abort(RequestId(1));
    assert!(!d.sched.abort(RequestId(1)), "abort twice is a no-op");
    assert!(!d.sched.abort(RequestId(99)));
    assert_eq!(16 - d.sched.kv().num_free_blocks(), used, "freed lazily");
    d.step();
    assert_eq!(d.out.finished_req_ids, vec![RequestId(1)]);
    assert!(d.out.chunks.iter().all(|c| c.req_id != RequestId(1)));
    assert!(d.sched.request(RequestId(1)).is_none());
    // Aborted between schedule and update: the step's work for it is dropped.
    d.sched.schedule_into(&mut d.out);
    d.abort(RequestId(2));
    let sampled = d.runner.run(&d.out);
    assert!(d.sched.update_from_output(&d.out, sampled).is_empty());
    d.run_to_completion(100);
    assert_eq!(d.sched.kv().num_free_blocks(), 16);
    d.check_against_reference();
}

#[test]
fn prompt_logprobs_requests_get_all_logits_and_skip_the_cache() {
    let mut d = Driver::new(cfg(4, 64, 16, 4));
    d.keep_log = true;
    let prompt = tokens(3, 20);
    d.submit(1, prompt.clone(), params_exact(2));
    d.run_to_completion(100);
    let echo = RequestParams {
        prompt_logprobs: true,
        ..params_exact(2)
    };
    d.submit(2, prompt, echo);
    let first = d.log.len();
    d.run_to_completion(100);
    d.check_against_reference();
    let chunks: Vec<_> = d.log[first..]
        .iter()
        .flat_map(|o| o.chunks.iter())
        .map(|c| (c.start_pos, c.num_tokens, c.logits))
        .collect();
    use LogitsWanted::{All, Last};
    assert_eq!(chunks, vec![(0, 16, All), (16, 4, All), (20, 1, Last)]);
    assert_eq!(d.tracks[&RequestId(2)].num_cached_tokens, 0);
}

#[test]
fn sliding_window_frees_blocks_behind_the_window() {
    let mut d = Driver::new(SchedulerConfig {
        sliding_window: Some(8),
        ..cfg(4, 64, 64, 4)
    });
    d.keep_log = true;
    d.submit(1, tokens(1, 30), params_exact(60));
    let mut peak = 0;
    while d.live() {
        d.step();
        peak = peak.max(64 - d.sched.kv().num_free_blocks());
    }
    d.check_against_reference();
    // The window (8) plus the block being written: never more than 4 blocks after the prompt.
    assert!(peak <= 9, "peak {peak}");
    let last = d.log.last().unwrap();
    let table = last.block_table(&last.chunks[0]);
    assert!(table.iter().filter(|&&b| b == u32::MAX).count() >= 18);
    assert!(table.len() >= 22);
}

/// Mixed output lengths: static batching holds slots until the slowest member is done, so it
/// needs more steps than continuous batching for the same work.
#[test]
fn static_batching_runs_fixed_batches_and_loses_to_continuous() {
    let lens = [4, 60, 6, 8, 50, 5, 7, 45, 3, 9, 40, 6];
    let run = |batching: Batching| {
        let mut d = Driver::new(SchedulerConfig {
            batching,
            ..cfg(4, 512, 64, 4)
        });
        d.keep_log = true;
        for (i, &n) in lens.iter().enumerate() {
            d.submit(i as u64, tokens(i as u64, 8), params_exact(n));
        }
        d.run_to_completion(1000);
        d.check_against_reference();
        d
    };
    let st = run(Batching::Static {
        max_wait: Duration::ZERO,
    });
    let co = run(Batching::Continuous);
    // Static: batches {0..4}, {4..8}, {8..12}; a batch starts only when the previous is done.
    for b in 0..3u64 {
        let ids: Vec<_> = (b * 4..b * 4 + 4).map(RequestId).collect();
        let start = st.tracks[&ids[0]].first_step.unwrap();
        for id in &ids {
            assert_eq!(st.tracks[id].first_step, Some(start));
        }
        if b > 0 {
            let prev_end = (0..4)
                .map(|i| (b - 1) * 4 + i)
                .map(|i| {
                    st.log
                        .iter()
                        .rposition(|o| o.chunks.iter().any(|c| c.req_id == RequestId(i)))
                        .unwrap()
                })
                .max()
                .unwrap();
            assert_eq!(start, prev_end + 1);
        }
    }
    let (s, c) = (st.log.len(), co.log.len());
    assert!(
        s as f64 >= 1.3 * c as f64,
        "static {s} steps vs continuous {c}"
    );
}

#[test]
fn static_batching_waits_for_a_full_batch() {
    let mut d = Driver::new(SchedulerConfig {
        batching: Batching::Static {
            max_wait: Duration::from_secs(3600),
        },
        ..cfg(4, 64, 64, 3)
    });
    d.submit(1, tokens(1, 4), params_exact(2));
    d.submit(2, tokens(2, 4), params_exact(2));
    d.step();
    assert!(d.out.is_empty(), "two of three: keep waiting");
    d.submit(3, tokens(3, 4), params_exact(2));
    d.step();
    assert_eq!(d.out.chunks.len(), 3);
    d.run_to_completion(50);
    d.check_against_reference();
}

#[test]
fn static_batching_pays_for_padding() {
    let mut d = Driver::new(SchedulerConfig {
        batching: Batching::Static {
            max_wait: Duration::ZERO,
        },
        ..cfg(4, 64, 64, 3)
    });
    d.submit(1, tokens(1, 4), params_exact(1));
    d.submit(2, tokens(2, 8), params_exact(2));
    d.submit(3, tokens(3, 12), params_exact(4));
    d.step();
    // Prefill: prompts padded to the longest (12): 8 + 4 pad tokens after their prompts.
    assert_eq!(d.out.chunks.len(), 3);
    assert_eq!(d.out.num_pad_tokens(), 8 + 4);
    let pad = |num_tokens, start_pos, logits| PadChunk {
        num_tokens,
        start_pos,
        logits,
    };
    assert_eq!(d.out.pads, [pad(8, 4, false), pad(4, 8, false)]);
    let mut steps = Vec::new();
    while !d.out.is_empty() {
        d.step();
        let position = d.out.chunks.iter().map(|c| c.start_pos).max();
        steps.push((d.out.chunks.len(), d.out.pads.clone(), position));
    }
    // Finished members keep their slots: running + pads = 3 on every decode step, each pad a
    // token with logits at the batch's position.
    for (n, pads, position) in &steps[..steps.len() - 1] {
        assert_eq!(n + pads.len(), 3, "{steps:?}");
        assert!(
            pads.iter().all(|p| *p == pad(1, position.unwrap(), true)),
            "{steps:?}"
        );
    }
    assert!(steps.iter().any(|(_, p, _)| !p.is_empty()), "{steps:?}");
    d.check_against_reference();
}

#[test]
fn scheduler_output_buffers_are_reused() {
    let mut d = Driver::new(cfg(4, 64, 64, 8));
    for i in 0..8 {
        d.submit(i, tokens(i, 12), params_exact(30));
    }
    for _ in 0..5 {
        d.step();
    }
    let before = (
        d.out.chunks.capacity(),
        d.out.preempted.capacity(),
        d.out.finished_req_ids.capacity(),
    );
    for _ in 0..10 {
        d.step();
    }
    let after = (
        d.out.chunks.capacity(),
        d.out.preempted.capacity(),
        d.out.finished_req_ids.capacity(),
    );
    assert_eq!(before, after);
    assert_eq!(d.out.num_scheduled_tokens, 8);
}

/// The allocator's occupancy is sampled after every step: blocks of 4, prompts of 10 and 3
/// tokens prefilled in one step hold 3 + 1 blocks (16 slots) for 13 filled positions; the
/// peak is the first step with the most blocks held, and the mean waste stays below a
/// quarter (at most 3 of the 4 slots of one block per request).
#[test]
fn kv_occupancy_counts_the_unfilled_tails_of_blocks() {
    let mut d = Driver::new(cfg(4, 64, 64, 4));
    d.submit(1, tokens(1, 10), params_exact(6));
    d.submit(2, tokens(2, 3), params_exact(6));
    d.step();
    let o = d.sched.stats().kv_occupancy;
    assert_eq!((o.samples, o.allocated, o.used), (1, 16, 13));
    d.run_to_completion(100);
    d.check_against_reference();
    let o = d.sched.stats().kv_occupancy;
    // Both advance one position a step: request 1 reaches its fourth block at 13 positions,
    // when request 2 fills 6 of its two: 24 slots for 19 (the first sample of the peak).
    assert_eq!((o.peak_allocated, o.used_at_peak), (24, 19));
    assert_eq!(o.waste_at_peak(), 5);
    assert!(o.mean_waste_fraction() > 0.0 && o.mean_waste_fraction() < 0.25);
}
