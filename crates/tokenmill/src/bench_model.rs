//! `tokenmill bench-model`: raw model speed, in the manner of `llama-bench` (pp, tg) and
//! `llama-batched-bench` (decode of many sequences at once), with achieved GFLOP/s, GB/s and
//! the share of time per op kind.
//!
//! - `pp N`: one sequence, an N-token prompt prefilled as one chunk;
//! - `tg N`: one sequence, N decode steps of one token from an empty context;
//! - `bd B×N`: B sequences, each prefilled with a `--batched-prompt`-token prompt (not timed),
//!   then N decode steps of a B-chunk batch — `llama-batched-bench`'s S_TG.
//!
//! Each test runs `--repetitions` times and the median is reported. Tokens are pseudo-random
//! ids, fixed by `--seed`, so no prefix is ever shared. Any [`Model`] runs, with its op split
//! and GFLOP/s (a DeepSeek token's FLOPs are exact whatever the routing: every token runs
//! `k` routed experts and the shared ones). The byte model (GB/s, the read roof) exists for
//! the Llama family only: which experts a MoE step reads depends on the routing, so a
//! DeepSeek model reports `-` there.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokenmill_model::deepseek::DeepSeekConfig;
use tokenmill_model::{
    KvDtype, LlamaModel, LogitsWanted, Model, ModelConfig, OpKind, OpProfile, SeqChunk, Workspace,
};

use crate::engine_args::KvDtypeArg;

#[derive(clap::Args, Debug)]
pub struct BenchModelArgs {
    /// GGUF file, Hugging Face folder, or Hugging Face id `ORG/NAME[:QUANT]` from the local
    /// hub cache (default: SmolLM2-135M-Instruct Q4_1, fetched if missing).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt lengths to prefill (pp tests).
    #[arg(long, value_delimiter = ',', default_value = "512")]
    pub prompt: Vec<usize>,
    /// Tokens to generate single-stream (tg tests).
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub generate: Vec<usize>,
    /// Batch sizes for batched decode (bd tests).
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    pub batch: Vec<usize>,
    /// Prompt length of each sequence before batched decode.
    #[arg(long, default_value_t = 128)]
    pub batched_prompt: usize,
    /// Decode steps of the batched tests.
    #[arg(long, default_value_t = 128)]
    pub batched_generate: usize,
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
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

/// One test's outcome: tokens processed, median wall time, and the op split of that run.
struct Outcome {
    tokens: usize,
    time: Duration,
    flops: f64,
    /// `None` where there is no byte model (DeepSeek: the experts read depend on routing).
    bytes: Option<f64>,
    ops: OpProfile,
}

pub fn run(args: BenchModelArgs) -> anyhow::Result<()> {
    crate::init_threads(args.threads, args.activation_bits);
    let path = crate::model_path::resolve(args.model.clone())?;
    let model = Model::open(&path)?;
    let (n_layers, hidden) = match &model {
        Model::Llama(m) => (m.config().n_layers, m.config().hidden),
        Model::DeepSeek(m) => (m.config().n_layers, m.config().hidden),
    };
    let weights = match llama(&model) {
        Some(m) => format!(
            "{:.1} MiB of matmul weights",
            matmul_weight_bytes(m) / 1048576.0
        ),
        None => "MLA + MoE".to_string(),
    };
    let dtype = KvDtype::from(args.kv_cache_dtype);
    println!(
        "model: {} ({n_layers} layers, hidden {hidden}, {weights}), threads: {}, KV cache: {dtype}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        tokenmill_kernels::pool::global().num_threads(),
    );
    println!("kernels: {}", crate::kernels_summary());
    println!(
        "{:<12} {:>8} {:>10} {:>10} {:>9} {:>8}  op share",
        "test", "tokens", "ms", "tok/s", "GFLOP/s", "GB/s"
    );
    let mut rng = args.seed;
    for &n in &args.prompt {
        let o = median(args.repetitions, || pp(&model, dtype, n, &mut rng));
        report(&format!("pp{n}"), &o);
    }
    let mut tg = Vec::new();
    for &n in &args.generate {
        let o = median(args.repetitions, || bd(&model, dtype, 1, 0, n, &mut rng));
        report(&format!("tg{n}"), &o);
        tg.push((n, o));
    }
    for &b in &args.batch {
        let o = median(args.repetitions, || {
            bd(
                &model,
                dtype,
                b,
                args.batched_prompt,
                args.batched_generate,
                &mut rng,
            )
        });
        report(&format!("bd{b}x{}", args.batched_generate), &o);
    }
    if let Some(m) = llama(&model) {
        report_read_roof(&tg, matmul_weight_bytes(m));
    }
    Ok(())
}

/// Single-stream decode against the machine's read bandwidth: each tgN step streams the
/// weights once, so the measured streaming-read rate over a buffer of the weights' size
/// (the profiler's roofline probe, on the same threads) bounds its tok/s.
fn report_read_roof(tg: &[(usize, Outcome)], weight_bytes: f64) {
    if tg.is_empty() {
        return;
    }
    let threads = tokenmill_kernels::pool::global().num_threads();
    let roof = tokenmill_profiler::roofline::mem_read_gbps(threads, weight_bytes as usize);
    for (n, o) in tg {
        let Some(bytes) = o.bytes else { continue };
        let secs = o.time.as_secs_f64();
        let (gbps, per_token) = (bytes / secs / 1e9, bytes / o.tokens.max(1) as f64);
        println!(
            "tg{n}: {gbps:.1} GB/s = {:.0}% of the read roof ({roof:.1} GB/s: a {:.0} MiB streaming \
             read on {threads} threads), whose ceiling is {:.0} tok/s",
            100.0 * gbps / roof,
            weight_bytes / 1048576.0,
            roof * 1e9 / per_token,
        );
    }
}

fn median(reps: usize, mut f: impl FnMut() -> anyhow::Result<Outcome>) -> Outcome {
    let mut runs: Vec<Outcome> = (0..reps.max(1))
        .map(|_| f().expect("benchmark run"))
        .collect();
    runs.sort_by_key(|o| o.time);
    runs.swap_remove(runs.len() / 2)
}

fn report(name: &str, o: &Outcome) {
    let secs = o.time.as_secs_f64();
    let rate = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}", v / secs / 1e9));
    // Shares of the wall time; what no op recorded (the work between ops, e.g. the batch's
    // bookkeeping and sampling) is shown as such.
    let wall = secs.max(1e-12);
    let mut shares: Vec<String> = OpKind::ALL
        .iter()
        .map(|&k| (k, o.ops.total(k).as_secs_f64() / wall))
        .filter(|(_, s)| *s >= 0.005)
        .map(|(k, s)| format!("{} {:.0}%", k.name(), s * 100.0))
        .collect();
    let rest = 1.0 - o.ops.sum().as_secs_f64() / wall;
    if rest >= 0.005 {
        shares.push(format!("unattributed {:.0}%", rest * 100.0));
    }
    println!(
        "{:<12} {:>8} {:>10.1} {:>10.1} {:>9} {:>8}  {}",
        name,
        o.tokens,
        secs * 1e3,
        o.tokens as f64 / secs,
        rate(Some(o.flops)),
        rate(o.bytes),
        shares.join(", ")
    );
}

