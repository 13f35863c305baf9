//! [`ModelConfig`]: the hyper-parameters of a Llama-family model, read from GGUF metadata.
//!
//! Keys are the llama.cpp ones, prefixed by `general.architecture` (`llama.block_count`, ...).
//! Missing optional keys take llama.cpp's defaults; every value is range-checked so a hostile
//! file cannot make the model allocate absurd buffers or divide by zero.

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::attention::AttnShape;
use tokenmill_kernels::ops::RopeStyle;

use crate::{Int4Config, ModelError};

/// The architectures this crate runs, by their GGUF `general.architecture` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, Mistral (older Mistral GGUFs also say `llama`).
    Llama,
    /// Mistral files converted under their own name.
    Mistral,
    /// Qwen2 (and the DeepSeek-R1 Qwen distills): QKV bias, NeoX RoPE.
    Qwen2,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "mistral" => Some(Arch::Mistral),
            "qwen2" => Some(Arch::Qwen2),
            _ => None,
        }
    }

    /// The RoPE pairing llama.cpp uses for the architecture (its `llama_model_rope_type`).
    /// Llama GGUFs have Q/K permuted at conversion so that interleaved pairs are right.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama | Arch::Mistral => RopeStyle::Interleaved,
            Arch::Qwen2 => RopeStyle::NeoX,
        }
    }
}

/// RoPE frequency scaling as the metadata asks for it.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (`rope.scaling.type = linear`).
    Linear {
        factor: f32,
    },
    /// Per-dimension frequency divisors from the `rope_freqs.weight` tensor (Llama 3.1+).
    FreqFactors(Vec<f32>),
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_hidden: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Dimensions of each head that RoPE rotates (≤ `head_dim`).
    pub rope_dim: usize,
    pub rope_scaling: RopeScaling,
    /// Which RoPE pairing the weights expect: interleaved for Llama GGUFs (Q/K permuted at
    /// conversion), halves (NeoX) for Qwen2 GGUFs and every Hugging Face checkpoint.
    pub rope_style: RopeStyle,
    /// The AWQ / GPTQ int4 scheme of a Hugging Face checkpoint (`quantization_config`);
    /// `None` for GGUF files and float checkpoints.
    pub quantization: Option<Int4Config>,
}

