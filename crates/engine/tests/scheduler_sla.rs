//! SLA-aware batching against a synthetic machine whose step time is a known function of the
//! step: the model must learn it, and the scheduler must then pick the largest batch whose
//! predicted step time meets the targets.

mod common;

use std::time::Duration;

use common::{Driver, params_exact, tokens};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenmill_engine::{SchedulerConfig, SchedulerOutput, SlaTargets, StepFeatures};

/// 2 ms + 0.05 ms per prefill token + 3 ms per decoding sequence.
fn machine_ms(f: &StepFeatures) -> f64 {
    2.0 + 0.05 * f.prefill_tokens as f64 + 3.0 * f.decode_seqs as f64
}

fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1e3)
}

fn sla_driver(sla: SlaTargets) -> Driver {
    Driver::new(SchedulerConfig {
        block_size: 4,
        num_blocks: 2048,
        max_num_batched_tokens: 512,
        max_num_seqs: 16,
        max_model_len: 512,
        sla,
        ..Default::default()
    })
}

/// Feeds `n` random synthetic steps with their true cost.
fn train(d: &mut Driver, n: usize) {
    let mut rng = StdRng::seed_from_u64(5);
    let mut o = SchedulerOutput::new();
    for _ in 0..n {
        let mut f = StepFeatures::default();
        for _ in 0..rng.random_range(0..12) {
            f.add_chunk(rng.random_range(10..300), 1, true);
        }
        if rng.random_bool(0.6) {
            f.add_chunk(rng.random_range(0..200), rng.random_range(2..300), false);
        }
        o.features = f;
        d.sched.record_step(&o, ms(machine_ms(&f)));
    }
}

/// Steps the driver, "measuring" each step on the synthetic machine. Returns, per step,
/// (decoding sequences, prefill tokens, measured ms).
fn run(d: &mut Driver, max_steps: usize) -> Vec<(usize, usize, f64)> {
    let mut trace = Vec::new();
    while d.live() {
        assert!(d.step < max_steps);
        d.step();
        let f = d.out.features;
        let t = machine_ms(&f);
        let out = d.out.clone();
        d.sched.record_step(&out, ms(t));
        trace.push((f.decode_seqs, f.prefill_tokens, t));
    }
    trace
}

#[test]
fn learns_the_machine_and_caps_the_batch_to_meet_tpot() {
    // TPOT 21 ms: 6 decoding sequences take 20 ms, 7 would take 23.
    let mut d = sla_driver(SlaTargets {
        tpot: Some(Duration::from_millis(21)),
        ttft: None,
    });
    d.check_running_progress = false;
    train(&mut d, 200);
    let c = d.sched.step_model().coefficients();
    assert!((c.base_ms - 2.0).abs() < 0.05, "{c:?}");
    assert!((c.prefill_ms_per_token - 0.05).abs() < 0.002, "{c:?}");
    assert!((c.decode_ms_per_seq - 3.0).abs() < 0.05, "{c:?}");
    assert!(c.context_ms_per_token < 1e-5, "{c:?}");

    let trained = d.sched.stats().step_time;
    assert_eq!(
        d.sched.stats().decode_step_p95,
        Duration::ZERO,
        "nothing to decode"
    );
    for i in 0..30 {
        d.submit(i, tokens(i, 40), params_exact(20));
    }
    // The load on the SLA: all 30 decoding together would take 2 + 30 · 3 ms.
    let load = d.sched.stats().decode_step_p95.as_secs_f64() * 1e3;
    assert!((load - 92.0).abs() < 92.0 * 0.05, "{load} ms");
    let trace = run(&mut d, 2000);
    d.check_against_reference();
    let max_decodes = trace.iter().map(|s| s.0).max().unwrap();
    assert_eq!(max_decodes, 6, "the largest batch that meets the target");
    for &(decodes, prefill, t) in &trace {
        if decodes > 0 {
            assert!(
                t <= 21.0 + 0.1,
                "{decodes} decodes + {prefill} prefill took {t} ms"
            );
        }
    }
    // Predicted vs measured is reported, and small once the model has learnt.
    let s = d.sched.stats().step_time;
    assert!(s.last_predicted.is_some() && s.last_measured.is_some());
    let run_error = (s.mean_abs_error_ms * s.num_steps as f64
        - trained.mean_abs_error_ms * trained.num_steps as f64)
        / (s.num_steps - trained.num_steps) as f64;
    assert!(run_error < 0.1, "{run_error} {s:?}");

    // Without a target the same workload decodes 16 at a time, far over 21 ms.
    let mut free = sla_driver(SlaTargets::default());
    for i in 0..30 {
        free.submit(i, tokens(i, 40), params_exact(20));
    }
    let trace = run(&mut free, 2000);
    assert!(trace.iter().any(|s| s.0 == 16 && s.2 > 40.0));
}

#[test]
fn ttft_target_caps_prefill_only_steps() {
    // 10 ms for a prefill-only step: 2 + 0.05·n ≤ 10 → n ≤ 160 tokens.
    let mut d = sla_driver(SlaTargets {
        ttft: Some(Duration::from_millis(10)),
        tpot: None,
    });
    d.keep_log = true;
    train(&mut d, 200);
    d.submit(1, tokens(1, 400), params_exact(2));
    run(&mut d, 100);
    d.check_against_reference();
    let first = &d.log[0].chunks[0];
    assert!(
        (150..=160).contains(&first.num_tokens),
        "{}",
        first.num_tokens
    );
}

#[test]
fn impossible_targets_still_make_progress() {
    let mut d = sla_driver(SlaTargets {
        ttft: Some(Duration::from_micros(1)),
        tpot: Some(Duration::from_micros(1)),
    });
    d.check_running_progress = false;
    train(&mut d, 50);
    for i in 0..5 {
        d.submit(i, tokens(i, 30), params_exact(5));
    }
    let trace = run(&mut d, 1000);
    d.check_against_reference();
    // One sequence at a time, a block of prefill per step when nothing decodes.
    assert!(trace.iter().all(|s| s.0 <= 1));
    assert!(trace.iter().all(|s| s.1 <= 4));
}

#[test]
fn learns_online_from_measured_steps_alone() {
    let mut d = sla_driver(SlaTargets {
        tpot: Some(Duration::from_millis(21)),
        ttft: None,
    });
    d.check_running_progress = false;
    for i in 0..60 {
        d.submit(i, tokens(i, 40), params_exact(20));
    }
    let trace = run(&mut d, 2000);
    d.check_against_reference();
    let c = d.sched.step_model().coefficients();
    assert!((c.decode_ms_per_seq - 3.0).abs() < 0.1, "{c:?}");
    // The priors may overshoot while the first sequences run; after that the target holds.
    let late = &trace[trace.len() / 3..];
    assert!(late.iter().all(|s| s.0 == 0 || s.2 <= 21.1), "{late:?}");
    assert!(late.iter().any(|s| s.0 == 6));
}