fn random_tokens(rng: &mut u64, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            *rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*rng >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn profiled_workspace() -> Workspace {
    let mut ws = Workspace::default();
    ws.profile = Some(OpProfile::default());
    ws
}

/// The Llama-family model, whose FLOP and byte models this benchmark has.
fn llama(model: &Model) -> Option<&LlamaModel> {
    match model {
        Model::Llama(m) => Some(m),
        Model::DeepSeek(_) => None,
    }
}

/// Prefill of one `n`-token prompt.
fn pp(model: &Model, dtype: KvDtype, n: usize, rng: &mut u64) -> anyhow::Result<Outcome> {
    let tokens = random_tokens(rng, n, model.vocab_size());
    let num_blocks = n.div_ceil(BLOCK_SIZE);
    let mut kv = model.kv_cache_with_dtype(num_blocks, BLOCK_SIZE, dtype);
    let table: Vec<u32> = (0..num_blocks as u32).collect();
    let mut ws = profiled_workspace();
    let chunk = SeqChunk {
        tokens: &tokens,
        start_pos: 0,
        block_table: &table,
        logits: LogitsWanted::Last,
    };
    let t = Instant::now();
    model.forward(&[chunk], &mut kv, &mut ws)?;
    let time = t.elapsed();
    // Attention: each token attends to ~half the prompt on average.
    let flops = n as f64 * flops_per_token(model, n as f64 / 2.0, (n, 0));
    let bytes = llama(model).map(matmul_weight_bytes);
    Ok(Outcome {
        tokens: n,
        time,
        flops,
        bytes,
        ops: ws.profile.unwrap_or_default(),
    })
}

/// `b` sequences with `prompt`-token prompts (prefilled untimed), then `steps` decode steps of
/// the whole batch. `b == 1, prompt == 0` is llama-bench's tg.
fn bd(
    model: &Model,
    dtype: KvDtype,
    b: usize,
    prompt: usize,
    steps: usize,
    rng: &mut u64,
) -> anyhow::Result<Outcome> {
    let vocab = model.vocab_size();
    let per_seq = (prompt + steps).div_ceil(BLOCK_SIZE);
    let mut kv = model.kv_cache_with_dtype(b * per_seq, BLOCK_SIZE, dtype);
    let tables: Vec<Vec<u32>> = (0..b)
        .map(|s| {
            (0..per_seq as u32)
                .map(|i| s as u32 * per_seq as u32 + i)
                .collect()
        })
        .collect();
    let mut ws = Workspace::default();
    let mut last: Vec<u32> = random_tokens(rng, b, vocab);
    if prompt > 0 {
        let prompts: Vec<Vec<u32>> = (0..b).map(|_| random_tokens(rng, prompt, vocab)).collect();
        let chunks: Vec<SeqChunk> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqChunk {
                tokens: p,
                start_pos: 0,
                block_table: t,
                logits: LogitsWanted::Last,
            })
            .collect();
        model.forward(&chunks, &mut kv, &mut ws)?;
    }
    ws.profile = Some(OpProfile::default());
    let t = Instant::now();
    for step in 0..steps {
        let tokens = last.clone();
        let chunks: Vec<SeqChunk> = tokens
            .chunks(1)
            .zip(&tables)
            .map(|(tok, table)| SeqChunk {
                tokens: tok,
                start_pos: prompt + step,
                block_table: table,
                logits: LogitsWanted::Last,
            })
            .collect();
        let logits = model.forward(&chunks, &mut kv, &mut ws)?;
        for (s, row) in logits.chunks_exact(vocab).enumerate() {
            last[s] = tokenmill_engine::argmax(row);
        }
    }
    let time = t.elapsed();
    let mean_ctx = prompt as f64 + steps as f64 / 2.0;
    let tokens = b * steps;
    let flops = tokens as f64 * flops_per_token(model, mean_ctx, (1, prompt));
    // Every step streams all weights once, plus each sequence's K/V so far.
    let kv_bytes = kv.bytes_per_token() as f64 * mean_ctx * b as f64;
    let bytes = llama(model).map(|m| steps as f64 * (matmul_weight_bytes(m) + kv_bytes));
    Ok(Outcome {
        tokens,
        time,
        flops,
        bytes,
        ops: ws.profile.unwrap_or_default(),
    })
}

