//! `tokenmill generate`: one prompt, streamed to stdout, with prefill/decode speed on stderr.
//!
//! Runs the prompt as the only request of an in-process engine (the same
//! [`tokenmill_engine::launch`] as `serve`, with a KV cache just large enough for it) and
//! streams the tokens of its [`RequestStream`](tokenmill_engine::RequestStream) through the
//! incremental detokenizer: one decode loop and one stop rule, the engine's. Any model the
//! engine runs works: a Llama-family model over the paged K/V cache or DeepSeek over its
//! latent cache.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use tokenmill_engine::{
    EngineConfig, FinishReason, KvCacheMemory, KvDtype, RequestParams, SamplingParams, StreamEvent,
};
use tokenmill_model::Model;
use tokenmill_tokenizer::{ChatMessage, Tokenizer};

use crate::engine_args::KvDtypeArg;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// GGUF file, Hugging Face folder, or Hugging Face id `ORG/NAME[:QUANT]` from the local
    /// hub cache (default: SmolLM2-135M-Instruct Q4_1, fetched if missing).
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
    /// Bits of the activation quants the integer matmuls take: 12 (default) or 8.
    #[arg(long, value_enum, default_value = "12")]
    pub activation_bits: crate::engine_args::ActivationBits,
    /// What the KV cache stores per element (f16 by default, as llama.cpp's; f32 is the
    /// reference numerics).
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache_dtype: KvDtypeArg,
}

const BLOCK_SIZE: usize = 16;

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if !(args.temperature >= 0.0 && args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--temperature must be ≥ 0 and --top-p in (0, 1]");
    }
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    crate::init_threads(args.threads, args.activation_bits);
    let path = crate::model_path::resolve(args.model.clone())?;
    let tokenizer = crate::model_path::tokenizer(&path)?;
    for warning in tokenizer.warnings() {
        eprintln!("warning: {warning}");
    }
    let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
    let context_length = model.context_length();
    let prompt_ids = prompt_ids(&args, &tokenizer)?;
    if prompt_ids.len() >= context_length {
        bail!(
            "the prompt has {} tokens; the context is {context_length}",
            prompt_ids.len(),
        );
    }
    let max_tokens = args.max_tokens.min(context_length - prompt_ids.len());
    let config = engine_config(
        &model,
        prompt_ids.len(),
        max_tokens,
        args.kv_cache_dtype.into(),
    );
    let engine = tokenmill_engine::launch(&config, model)?;
    let params = request_params(&args, &tokenizer, max_tokens);
    let num_prompt = prompt_ids.len();
    let t0 = Instant::now();
    let mut stream = engine.handle.submit(prompt_ids, params);
    let mut decoder = tokenizer.decoder();
    let mut out = std::io::stdout().lock();
    let (mut generated, mut first) = (0usize, None);
    while let Some(event) = stream.blocking_next() {
        let t = match event {
            StreamEvent::Token(t) => t,
            StreamEvent::Error(e) => bail!("generation failed: {e}"),
            StreamEvent::PromptLogprobs { .. } | StreamEvent::Embedding(_) => continue,
        };
        generated += 1;
        first.get_or_insert_with(Instant::now);
        // A stop token ends the text; it is not part of it.
        if t.finish_reason != Some(FinishReason::Stop) {
            write!(out, "{}", decoder.push(&tokenizer, t.token)?)?;
            out.flush()?;
        }
    }
    writeln!(out, "{}", decoder.flush(&tokenizer)?)?;
    out.flush()?;
    let end = Instant::now();
    let first = first.unwrap_or(end);
    let (prefill, decode) = (first - t0, end - first);
    // The first token comes from the prefill; decode steps made the other `generated - 1`.
    let decode_steps = generated.saturating_sub(1);
    eprintln!(
        "prefill: {num_prompt} tokens in {:.1} ms ({:.1} tok/s) | decode: {decode_steps} tokens in {:.1} ms ({:.1} tok/s)",
        prefill.as_secs_f64() * 1e3,
        num_prompt as f64 / prefill.as_secs_f64(),
        decode.as_secs_f64() * 1e3,
        decode_steps as f64 / decode.as_secs_f64().max(1e-9),
    );
    Ok(())
}

/// The request: the sampling flags, and the model's stop tokens unless `--ignore-eos`.
fn request_params(args: &GenerateArgs, tokenizer: &Tokenizer, max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        eos_token_id: tokenizer.eos_token_id(),
        stop_token_ids: if args.ignore_eos {
            Vec::new()
        } else {
            tokenizer.stop_token_ids().to_vec()
        },
        ignore_eos: args.ignore_eos,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    }
}

/// An engine for this one request: one sequence, the whole prompt in one step, and a KV
/// cache just large enough for prompt and output.
fn engine_config(
    model: &Model,
    prompt_len: usize,
    max_tokens: usize,
    dtype: KvDtype,
) -> EngineConfig {
    let len = prompt_len + max_tokens;
    let block = model.kv_shape().bytes_per_block(BLOCK_SIZE, dtype);
    EngineConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: prompt_len.max(1),
        max_model_len: Some(len),
        kv_cache_memory: KvCacheMemory::Bytes((block * len.div_ceil(BLOCK_SIZE)) as u64),
        kv_cache_dtype: dtype,
        block_size: BLOCK_SIZE,
        ..EngineConfig::default()
    }
}

/// The prompt's token ids: the text as is, or as a user message in the model's chat template.
fn prompt_ids(args: &GenerateArgs, tokenizer: &Tokenizer) -> anyhow::Result<Vec<u32>> {
    let ids = if args.chat {
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
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(ids)
}
