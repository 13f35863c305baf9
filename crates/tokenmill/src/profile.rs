//! `tokenmill profile`: runs a closed-loop workload on the engine in-process (the same load as
//! `bench-engine`) with tracing on and writes the trace (Chrome Trace Event JSON; open it in
//! Perfetto). `tokenmill profile report TRACE` analyses a trace: op × layer heat map, top ops
//! against a measured roofline, gaps, a request's critical path and a verdict.
//!
//! The trace's `otherData` carries the model's shape (for FLOP and byte counts) and the
//! workload. A short untraced warm-up runs first so thread-pool start-up and first-touch
//! page faults stay out of the trace. `--overhead-pairs N` first measures the recorder's
//! cost: N interleaved pairs of untraced and traced runs of the workload (a different seed
//! per pair), printing each pair's output tok/s and the median on/off ratio.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;
use tokenmill_bench::dataset::OutputLenDist;
use tokenmill_bench::inprocess::{WorkItem, random_workload, run_closed_loop};
use tokenmill_bench::stats::Summary;
use tokenmill_engine::{EngineHandle, RequestParams, SamplingParams};
use tokenmill_gguf::GgufFile;
use tokenmill_model::deepseek::DeepSeekConfig;
use tokenmill_model::{KvDtype, ModelConfig};
use tokenmill_profiler::shape::DeepSeekShape;
use tokenmill_profiler::{ModelShape, Roofline};

use crate::engine_args::EngineArgs;

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ProfileArgs {
    #[command(subcommand)]
    pub action: Option<ProfileAction>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum ProfileAction {
    /// Analyse a trace: heat map PNG, top ops vs roofline, gaps, critical path, verdict.
    Report(ReportArgs),
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A trace written by `tokenmill profile` or `serve --profile-dir`.
    pub trace: PathBuf,
    /// Where to write heatmap.png (default: beside the trace).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Requests in the traced run.
    #[arg(long, default_value_t = 32)]
    pub num_prompts: usize,
    /// Clients, each with one request in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The trace file to write.
    #[arg(long, default_value = "trace.json")]
    pub out: PathBuf,
    /// Print the report of the trace when done.
    #[arg(long)]
    pub report: bool,
    /// Before the traced run, measure the recorder's overhead: N interleaved off/on pairs.
    #[arg(long, default_value_t = 0)]
    pub overhead_pairs: usize,
}

pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    match args.action {
        Some(ProfileAction::Report(r)) => report(&r),
        None => run_workload(&args.run),
    }
}

fn report(r: &ReportArgs) -> anyhow::Result<()> {
    let out_dir = r.out_dir.clone().unwrap_or_else(|| {
        r.trace
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    });
    let roof = || {
        eprintln!("measuring the roofline…");
        Roofline::measure()
    };
    let out = tokenmill_profiler::report_trace(&r.trace, Some(&out_dir), roof)
        .with_context(|| format!("reporting {}", r.trace.display()))?;
    print!("{}", out.text);
    Ok(())
}

/// The model's dimensions and weight sizes from its GGUF file (`None` for other formats), with
/// a KV cache of `kv_dtype`.
pub fn model_shape(path: &Path, kv_dtype: KvDtype) -> Option<ModelShape> {
    let file = GgufFile::open(path).ok()?;
    if file.architecture() == Some("deepseek2") {
        return deepseek_shape(&file, kv_dtype);
    }
    let cfg = ModelConfig::from_gguf(&file).ok()?;
    let sizes = TensorSizes(&file, cfg.n_layers);
    let sum = |names: &[&str]| sizes.mean(names);
    let embed = file.tensor("token_embd.weight").map_or(0, |t| t.size) as f64;
    let lm_head = file
        .tensor("output.weight")
        .map_or(embed, |t| t.size as f64);
    Some(ModelShape {
        n_layers: cfg.n_layers,
        hidden: cfg.hidden,
        n_heads: cfg.n_heads,
        head_dim: cfg.head_dim,
        kv_dim: cfg.kv_dim(),
        ffn_hidden: cfg.ffn_hidden,
        vocab: cfg.vocab_size,
        kv_elem_bytes: kv_dtype.bytes(),
        qkv_bytes: sum(&["attn_q", "attn_k", "attn_v"]),
        out_bytes: sum(&["attn_output"]),
        gate_up_bytes: sum(&["ffn_gate", "ffn_up"]),
        down_bytes: sum(&["ffn_down"]),
        lm_head_bytes: lm_head,
        embed_row_bytes: embed / cfg.vocab_size.max(1) as f64,
        deepseek: None,
    })
}

