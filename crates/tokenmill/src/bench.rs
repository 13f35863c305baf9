//! `tokenmill bench`: a `vllm bench serve`-style load test of any OpenAI-compatible server
//! (tokenmill, llama.cpp's `llama-server`, vLLM) over real HTTP with streaming SSE.
//!
//! This file only turns flags into the bench crate's types and prints: a single run, an SLA
//! sweep (`--sweep-concurrency` / `--sweep-request-rate`, with plots in `--plot-dir`), or a
//! side-by-side comparison (`--compare-url`, A B A B for `--rounds`). Prompts come from the
//! model's tokenizer (`--model-path`/`--tokenizer`, default: the default model), so random
//! prompts have exact token lengths. For the engine alone, without HTTP, see `bench-engine`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokenmill_bench::arrival::Arrival;
use tokenmill_bench::client::{Endpoint, RequestOptions, Target, served_model};
use tokenmill_bench::dataset::{
    OutputLenDist, PromptFormat, RandomSpec, file_prompts, random_prompts,
};
use tokenmill_bench::memory::MemorySource;
use tokenmill_bench::report::{Sla, render_compare, render_sweep};
use tokenmill_bench::runner::{
    BenchError, RunResult, RunSpec, Workload, run_compare, run_points, stdout_is_terminal,
};
use tokenmill_bench::stats::{Slo, Summary};
use tokenmill_tokenizer::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The server under test.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub base_url: String,
    /// /v1/completions or /v1/chat/completions.
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: Endpoint,
    #[arg(long, env = "OPENAI_API_KEY")]
    pub api_key: Option<String>,
    /// Served model name (default: the first one GET /v1/models lists).
    #[arg(long)]
    pub model: Option<String>,
    /// GGUF file or tokenizer.json folder whose tokenizer builds the prompts (default: the
    /// default model).
    #[arg(long, visible_alias = "tokenizer")]
    pub model_path: Option<PathBuf>,
    /// tokens: prompts as token-id lists (exact lengths, /v1/completions); text: decoded text.
    #[arg(long, default_value = "tokens")]
    pub prompt_format: PromptFormat,
    /// A JSONL ({"prompt", "output_len"}) or ShareGPT JSON file instead of random prompts.
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Requests sent first at the same concurrency and left out of every figure.
    #[arg(long, default_value_t = 0)]
    pub num_warmups: usize,
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Output tokens per request (overrides a dataset file's lengths when given).
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Lengths are drawn from len × [1 − r, 1 + r] (output lengths: with the uniform
    /// --output-len-dist).
    #[arg(long, default_value_t = 0.0)]
    pub range_ratio: f64,
    /// How random output lengths spread: `uniform` (--range-ratio) or `exponential` (mean
    /// --output-len, the long tail of chat traffic; at most 8 × --output-len).
    #[arg(long, default_value = "uniform")]
    pub output_len_dist: OutputLenDist,
    /// Tokens of a prefix shared by every random prompt (added to --input-len).
    #[arg(long, default_value_t = 0)]
    pub prefix_len: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Closed loop: this many requests always in flight (default when no --request-rate: 1).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: requests per second (Poisson; see --burstiness). Default: unlimited.
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Gamma shape of the gaps between requests: 1 = Poisson, < 1 burstier.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// With --request-rate: at most this many requests in flight.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    #[arg(long, value_delimiter = ',', default_value = "50,95,99")]
    pub percentiles: Vec<f64>,
    /// SLOs for goodput: ttft:MS tpot:MS e2el:MS.
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// PID of a local server to sample memory from (/proc/PID/status).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Sample process_resident_memory_bytes from the server's /metrics.
    #[arg(long)]
    pub server_metrics: bool,
    /// Write every figure and per-request record here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Send ignore_eos so outputs have exactly the asked length.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub ignore_eos: bool,
    /// Also send min_tokens = max_tokens (vLLM, tokenmill).
    #[arg(long)]
    pub min_tokens: bool,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// A JSON object merged into every request body, e.g. a structured-output constraint:
    /// '{"response_format": {"type": "json_object"}}'.
    #[arg(long, value_parser = parse_extra_body)]
    pub extra_body: Option<serde_json::Map<String, serde_json::Value>>,
    /// Client-side timeout of one request, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout_s: f64,
    /// SLA sweep over these concurrencies (closed loop, or caps with --request-rate).
    #[arg(long, value_delimiter = ',', conflicts_with = "sweep_request_rate")]
    pub sweep_concurrency: Vec<usize>,
    /// SLA sweep over these request rates.
    #[arg(long, value_delimiter = ',')]
    pub sweep_request_rate: Vec<f64>,
    /// SLA limit on P95 TTFT for the sweep's best point.
    #[arg(long)]
    pub sla_ttft_ms: Option<f64>,
    /// SLA limit on P95 TPOT for the sweep's best point.
    #[arg(long)]
    pub sla_tpot_ms: Option<f64>,
    /// Draw PNG and SVG plots here (sweeps, and the TTFT CDF of a single run).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// A second server: run the same workload on both, interleaved A B A B.
    #[arg(long, conflicts_with_all = ["sweep_concurrency", "sweep_request_rate"])]
    pub compare_url: Option<String>,
    /// Served model name on --compare-url (default: its first listed model).
    #[arg(long)]
    pub compare_model: Option<String>,
    /// PID of the --compare-url server, for its memory.
    #[arg(long)]
    pub compare_server_pid: Option<u32>,
    /// Rounds of A B with --compare-url (each round has its own seed).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
}

impl BenchArgs {
    fn arrival(&self, concurrency: Option<usize>, rate: Option<f64>) -> Arrival {
        match (rate.or(self.request_rate), concurrency) {
            (None, c) => Arrival::Closed {
                concurrency: c.or(self.concurrency).or(self.max_concurrency).unwrap_or(1),
            },
            (Some(rate), c) => Arrival::Open {
                rate,
                burstiness: self.burstiness,
                max_concurrency: c.or(self.max_concurrency).or(self.concurrency),
            },
        }
    }

    fn spec(&self) -> anyhow::Result<RunSpec> {
        let mut percentiles = self.percentiles.clone();
        if percentiles.iter().any(|p| !(0.0..=100.0).contains(p)) {
            bail!("--percentiles must be within 0..=100");
        }
        if !percentiles.contains(&95.0) {
            percentiles.push(95.0); // the SLA percentile; printed too
        }
        Ok(RunSpec {
            arrival: self.arrival(None, None),
            options: RequestOptions {
                ignore_eos: self.ignore_eos,
                min_tokens: self.min_tokens,
                temperature: self.temperature,
                extra_body: self.extra_body.clone().unwrap_or_default(),
            },
            percentiles,
            slo: Slo::parse(&self.goodput).map_err(anyhow::Error::msg)?,
            memory: self.memory(&self.base_url, self.server_pid),
            seed: self.seed,
            progress: stdout_is_terminal(),
        })
    }

    fn memory(&self, base: &str, pid: Option<u32>) -> MemorySource {
        MemorySource {
            pid,
            metrics_url: self
                .server_metrics
                .then(|| format!("{}/metrics", base.trim_end_matches('/'))),
        }
    }

    fn sla(&self) -> Sla {
        Sla {
            ttft_ms: self.sla_ttft_ms,
            tpot_ms: self.sla_tpot_ms,
        }
    }
}

/// `(warm-ups, prompts)` for a seed, from the flags.
fn workload<'a>(args: &'a BenchArgs, tok: &'a Tokenizer) -> Box<Workload<'a>> {
    Box::new(move |seed| {
        let n = args.num_warmups + args.num_prompts;
        let mut all = match &args.dataset_path {
            Some(path) => file_prompts(path, n, args.output_len, seed, tok)?,
            None => {
                let spec = RandomSpec {
                    num_prompts: n,
                    input_len: args.input_len,
                    output_len: args.output_len.unwrap_or(128),
                    range_ratio: args.range_ratio,
                    output_dist: args.output_len_dist,
                    prefix_len: args.prefix_len,
                    seed,
                };
                random_prompts(&spec, tok, args.prompt_format)?
            }
        };
        if all.len() <= args.num_warmups {
            return Err(BenchError::Invalid(
                "no prompt left after the warm-ups".into(),
            ));
        }
        let prompts = all.split_off(args.num_warmups);
        Ok((all, prompts))
    })
}

pub fn run_cli(args: BenchArgs) -> anyhow::Result<()> {
    let tok = crate::model_path::tokenizer(&crate::model_path::resolve(args.model_path.clone())?)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_async(&args, &tok))
}

