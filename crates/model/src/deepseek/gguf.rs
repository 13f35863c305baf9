//! DeepSeek V2/V3 from a GGUF file of llama.cpp's `deepseek2` architecture, as
//! `convert_hf_to_gguf.py` (`DeepseekV2Model`) writes it.
//!
//! Hyper-parameters (`deepseek2.` prefix): `block_count`, `embedding_length`,
//! `attention.head_count`, `attention.layer_norm_rms_epsilon`, `attention.q_lora_rank` (absent
//! or 0: a plain `attn_q`), `attention.kv_lora_rank`, `rope.dimension_count` (qk_rope),
//! `attention.key_length_mla` / `value_length_mla` (per-head qk and v sizes; files from before
//! the MLA split have them in `key_length` / `value_length` instead, where newer files keep the
//! MQA view `kv_lora_rank + rope` / `kv_lora_rank`), `feed_forward_length` (dense layers),
//! `expert_feed_forward_length`, `expert_count`, `expert_used_count`, `expert_shared_count`,
//! `leading_dense_block_count`, `expert_weights_scale`, `expert_weights_norm`,
//! `expert_gating_func` (1 softmax — also when absent, as llama.cpp assumes for older V2 files —
//! 2 sigmoid), `expert_group_count` / `expert_group_used_count`, `vocab_size` (else the token
//! list's length), `context_length`, and RoPE: `rope.freq_base`, `rope.scaling.{type, factor,
//! original_context_length, yarn_beta_fast, yarn_beta_slow, yarn_attn_factor,
//! yarn_log_multiplier}`.
//!
//! RoPE is mapped back to the config.json form and computed by the one YaRN implementation in
//! `config.rs`. The converter stores `0.1 · mscale_all_dim` as `yarn_log_multiplier` and drops
//! `mscale`; like llama.cpp we take `mscale = mscale_all_dim` (true of every DeepSeek V2/V3
//! release), so cos/sin stay unscaled and the softmax scale gains `mscale(factor, m)²`.
//! Routing keeps transformers' semantics: softmax with `expert_group_count > 1` is V2's
//! `group_limited_greedy` (groups ranked by their best score; llama.cpp ranks by the top-2
//! sum), and sigmoid is V3's `noaux_tc` with the `exp_probs_b` bias.
//!
//! Tensors (GGUF dims reversed to PyTorch order by the store): `token_embd`, `output_norm`,
//! `output` (absent: tied), per layer `blk.N.`{`attn_norm`, `attn_q_a`, `attn_q_a_norm`,
//! `attn_q_b` | `attn_q`, `attn_kv_a_mqa`, `attn_kv_a_norm`, `attn_k_b` `[H, r, nope]` (W_UK
//! per head, transposed) + `attn_v_b` `[H, v, r]` | the legacy whole `attn_kv_b`
//! `[H·(nope+v), r]`, `attn_output`, `ffn_norm`} and either the dense `ffn_{gate,up,down}` or
//! `ffn_gate_inp`, `exp_probs_b.bias` (V3), `ffn_{gate,up,down}_exps` (all experts in one 3-D
//! tensor; each expert is a [`Linear`](crate::Linear) over its own byte range) and
//! `ffn_{gate,up,down}_shexp`. The converter does not permute the rope dims of q/k for
//! `deepseek2`, so RoPE rotates adjacent pairs exactly as for the Hugging Face weights.
//!
//! Invariants: every count is range-checked; a missing required key is
//! [`ModelError::MissingMetadata`], a present key of the wrong type or range
//! [`ModelError::BadConfig`], a missing or mis-shaped tensor `MissingTensor` / `BadShape`.

use serde_json::json;
use tokenmill_gguf::{GgufFile, Metadata};

use super::config::{DeepSeekConfig, Routing, check_experts, rope};
use super::weights::{Ffn, HeadMatrices, Layer, Mlp, Moe, QProj, Weights, expansion_matrix};
use crate::ModelError;
use crate::store::WeightStore;

/// The `general.architecture` this module reads.
pub const ARCH: &str = "deepseek2";

const MAX_DIM: u64 = 1 << 20;
const MAX_LAYERS: u64 = 4096;
const MAX_EXPERTS: u64 = 1 << 16;

fn bad(msg: impl Into<String>) -> ModelError {
    ModelError::BadConfig(msg.into())
}

/// Typed, range-checked reads of `deepseek2.*` keys.
struct Keys<'a>(&'a Metadata);

