//! `tokenmill quantize IN OUT --type T`: the command line of [`tokenmill_convert`] — an
//! F32/F16/BF16 GGUF, or a Hugging Face folder, to a GGUF that tokenmill and llama.cpp both
//! load. This file maps the flags to [`QuantizeOptions`] and prints a line per converted
//! tensor and a summary to stderr; the type rules, the Q/K permutation, the tokenizer
//! metadata and their errors are the library's.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use tokenmill_convert::{QuantizeOptions, TargetType, TensorReport};

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// Source: a GGUF (F32/F16/BF16 weights) or a Hugging Face folder (Llama, Mistral, Qwen2).
    pub input: PathBuf,
    /// Where to write the quantized GGUF.
    pub output: PathBuf,
    /// Target type of the weight matrices.
    #[arg(long = "type", ignore_case = true, value_parser = target_type_parser())]
    pub ty: TargetType,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also convert tensors that are already quantized (dequantized first; the errors add
    /// up), as llama-quantize's flag of the same name.
    #[arg(long)]
    pub allow_requantize: bool,
}

/// `--type`: one of the library's target names (listed in `--help` and in the error for an
/// unknown one), any ASCII case.
fn target_type_parser() -> impl TypedValueParser<Value = TargetType> {
    PossibleValuesParser::new(TargetType::names()).try_map(|name| name.parse::<TargetType>())
}

pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let mut options = QuantizeOptions::new(args.ty);
    options.allow_requantize = args.allow_requantize;
    if let Some(threads) = args.threads {
        options.threads = threads;
    }
    let report =
        tokenmill_convert::quantize_with_progress(&args.input, &args.output, &options, print)?;
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    eprintln!(
        "wrote {}: {:.2} MiB of tensors -> {:.2} MiB",
        args.output.display(),
        mib(report.bytes_in()),
        mib(report.bytes_out())
    );
    Ok(())
}

/// One line per tensor whose type changed.
fn print(t: &TensorReport) {
    if t.from != t.to {
        eprintln!("{:<40} {:>5} -> {:<5} {:?}", t.name, t.from, t.to, t.dims);
    }
}
