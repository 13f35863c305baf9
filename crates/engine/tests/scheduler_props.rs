//! Property tests: random arrivals, lengths, priorities, aborts and tiny pools, driven through
//! the fake runner. Every step checks the budget, the sequence cap, block conservation and ref
//! counts, chunk contiguity and block-table coverage, admission order and running progress
//! (see `common::Driver::step`); every run checks that all requests finish within a bound and
//! that every output equals the request's reference output (scheduling is invisible).

mod common;

use std::time::Duration;

use common::{Driver, EOS, tokens};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenmill_engine::{
    Batching, RequestId, RequestParams, SchedulerConfig, SchedulingPolicy, SlaTargets,
    SpeculativeConfig, StepFeatures,
};

fn random_config(rng: &mut StdRng) -> SchedulerConfig {
    let block_size: usize = [1, 2, 4, 16][rng.random_range(0..4)];
    let max_num_seqs = rng.random_range(1..=8);
    let max_model_len: usize = rng.random_range(16..=96);
    let chunked = rng.random_bool(0.8);
    let min_budget = if chunked { max_num_seqs } else { max_model_len };
    let max_num_batched_tokens = rng.random_range(min_budget..=min_budget.max(64) + 32);
    // Tiny pools: from just enough for the longest request to a few times that.
    let min_blocks = (max_model_len - 1).div_ceil(block_size);
    let num_blocks = rng.random_range(min_blocks..=min_blocks * 3);
    SchedulerConfig {
        block_size,
        num_blocks,
        max_num_batched_tokens,
        max_num_seqs,
        max_model_len,
        policy: if rng.random_bool(0.5) {
            SchedulingPolicy::Fcfs
        } else {
            SchedulingPolicy::Priority
        },
        enable_prefix_caching: rng.random_bool(0.7),
        enable_chunked_prefill: chunked,
        long_prefill_token_threshold: if chunked && rng.random_bool(0.3) {
            Some(rng.random_range(1..=24))
        } else {
            None
        },
        batching: if rng.random_bool(0.15) {
            Batching::Static {
                max_wait: Duration::ZERO,
            }
        } else {
            Batching::Continuous
        },
        sliding_window: if rng.random_bool(0.15) {
            Some(rng.random_range(2..=24))
        } else {
            None
        },
        sla: SlaTargets::default(),
        speculative: None,
    }
}

/// A synthetic machine for SLA runs: what a step "takes".
fn synthetic_ms(f: &StepFeatures) -> f64 {
    2.0 + 0.1 * f.prefill_tokens as f64
        + 1.5 * f.decode_seqs as f64
        + 1e-4 * f.context_tokens as f64
}

/// What a run exercised, so the property test can prove it is not vacuous.
#[derive(Default, Debug)]
struct Coverage {
    preemptions: u64,
    prefix_hit_tokens: u64,
    split_prompts: u64,
    aborts: u64,
    rejections: u64,
    window_nulls: u64,
    static_runs: u64,
    sla_runs: u64,
    spec_runs: u64,
    accepted_drafts: u64,
    max_running: usize,
}

