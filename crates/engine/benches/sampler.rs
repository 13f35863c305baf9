//! One greedy sampling of a 49,152-token vocabulary (the default model's): `argmax` alone,
//! the scalar scan it replaced (`argmax_scalar`, kept here as the yardstick), and
//! `Sampler::sample` without and with `logprobs` (which adds the log-sum-exp over the
//! vocabulary).
//!
//! ```text
//! cargo bench -p tokenmill-engine --bench sampler
//! ```

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tokenmill_engine::{Sampler, SamplingParams, argmax};

const VOCAB: usize = 49_152;

fn logits() -> Vec<f32> {
    // Deterministic, unsorted, the maximum far from the start.
    (0..VOCAB)
        .map(|i| ((i * 7919 % VOCAB) as f32 * 0.001).sin() * 8.0)
        .collect()
}

fn argmax_scalar(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

fn bench(c: &mut Criterion) {
    let l = logits();
    assert_eq!(argmax(&l), argmax_scalar(&l));
    c.bench_function("argmax", |b| b.iter(|| argmax(black_box(&l))));
    c.bench_function("argmax_scalar", |b| b.iter(|| argmax_scalar(black_box(&l))));
    for (name, logprobs) in [("sample_greedy", None), ("sample_greedy_logprobs", Some(0))] {
        let mut s = Sampler::new(SamplingParams {
            logprobs,
            ..SamplingParams::greedy()
        });
        let mut buf = l.clone();
        c.bench_function(name, |b| {
            b.iter(|| s.sample(black_box(&mut buf), &[]).token)
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
