//! Speculative decoding in the scheduler, through the fake runner (`common`) with its copying
//! model: prompt lookup proposes drafts, the runner verifies them, and whatever is accepted,
//! rejected, preempted or cached, every output equals the request's reference generation.

mod common;

use common::{Driver, params, params_exact, tokens};
use tokenmill_engine::{RequestId, SchedulerConfig, SpeculativeConfig};

const PERIOD: usize = 7;

fn cfg(num_blocks: usize, spec: SpeculativeConfig) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 4,
        num_blocks,
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        max_model_len: 256,
        speculative: Some(spec),
        ..Default::default()
    }
}

/// Every draft the proposer finds, up to 4 per step.
fn fixed(k: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        adaptive: false,
        ..SpeculativeConfig::ngram(k)
    }
}

fn driver(config: SchedulerConfig) -> Driver {
    let mut d = Driver::new(config);
    d.runner.copy_period = Some(PERIOD);
    d.keep_log = true;
    d
}

/// A prompt that already repeats with the model's period.
fn periodic_prompt(seed: u64, len: usize) -> Vec<u32> {
    let unit = tokens(seed, PERIOD);
    unit.iter().copied().cycle().take(len).collect()
}

#[test]
fn accepted_and_rejected_drafts_leave_every_output_as_the_reference() {
    let mut d = driver(cfg(128, fixed(4)));
    for i in 0..6 {
        d.submit(i, periodic_prompt(i, 12 + i as usize), params(40));
    }
    d.submit(9, tokens(9, 20), params_exact(30));
    d.run_to_completion(500);
    d.check_against_reference();
    let s = d.sched.stats().spec_decode;
    assert!(
        s.num_drafts > 0 && s.num_draft_tokens >= s.num_drafts,
        "{s:?}"
    );
    // The copying model agrees with most drafts, but not all.
    assert!(s.num_accepted_tokens > s.num_draft_tokens / 2, "{s:?}");
    assert!(s.num_accepted_tokens < s.num_draft_tokens, "{s:?}");
    // Fewer steps than tokens: speculation did produce several tokens in a step.
    let outputs: usize = d.tracks.values().map(|t| t.output.len()).sum();
    let decode_rows: usize = d
        .log
        .iter()
        .flat_map(|o| &o.chunks)
        .filter(|c| c.is_decode)
        .count();
    assert!(
        decode_rows < outputs,
        "{decode_rows} decode chunks for {outputs} tokens"
    );
}

#[test]
fn drafts_fit_the_token_budget_and_a_tight_cache_preempts_instead_of_corrupting() {
    let config = SchedulerConfig {
        max_num_batched_tokens: 10,
        enable_prefix_caching: false,
        ..cfg(20, fixed(6))
    };
    let mut d = driver(config);
    for i in 0..6 {
        d.submit(i, periodic_prompt(i, 10), params_exact(30));
    }
    d.run_to_completion(2000);
    d.check_against_reference();
    assert!(d.sched.stats().num_preemptions > 0);
    assert!(d.sched.stats().spec_decode.num_accepted_tokens > 0);
}

#[test]
fn the_prefix_cache_holds_only_verified_tokens() {
    let mut d = driver(cfg(128, fixed(4)));
    let prompt = periodic_prompt(3, 9);
    d.submit(1, prompt.clone(), params_exact(40));
    d.run_to_completion(500);
    // A second request whose prompt is the first one's whole sequence: every full block of it
    // is a hit, and what follows still equals the reference.
    let mut longer = prompt;
    longer.extend(&d.tracks[&RequestId(1)].output);
    d.submit(2, longer.clone(), params_exact(20));
    d.run_to_completion(1000);
    d.check_against_reference();
    let cached = d.tracks[&RequestId(2)].num_cached_tokens;
    assert_eq!(
        cached,
        (longer.len() - 1) / 4 * 4,
        "{cached} of {}",
        longer.len()
    );
}

/// Decode chunks the driver logged, and those of them that carried drafts.
fn decode_chunks(d: &Driver) -> (usize, usize) {
    let decodes = d.log.iter().flat_map(|o| &o.chunks).filter(|c| c.is_decode);
    decodes.fold((0, 0), |(n, drafted), c| {
        (n + 1, drafted + usize::from(c.num_draft_tokens > 0))
    })
}

