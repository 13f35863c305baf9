//! DeepSeek V2/V3 weights in a Hugging Face store, shape-checked at load.
//!
//! Matrices stay mapped ([`Linear`]); norms, the router and `kv_b_proj` (needed per head in
//! f32 for weight absorption: rows `h·(nope+v) ..+nope` are `W_UK_h`, the next `v` rows
//! `W_UV_h`, each `[·, kv_lora_rank]`) are dequantized once.

use super::config::DeepSeekConfig;
use crate::store::{Linear, WeightStore};
use crate::{ModelError, Naming};

pub enum QProj {
    Full(Linear),
    /// `q = W_qb · rms_norm(W_qa · x)`
    Lora {
        a: Linear,
        norm: Vec<f32>,
        b: Linear,
    },
}

pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

pub struct Moe {
    /// `[n_experts, hidden]`
    pub router: Vec<f32>,
    /// V3's `e_score_correction_bias` `[n_experts]`.
    pub bias: Option<Vec<f32>>,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
}

pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: QProj,
    /// `[kv_lora_rank + rope, hidden]`
    pub kv_a: Linear,
    pub kv_a_norm: Vec<f32>,
    /// `[n_heads · (nope + v), kv_lora_rank]`, f32.
    pub kv_b: Vec<f32>,
    pub o: Linear,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

pub struct Weights {
    pub embed: Linear,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    pub lm_head: Linear,
}

fn mlp(s: &WeightStore, p: &str, h: usize, f: usize) -> Result<Mlp, ModelError> {
    Ok(Mlp {
        gate: s.linear(&format!("{p}.gate_proj.weight"), f, h)?,
        up: s.linear(&format!("{p}.up_proj.weight"), f, h)?,
        down: s.linear(&format!("{p}.down_proj.weight"), h, f)?,
    })
}

fn ffn(s: &WeightStore, c: &DeepSeekConfig, l: usize) -> Result<Ffn, ModelError> {
    let p = format!("model.layers.{l}.mlp");
    let h = c.hidden;
    if !c.is_moe(l) {
        return Ok(Ffn::Dense(mlp(s, &p, h, c.ffn_hidden)?));
    }
    let e = c.n_routed_experts;
    let experts = (0..e)
        .map(|i| mlp(s, &format!("{p}.experts.{i}"), h, c.moe_hidden))
        .collect::<Result<_, _>>()?;
    let shared = (c.n_shared_experts > 0)
        .then(|| {
            mlp(
                s,
                &format!("{p}.shared_experts"),
                h,
                c.moe_hidden * c.n_shared_experts,
            )
        })
        .transpose()?;
    Ok(Ffn::Moe(Moe {
        router: s.dense(&format!("{p}.gate.weight"), &[e, h])?,
        bias: s.dense_opt(&format!("{p}.gate.e_score_correction_bias"), &[e])?,
        experts,
        shared,
    }))
}

fn layer(s: &WeightStore, c: &DeepSeekConfig, l: usize) -> Result<Layer, ModelError> {
    let n = |k: &str| format!("model.layers.{l}.{k}");
    let h = c.hidden;
    let qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    let q_out = c.n_heads * qk;
    let q = match c.q_lora_rank {
        None => QProj::Full(s.linear(&n("self_attn.q_proj.weight"), q_out, h)?),
        Some(r) => QProj::Lora {
            a: s.linear(&n("self_attn.q_a_proj.weight"), r, h)?,
            norm: s.dense(&n("self_attn.q_a_layernorm.weight"), &[r])?,
            b: s.linear(&n("self_attn.q_b_proj.weight"), q_out, r)?,
        },
    };
    let r = c.kv_lora_rank;
    Ok(Layer {
        attn_norm: s.dense(&n("input_layernorm.weight"), &[h])?,
        q,
        kv_a: s.linear(&n("self_attn.kv_a_proj_with_mqa.weight"), c.latent_dim(), h)?,
        kv_a_norm: s.dense(&n("self_attn.kv_a_layernorm.weight"), &[r])?,
        kv_b: s.dense(
            &n("self_attn.kv_b_proj.weight"),
            &[c.n_heads * (c.qk_nope_head_dim + c.v_head_dim), r],
        )?,
        o: s.linear(&n("self_attn.o_proj.weight"), h, c.n_heads * c.v_head_dim)?,
        ffn_norm: s.dense(&n("post_attention_layernorm.weight"), &[h])?,
        ffn: ffn(s, c, l)?,
    })
}

impl Weights {
    pub fn load(s: &WeightStore, c: &DeepSeekConfig) -> Result<Weights, ModelError> {
        let names = Naming::Hf;
        let embed = s.linear(&names.global("token_embd"), c.vocab_size, c.hidden)?;
        let layers = (0..c.n_layers)
            .map(|l| layer(s, c, l))
            .collect::<Result<_, _>>()?;
        let head = names.global("output");
        let lm_head = match s.find(&head)? {
            Some(_) => s.linear(&head, c.vocab_size, c.hidden)?,
            None => embed.clone(),
        };
        Ok(Weights {
            embed,
            layers,
            norm: s.dense(&names.global("output_norm"), &[c.hidden])?,
            lm_head,
        })
    }
}
