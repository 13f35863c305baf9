//! `tokenmill perplexity`: a model's perplexity on a text file, by `llama-perplexity`'s method,
//! so the two tools' figures compare directly and a quantization's cost reads as a PPL change.
//!
//! The file is tokenized as one text (BOS added when the model's metadata asks). It is cut into
//! `--chunks` (default: all whole) chunks of `--ctx-size` tokens; each chunk is a fresh context
//! whose first token becomes BOS when the model adds one. Only the second half of each chunk is
//! scored: position `j` (from `ctx/2` to `ctx − 2`) predicts token `j + 1`, so every scored
//! token has at least `ctx/2` tokens of context. `PPL = exp(mean NLL)`; its standard error is
//! `PPL · sqrt(var(NLL) / (N − 1))` over the `N` scored tokens — `llama-perplexity`'s
//! "Final estimate: PPL = X +/- Y".

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use tokenmill_model::{LogitsWanted, Model, SeqChunk, Workspace};

use crate::engine_args::KvDtypeArg;

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    /// The text to score (UTF-8; e.g. wikitext-2's `wiki.test.raw`).
    pub file: PathBuf,
    /// GGUF file, Hugging Face folder, or Hugging Face id `ORG/NAME[:QUANT]` from the local
    /// hub cache (default: SmolLM2-135M-Instruct Q4_1, fetched if missing).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Tokens per chunk (llama.cpp's `-c`).
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx_size: usize,
    /// Chunks to score (default: every whole chunk of the file).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Tokens per forward pass within a chunk (llama.cpp's `-b`).
    #[arg(long, short = 'b', default_value_t = 512)]
    pub batch_size: usize,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Bits of the activation quants the integer matmuls take: 12 (default) or 8.
    #[arg(long, value_enum, default_value = "12")]
    pub activation_bits: crate::engine_args::ActivationBits,
    /// What the KV cache stores per element (f16 by default, as llama.cpp's; f32 is the
    /// reference numerics).
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache_dtype: KvDtypeArg,
    /// Print the result as one JSON object on stdout (the per-chunk lines go to stderr).
    #[arg(long)]
    pub json: bool,
}

const BLOCK_SIZE: usize = 16;

/// Running sums of the scored tokens' negative log-likelihoods.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NllSums {
    pub count: usize,
    pub sum: f64,
    pub sum_sq: f64,
}

impl NllSums {
    /// Adds the NLL of `target` under one row of logits.
    pub fn add_row(&mut self, logits: &[f32], target: u32) {
        let nll = nll(logits, target as usize);
        self.count += 1;
        self.sum += nll;
        self.sum_sq += nll * nll;
    }

