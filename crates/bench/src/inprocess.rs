//! Closed-loop load on the engine handle, in-process (no HTTP, no tokenizer): separates
//! engine throughput from server cost.
//!
//! `concurrency` client threads each take the next request of the workload, submit it, read
//! its stream to the end, and repeat. Token arrival times are taken on the client threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokenmill_engine::{EngineHandle, RequestParams, StreamEvent};

use crate::dataset::{OutputLenDist, exponential_len};
use crate::stats::{ErrorKind, RequestError, RequestRecord};

/// One request of a workload: prompt ids and the number of tokens to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkItem {
    pub prompt: Vec<u32>,
    pub output_len: usize,
}

/// `vllm bench serve --dataset-name random`: prompt lengths drawn uniformly from
/// `len × [1 - range_ratio, 1 + range_ratio]`, output lengths likewise or (`output_dist`)
/// exponentially around `output_len`, token ids uniform in `0..vocab`, from `seed`.
pub fn random_workload(
    num_prompts: usize,
    input_len: usize,
    output_len: usize,
    range_ratio: f64,
    output_dist: OutputLenDist,
    vocab: usize,
    seed: u64,
) -> Vec<WorkItem> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 11
    };
    let draw_len = |len: usize, next: &mut dyn FnMut() -> u64| {
        let lo = ((len as f64) * (1.0 - range_ratio)).round().max(1.0) as u64;
        let hi = ((len as f64) * (1.0 + range_ratio)).round().max(lo as f64) as u64;
        (lo + next() % (hi - lo + 1)) as usize
    };
    (0..num_prompts)
        .map(|_| {
            let n_in = draw_len(input_len, &mut next);
            let n_out = match output_dist {
                OutputLenDist::Uniform => draw_len(output_len, &mut next),
                // u in (0, 1]: 53 random bits.
                OutputLenDist::Exponential => {
                    exponential_len(output_len, (next() + 1) as f64 / (1u64 << 53) as f64)
                }
            };
            let prompt = (0..n_in).map(|_| (next() % vocab as u64) as u32).collect();
            WorkItem {
                prompt,
                output_len: n_out,
            }
        })
        .collect()
}

/// Runs `work` with `concurrency` clients; returns one record per request and the wall time.
/// Every request uses `params` with `max_tokens = output_len` and `ignore_eos` set.
pub fn run_closed_loop(
    handle: &EngineHandle,
    work: &[WorkItem],
    concurrency: usize,
    params: &RequestParams,
) -> (Vec<RequestRecord>, Duration) {
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let mut records: Vec<(usize, RequestRecord)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..concurrency.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = work.get(i) else { break };
                        done.push((i, run_one(handle, item, params, start)));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("bench client thread"))
            .collect()
    });
    let elapsed = start.elapsed();
    records.sort_by_key(|r| r.0);
    (records.into_iter().map(|r| r.1).collect(), elapsed)
}

fn run_one(
    handle: &EngineHandle,
    item: &WorkItem,
    params: &RequestParams,
    origin: Instant,
) -> RequestRecord {
    let params = RequestParams {
        max_tokens: Some(item.output_len),
        ignore_eos: true,
        ..params.clone()
    };
    let sent = Instant::now();
    let mut stream = handle.submit(item.prompt.clone(), params);
    let mut rec = RequestRecord {
        prompt_tokens: item.prompt.len(),
        start: sent - origin,
        ..RequestRecord::default()
    };
    let fail = |message: String, kind| Some(RequestError { kind, message });
    while let Some(ev) = stream.blocking_next() {
        match ev {
            StreamEvent::Token(_) => rec.token_times.push(sent.elapsed()),
            StreamEvent::PromptLogprobs { .. } | StreamEvent::Embedding(_) => {}
            StreamEvent::Error(e) => rec.error = fail(e.to_string(), ErrorKind::ServerError),
        }
    }
    if rec.error.is_none() && rec.token_times.len() != item.output_len {
        let msg = format!("{} of {} tokens", rec.token_times.len(), item.output_len);
        rec.error = fail(msg, ErrorKind::Incomplete);
    }
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_workload_respects_lengths_and_seed() {
        let u = OutputLenDist::Uniform;
        let a = random_workload(50, 100, 20, 0.5, u, 1000, 7);
        assert_eq!(a, random_workload(50, 100, 20, 0.5, u, 1000, 7));
        assert_ne!(a, random_workload(50, 100, 20, 0.5, u, 1000, 8));
        for w in &a {
            assert!((50..=150).contains(&w.prompt.len()), "{}", w.prompt.len());
            assert!((10..=30).contains(&w.output_len));
            assert!(w.prompt.iter().all(|&t| t < 1000));
        }
        let fixed = random_workload(5, 64, 8, 0.0, u, 10, 1);
        assert!(
            fixed
                .iter()
                .all(|w| w.prompt.len() == 64 && w.output_len == 8)
        );
    }

    #[test]
    fn exponential_output_lengths_have_the_mean_and_the_spread() {
        let e = OutputLenDist::Exponential;
        let w = random_workload(4000, 16, 128, 0.0, e, 1000, 3);
        let lens: Vec<f64> = w.iter().map(|w| w.output_len as f64).collect();
        let mean = lens.iter().sum::<f64>() / lens.len() as f64;
        let sd = (lens.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / lens.len() as f64).sqrt();
        // Mean 128 and standard deviation ≈ mean, within sampling error of 4000 draws.
        assert!((mean - 128.0).abs() < 8.0, "mean {mean}");
        assert!((sd / mean - 1.0).abs() < 0.1, "sd {sd}");
        assert!(lens.iter().all(|&l| (1.0..=1024.0).contains(&l)));
        assert!(w.iter().all(|w| w.prompt.len() == 16));
    }
}