/// Sizes above these are rejected as corrupt rather than allocated.
pub(crate) const MAX_DIM: u64 = 1 << 20;
pub(crate) const MAX_LAYERS: u64 = 4096;

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let md = file.metadata();
        let arch_name = file.architecture().ok_or(ModelError::MissingMetadata {
            key: "general.architecture".into(),
        })?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_string()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str, max: u64| -> Result<usize, ModelError> {
            let full = key(k);
            let v = md
                .get_u64(&full)
                .ok_or_else(|| ModelError::MissingMetadata { key: full.clone() })?;
            check_range(&full, v, max)
        };
        let opt = |k: &str, max: u64| -> Result<Option<usize>, ModelError> {
            let full = key(k);
            md.get_u64(&full)
                .map(|v| check_range(&full, v, max))
                .transpose()
        };
        let n_layers = req("block_count", MAX_LAYERS)?;
        let hidden = req("embedding_length", MAX_DIM)?;
        let n_heads = req("attention.head_count", MAX_DIM)?;
        let n_kv_heads = opt("attention.head_count_kv", MAX_DIM)?.unwrap_or(n_heads);
        let ffn_hidden = req("feed_forward_length", MAX_DIM)?;
        let context_length = opt("context_length", 1 << 24)?.unwrap_or(4096);
        let head_dim = match opt("attention.key_length", MAX_DIM)? {
            Some(d) => d,
            None if hidden % n_heads == 0 => hidden / n_heads,
            None => {
                return Err(ModelError::BadConfig(format!(
                    "embedding_length {hidden} is not a multiple of head_count {n_heads}"
                )));
            }
        };
        if n_heads % n_kv_heads != 0 {
            return Err(ModelError::BadConfig(format!(
                "head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}"
            )));
        }
        let rope_dim = opt("rope.dimension_count", MAX_DIM)?.unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ModelError::BadConfig(format!(
                "rope.dimension_count {rope_dim} must be even and ≤ head dim {head_dim}"
            )));
        }
        let rms_eps = md
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5);
        let rope_theta = md.get_f32(&key("rope.freq_base")).unwrap_or(10000.0);
        if !(rms_eps.is_finite() && rms_eps >= 0.0 && rope_theta.is_finite() && rope_theta > 1.0) {
            return Err(ModelError::BadConfig(format!(
                "rms epsilon {rms_eps} / rope freq_base {rope_theta} out of range"
            )));
        }
        let rope_scaling = rope_scaling(file, arch_name, rope_dim)?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or(ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let vocab_size = match embd.dims.as_slice() {
            [h, v] if *h as usize == hidden => check_range("token_embd rows", *v, 1 << 24)?,
            dims => {
                return Err(ModelError::BadShape {
                    name: "token_embd.weight".into(),
                    expected: vec![hidden as u64, 0],
                    found: dims.to_vec(),
                });
            }
        };
        Ok(ModelConfig {
            arch,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_hidden,
            vocab_size,
            context_length,
            rms_eps,
            rope_theta,
            rope_dim,
            rope_scaling,
            rope_style: arch.rope_style(),
            quantization: None,
        })
    }

    /// Values per token per layer in K (and in V): `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The attention geometry, with the usual `1 / sqrt(head_dim)` scale.
    pub fn attn_shape(&self) -> AttnShape {
        AttnShape {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }

    /// RoPE inverse frequencies `1 / theta^(2i/rope_dim)`, with the scaling folded in.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let half = self.rope_dim / 2;
        (0..half)
            .map(|i| {
                let f = 1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / self.rope_dim as f64);
                let f = match &self.rope_scaling {
                    RopeScaling::None => f,
                    RopeScaling::Linear { factor } => f / *factor as f64,
                    RopeScaling::FreqFactors(ff) => f / ff[i] as f64,
                };
                f as f32
            })
            .collect()
    }
}

fn check_range(key: &str, v: u64, max: u64) -> Result<usize, ModelError> {
    if v == 0 || v > max {
        return Err(ModelError::BadConfig(format!(
            "{key} = {v} is out of range 1..={max}"
        )));
    }
    Ok(v as usize)
}

fn rope_scaling(file: &GgufFile, arch: &str, rope_dim: usize) -> Result<RopeScaling, ModelError> {
    if let Some(t) = file.tensor("rope_freqs.weight") {
        let mut ff = vec![0f32; rope_dim / 2];
        if t.n_elements() != ff.len() as u64 {
            return Err(ModelError::BadShape {
                name: t.name.clone(),
                expected: vec![ff.len() as u64],
                found: t.dims.clone(),
            });
        }
        tokenmill_kernels::quant::dequantize_row(t.ty, file.tensor_data(t), &mut ff);
        if ff.iter().any(|f| !f.is_finite() || *f <= 0.0) {
            return Err(ModelError::BadConfig(
                "rope_freqs.weight has non-positive factors".into(),
            ));
        }
        return Ok(RopeScaling::FreqFactors(ff));
    }
    let md = file.metadata();
    let ty = md
        .get_str(&format!("{arch}.rope.scaling.type"))
        .unwrap_or("none");
    let factor = md.get_f32(&format!("{arch}.rope.scaling.factor"));
    match (ty, factor) {
        ("none", _) => Ok(RopeScaling::None),
        ("linear", Some(f)) if f.is_finite() && f > 0.0 => Ok(RopeScaling::Linear { factor: f }),
        ("linear", None) => Ok(RopeScaling::None),
        (other, _) => Err(ModelError::BadConfig(format!(
            "unsupported rope scaling '{other}'"
        ))),
    }
}