    /// `(PPL, its standard error)`, as `llama-perplexity` computes them.
    pub fn estimate(&self) -> (f64, f64) {
        let n = self.count.max(1) as f64;
        let mean = self.sum / n;
        let ppl = mean.exp();
        let var = self.sum_sq / n - mean * mean;
        let err = if self.count > 1 && var > 0.0 {
            ppl * (var / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        (ppl, err)
    }
}

/// `−log softmax(logits)[target]`, in f64.
fn nll(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    sum.ln() + max - logits[target] as f64
}

pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    crate::init_threads(args.threads, args.activation_bits);
    if args.ctx_size < 4 {
        bail!("--ctx-size must be at least 4");
    }
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let path = crate::model_path::resolve(args.model.clone())?;
    let tokenizer = crate::model_path::tokenizer(&path)?;
    let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
    eprintln!("kernels: {}", crate::kernels_summary());
    if args.ctx_size > model.context_length() {
        bail!(
            "--ctx-size {} is longer than the model's context ({})",
            args.ctx_size,
            model.context_length()
        );
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let tokens = tokenizer.encode(&text, true)?;
    let ctx = args.ctx_size;
    let whole = tokens.len() / ctx;
    let n_chunks = args.chunks.map_or(whole, |c| c.min(whole));
    if n_chunks == 0 {
        bail!(
            "{} has {} tokens, fewer than one chunk of --ctx-size {ctx}",
            args.file.display(),
            tokens.len()
        );
    }
    let bos = tokenizer
        .bos_token_id()
        .filter(|_| tokenizer.add_bos_token());
    let first = ctx / 2;
    eprintln!(
        "perplexity: {} tokens, {n_chunks} chunks of {ctx}, scoring {} tokens per chunk",
        tokens.len(),
        ctx - 1 - first
    );

    let num_blocks = ctx.div_ceil(BLOCK_SIZE);
    let mut kv = model.kv_cache_with_dtype(num_blocks, BLOCK_SIZE, args.kv_cache_dtype.into());
    let table: Vec<u32> = (0..num_blocks as u32).collect();
    let mut ws = Workspace::default();
    let vocab = model.vocab_size();
    let mut sums = NllSums::default();
    let mut chunk = vec![0u32; ctx];
    let t = Instant::now();
    let mut err = std::io::stderr().lock();
    for i in 0..n_chunks {
        chunk.copy_from_slice(&tokens[i * ctx..(i + 1) * ctx]);
        if let Some(b) = bos {
            chunk[0] = b;
        }
        for start in (0..ctx).step_by(args.batch_size) {
            let end = (start + args.batch_size).min(ctx);
            let wanted = if end > first {
                LogitsWanted::All
            } else {
                LogitsWanted::None
            };
            let c = SeqChunk {
                tokens: &chunk[start..end],
                start_pos: start,
                block_table: &table,
                logits: wanted,
            };
            let logits = model.forward(&[c], &mut kv, &mut ws)?;
            if wanted == LogitsWanted::None {
                continue;
            }
            // Row r is position start + r and predicts token start + r + 1.
            for pos in start.max(first)..end.min(ctx - 1) {
                let row = &logits[(pos - start) * vocab..(pos - start + 1) * vocab];
                sums.add_row(row, chunk[pos + 1]);
            }
        }
        let (ppl, _) = sums.estimate();
        write!(err, "[{}]{ppl:.4},", i + 1)?;
        err.flush()?;
    }
    writeln!(err)?;
    let secs = t.elapsed().as_secs_f64();
    let (ppl, ppl_err) = sums.estimate();
    eprintln!(
        "{:.1} s, {:.0} tok/s evaluated",
        secs,
        (n_chunks * ctx) as f64 / secs
    );
    if args.json {
        let v = serde_json::json!({
            "model": path.display().to_string(),
            "file": args.file.display().to_string(),
            "ctx_size": ctx,
            "chunks": n_chunks,
            "tokens_scored": sums.count,
            "nll_mean": sums.sum / sums.count.max(1) as f64,
            "ppl": ppl,
            "ppl_err": ppl_err,
        });
        println!("{v}");
    } else {
        println!("Final estimate: PPL = {ppl:.4} +/- {ppl_err:.5}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_minus_log_softmax() {
        // Uniform over 4: NLL = ln 4 for any target.
        assert!((nll(&[0.5; 4], 2) - 4f64.ln()).abs() < 1e-12);
        // Large logits do not overflow.
        let row = [1000.0, 0.0];
        assert!(nll(&row, 0).abs() < 1e-12);
        assert!((nll(&row, 1) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn estimate_matches_llama_perplexity_formula() {
        let mut s = NllSums::default();
        // Two rows whose NLLs are ln 2 and ln 8: mean ln 4, PPL 4.
        s.add_row(&[0.0, 0.0], 0);
        s.add_row(&[0.0; 8], 3);
        let (ppl, err) = s.estimate();
        assert!((ppl - 4.0).abs() < 1e-9);
        let (a, b) = (2f64.ln(), 8f64.ln());
        let mean = (a + b) / 2.0;
        let var = (a * a + b * b) / 2.0 - mean * mean;
        assert!((err - 4.0 * (var / 1.0).sqrt()).abs() < 1e-9);
        assert_eq!(NllSums::default().estimate().1, 0.0);
    }
}
