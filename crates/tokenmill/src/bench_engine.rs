//! `tokenmill bench-engine`: a closed-loop load on the engine in-process (no HTTP), reported
//! in `vllm bench serve`'s labels — to compare batching modes and SLA targets on the engine
//! alone.

use tokenmill_bench::dataset::OutputLenDist;
use tokenmill_bench::inprocess::{random_workload, run_closed_loop};
use tokenmill_bench::runner::RunResult;
use tokenmill_bench::stats::{Slo, Summary};
use tokenmill_engine::{RequestParams, SamplingParams};

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
    Ok(())
}