impl Keys<'_> {
    fn uint(&self, k: &str, max: u64) -> Result<Option<usize>, ModelError> {
        let key = format!("{ARCH}.{k}");
        match self.0.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n as usize)),
                _ => Err(bad(format!(
                    "{key} ({}) is not an integer in 0..={max}",
                    v.type_name()
                ))),
            },
        }
    }

    /// A required positive integer.
    fn req(&self, k: &str, max: u64) -> Result<usize, ModelError> {
        match self.uint(k, max)? {
            Some(n) if n > 0 => Ok(n),
            Some(_) => Err(bad(format!("{ARCH}.{k} must be positive"))),
            None => Err(ModelError::MissingMetadata {
                key: format!("{ARCH}.{k}"),
            }),
        }
    }

    fn float(&self, k: &str) -> Result<Option<f64>, ModelError> {
        let key = format!("{ARCH}.{k}");
        match self.0.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_f32().filter(|f| f.is_finite()) {
                Some(f) => Ok(Some(f as f64)),
                None => Err(bad(format!(
                    "{key} ({}) is not a finite number",
                    v.type_name()
                ))),
            },
        }
    }

    fn flag(&self, k: &str) -> Result<Option<bool>, ModelError> {
        let key = format!("{ARCH}.{k}");
        match self.0.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| bad(format!("{key} ({}) is not a bool", v.type_name()))),
        }
    }

    fn text(&self, k: &str) -> Result<Option<&str>, ModelError> {
        let key = format!("{ARCH}.{k}");
        match self.0.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| bad(format!("{key} ({}) is not a string", v.type_name()))),
        }
    }
}

/// The RoPE keys as config.json's `rope_parameters` (what `config::rope` reads).
fn rope_parameters(k: &Keys<'_>) -> Result<serde_json::Value, ModelError> {
    let theta = k.float("rope.freq_base")?.unwrap_or(10000.0);
    let p = match k.text("rope.scaling.type")?.unwrap_or("none") {
        "none" => json!({"rope_type": "default", "rope_theta": theta}),
        "yarn" => {
            // [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: the converter writes 0.1 · mscale_all_dim.
            let m = k
                .float("rope.scaling.yarn_log_multiplier")?
                .map(|l| l / 0.1);
            json!({
                "rope_type": "yarn",
                "rope_theta": theta,
                "factor": k.float("rope.scaling.factor")?,
                "original_max_position_embeddings":
                    k.uint("rope.scaling.original_context_length", 1 << 24)?,
                "beta_fast": k.float("rope.scaling.yarn_beta_fast")?,
                "beta_slow": k.float("rope.scaling.yarn_beta_slow")?,
                "attention_factor": k.float("rope.scaling.yarn_attn_factor")?,
                "mscale": m,
                "mscale_all_dim": m,
            })
        }
        other => {
            return Err(bad(format!(
                "unsupported rope scaling '{other}' for DeepSeek"
            )));
        }
    };
    Ok(json!({ "rope_parameters": p }))
}

/// The vocabulary size: `deepseek2.vocab_size`, else the length of the token list.
fn vocab_size(md: &Metadata, k: &Keys<'_>) -> Result<usize, ModelError> {
    if let Some(n) = k.uint("vocab_size", 1 << 24)? {
        return Ok(n);
    }
    match md.get_array("tokenizer.ggml.tokens").map(|a| a.len()) {
        Some(n) if n > 0 && n <= 1 << 24 => Ok(n),
        Some(n) => Err(bad(format!("token list of {n} entries"))),
        None => Err(ModelError::MissingMetadata {
            key: format!("{ARCH}.vocab_size"),
        }),
    }
}

/// Per-head `(qk, v)` sizes: the `*_mla` keys of split-MLA files, else (files from before
/// the split) `key_length` / `value_length`.
fn head_dims(k: &Keys<'_>, rope: usize) -> Result<(usize, usize), ModelError> {
    let (qk, v) = match k.uint("attention.key_length_mla", MAX_DIM)? {
        Some(qk) => (qk, k.req("attention.value_length_mla", MAX_DIM)?),
        None => (
            k.req("attention.key_length", MAX_DIM)?,
            k.req("attention.value_length", MAX_DIM)?,
        ),
    };
    if qk <= rope {
        return Err(bad(format!(
            "key length {qk} leaves no room beside {rope} rope dims"
        )));
    }
    Ok((qk, v))
}

/// The routed-expert counts, groups and routing function.
struct Experts {
    n_routed_experts: usize,
    n_experts_per_tok: usize,
    n_group: usize,
    topk_group: usize,
    routing: Routing,
}

