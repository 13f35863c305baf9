//! [`DeepSeekConfig`]: the hyper-parameters of a DeepSeek V2/V3 model (MLA + MoE) from a
//! Hugging Face `config.json` (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`); GGUF
//! `deepseek2.*` keys are read in `gguf.rs`, which maps RoPE back to config.json form so
//! both go through the one YaRN computation here ([`rope`]).
//!
//! RoPE: DeepSeek's YaRN (`rope_type: yarn`) is computed as transformers'
//! `_compute_yarn_parameters` does — interpolated/extrapolated inverse frequencies blended by
//! a linear ramp between the correction dims of `beta_fast`/`beta_slow`, and an attention
//! factor `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` on cos and sin — and the
//! softmax scale is `qk_head_dim^-½ · mscale(factor, mscale_all_dim)²`.

use serde_json::Value;

use crate::ModelError;

fn bad(msg: impl Into<String>) -> ModelError {
    ModelError::BadConfig(msg.into())
}

/// How the router scores and picks experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// V2: softmax scores, top-k (optionally within the `topk_group` best groups by max).
    Softmax { group_limited: bool },
    /// V3: sigmoid scores + `e_score_correction_bias` for the choice, groups ranked by the
    /// sum of their top-2 biased scores; the weights are the unbiased scores.
    Sigmoid,
}

#[derive(Clone, Debug)]
pub struct DeepSeekConfig {
    pub v3: bool,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// Dense FFN width (the first `first_k_dense_replace` layers).
    pub ffn_hidden: usize,
    pub moe_hidden: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub n_experts_per_tok: usize,
    pub first_k_dense_replace: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub n_group: usize,
    pub topk_group: usize,
    pub routing: Routing,
    /// RoPE inverse frequencies `[qk_rope_head_dim / 2]`, YaRN applied.
    pub inv_freq: Vec<f32>,
    /// Factor on RoPE's cos and sin (YaRN's attention factor; 1 without scaling).
    pub rope_mscale: f32,
    /// Softmax scale.
    pub attn_scale: f32,
}

fn get_usize(cfg: &Value, key: &str, max: u64) -> Result<Option<usize>, ModelError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max => Ok(Some(n as usize)),
            _ => Err(bad(format!(
                "config.json {key} = {v} is out of range 0..={max}"
            ))),
        },
    }
}

fn req(cfg: &Value, key: &str) -> Result<usize, ModelError> {
    match get_usize(cfg, key, 1 << 20)? {
        Some(n) if n > 0 => Ok(n),
        Some(_) => Err(bad(format!("config.json {key} must be positive"))),
        None => Err(ModelError::MissingMetadata {
            key: format!("config.json {key}"),
        }),
    }
}

fn get_f64(cfg: &Value, key: &str) -> Option<f64> {
    cfg.get(key)
        .and_then(Value::as_f64)
        .filter(|f| f.is_finite())
}

/// The expert counts and groups agree (anything goes without routed experts).
pub(super) fn check_experts(
    n_routed: usize,
    per_tok: usize,
    n_group: usize,
    topk_group: usize,
) -> Result<(), ModelError> {
    if n_routed > 0
        && (per_tok == 0
            || per_tok > n_routed
            || n_group == 0
            || !n_routed.is_multiple_of(n_group)
            || topk_group == 0
            || topk_group > n_group)
    {
        return Err(bad("inconsistent expert counts / groups"));
    }
    Ok(())
}

