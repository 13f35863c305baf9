//! The HTTP load driver: sends a workload to a [`Target`] on an [`Arrival`] schedule and
//! returns one record per request plus the summary.
//!
//! Each request is its own tokio task with its own HTTP/1.1 connection while in flight (the
//! client pools idle connections only; plain `http://` never multiplexes), so the server sees
//! exactly the concurrency asked for. The driver waits for each request's send offset, then
//! for a concurrency slot, then spawns it. Warm-up requests run first, at the same
//! concurrency, and are left out of every figure. The benchmark duration runs from the first
//! measured send to the last measured completion (vLLM's definition). Server memory is
//! sampled while the measured requests run.
//!
//! [`run_points`] runs several arrivals (an SLA sweep) and [`run_compare`] runs the same
//! workload on two targets, interleaved A B A B with a fresh seed each round.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::arrival::Arrival;
use crate::client::{RequestOptions, Target, request_body, send};
use crate::dataset::{DatasetError, Prompt};
use crate::memory::MemorySource;
use crate::spec_decode;
use crate::stats::{ErrorKind, RequestError, RequestRecord, Slo, Summary};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("workload: {0}")]
    Dataset(#[from] DatasetError),
    #[error("{0}")]
    Invalid(String),
}

/// Everything about a run except the prompts and where they go.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub arrival: Arrival,
    pub options: RequestOptions,
    pub percentiles: Vec<f64>,
    pub slo: Slo,
    pub memory: MemorySource,
    pub seed: u64,
    /// Draw a progress bar (on stderr) — callers pass `stdout().is_terminal()`.
    pub progress: bool,
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub summary: Summary,
    pub records: Vec<RequestRecord>,
}

impl RunResult {
    /// The summary's figures and every per-request record.
    pub fn to_json(&self) -> Value {
        let mut j = self.summary.to_json();
        j["requests"] = self.records.iter().map(crate::stats::record_json).collect();
        j
    }
}

/// Whether progress bars make sense here.
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

fn progress_bar(n: usize, show: bool, label: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(n as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({eta})")
    {
        pb.set_style(style);
    }
    pb.set_message(label.to_string());
    pb
}

/// Sends `bodies` (with their prompt lengths) on `offsets`, at most `max_concurrency` at once.
async fn drive(
    client: &reqwest::Client,
    target: &Arc<Target>,
    bodies: Vec<(Value, usize)>,
    offsets: &[Duration],
    max_concurrency: Option<usize>,
    pb: &ProgressBar,
) -> (Vec<RequestRecord>, Duration) {
    let slots = max_concurrency.map(|c| Arc::new(Semaphore::new(c)));
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let n = bodies.len();
    for (i, (body, prompt_len)) in bodies.into_iter().enumerate() {
        tokio::time::sleep_until((start + offsets[i]).into()).await;
        let permit = match &slots {
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        let (client, target, pb) = (client.clone(), target.clone(), pb.clone());
        tasks.spawn(async move {
            let rec = send(&client, &target, &body, prompt_len, start.elapsed()).await;
            drop(permit);
            pb.inc(1);
            (i, rec)
        });
    }
    let mut records: Vec<Option<RequestRecord>> = vec![None; n];
    while let Some(done) = tasks.join_next().await {
        if let Ok((i, rec)) = done {
            records[i] = Some(rec);
        }
    }
    let duration = start.elapsed();
    let lost = |_| RequestRecord {
        error: Some(RequestError {
            kind: ErrorKind::Protocol,
            message: "request task failed".into(),
        }),
        ..RequestRecord::default()
    };
    let records = records
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|| lost(i)))
        .collect();
    (records, duration)
}

fn bodies(
    target: &Target,
    prompts: &[Prompt],
    opts: &RequestOptions,
) -> Result<Vec<(Value, usize)>, BenchError> {
    prompts
        .iter()
        .map(|p| {
            Ok((
                request_body(target, p, opts).map_err(BenchError::Invalid)?,
                p.prompt_len,
            ))
        })
        .collect()
}

/// One run: `warmups` (not measured), then `prompts`.
pub async fn run(
    client: &reqwest::Client,
    target: &Target,
    warmups: &[Prompt],
    prompts: &[Prompt],
    spec: &RunSpec,
) -> Result<RunResult, BenchError> {
    let offsets = spec
        .arrival
        .offsets(prompts.len(), spec.seed)
        .map_err(BenchError::Invalid)?;
    let target = Arc::new(target.clone());
    let cap = spec.arrival.max_concurrency();
    if !warmups.is_empty() {
        let pb = progress_bar(warmups.len(), spec.progress, "warm-up");
        let zero = vec![Duration::ZERO; warmups.len()];
        let warm = bodies(&target, warmups, &spec.options)?;
        drive(client, &target, warm, &zero, cap, &pb).await;
        pb.finish_and_clear();
    }
    let measured = bodies(&target, prompts, &spec.options)?;
    let metrics_url = target.url("/metrics");
    let spec_before = spec_decode::read(client, &metrics_url).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = tokio::spawn(spec.memory.clone().watch(client.clone(), stop_rx));
    let pb = progress_bar(prompts.len(), spec.progress, "benchmark");
    let (records, duration) = drive(client, &target, measured, &offsets, cap, &pb).await;
    pb.finish_and_clear();
    let _ = stop_tx.send(true);
    let mut summary = Summary::with_slo(&records, duration, &spec.percentiles, &spec.slo);
    summary.memory = sampler.await.unwrap_or_default();
    if let Some(before) = spec_before {
        let after = spec_decode::read(client, &metrics_url).await;
        summary.spec_decode = after.map(|a| a.since(&before));
    }
    summary.request_rate = spec.arrival.rate();
    summary.max_concurrency = cap;
    Ok(RunResult { summary, records })
}

/// Makes `(warm-ups, prompts)` for a seed.
pub type Workload<'a> = dyn Fn(u64) -> Result<(Vec<Prompt>, Vec<Prompt>), BenchError> + 'a;

/// One run per arrival (an SLA sweep), each with the workload of `spec.seed + i`.
pub async fn run_points(
    client: &reqwest::Client,
    target: &Target,
    workload: &Workload<'_>,
    arrivals: &[Arrival],
    spec: &RunSpec,
) -> Result<Vec<RunResult>, BenchError> {
    let mut out = Vec::with_capacity(arrivals.len());
    for (i, &arrival) in arrivals.iter().enumerate() {
        let seed = spec.seed.wrapping_add(i as u64);
        let (warm, prompts) = workload(seed)?;
        let point = RunSpec {
            arrival,
            seed,
            ..spec.clone()
        };
        out.push(run(client, target, &warm, &prompts, &point).await?);
    }
    Ok(out)
}

/// The same workload on `a` and `b`, interleaved A B A B for `rounds` rounds; round `i` uses
/// seed `spec.seed + i` for both. `memory` gives each target's memory source.
pub async fn run_compare(
    client: &reqwest::Client,
    targets: [&Target; 2],
    memory: [MemorySource; 2],
    workload: &Workload<'_>,
    rounds: usize,
    spec: &RunSpec,
) -> Result<[Vec<RunResult>; 2], BenchError> {
    let mut out: [Vec<RunResult>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds.max(1) {
        let seed = spec.seed.wrapping_add(round as u64);
        let (warm, prompts) = workload(seed)?;
        for (side, target) in targets.iter().enumerate() {
            let s = RunSpec {
                seed,
                memory: memory[side].clone(),
                ..spec.clone()
            };
            out[side].push(run(client, target, &warm, &prompts, &s).await?);
        }
    }
    Ok(out)
}
