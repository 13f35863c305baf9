//! `tokenmill generate`: one prompt, streamed to stdout, with prefill/decode speed on stderr.
//!
//! Runs the model directly (one sequence, blocks `0..n` of a private KV cache): the prompt is
//! prefilled as one chunk, then one token per step is sampled, streamed through the
//! incremental detokenizer, until `--max-tokens` or a stop token. Any [`Model`] runs: a
//! Llama-family model over the paged K/V cache or DeepSeek over its latent cache.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use tokenmill_engine::{Sampler, SamplingParams};
use tokenmill_model::{LogitsWanted, Model, SeqChunk};
use tokenmill_tokenizer::ChatMessage;

use crate::engine_args::KvDtypeArg;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// GGUF model file or Hugging Face folder (default: SmolLM2-135M-Instruct Q4_1, fetched
    /// if missing).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// RNG seed, for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// What the KV cache stores per element.
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_cache_dtype: KvDtypeArg,
}

const BLOCK_SIZE: usize = 16;

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if !(args.temperature >= 0.0 && args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--temperature must be ≥ 0 and --top-p in (0, 1]");
    }
    crate::init_threads(args.threads);
    let path = crate::model_path::resolve(args.model)?;
    let tokenizer = crate::model_path::tokenizer(&path)?;
    for warning in tokenizer.warnings() {
        eprintln!("warning: {warning}");
    }
    let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
    let context_length = model.context_length();

    let prompt_ids = if args.chat {
        let template = tokenizer
            .chat_template()
            .context("the model has no chat template")?;
        let msg = ChatMessage {
            role: "user".into(),
            content: args.prompt.clone(),
        };
        let text = template.render(&[msg], true)?;
        tokenizer.encode(&text, false)?
    } else {
        tokenizer.encode(&args.prompt, true)?
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    if prompt_ids.len() >= context_length {
        bail!(
            "the prompt has {} tokens; the context is {context_length}",
            prompt_ids.len(),
        );
    }
    let max_tokens = args.max_tokens.min(context_length - prompt_ids.len());
    let num_blocks = (prompt_ids.len() + max_tokens).div_ceil(BLOCK_SIZE);
    let mut kv = model.kv_cache_with_dtype(num_blocks, BLOCK_SIZE, args.kv_cache_dtype.into());
    let block_table: Vec<u32> = (0..num_blocks as u32).collect();
    let mut ws = model.workspace(prompt_ids.len(), 1);
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        ..SamplingParams::default()
    };
    let mut sampler = Sampler::with_prompt(params, &prompt_ids);
    let mut decoder = tokenizer.decoder();
    let mut out = std::io::stdout().lock();

    let t0 = Instant::now();
    let chunk = SeqChunk {
        tokens: &prompt_ids,
        start_pos: 0,
        block_table: &block_table,
        logits: LogitsWanted::Last,
    };
    let mut next = sampler
        .sample(model.forward(&[chunk], &mut kv, &mut ws)?, &[])
        .token;
    let prefill = t0.elapsed();

    let t1 = Instant::now();
    let mut generated = 0;
    let mut pos = prompt_ids.len();
    loop {
        generated += 1;
        if !args.ignore_eos && tokenizer.stop_token_ids().contains(&next) {
            break;
        }
        write!(out, "{}", decoder.push(&tokenizer, next)?)?;
        out.flush()?;
        if generated == max_tokens {
            break;
        }
        let tokens = [next];
        let chunk = SeqChunk {
            tokens: &tokens,
            start_pos: pos,
            block_table: &block_table,
            logits: LogitsWanted::Last,
        };
        next = sampler
            .sample(model.forward(&[chunk], &mut kv, &mut ws)?, &[])
            .token;
        pos += 1;
    }
    writeln!(out, "{}", decoder.flush(&tokenizer)?)?;
    out.flush()?;
    let decode = t1.elapsed();
    // The first token comes from the prefill; decode steps made the other `generated - 1`.
    let decode_steps = generated.saturating_sub(1);
    eprintln!(
        "prefill: {} tokens in {:.1} ms ({:.1} tok/s) | decode: {} tokens in {:.1} ms ({:.1} tok/s)",
        prompt_ids.len(),
        prefill.as_secs_f64() * 1e3,
        prompt_ids.len() as f64 / prefill.as_secs_f64(),
        decode_steps,
        decode.as_secs_f64() * 1e3,
        decode_steps as f64 / decode.as_secs_f64().max(1e-9),
    );
    Ok(())
}