fn run_case(seed: u64, cov: &mut Coverage) {
    eprintln!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cfg = random_config(&mut rng);
    let sla = cfg.batching == Batching::Continuous && rng.random_bool(0.2);
    if sla {
        cfg.sla = SlaTargets {
            ttft: Some(Duration::from_millis(rng.random_range(5..60))),
            tpot: Some(Duration::from_millis(rng.random_range(3..20))),
        };
    }
    // Speculation over a model that mostly copies itself, so that drafts get accepted.
    let spec = cfg.batching == Batching::Continuous && rng.random_bool(0.3);
    // Half prompt lookup, half a stand-in draft model proposing copied tokens.
    let draft_model = spec && rng.random_bool(0.5);
    if spec {
        let k = rng.random_range(1..=6);
        let method = if draft_model {
            SpeculativeConfig::draft_model(k)
        } else {
            SpeculativeConfig::ngram(k)
        };
        cfg.speculative = Some(SpeculativeConfig {
            adaptive: rng.random_bool(0.5),
            ..method
        });
    }
    let mut d = Driver::new(cfg.clone());
    d.check_running_progress = !sla;
    let period = rng.random_range(2..=8);
    if spec || rng.random_bool(0.2) {
        d.runner.copy_period = Some(period);
    }

    // Shared prefixes so that prefix caching has something to hit.
    let prefixes: Vec<Vec<u32>> = (0..3).map(|i| tokens(seed * 10 + i, 40)).collect();
    let n = rng.random_range(1..=24);
    let mut arrivals: Vec<(usize, u64)> = (0..n)
        .map(|i| (rng.random_range(0..30), i as u64))
        .collect();
    arrivals.sort();
    let mut next = 0;
    let mut rejected = 0;
    let mut step = 0;
    while next < arrivals.len() || d.live() {
        while next < arrivals.len() && arrivals[next].0 <= step {
            let id = arrivals[next].1;
            next += 1;
            let plen = rng.random_range(1..=cfg.max_model_len.min(60));
            let mut prompt = if rng.random_bool(0.5) {
                let p = &prefixes[rng.random_range(0..prefixes.len())];
                p[..plen.min(p.len())].to_vec()
            } else {
                Vec::new()
            };
            prompt.extend(tokens(seed * 1000 + id, plen - prompt.len()));
            // Mostly valid; sometimes too long (must be rejected at submission).
            let room = cfg.max_model_len.saturating_sub(plen);
            let max_tokens = if rng.random_bool(0.1) {
                room + 1
            } else {
                rng.random_range(1..=room.clamp(1, 40))
            };
            let params = RequestParams {
                max_tokens: Some(max_tokens),
                min_tokens: rng.random_range(0..3),
                eos_token_id: Some(EOS),
                ignore_eos: rng.random_bool(0.3),
                stop_token_ids: if rng.random_bool(0.2) {
                    vec![rng.random_range(1..1000)]
                } else {
                    vec![]
                },
                priority: rng.random_range(0..3),
                ..Default::default()
            };
            let valid = plen + max_tokens <= cfg.max_model_len;
            let accepted = d.submit(id, prompt, params);
            assert_eq!(accepted, valid, "seed {seed}: request {id} acceptance");
            rejected += usize::from(!accepted);
        }
        if rng.random_bool(0.04) && d.live() {
            let victim = RequestId(rng.random_range(0..n as u64));
            d.abort(victim);
        }
        d.step();
        if draft_model {
            d.propose_copied_drafts(period, 6);
        }
        cov.max_running = cov.max_running.max(d.sched.num_running());
        for (i, c) in d.out.chunks.iter().enumerate() {
            let prompt_len = d.tracks[&c.req_id].prompt.len();
            cov.split_prompts += u64::from(c.start_pos + c.num_tokens < prompt_len);
            let nulls = d
                .out
                .seq_chunk(i)
                .block_table
                .iter()
                .filter(|&&b| b == u32::MAX);
            cov.window_nulls += nulls.count() as u64;
        }
        if sla {
            let ms = synthetic_ms(&d.out.features);
            let out = d.out.clone();
            d.sched.record_step(&out, Duration::from_secs_f64(ms / 1e3));
        }
        step += 1;
        assert!(
            step < 5000,
            "seed {seed}: not finished after 5000 steps ({cfg:?})"
        );
    }
    d.run_to_completion(step + 2);
    d.check_against_reference();
    // Everything admitted was counted once in the prefix-cache stats.
    let stats = d.sched.stats();
    assert_eq!(stats.prefix_cache.num_requests as usize, {
        d.tracks.values().filter(|t| t.first_step.is_some()).count()
    });
    assert!(stats.prefix_cache.hit_tokens <= stats.prefix_cache.query_tokens);
    assert_eq!(
        stats.num_free_blocks, cfg.num_blocks,
        "seed {seed}: blocks leaked"
    );
    assert_eq!(stats.num_running + stats.num_waiting, 0);
    cov.preemptions += stats.num_preemptions;
    cov.prefix_hit_tokens += stats.prefix_cache.hit_tokens;
    cov.aborts += d.tracks.values().filter(|t| t.aborted).count() as u64;
    cov.rejections += rejected as u64;
    cov.static_runs += u64::from(cfg.batching != Batching::Continuous);
    cov.sla_runs += u64::from(sla);
    cov.spec_runs += u64::from(spec);
    cov.accepted_drafts += stats.spec_decode.num_accepted_tokens;
}

#[test]
fn random_workloads_keep_every_invariant() {
    let mut cov = Coverage::default();
    for seed in 0..1000 {
        run_case(seed, &mut cov);
    }
    eprintln!("{cov:?}");
    assert!(cov.preemptions > 0 && cov.prefix_hit_tokens > 0 && cov.split_prompts > 0);
    assert!(cov.aborts > 0 && cov.rejections > 0 && cov.window_nulls > 0);
    assert!(cov.static_runs > 0 && cov.sla_runs > 0 && cov.max_running == 8);
    assert!(cov.spec_runs > 0 && cov.accepted_drafts > 0);
}

/// FCFS with one sequence slot and a pool that fits one request: strictly one at a time, in
/// arrival order, and everyone finishes.
#[test]
fn fcfs_admits_in_arrival_order() {
    let cfg = SchedulerConfig {
        block_size: 4,
        num_blocks: 8,
        max_num_batched_tokens: 16,
        max_num_seqs: 2,
        max_model_len: 32,
        ..Default::default()
    };
    let mut d = Driver::new(cfg);
    for i in 0..10 {
        assert!(d.submit(i, tokens(i, 10 + i as usize), common::params(8)));
    }
    d.run_to_completion(1000);
    d.check_against_reference();
    let mut firsts: Vec<(u64, usize)> = d
        .tracks
        .iter()
        .map(|(id, t)| (id.0, t.first_step.unwrap()))
        .collect();
    firsts.sort();
    assert!(firsts.windows(2).all(|w| w[0].1 <= w[1].1), "{firsts:?}");
}