/// YaRN's magnitude correction (`yarn_get_mscale`).
fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl DeepSeekConfig {
    pub fn from_hf_config(json: &str) -> Result<DeepSeekConfig, ModelError> {
        let cfg: Value =
            serde_json::from_str(json).map_err(|e| bad(format!("config.json: {e}")))?;
        let class = cfg
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("");
        let v3 = match class {
            "DeepseekV2ForCausalLM" => false,
            "DeepseekV3ForCausalLM" => true,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
        };
        let n_layers = req(&cfg, "num_hidden_layers")?;
        let n_heads = req(&cfg, "num_attention_heads")?;
        let n_routed_experts = get_usize(&cfg, "n_routed_experts", 1 << 16)?.unwrap_or(0);
        let n_experts_per_tok = get_usize(&cfg, "num_experts_per_tok", 1 << 16)?.unwrap_or(0);
        let n_group = get_usize(&cfg, "n_group", 1 << 16)?.unwrap_or(1).max(1);
        let topk_group = get_usize(&cfg, "topk_group", 1 << 16)?.unwrap_or(n_group);
        check_experts(n_routed_experts, n_experts_per_tok, n_group, topk_group)?;
        let topk_method = cfg.get("topk_method").and_then(Value::as_str);
        let routing = match (v3, topk_method) {
            (true, _) | (false, Some("noaux_tc")) => Routing::Sigmoid,
            (false, None | Some("greedy")) => Routing::Softmax {
                group_limited: false,
            },
            (false, Some("group_limited_greedy")) => Routing::Softmax {
                group_limited: true,
            },
            (false, Some(m)) => return Err(bad(format!("unsupported topk_method '{m}'"))),
        };
        if let Some(f) = cfg.get("scoring_func").and_then(Value::as_str)
            && f != (if routing == Routing::Sigmoid {
                "sigmoid"
            } else {
                "softmax"
            })
        {
            return Err(bad(format!(
                "scoring_func '{f}' does not match the routing"
            )));
        }
        if v3 && cfg.get("rope_interleave").and_then(Value::as_bool) == Some(false) {
            return Err(bad("rope_interleave = false is not supported"));
        }
        let qk_nope_head_dim = req(&cfg, "qk_nope_head_dim")?;
        let qk_rope_head_dim = req(&cfg, "qk_rope_head_dim")?;
        if qk_rope_head_dim % 2 != 0 {
            return Err(bad("qk_rope_head_dim must be even"));
        }
        let (inv_freq, rope_mscale, attn_mscale) = rope(&cfg, qk_rope_head_dim)?;
        let qk_head_dim = qk_nope_head_dim + qk_rope_head_dim;
        let q_lora_rank = get_usize(&cfg, "q_lora_rank", 1 << 20)?.filter(|&r| r > 0);
        let routed_scaling_factor = get_f64(&cfg, "routed_scaling_factor").unwrap_or(1.0) as f32;
        Ok(DeepSeekConfig {
            v3,
            n_layers,
            hidden: req(&cfg, "hidden_size")?,
            n_heads,
            vocab_size: req(&cfg, "vocab_size")?,
            context_length: get_usize(&cfg, "max_position_embeddings", 1 << 24)?.unwrap_or(4096),
            rms_eps: get_f64(&cfg, "rms_norm_eps").unwrap_or(1e-6) as f32,
            q_lora_rank,
            kv_lora_rank: req(&cfg, "kv_lora_rank")?,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim: req(&cfg, "v_head_dim")?,
            ffn_hidden: req(&cfg, "intermediate_size")?,
            moe_hidden: get_usize(&cfg, "moe_intermediate_size", 1 << 20)?.unwrap_or(0),
            n_routed_experts,
            n_shared_experts: get_usize(&cfg, "n_shared_experts", 1 << 16)?.unwrap_or(0),
            n_experts_per_tok,
            first_k_dense_replace: get_usize(&cfg, "first_k_dense_replace", 1 << 16)?.unwrap_or(0),
            routed_scaling_factor,
            norm_topk_prob: cfg.get("norm_topk_prob").and_then(Value::as_bool) == Some(true),
            n_group,
            topk_group,
            routing,
            inv_freq,
            rope_mscale,
            attn_scale: (qk_head_dim as f64).powf(-0.5) as f32 * attn_mscale,
        })
    }

    /// Whether layer `l` is a mixture-of-experts layer.
    pub fn is_moe(&self, l: usize) -> bool {
        self.n_routed_experts > 0 && l >= self.first_k_dense_replace
    }

    /// Whether MLA over a run of `t` tokens of one sequence, after `p` cached keys, costs
    /// fewer multiply-adds in the expanded form (prefill) than absorbed (decode). Both forms
    /// project every query's nope part or output once (absorbed: `W_UK_hᵀ`, `W_UV_h` a token;
    /// expanded: `kv_b` a key, `p + t` keys), and they differ per scored pair
    /// (`H·(2r + rope)` against `H·(nope + rope + v)`); so the expanded form pays when
    /// `p · H·(nope + v)·r < pairs · H·(2r − nope − v)`, `pairs = t·p + t(t + 1)/2`.
    pub fn mla_expanded_pays(&self, t: usize, p: usize) -> bool {
        let (nope, v, r) = (self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank);
        let per_pair = (2 * r).saturating_sub(nope + v);
        let pairs = t * p + t * (t + 1) / 2;
        p * (nope + v) * r < pairs * per_pair
    }

    /// Values cached per token per layer: the compressed latent and the shared rope key.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Values an expanded K/V cache would hold per token per layer: K is `n_heads ×
    /// (nope + rope)`, V is `n_heads × v_head_dim`.
    pub fn expanded_kv_dim(&self) -> usize {
        self.n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
    }
}

