//! The `tokenmill` command line: generate, tokenize, inspect.

mod bench;
mod bench_engine;
mod bench_model;
mod engine_args;
mod generate;
mod hf_cache;
mod inspect;
mod model_path;
mod perplexity;
mod profile;
mod quantize;
mod serve;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "tokenmill",
    version,
    about = "A fast LLM inference engine and server for CPUs",
    // A flag given twice: the last wins (as vLLM's argparse flags do), so scripts can append
    // overrides to a base command line.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a completion for one prompt, streamed to stdout.
    Generate(generate::GenerateArgs),
    /// Print the token ids of TEXT as a JSON array.
    Tokenize {
        /// GGUF file, Hugging Face folder, or Hugging Face id `ORG/NAME[:QUANT]` from the local
        /// hub cache (default: SmolLM2-135M-Instruct Q4_1, fetched if missing).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Do not add the BOS/EOS tokens the model's metadata asks for.
        #[arg(long)]
        no_special: bool,
        text: String,
    },
    /// Measure raw model speed: prefill, single-stream and batched decode (like llama-bench).
    BenchModel(bench_model::BenchModelArgs),
    /// Load-test an OpenAI-compatible server over HTTP, like `vllm bench serve`.
    Bench(Box<bench::BenchArgs>),
    /// Load-test the engine in-process (no HTTP): throughput and TTFT/TPOT percentiles.
    BenchEngine(Box<bench_engine::BenchEngineArgs>),
    /// Trace an in-process workload (Chrome/Perfetto JSON); `profile report TRACE` analyses one.
    Profile(Box<profile::ProfileArgs>),
    /// A model's perplexity on a text file (llama-perplexity's method: second-half scoring of
    /// --ctx-size chunks; PPL ± its standard error).
    Perplexity(perplexity::PerplexityArgs),
    /// Print a GGUF file's metadata and tensor table.
    Inspect { path: PathBuf },
    /// Quantize an F32/F16/BF16 GGUF model or a Hugging Face folder into a GGUF
    /// (llama.cpp-compatible).
    Quantize(quantize::QuantizeArgs),
    /// Serve the model over an OpenAI/vLLM-compatible HTTP API (default 127.0.0.1:8080).
    Serve(Box<serve::ServeArgs>),
    /// Serve tokenize/detokenize/chat-render over gRPC (for `serve --tokenizer-endpoint`).
    TokenizerServer(serve::TokenizerServerArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Generate(args) => generate::run(args),
        Command::Tokenize {
            model,
            no_special,
            text,
        } => {
            let tokenizer = model_path::tokenizer(&model_path::resolve(model)?)?;
            let ids = tokenizer.encode(&text, !no_special)?;
            println!("{}", serde_json::to_string(&ids)?);
            Ok(())
        }
        Command::BenchModel(args) => bench_model::run(args),
        Command::Bench(args) => bench::run_cli(*args),
        Command::BenchEngine(args) => bench_engine::run(*args),
        Command::Profile(args) => profile::run(*args),
        Command::Inspect { path } => inspect::run(&path),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::TokenizerServer(args) => serve::run_tokenizer_server(args),
    }
}

/// Sizes the kernels' thread pool before first use (default: every core), and fixes the
/// kernel table: its tier when `TOKENMILL_KERNELS` names one (`amx`, `avx512-vnni`,
/// `avx-vnni`, `avx2`, `scalar`; default: the best this CPU supports), and 8-bit activations
/// for `--activation-bits 8`.
pub fn init_threads(threads: Option<usize>, bits: engine_args::ActivationBits) {
    use tokenmill_kernels::dispatch::{Tier, init_kernels_with, kernels};
    if let Some(n) = threads
        && !tokenmill_kernels::pool::set_num_threads(n.max(1))
    {
        eprintln!("warning: the thread pool was already started; --threads {n} is ignored");
    }
    let a8 = bits == engine_args::ActivationBits::Eight;
    let named = std::env::var("TOKENMILL_KERNELS").ok();
    if named.is_none() && !a8 {
        return;
    }
    let tier = match named.as_deref().map(|n| (n, Tier::from_name(n))) {
        Some((_, Some(t))) if t.is_supported() => t,
        Some((_, Some(t))) => {
            eprintln!("warning: TOKENMILL_KERNELS={t}: not supported here; ignored");
            Tier::best()
        }
        Some((name, None)) => {
            eprintln!("warning: TOKENMILL_KERNELS={name}: no such kernel tier; ignored");
            Tier::best()
        }
        None => Tier::best(),
    };
    if !init_kernels_with(tier, a8) {
        eprintln!(
            "warning: the kernel table was already chosen ({}); {tier} with {}-bit activations is ignored",
            kernels().tier(),
            if a8 { 8 } else { 12 }
        );
    } else if a8 && !kernels().runs_a8() {
        eprintln!(
            "warning: --activation-bits 8: the {} tier has no 8-bit kernels; activations stay 12-bit",
            kernels().tier()
        );
    }
}

/// Which kernel tier runs, and why not AMX when it is not (for logs and reports).
pub fn kernels_summary() -> String {
    use tokenmill_kernels::dispatch::{Tier, kernels};
    let tier = kernels().tier();
    let summary = match Tier::amx_status() {
        _ if tier == Tier::Amx && kernels().runs_a8() => {
            format!(
                "{tier} (8-bit activations run on its AVX-512 VNNI kernels; the tiles take 12-bit only)"
            )
        }
        _ if tier == Tier::Amx => format!(
            "{tier} (AMX int8 tiles from {} rows a matmul)",
            tokenmill_kernels::matmul::AMX_MIN_ROWS
        ),
        Ok(()) => format!("{tier} (AMX available; TOKENMILL_KERNELS chose {tier})"),
        Err(why) => format!("{tier} (no AMX: {why})"),
    };
    if kernels().runs_a8() {
        let at_12: Vec<String> = kernels()
            .rows16_types_at_12_bits()
            .iter()
            .map(|ty| ty.to_string())
            .collect();
        if at_12.is_empty() {
            format!("{summary}, 8-bit activations")
        } else {
            format!(
                "{summary}, 8-bit activations ({} weights at 12 bits: no 8-bit kernel on this tier)",
                at_12.join("/")
            )
        }
    } else {
        summary
    }
}
