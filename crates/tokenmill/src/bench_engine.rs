//! `tokenmill bench-engine`: a closed-loop load on the engine in-process (no HTTP), reported
//! in `vllm bench serve`'s labels — to compare batching modes and SLA targets on the engine
//! alone.

use tokenmill_bench::dataset::OutputLenDist;
use tokenmill_bench::inprocess::{random_workload, run_closed_loop};
use tokenmill_bench::runner::RunResult;
use tokenmill_bench::stats::{Slo, Summary};
use tokenmill_engine::{KvOccupancy, RequestParams, SamplingParams};

use crate::engine_args::EngineArgs;

#[derive(clap::Args, Debug)]
pub struct BenchEngineArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Requests in the run.
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// Clients, each with one request in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Lengths are drawn from len × [1 − r, 1 + r] (output lengths: with the uniform
    /// --output-len-dist).
    #[arg(long, default_value_t = 0.0)]
    pub range_ratio: f64,
    /// How output lengths spread: `uniform` (--range-ratio) or `exponential` (mean
    /// --output-len, the long tail of chat traffic; at most 8 × --output-len).
    #[arg(long, default_value = "uniform")]
    pub output_len_dist: OutputLenDist,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Percentiles to report.
    #[arg(long, value_delimiter = ',', default_value = "50,95,99")]
    pub percentiles: Vec<f64>,
    /// SLOs for goodput: ttft:MS tpot:MS e2el:MS (as `tokenmill bench`).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Write every figure and per-request record here (the JSON of `tokenmill bench`).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

pub fn run(args: BenchEngineArgs) -> anyhow::Result<()> {
    let (handle, path) = args.engine.start()?;
    let vocab = crate::model_path::tokenizer(&path)?.vocab_size();
    let work = random_workload(
        args.num_prompts,
        args.input_len,
        args.output_len,
        args.range_ratio,
        args.output_len_dist,
        vocab,
        args.seed,
    );
    let params = RequestParams {
        sampling: SamplingParams::greedy(),
        ..RequestParams::default()
    };
    let (records, duration) = run_closed_loop(&handle, &work, args.concurrency, &params);
    let slo = Slo::parse(&args.goodput).map_err(anyhow::Error::msg)?;
    let mut summary = Summary::with_slo(&records, duration, &args.percentiles, &slo);
    summary.max_concurrency = Some(args.concurrency);
    let title = format!(
        "{:?} batching, concurrency {}",
        args.engine.batching, args.concurrency
    );
    println!("{}", summary.render(&title));
    if let Some(path) = &args.json {
        let result = RunResult { summary, records };
        std::fs::write(path, serde_json::to_string_pretty(&result.to_json())?)?;
    }
    let step = handle.stats();
    let t = &step.scheduler.step_time;
    println!(
        "engine steps: {}  preemptions: {}  step time predicted vs measured: mean abs error {:.2} ms, P95 measured/predicted {:.3}",
        step.steps, step.scheduler.num_preemptions, t.mean_abs_error_ms, t.tail_ratio
    );
    println!(
        "{}",
        kv_occupancy_line(&step.scheduler.kv_occupancy, step.kv_bytes_per_token)
    );
    Ok(())
}

/// The paged allocator's occupancy over the run: the peak of the running requests' KV blocks
/// against the positions they filled, and the mean share of allocated slots left unfilled.
fn kv_occupancy_line(o: &KvOccupancy, bytes_per_token: usize) -> String {
    let mib = |slots: usize| (slots * bytes_per_token) as f64 / (1 << 20) as f64;
    let pct = |part: usize| 100.0 * part as f64 / o.peak_allocated.max(1) as f64;
    format!(
        "KV cache at its peak: {:.1} MiB allocated for {:.1} MiB of tokens ({} slots for {}), waste {:.2} MiB ({:.2}%); mean waste over {} steps {:.2}%",
        mib(o.peak_allocated),
        mib(o.used_at_peak),
        o.peak_allocated,
        o.used_at_peak,
        mib(o.waste_at_peak()),
        pct(o.waste_at_peak()),
        o.samples,
        100.0 * o.mean_waste_fraction()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_line_reports_peak_bytes_and_waste() {
        let mut o = KvOccupancy::default();
        // 2 requests in blocks of 16: 64 slots for 49 positions, 1 MiB a token.
        o.record(16, [(3, 33), (1, 16)].into_iter());
        let line = kv_occupancy_line(&o, 1 << 20);
        assert!(
            line.contains("64.0 MiB allocated for 49.0 MiB of tokens (64 slots for 49), waste 15.00 MiB (23.44%)"),
            "{line}"
        );
        assert!(line.contains("mean waste over 1 steps 23.44%"), "{line}");
    }
}