async fn target(
    c: &reqwest::Client,
    args: &BenchArgs,
    url: &str,
    model: &Option<String>,
) -> anyhow::Result<Target> {
    let model = match model {
        Some(m) => m.clone(),
        None => served_model(c, url, args.api_key.as_deref())
            .await
            .map_err(anyhow::Error::msg)?,
    };
    Ok(Target {
        base_url: url.to_string(),
        endpoint: args.endpoint,
        api_key: args.api_key.clone(),
        model,
    })
}

async fn run_async(args: &BenchArgs, tok: &Tokenizer) -> anyhow::Result<()> {
    if !(args.request_timeout_s > 0.0 && args.request_timeout_s.is_finite()) {
        bail!("--request-timeout-s must be positive");
    }
    // A fresh connection per request (no idle pool): reusing a keep-alive connection the
    // server is closing (llama-server closes one after a few requests) fails the request
    // with "error sending request", which is the client's fault, not the server's.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(args.request_timeout_s))
        .pool_max_idle_per_host(0)
        .build()?;
    let a = target(&client, args, &args.base_url, &args.model).await?;
    let spec = args.spec()?;
    let work = workload(args, tok);
    let config = json!({
        "base_url": args.base_url, "endpoint": args.endpoint.path(), "model": a.model,
        "num_prompts": args.num_prompts, "num_warmups": args.num_warmups,
        "input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio,
        "prefix_len": args.prefix_len, "seed": args.seed, "dataset_path": args.dataset_path,
        "burstiness": args.burstiness, "goodput": spec.slo,
    });
    let out = if let Some(url) = &args.compare_url {
        let b = target(&client, args, url, &args.compare_model).await?;
        let mem = [
            spec.memory.clone(),
            args.memory(url, args.compare_server_pid),
        ];
        let [ra, rb] = run_compare(&client, [&a, &b], mem, &*work, args.rounds, &spec).await?;
        let sums = |r: &[RunResult]| r.iter().map(|r| r.summary.clone()).collect::<Vec<_>>();
        println!(
            "{}",
            render_compare([&args.base_url, url], &sums(&ra), &sums(&rb))
        );
        let runs = |r: &[RunResult]| r.iter().map(RunResult::to_json).collect::<Vec<_>>();
        json!({"config": config, "compare_url": url, "a": runs(&ra), "b": runs(&rb)})
    } else {
        let (x_name, xs, arrivals) = sweep_points(args);
        let results = run_points(&client, &a, &*work, &arrivals, &spec).await?;
        for (x, r) in xs.iter().zip(&results) {
            let title = match x_name {
                Some(n) => format!(" Serving Benchmark Result ({n} {x}) "),
                None => " Serving Benchmark Result ".to_string(),
            };
            println!("{}", r.summary.render(title.trim()));
        }
        let sums: Vec<Summary> = results.iter().map(|r| r.summary.clone()).collect();
        if let Some(n) = x_name {
            println!("{}", render_sweep(n, &xs, &sums, &args.sla()));
        }
        if let Some(dir) = &args.plot_dir {
            let files = tokenmill_bench::plot::sweep_plots(
                dir,
                x_name.unwrap_or("run"),
                &xs,
                &results,
                &args.sla(),
            )?;
            eprintln!("plots: {}", files.len());
        }
        let points: Vec<Value> = xs
            .iter()
            .zip(&results)
            .map(|(x, r)| json!({"x": x, "result": r.to_json()}))
            .collect();
        match x_name {
            Some(n) => json!({"config": config, "sweep": n, "points": points}),
            None => json!({"config": config, "result": results[0].to_json()}),
        }
    };
    if let Some(path) = &args.json {
        write_json(path, &out)?;
    }
    Ok(())
}

/// The swept name, the x values and their arrivals (one point when not sweeping).
fn sweep_points(args: &BenchArgs) -> (Option<&'static str>, Vec<f64>, Vec<Arrival>) {
    if !args.sweep_concurrency.is_empty() {
        let xs = args.sweep_concurrency.iter().map(|&c| c as f64).collect();
        let arr = args
            .sweep_concurrency
            .iter()
            .map(|&c| args.arrival(Some(c), None))
            .collect();
        (Some("concurrency"), xs, arr)
    } else if !args.sweep_request_rate.is_empty() {
        let arr = args
            .sweep_request_rate
            .iter()
            .map(|&r| args.arrival(None, Some(r)))
            .collect();
        (Some("request rate"), args.sweep_request_rate.clone(), arr)
    } else {
        (None, vec![0.0], vec![args.arrival(None, None)])
    }
}

fn write_json(path: &Path, v: &Value) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// `--extra-body`: a JSON object.
fn parse_extra_body(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err("--extra-body must be a JSON object".into()),
        Err(e) => Err(format!("--extra-body is not JSON: {e}")),
    }
}