/// FLOPs of one token attending to `ctx` positions: the matmuls (2 × the parameters each token
/// multiplies) and attention. `run`: the tokens of its chunk and the chunk's start, which
/// decide DeepSeek's MLA form.
fn flops_per_token(model: &Model, ctx: f64, run: (usize, usize)) -> f64 {
    match model {
        Model::Llama(m) => llama_flops(m.config(), ctx),
        Model::DeepSeek(m) => {
            let c = m.config();
            deepseek_flops(c, ctx, c.mla_expanded_pays(run.0, run.1))
        }
    }
}

/// Every linear layer and the LM head; QKᵀ and PV over every head and layer.
fn llama_flops(cfg: &ModelConfig, ctx: f64) -> f64 {
    let (h, q, kv, f) = (
        cfg.hidden,
        cfg.n_heads * cfg.head_dim,
        cfg.kv_dim(),
        cfg.ffn_hidden,
    );
    let per_layer = h * q + 2 * h * kv + q * h + 3 * h * f;
    let matmuls = 2.0 * (cfg.n_layers * per_layer + h * cfg.vocab_size) as f64;
    matmuls + 4.0 * (cfg.n_layers * cfg.n_heads * cfg.head_dim) as f64 * ctx
}

/// The Q (or Q-LoRA) and latent `kv_a` projections, the absorbed `kv_b` halves (`q_nope` into
/// the latent, the latent output into `v`), the output projection, the dense FFN or the router
/// with `k` routed experts and the shared experts, and the LM head; MLA per key: the latent
/// score (`r + rope`) and the latent accumulation (`r`), for every head and layer. In the
/// `expanded` form (a prefill chunk from position 0: each key's expansion by `kv_b` counts
/// what the absorbed projections of its token would) a key costs a head's score
/// (`nope + rope`) and value accumulation (`v`) instead.
fn deepseek_flops(c: &DeepSeekConfig, ctx: f64, expanded: bool) -> f64 {
    let (h, nh, r, rope) = (c.hidden, c.n_heads, c.kv_lora_rank, c.qk_rope_head_dim);
    let q_out = nh * (c.qk_nope_head_dim + rope);
    let q = match c.q_lora_rank {
        Some(ql) => h * ql + ql * q_out,
        None => h * q_out,
    };
    let attn =
        q + h * (r + rope) + nh * r * (c.qk_nope_head_dim + c.v_head_dim) + nh * c.v_head_dim * h;
    let moe =
        h * c.n_routed_experts + 3 * h * c.moe_hidden * (c.n_experts_per_tok + c.n_shared_experts);
    let ffn: usize = (0..c.n_layers)
        .map(|l| {
            if c.is_moe(l) {
                moe
            } else {
                3 * h * c.ffn_hidden
            }
        })
        .sum();
    let matmuls = 2.0 * (c.n_layers * attn + ffn + h * c.vocab_size) as f64;
    let per_key = match expanded {
        true => c.qk_nope_head_dim + rope + c.v_head_dim,
        false => 2 * r + rope,
    };
    matmuls + 2.0 * (c.n_layers * nh * per_key) as f64 * ctx
}

/// Bytes of every matmul weight (what one forward step must stream from memory).
fn matmul_weight_bytes(model: &LlamaModel) -> f64 {
    model.matmul_weight_bytes() as f64
}
