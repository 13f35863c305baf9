//! The `tokenmill` command line: generate, tokenize, inspect.

mod generate;
mod inspect;
mod model_path;

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
    /// Print a GGUF file's metadata and tensor table.
    Inspect { path: PathBuf },
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
        Command::Inspect { path } => inspect::run(&path),
    }
}