/// `(inv_freq, cos/sin factor, softmax-scale factor)` of a config.json's RoPE parameters
/// (`rope_parameters`, else `rope_scaling`, else the top-level `rope_theta`).
pub(super) fn rope(cfg: &Value, dim: usize) -> Result<(Vec<f32>, f32, f32), ModelError> {
    let p = match cfg.get("rope_parameters") {
        Some(p @ Value::Object(_)) => p.clone(),
        _ => cfg.get("rope_scaling").cloned().unwrap_or(Value::Null),
    };
    let base = get_f64(&p, "rope_theta")
        .or(get_f64(cfg, "rope_theta"))
        .unwrap_or(10000.0);
    if base <= 1.0 {
        return Err(bad("rope_theta must be > 1"));
    }
    let pos_freq = |i: usize| base.powf((2 * i) as f64 / dim as f64);
    let ty = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match ty {
        "default" => Ok((
            (0..dim / 2).map(|i| (1.0 / pos_freq(i)) as f32).collect(),
            1.0,
            1.0,
        )),
        "yarn" => {
            let factor = get_f64(&p, "factor")
                .filter(|&f| f > 0.0)
                .ok_or_else(|| bad("yarn needs factor"))?;
            let orig = get_f64(&p, "original_max_position_embeddings")
                .ok_or_else(|| bad("yarn needs original_max_position_embeddings"))?;
            let (mscale, mscale_all) = (get_f64(&p, "mscale"), get_f64(&p, "mscale_all_dim"));
            let attention_factor = match (get_f64(&p, "attention_factor"), mscale, mscale_all) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, ma)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            let attn = match mscale_all {
                Some(ma) if ma != 0.0 => yarn_mscale(factor, ma).powi(2),
                _ => 1.0,
            };
            let beta_fast = get_f64(&p, "beta_fast")
                .filter(|&b| b != 0.0)
                .unwrap_or(32.0);
            let beta_slow = get_f64(&p, "beta_slow")
                .filter(|&b| b != 0.0)
                .unwrap_or(1.0);
            let corr = |rot: f64| {
                dim as f64 * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
            };
            let truncate = p.get("truncate").and_then(Value::as_bool) != Some(false);
            let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
            if low == high {
                high += 0.001;
            }
            let inv_freq = (0..dim / 2)
                .map(|i| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0) as f32;
                    let extra = 1.0 - ramp;
                    let pf = pos_freq(i) as f32;
                    let (inter, ext) = (1.0 / (factor as f32 * pf), 1.0 / pf);
                    inter * (1.0 - extra) + ext * extra
                })
                .collect();
            Ok((inv_freq, attention_factor as f32, attn as f32))
        }
        other => Err(bad(format!("unsupported rope type '{other}' for DeepSeek"))),
    }
}