fn experts(k: &Keys<'_>) -> Result<Experts, ModelError> {
    let n_routed_experts = k.uint("expert_count", MAX_EXPERTS)?.unwrap_or(0);
    let n_experts_per_tok = k.uint("expert_used_count", MAX_EXPERTS)?.unwrap_or(0);
    let n_group = k
        .uint("expert_group_count", MAX_EXPERTS)?
        .unwrap_or(1)
        .max(1);
    let topk_group = k
        .uint("expert_group_used_count", MAX_EXPERTS)?
        .unwrap_or(n_group);
    check_experts(n_routed_experts, n_experts_per_tok, n_group, topk_group)?;
    let routing = match k.uint("expert_gating_func", 255)? {
        None | Some(1) => Routing::Softmax {
            group_limited: n_group > 1,
        },
        Some(2) => Routing::Sigmoid,
        Some(g) => return Err(bad(format!("unsupported expert_gating_func {g}"))),
    };
    Ok(Experts {
        n_routed_experts,
        n_experts_per_tok,
        n_group,
        topk_group,
        routing,
    })
}

impl DeepSeekConfig {
    /// The hyper-parameters of a `deepseek2` GGUF file (see the module doc for the keys).
    pub fn from_gguf(file: &GgufFile) -> Result<DeepSeekConfig, ModelError> {
        match file.architecture() {
            Some(ARCH) => {}
            Some(other) => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
            None => {
                return Err(ModelError::MissingMetadata {
                    key: "general.architecture".into(),
                });
            }
        }
        let md = file.metadata();
        let k = Keys(md);
        let n_layers = k.req("block_count", MAX_LAYERS)?;
        let n_heads = k.req("attention.head_count", MAX_DIM)?;
        let qk_rope_head_dim = k.req("rope.dimension_count", MAX_DIM)?;
        if qk_rope_head_dim % 2 != 0 {
            return Err(bad("rope.dimension_count must be even"));
        }
        let (qk_head_dim, v_head_dim) = head_dims(&k, qk_rope_head_dim)?;
        let Experts {
            n_routed_experts,
            n_experts_per_tok,
            n_group,
            topk_group,
            routing,
        } = experts(&k)?;
        let first_k_dense_replace = k
            .uint("leading_dense_block_count", MAX_LAYERS)?
            .unwrap_or(0);
        let any_dense = n_routed_experts == 0 || first_k_dense_replace > 0;
        let ffn_hidden = match any_dense {
            true => k.req("feed_forward_length", MAX_DIM)?,
            false => k.uint("feed_forward_length", MAX_DIM)?.unwrap_or(0),
        };
        let moe_hidden = match n_routed_experts > 0 {
            true => k.req("expert_feed_forward_length", MAX_DIM)?,
            false => 0,
        };
        let rms_eps = k
            .float("attention.layer_norm_rms_epsilon")?
            .filter(|e| *e >= 0.0)
            .ok_or_else(|| ModelError::MissingMetadata {
                key: format!("{ARCH}.attention.layer_norm_rms_epsilon"),
            })?;
        let routed_scaling_factor = k.float("expert_weights_scale")?.unwrap_or(1.0);
        let (inv_freq, rope_mscale, attn_mscale) = rope(&rope_parameters(&k)?, qk_rope_head_dim)?;
        Ok(DeepSeekConfig {
            v3: routing == Routing::Sigmoid,
            n_layers,
            hidden: k.req("embedding_length", MAX_DIM)?,
            n_heads,
            vocab_size: vocab_size(md, &k)?,
            context_length: k.uint("context_length", 1 << 24)?.unwrap_or(4096).max(1),
            rms_eps: rms_eps as f32,
            q_lora_rank: k.uint("attention.q_lora_rank", MAX_DIM)?.filter(|&r| r > 0),
            kv_lora_rank: k.req("attention.kv_lora_rank", MAX_DIM)?,
            qk_nope_head_dim: qk_head_dim - qk_rope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            ffn_hidden,
            moe_hidden,
            n_routed_experts,
            n_shared_experts: k.uint("expert_shared_count", MAX_EXPERTS)?.unwrap_or(0),
            n_experts_per_tok,
            first_k_dense_replace,
            routed_scaling_factor: routed_scaling_factor as f32,
            norm_topk_prob: k.flag("expert_weights_norm")?.unwrap_or(false),
            n_group,
            topk_group,
            routing,
            inv_freq,
            rope_mscale,
            attn_scale: (qk_head_dim as f64).powf(-0.5) as f32 * attn_mscale,
        })
    }
}

fn name(l: usize, t: &str) -> String {
    format!("blk.{l}.{t}.weight")
}

