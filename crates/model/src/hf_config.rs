//! [`ModelConfig`] from a Hugging Face `config.json` (LlamaForCausalLM, MistralForCausalLM,
//! Qwen2ForCausalLM).
//!
//! Reads both the transformers-5 form (`rope_parameters: {rope_theta, rope_type, ...}`) and
//! the older one (`rope_theta` at the top level, `rope_scaling: {type | rope_type, ...}`).
//! Llama 3 RoPE scaling becomes per-pair frequency divisors computed exactly as llama.cpp's
//! converter writes `rope_freqs.weight` (and as transformers' `_compute_llama3_parameters`
//! scales its inverse frequencies), so both formats share one RoPE path.
//!
//! HF checkpoints keep Q/K unpermuted, so every architecture rotates halves
//! ([`RopeStyle::NeoX`]) — unlike Llama GGUFs, which were permuted for interleaved pairs.
//! Sizes are range-checked like the GGUF path so a hostile config cannot allocate absurdly.
//! `quantization_config` (AWQ / GPTQ int4) is read by [`Int4Config::from_hf`].

use serde_json::Value;
use tokenmill_kernels::ops::RopeStyle;

use crate::config::{MAX_DIM, MAX_LAYERS};
use crate::{Arch, Int4Config, ModelConfig, ModelError, RopeScaling};

fn bad(msg: impl Into<String>) -> ModelError {
    ModelError::BadConfig(msg.into())
}

/// A size field: a positive integer no larger than `max`.
fn size(cfg: &Value, key: &str, max: u64) -> Result<Option<usize>, ModelError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= max => Ok(Some(n as usize)),
            _ => Err(bad(format!(
                "config.json {key} = {v} is out of range 1..={max}"
            ))),
        },
    }
}

fn req(cfg: &Value, key: &str, max: u64) -> Result<usize, ModelError> {
    size(cfg, key, max)?.ok_or_else(|| ModelError::MissingMetadata {
        key: format!("config.json {key}"),
    })
}

fn float(v: &Value, key: &str) -> Result<Option<f64>, ModelError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_f64() {
            Some(f) if f.is_finite() => Ok(Some(f)),
            _ => Err(bad(format!(
                "config.json {key} = {x} is not a finite number"
            ))),
        },
    }
}

impl ModelConfig {
    /// The configuration `config.json` describes.
    pub fn from_hf_config(json: &str) -> Result<ModelConfig, ModelError> {
        let cfg: Value =
            serde_json::from_str(json).map_err(|e| bad(format!("config.json: {e}")))?;
        let class = cfg
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::MissingMetadata {
                key: "config.json architectures".into(),
            })?;
        let arch = match class {
            "LlamaForCausalLM" => Arch::Llama,
            "MistralForCausalLM" => Arch::Mistral,
            "Qwen2ForCausalLM" => Arch::Qwen2,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
        };
        if let Some(act) = cfg.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            return Err(bad(format!(
                "hidden_act '{act}' is not supported (silu only)"
            )));
        }
        if cfg.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            return Err(bad("mlp_bias is not supported"));
        }
        let n_layers = req(&cfg, "num_hidden_layers", MAX_LAYERS)?;
        let hidden = req(&cfg, "hidden_size", MAX_DIM)?;
        let n_heads = req(&cfg, "num_attention_heads", MAX_DIM)?;
        let n_kv_heads = size(&cfg, "num_key_value_heads", MAX_DIM)?.unwrap_or(n_heads);
        let head_dim = match size(&cfg, "head_dim", MAX_DIM)? {
            Some(d) => d,
            None if hidden % n_heads == 0 => hidden / n_heads,
            None => return Err(bad(format!("hidden_size {hidden} % heads {n_heads} != 0"))),
        };
        if n_heads % n_kv_heads != 0 || head_dim % 2 != 0 {
            return Err(bad(format!(
                "heads {n_heads} / kv heads {n_kv_heads} / head_dim {head_dim} are inconsistent"
            )));
        }
        let mut context_length = size(&cfg, "max_position_embeddings", 1 << 24)?.unwrap_or(4096);
        let sliding = cfg.get("use_sliding_window").and_then(Value::as_bool) != Some(false);
        if let (true, Some(w)) = (sliding, size(&cfg, "sliding_window", 1 << 24)?) {
            // No sliding-window attention here: stay within the window, where it is exact.
            context_length = context_length.min(w);
        }
        let rms_eps = float(&cfg, "rms_norm_eps")?.unwrap_or(1e-6) as f32;
        let (rope_theta, rope_scaling) = rope(&cfg, head_dim)?;
        if rms_eps < 0.0 || rope_theta <= 1.0 {
            return Err(bad("rms_norm_eps / rope_theta out of range"));
        }
        Ok(ModelConfig {
            arch,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_hidden: req(&cfg, "intermediate_size", MAX_DIM)?,
            vocab_size: req(&cfg, "vocab_size", 1 << 24)?,
            context_length,
            rms_eps,
            rope_theta,
            rope_dim: head_dim,
            rope_scaling,
            rope_style: RopeStyle::NeoX,
            quantization: Int4Config::from_hf(&cfg)?,
        })
    }
}

/// `(rope_theta, scaling)` from `rope_parameters` or the older `rope_theta` + `rope_scaling`.
fn rope(cfg: &Value, head_dim: usize) -> Result<(f32, RopeScaling), ModelError> {
    let params = match cfg.get("rope_parameters") {
        Some(p @ Value::Object(_)) => Some(p),
        _ => cfg.get("rope_scaling").filter(|p| p.is_object()),
    };
    let theta = params
        .map(|p| float(p, "rope_theta"))
        .transpose()?
        .flatten()
        .or(float(cfg, "rope_theta")?)
        .unwrap_or(10000.0);
    let Some(p) = params else {
        return Ok((theta as f32, RopeScaling::None));
    };
    let ty = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = float(p, "factor")?;
    let scaling = match (ty, factor) {
        ("default", _) => RopeScaling::None,
        ("linear", Some(f)) if f > 0.0 => RopeScaling::Linear { factor: f as f32 },
        ("llama3", Some(f)) if f > 0.0 => llama3(p, f, theta, head_dim)?,
        (other, _) => return Err(bad(format!("unsupported rope type '{other}'"))),
    };
    Ok((theta as f32, scaling))
}

/// Llama 3.1 frequency divisors (llama.cpp `LlamaModel.generate_extra_tensors`).
fn llama3(p: &Value, factor: f64, theta: f64, dim: usize) -> Result<RopeScaling, ModelError> {
    let low = float(p, "low_freq_factor")?.unwrap_or(1.0);
    let high = float(p, "high_freq_factor")?.unwrap_or(4.0);
    let old_ctx = float(p, "original_max_position_embeddings")?.unwrap_or(8192.0);
    if !(low > 0.0 && high > low && old_ctx > 0.0) {
        return Err(bad(
            "llama3 rope: need 0 < low_freq_factor < high_freq_factor",
        ));
    }
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    let ff = (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect();
    Ok(RopeScaling::FreqFactors(ff))
}