/// Bytes of a GGUF's per-layer tensors `blk.{l}.{name}.weight`.
struct TensorSizes<'a>(&'a GgufFile, usize);

impl TensorSizes<'_> {
    /// Σ of `names` in layer `l` (`None` if the layer has none of them).
    fn layer(&self, l: usize, names: &[&str]) -> Option<f64> {
        let sizes = names
            .iter()
            .filter_map(|t| self.0.tensor(&format!("blk.{l}.{t}.weight")))
            .map(|t| t.size as f64);
        sizes.reduce(|a, b| a + b)
    }

    /// Σ of `names` a layer, the mean over all layers.
    fn mean(&self, names: &[&str]) -> f64 {
        let n = self.1.max(1);
        (0..n).filter_map(|l| self.layer(l, names)).sum::<f64>() / n as f64
    }

    /// Σ of `names` a layer, the mean over the layers that have them (a DeepSeek's dense or
    /// MoE layers).
    fn mean_present(&self, names: &[&str]) -> f64 {
        let present: Vec<f64> = (0..self.1).filter_map(|l| self.layer(l, names)).collect();
        present.iter().sum::<f64>() / present.len().max(1) as f64
    }
}

/// [`model_shape`] of a llama.cpp `deepseek2` GGUF: MLA's widths, the MoE and their bytes.
fn deepseek_shape(file: &GgufFile, kv_dtype: KvDtype) -> Option<ModelShape> {
    let c = DeepSeekConfig::from_gguf(file).ok()?;
    let sizes = TensorSizes(file, c.n_layers);
    let embed = file.tensor("token_embd.weight").map_or(0, |t| t.size) as f64;
    let lm_head = file
        .tensor("output.weight")
        .map_or(embed, |t| t.size as f64);
    let q = ["attn_q", "attn_q_a", "attn_q_b", "attn_kv_a_mqa"];
    let experts = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];
    Some(ModelShape {
        n_layers: c.n_layers,
        hidden: c.hidden,
        n_heads: c.n_heads,
        head_dim: c.qk_nope_head_dim + c.qk_rope_head_dim,
        kv_dim: c.latent_dim(),
        ffn_hidden: c.ffn_hidden,
        vocab: c.vocab_size,
        kv_elem_bytes: kv_dtype.bytes(),
        qkv_bytes: sizes.mean(&q),
        out_bytes: sizes.mean(&["attn_output"]),
        gate_up_bytes: sizes.mean_present(&["ffn_gate", "ffn_up"]),
        down_bytes: sizes.mean_present(&["ffn_down"]),
        lm_head_bytes: lm_head,
        embed_row_bytes: embed / c.vocab_size.max(1) as f64,
        deepseek: Some(DeepSeekShape {
            kv_lora_rank: c.kv_lora_rank,
            qk_nope: c.qk_nope_head_dim,
            qk_rope: c.qk_rope_head_dim,
            v_head: c.v_head_dim,
            q_lora_rank: c.q_lora_rank.unwrap_or(0),
            n_experts: c.n_routed_experts,
            experts_per_tok: c.n_experts_per_tok,
            n_shared: c.n_shared_experts,
            moe_hidden: c.moe_hidden,
            kv_b_bytes: sizes.mean(&["attn_k_b", "attn_v_b", "attn_kv_b"]),
            expert_bytes: sizes.mean_present(&experts) / c.n_routed_experts.max(1) as f64,
            shared_bytes: sizes.mean_present(&["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]),
        }),
    })
}

struct Workload<'a> {
    handle: &'a EngineHandle,
    args: &'a RunArgs,
    vocab: usize,
    params: RequestParams,
}

impl Workload<'_> {
    fn items(&self, seed: u64) -> Vec<WorkItem> {
        let a = self.args;
        random_workload(
            a.num_prompts,
            a.input_len,
            a.output_len,
            0.0,
            OutputLenDist::Uniform,
            self.vocab,
            seed,
        )
    }

    /// Runs `work`; returns the summary and the output tok/s.
    fn run(&self, work: &[WorkItem]) -> (Summary, f64) {
        let (records, dur) =
            run_closed_loop(self.handle, work, self.args.concurrency, &self.params);
        let out_tokens: usize = records.iter().map(|r| r.token_times.len()).sum();
        let tok_s = out_tokens as f64 / dur.as_secs_f64().max(1e-9);
        (Summary::of(&records, dur, &[50.0, 99.0]), tok_s)
    }

    fn traced(&self, work: &[WorkItem]) -> anyhow::Result<(Summary, f64, tokenmill_trace::Trace)> {
        tokenmill_trace::start()?;
        let (summary, tok_s) = self.run(work);
        Ok((summary, tok_s, tokenmill_trace::stop()?))
    }
}

