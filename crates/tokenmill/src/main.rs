//! The `tokenmill` command line: generate, tokenize, inspect.

mod bench_engine;
mod bench_model;
mod engine_args;
mod generate;
mod inspect;
mod model_path;
mod serve;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tokenmill_gguf::GgufFile;
use tokenmill_tokenizer::Tokenizer;

#[derive(Parser, Debug)]
#[command(
    name = "tokenmill",
    version,
    about = "A fast LLM inference engine and server for CPUs"
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
        /// GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched if missing).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Do not add the BOS/EOS tokens the model's metadata asks for.
        #[arg(long)]
        no_special: bool,
        text: String,
    },
    /// Measure raw model speed: prefill, single-stream and batched decode (like llama-bench).
    BenchModel(bench_model::BenchModelArgs),
    /// Load-test the engine in-process (no HTTP): throughput and TTFT/TPOT percentiles.
    BenchEngine(bench_engine::BenchEngineArgs),
    /// Print a GGUF file's metadata and tensor table.
    Inspect { path: PathBuf },
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
            let file = GgufFile::open(model_path::resolve(model)?)?;
            let ids = Tokenizer::from_gguf(&file)?.encode(&text, !no_special)?;
            println!("{}", serde_json::to_string(&ids)?);
            Ok(())
        }
        Command::BenchModel(args) => bench_model::run(args),
        Command::BenchEngine(args) => bench_engine::run(args),
        Command::Inspect { path } => inspect::run(&path),
        Command::Serve(args) => serve::run(*args),
        Command::TokenizerServer(args) => serve::run_tokenizer_server(args),
    }
}

/// Sizes the kernels' thread pool before first use (default: every core).
pub fn init_threads(threads: Option<usize>) {
    if let Some(n) = threads
        && !tokenmill_kernels::pool::set_num_threads(n.max(1))
    {
        eprintln!("warning: the thread pool was already started; --threads {n} is ignored");
    }
}
