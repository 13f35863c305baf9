//! The weights of a Llama-family model, located in their [`WeightStore`] and shape-checked at
//! load.
//!
//! Matrices stay in the store's memory map in their native format ([`Linear`] only records
//! where); norms and biases are small and are dequantized to f32 once. Tensor names follow the
//! store's convention ([`Naming`]): llama.cpp's (`blk.N.attn_q.weight`) for GGUF, Hugging
//! Face's (`model.layers.N.self_attn.q_proj.weight`) for safetensors.
//!
//! Q/K/V (and gate/up) are not concatenated into copies: the forward runs them as one pass
//! over the mapped matrices (`matmul_multi`, `matmul_silu_mul`: one activation quantization,
//! one pool job), which works even when their weight types differ but share an activation
//! format (a Q6_K `attn_v` beside Q4_K `attn_q`/`attn_k` in Q4_K_M files). The Q/K/V biases
//! are concatenated here (zeros for a missing one) to match the side-by-side Q/K/V output.
//!
//! The seven layer matrices are [`Weight`]s: stored matrices, or AWQ / GPTQ int4 matrices
//! when the checkpoint has `<name>.qweight` (`int4_linear.rs`), and so is the LM head
//! (GPTQModel can quantize it). Embedding and norms are always stored floats.

use crate::int4_linear::{Weight, has_int4};
use crate::store::{Linear, WeightStore};
use crate::{ModelConfig, ModelError};

/// A store's tensor naming convention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// llama.cpp's GGUF names.
    Gguf,
    /// Hugging Face transformers' state-dict names.
    Hf,
}

impl Naming {
    pub fn for_store(store: &WeightStore) -> Naming {
        match store {
            WeightStore::Gguf(_) => Naming::Gguf,
            WeightStore::Safetensors(_) => Naming::Hf,
        }
    }

    /// A whole-model tensor, by its GGUF name (`token_embd`, `output_norm`, `output`).
    pub fn global(self, gguf: &str) -> String {
        let hf = match gguf {
            "token_embd" => "model.embed_tokens",
            "output_norm" => "model.norm",
            "output" => "lm_head",
            other => other,
        };
        match self {
            Naming::Gguf => format!("{gguf}.weight"),
            Naming::Hf => format!("{hf}.weight"),
        }
    }

    /// Layer `i`'s tensor by its GGUF short name and suffix (`attn_q.bias`).
    pub fn layer(self, i: usize, gguf: &str) -> String {
        let (base, suffix) = gguf.split_once('.').unwrap_or((gguf, "weight"));
        match self {
            Naming::Gguf => format!("blk.{i}.{base}.{suffix}"),
            Naming::Hf => {
                let hf = match base {
                    "attn_norm" => "input_layernorm",
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_output" => "self_attn.o_proj",
                    "ffn_norm" => "post_attention_layernorm",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_down" => "mlp.down_proj",
                    other => other,
                };
                format!("model.layers.{i}.{hf}.{suffix}")
            }
        }
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    /// Qwen2's Q/K/V biases side by side, `[q_dim + 2 · kv_dim]` (zeros for a missing one);
    /// `None` when the layer has none.
    pub qkv_bias: Option<Vec<f32>>,
    pub wo: Weight,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Weight,
    pub w_up: Weight,
    pub w_down: Weight,
}

pub struct Weights {
    pub token_embd: Linear,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `output.weight` (int4 when the checkpoint quantized the LM head too, as GPTQModel's
    /// `lm_head: true` does), or the token embedding when tied.
    pub output: Weight,
}

impl Weights {
    pub fn load(store: &WeightStore, cfg: &ModelConfig) -> Result<Weights, ModelError> {
        let names = Naming::for_store(store);
        let (h, q_dim, kv_dim) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.kv_dim());
        let quant = cfg.quantization.as_ref();
        let token_embd = store.linear(&names.global("token_embd"), cfg.vocab_size, h)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| names.layer(i, s);
            let biases = [
                store.dense_opt(&n("attn_q.bias"), &[q_dim])?,
                store.dense_opt(&n("attn_k.bias"), &[kv_dim])?,
                store.dense_opt(&n("attn_v.bias"), &[kv_dim])?,
            ];
            let qkv_bias = biases.iter().any(Option::is_some).then(|| {
                biases
                    .iter()
                    .zip([q_dim, kv_dim, kv_dim])
                    .flat_map(|(b, len)| b.clone().unwrap_or_else(|| vec![0.0; len]))
                    .collect()
            });
            let f = cfg.ffn_hidden;
            let lin = |s: &str, rows, cols| Weight::load(store, &n(s), rows, cols, quant);
            layers.push(LayerWeights {
                attn_norm: store.dense(&n("attn_norm"), &[h])?,
                wq: lin("attn_q", q_dim, h)?,
                wk: lin("attn_k", kv_dim, h)?,
                wv: lin("attn_v", kv_dim, h)?,
                qkv_bias,
                wo: lin("attn_output", h, q_dim)?,
                ffn_norm: store.dense(&n("ffn_norm"), &[h])?,
                w_gate: lin("ffn_gate", f, h)?,
                w_up: lin("ffn_up", f, h)?,
                w_down: lin("ffn_down", h, f)?,
            });
        }
        let output_name = names.global("output");
        let output = if store.find(&output_name)?.is_some() || has_int4(store, &output_name) {
            Weight::load(store, &output_name, cfg.vocab_size, h, quant)?
        } else {
            Weight::Stored(token_embd.clone())
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm: store.dense(&names.global("output_norm"), &[h])?,
            output,
        })
    }

    /// Bytes of every matmul weight one forward step streams (the embedding table is only
    /// gathered from, so it counts only when it doubles as the LM head).
    pub fn matmul_bytes(&self) -> usize {
        let per_layer = |l: &LayerWeights| {
            [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                .iter()
                .map(|w| w.n_bytes())
                .sum::<usize>()
        };
        self.layers.iter().map(per_layer).sum::<usize>() + self.output.n_bytes()
    }
}