fn mlp(s: &WeightStore, l: usize, suffix: &str, h: usize, f: usize) -> Result<Mlp, ModelError> {
    Ok(Mlp {
        gate: s.linear(&name(l, &format!("ffn_gate{suffix}")), f, h)?,
        up: s.linear(&name(l, &format!("ffn_up{suffix}")), f, h)?,
        down: s.linear(&name(l, &format!("ffn_down{suffix}")), h, f)?,
    })
}

fn moe(s: &WeightStore, c: &DeepSeekConfig, l: usize) -> Result<Moe, ModelError> {
    let (h, f, e) = (c.hidden, c.moe_hidden, c.n_routed_experts);
    let gate = s.linear_stack(&name(l, "ffn_gate_exps"), e, f, h)?;
    let up = s.linear_stack(&name(l, "ffn_up_exps"), e, f, h)?;
    let down = s.linear_stack(&name(l, "ffn_down_exps"), e, h, f)?;
    let experts = gate
        .into_iter()
        .zip(up)
        .zip(down)
        .map(|((gate, up), down)| Mlp { gate, up, down })
        .collect();
    let shared = (c.n_shared_experts > 0)
        .then(|| mlp(s, l, "_shexp", h, f * c.n_shared_experts))
        .transpose()?;
    Ok(Moe {
        router: s.dense(&name(l, "ffn_gate_inp"), &[e, h])?,
        bias: s.dense_opt(&format!("blk.{l}.exp_probs_b.bias"), &[e])?,
        experts,
        shared,
    })
}

/// MLA's per-head `W_UKᵀ` and `W_UV`: views of the split `attn_k_b` `[H, r, nope]` and
/// `attn_v_b` `[H, v, r]` in their stored type, or made from the legacy whole `attn_kv_b`.
fn kv_b(
    s: &WeightStore,
    c: &DeepSeekConfig,
    l: usize,
) -> Result<(HeadMatrices, HeadMatrices), ModelError> {
    let (nh, nope, v, r) = (c.n_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank);
    if s.find(&name(l, "attn_k_b"))?.is_none() {
        let kv_b = s.dense(&name(l, "attn_kv_b"), &[nh * (nope + v), r])?;
        return Ok(HeadMatrices::from_kv_b(c, &kv_b));
    }
    let k_b = s.linear_stack(&name(l, "attn_k_b"), nh, r, nope)?;
    let v_b = s.linear_stack(&name(l, "attn_v_b"), nh, v, r)?;
    Ok((HeadMatrices::Stored(k_b), HeadMatrices::Stored(v_b)))
}

fn layer(s: &WeightStore, c: &DeepSeekConfig, l: usize) -> Result<Layer, ModelError> {
    let h = c.hidden;
    let q_out = c.n_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim);
    let q = match c.q_lora_rank {
        None => QProj::Full(s.linear(&name(l, "attn_q"), q_out, h)?),
        Some(r) => QProj::Lora {
            a: s.linear(&name(l, "attn_q_a"), r, h)?,
            norm: s.dense(&name(l, "attn_q_a_norm"), &[r])?,
            b: s.linear(&name(l, "attn_q_b"), q_out, r)?,
        },
    };
    let ffn = match c.is_moe(l) {
        true => Ffn::Moe(moe(s, c, l)?),
        false => Ffn::Dense(mlp(s, l, "", h, c.ffn_hidden)?),
    };
    let (k_b, v_b) = kv_b(s, c, l)?;
    Ok(Layer {
        kv_b: expansion_matrix(c, &k_b, &v_b, s),
        attn_norm: s.dense(&name(l, "attn_norm"), &[h])?,
        q,
        kv_a: s.linear(&name(l, "attn_kv_a_mqa"), c.latent_dim(), h)?,
        kv_a_norm: s.dense(&name(l, "attn_kv_a_norm"), &[c.kv_lora_rank])?,
        k_b,
        v_b,
        o: s.linear(&name(l, "attn_output"), h, c.n_heads * c.v_head_dim)?,
        ffn_norm: s.dense(&name(l, "ffn_norm"), &[h])?,
        ffn,
    })
}

/// The weights of a `deepseek2` GGUF store, located and shape-checked.
pub(super) fn load_weights(s: &WeightStore, c: &DeepSeekConfig) -> Result<Weights, ModelError> {
    let embed = s.linear("token_embd.weight", c.vocab_size, c.hidden)?;
    let layers = (0..c.n_layers)
        .map(|l| layer(s, c, l))
        .collect::<Result<_, _>>()?;
    let lm_head = match s.find("output.weight")? {
        Some(_) => s.linear("output.weight", c.vocab_size, c.hidden)?,
        None => embed.clone(),
    };
    Ok(Weights {
        embed,
        layers,
        norm: s.dense("output_norm.weight", &[c.hidden])?,
        lm_head,
    })
}
