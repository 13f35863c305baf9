//! KV bytes per token and the most concurrent sequences a fixed KV budget holds, for MLA's
//! latent cache vs the same model with expanded per-head K/V.
//!
//! ```sh
//! cargo run --release -p tokenmill-model --example mla_kv_budget [CONFIG_JSON] [BUDGET_GIB] [SEQ_LEN]
//! ```
//! Without a config, a DeepSeek-V2-Lite-shaped one (27 layers, 16 heads, kv_lora_rank 512,
//! qk_rope 64, qk_nope 128, v 128) is used; the budget defaults to 8 GiB, sequences to 4096
//! tokens. Figures for f32 (what tokenmill caches) and bf16 elements.

use tokenmill_model::deepseek::DeepSeekConfig;

const V2_LITE: &str = r#"{
  "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 27,
  "num_attention_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 10944,
  "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
  "num_experts_per_tok": 6, "first_k_dense_replace": 1, "vocab_size": 102400,
  "max_position_embeddings": 163840, "routed_scaling_factor": 1.0, "topk_method": "greedy",
  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
  "rope_theta": 10000
}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = match args.first().filter(|a| *a != "-") {
        Some(path) => std::fs::read_to_string(path)?,
        None => V2_LITE.to_string(),
    };
    let budget_gib: f64 = args.get(1).map_or(Ok(8.0), |s| s.parse())?;
    let seq_len: usize = args.get(2).map_or(Ok(4096), |s| s.parse())?;
    let cfg = DeepSeekConfig::from_hf_config(&json)?;
    let budget = (budget_gib * (1u64 << 30) as f64) as usize;
    let (latent, expanded) = (cfg.latent_dim(), cfg.expanded_kv_dim());
    println!(
        "{} layers; per token per layer: latent {latent} values (kv_lora_rank {} + rope {}), \
         expanded K/V {expanded} values ({} heads x (nope {} + rope {} + v {}))",
        cfg.n_layers,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
        cfg.n_heads,
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.v_head_dim
    );
    println!(
        "ratio expanded / latent = {:.2}",
        expanded as f64 / latent as f64
    );
    println!("budget {budget_gib} GiB, sequences of {seq_len} tokens:");
    for (name, elem) in [("f32", 4usize), ("bf16", 2)] {
        for (kind, dim) in [("latent", latent), ("expanded", expanded)] {
            let per_token = cfg.n_layers * dim * elem;
            let per_seq = per_token * seq_len;
            println!(
                "  {name:4} {kind:8}: {per_token:>8} B/token, {:>8.1} MiB/sequence, {:>5} sequences",
                per_seq as f64 / (1 << 20) as f64,
                budget / per_seq
            );
        }
    }
    Ok(())
}