fn run_workload(args: &RunArgs) -> anyhow::Result<()> {
    let (handle, path) = args.engine.start()?;
    let shape = model_shape(&path, args.engine.kv_cache_dtype.into());
    let vocab = shape.as_ref().map_or(32000, |s| s.vocab);
    if let Some(s) = &shape {
        tokenmill_trace::set_metadata("model_shape", serde_json::to_value(s)?);
    }
    tokenmill_trace::set_metadata(
        "workload",
        json!({
            "model": path.display().to_string(),
            "concurrency": args.concurrency,
            "num_prompts": args.num_prompts,
            "input_len": args.input_len,
            "output_len": args.output_len,
        }),
    );
    let w = Workload {
        handle: &handle,
        args,
        vocab,
        params: RequestParams {
            sampling: SamplingParams::greedy(),
            ..RequestParams::default()
        },
    };
    let warm = w.items(args.seed.wrapping_add(1 << 32));
    w.run(&warm[..args.concurrency.max(1).min(warm.len())]);
    if args.overhead_pairs > 0 {
        measure_overhead(&w, args)?;
    }
    let (summary, tok_s, trace) = w.traced(&w.items(args.seed))?;
    trace
        .write_file(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "{}",
        summary.render(&format!("traced run, concurrency {}", args.concurrency))
    );
    println!(
        "output throughput (client side): {tok_s:.1} tok/s; trace: {} ({} events)",
        args.out.display(),
        trace.events.len()
    );
    if args.report {
        report(&ReportArgs {
            trace: args.out.clone(),
            out_dir: None,
        })?;
    }
    Ok(())
}

fn measure_overhead(w: &Workload<'_>, args: &RunArgs) -> anyhow::Result<()> {
    let mut ratios = Vec::new();
    for i in 0..args.overhead_pairs {
        let seed = args.seed.wrapping_add(1000 + i as u64);
        let work = w.items(seed);
        let (_, off) = w.run(&work);
        let (_, on, _) = w.traced(&w.items(seed ^ 0x5555))?;
        println!(
            "overhead pair {i}: off {off:.1} tok/s, on {on:.1} tok/s, on/off {:.3}",
            on / off
        );
        ratios.push(on / off);
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "recorder overhead: median on/off throughput {median:.3} ({:+.1}%) over {} pairs",
        (median - 1.0) * 100.0,
        ratios.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The profiler counts MLA in the form the model runs: its copy of the rule agrees with
    /// the model's over decodes, speculative tokens and prefill chunks at V2-Lite's widths
    /// and at a tiny fixture's.
    #[test]
    fn profiler_and_model_pick_the_same_mla_form() {
        for (nh, r, nope, rope, v) in [(16, 512, 128, 64, 128), (4, 16, 8, 4, 12)] {
            let json = json!({
                "architectures": ["DeepseekV2ForCausalLM"], "num_hidden_layers": 2,
                "num_attention_heads": nh, "hidden_size": 64, "vocab_size": 8,
                "kv_lora_rank": r, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
                "v_head_dim": v, "intermediate_size": 4,
            });
            let c = DeepSeekConfig::from_hf_config(&json.to_string()).unwrap();
            let d = DeepSeekShape {
                kv_lora_rank: r,
                qk_nope: nope,
                qk_rope: rope,
                v_head: v,
                ..DeepSeekShape::default()
            };
            let (mut expanded, mut absorbed) = (0, 0);
            for t in [1, 2, 6, 64, 170, 171, 512, 2048] {
                for p in [0, 1, 5, 100, 400, 4096, 32_768] {
                    let e = c.mla_expanded_pays(t, p);
                    assert_eq!(d.mla_expanded(t, p), e, "{t} tokens after {p}");
                    if e { expanded += 1 } else { absorbed += 1 }
                }
            }
            assert!(expanded > 0 && absorbed > 0, "both forms are covered");
        }
    }
}