#[test]
fn adaptive_speculation_drafts_for_one_sequence_and_under_load_only_what_pays() {
    // Under the prior step-time model (2 ms a step, 2 ms a decode row) a lone decode takes a
    // draft worth 0.7 (the prior acceptance); in a batch of eight a draft must be accepted 8
    // times in 9 to pay.
    let mut alone = driver(cfg(128, SpeculativeConfig::ngram(4)));
    alone.submit(1, periodic_prompt(1, 14), params_exact(20));
    alone.run_to_completion(500);
    alone.check_against_reference();
    assert!(alone.sched.stats().spec_decode.num_drafts > 0);

    let batch = |copy_miss_one_in: u64| {
        let mut d = driver(cfg(256, SpeculativeConfig::ngram(4)));
        d.runner.copy_miss_one_in = copy_miss_one_in;
        for i in 0..8 {
            d.submit(i, periodic_prompt(i, 14), params_exact(60));
        }
        d.run_to_completion(2000);
        d.check_against_reference();
        decode_chunks(&d)
    };
    // Drafts right 3 times in 4: what each request's unverified guesses show keeps it
    // below the threshold nearly always.
    let (decodes, drafted) = batch(4);
    assert!(
        drafted * 20 < decodes,
        "{drafted} of {decodes} decodes drafted"
    );
    // Drafts always right: the guesses lift every request over it, and most decodes verify
    // drafts, though the engine has verified none before.
    let (decodes, drafted) = batch(0);
    assert!(
        drafted * 2 > decodes,
        "{drafted} of {decodes} decodes drafted"
    );
}

fn run_with_fake_draft(d: &mut Driver, k: usize, max_steps: usize) {
    while d.live() {
        assert!(d.step < max_steps, "not finished after {max_steps} steps");
        d.step();
        d.propose_copied_drafts(PERIOD, k);
    }
    d.run_to_completion(max_steps);
}

#[test]
fn draft_model_proposals_are_verified_with_lookahead_slots_and_change_no_output() {
    let every = SpeculativeConfig {
        adaptive: false,
        ..SpeculativeConfig::draft_model(4)
    };
    let mut d = driver(cfg(160, every));
    for i in 0..6 {
        d.submit(i, periodic_prompt(i, 12 + i as usize), params(40));
    }
    run_with_fake_draft(&mut d, 4, 500);
    d.check_against_reference();
    let s = d.sched.stats().spec_decode;
    assert!(
        s.num_accepted_tokens > 0 && s.num_accepted_tokens < s.num_draft_tokens,
        "{s:?}"
    );
    // Every sampling chunk got the proposer its 4 lookahead slots past the chunk, and asks
    // for a proposal.
    for o in &d.log {
        for c in o.chunks.iter().filter(|c| c.sample) {
            let covered = o.block_table(c).len() * 4;
            assert!(
                covered >= c.start_pos + c.num_tokens + 4,
                "{c:?}: {covered}"
            );
            assert!(c.propose);
        }
    }
    // Adaptive, in a full batch (the prior step-time model: a row must be accepted 16 times
    // in 18), the draft model is not asked to guess at all.
    let mut full = driver(cfg(256, SpeculativeConfig::draft_model(4)));
    for i in 0..8 {
        full.submit(i, periodic_prompt(i, 14), params_exact(20));
    }
    run_with_fake_draft(&mut full, 4, 500);
    full.check_against_reference();
    let decodes = full
        .log
        .iter()
        .flat_map(|o| &o.chunks)
        .filter(|c| c.is_decode);
    assert_eq!(decodes.filter(|c| c.propose).count(), 0);
    // A stale proposal (the request moved on without one) is not used.
    let mut d = driver(cfg(160, every));
    d.submit(1, periodic_prompt(1, 12), params_exact(10));
    d.run_to_completion(100);
    d.check_against_reference();
    assert_eq!(d.sched.stats().spec_decode.num_drafts, 0);
}
