//! A Hugging Face DeepSeek V2/V3 folder (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`) to
//! a GGUF of llama.cpp's `deepseek2` architecture, as `convert_hf_to_gguf.py`
//! (`DeepseekV2Model`) followed by `llama-quantize` would write it — the file tokenmill's
//! `deepseek2` loader reads and llama.cpp runs.
//!
//! # What is written
//!
//! * Metadata (`deepseek2.` prefix), the converter's keys: `block_count`, `context_length`,
//!   `embedding_length`, `feed_forward_length` (the dense layers' width),
//!   `attention.head_count`, `attention.head_count_kv` = 1 and `attention.key_length` /
//!   `value_length` = `kv_lora_rank + rope` / `kv_lora_rank` (MLA seen as MQA over the latent),
//!   `attention.key_length_mla` / `value_length_mla` (per-head `nope + rope` / `v`),
//!   `attention.q_lora_rank`, `attention.kv_lora_rank`,
//!   `attention.layer_norm_rms_epsilon`, `rope.freq_base`, `rope.dimension_count` (rope part),
//!   YaRN as `rope.scaling.{type, factor, original_context_length, yarn_beta_fast,
//!   yarn_beta_slow, yarn_attn_factor}` and `rope.scaling.yarn_log_multiplier = 0.1 ·
//!   mscale_all_dim`, `leading_dense_block_count`, `vocab_size`, `expert_count`,
//!   `expert_used_count`, `expert_shared_count`, `expert_feed_forward_length`,
//!   `expert_group_count` / `expert_group_used_count` (when config.json has them),
//!   `expert_weights_scale`, `expert_weights_norm` (when true), then `general.file_type` and
//!   the tokenizer metadata of [`crate::vocab`].
//! * `attention.q_lora_rank` is 0 for a model with a plain `q_proj`, where the converter
//!   writes no key: llama.cpp's loader reads the key unless the model has 26 or 27 layers (how
//!   it recognises DeepSeek-V2-Lite), and with 0 it loads `attn_q`, so a Lite-shaped model of
//!   any depth loads.
//! * `expert_gating_func` (1 softmax, 2 sigmoid) is written for every file, from the routing
//!   tokenmill runs: the converter writes it only when config.json has `scoring_func`, and
//!   llama.cpp routes a file without it by softmax — wrong for a V3 folder whose config.json
//!   leaves the sigmoid implied (transformers' `DeepseekV3Config` does not save it).
//! * Tensors under llama.cpp's names: `token_embd`, `output_norm`, `output` (unless tied), per
//!   layer `blk.N.`{`attn_norm`, `attn_q` | `attn_q_a` + `attn_q_a_norm` + `attn_q_b`,
//!   `attn_kv_a_mqa`, `attn_kv_a_norm`, `attn_k_b`, `attn_v_b`, `attn_output`, `ffn_norm`} and
//!   the dense `ffn_{gate,up,down}` or `ffn_gate_inp` (router), `exp_probs_b.bias` (V3),
//!   `ffn_{gate,up,down}_exps` (the experts stacked into one 3-D tensor, expert-major) and
//!   `ffn_{gate,up,down}_shexp`.
//! * `kv_b_proj` `[H·(nope + v), r]` is split per head as the converter does (the weight
//!   absorption layout): `attn_k_b` is `W_UK_h` transposed, PyTorch shape `[H, r, nope]`, and
//!   `attn_v_b` is `W_UV_h`, `[H, v, r]`.
//! * Types: 1-D tensors and the router (`ffn_gate_inp`, which llama-quantize never quantizes)
//!   are F32; other matrices get [`choose_type`](crate::choose_type)'s type for the target (a
//!   3-D expert stack is quantized row by row like a matrix of `E·rows` rows); `hf.rs`'s
//!   `write_export` plans and writes the file for both folder kinds.
//!
//! The folder is loaded as a model first (`DeepSeekModel::load_hf_dir`), so a config that does
//! not match its weights is refused before anything is written, and the file describes exactly
//! the model tokenmill runs from the folder.

use std::borrow::Cow;
use std::path::Path;

use serde_json::Value as Json;
use tokenmill_gguf::{GgmlType, TensorInfo, Value};
use tokenmill_model::deepseek::{DeepSeekConfig, DeepSeekModel, Routing};
use tokenmill_model::{ModelError, TensorRef, WeightStore};

use crate::QuantizeOptions;
use crate::error::{ConvertError, Result};
use crate::write::{Report, TensorReport};

/// Where a GGUF tensor's bytes come from (every source is a float tensor of the folder).
enum Source {
    Whole(TensorRef),
    /// `attn_k_b`: per head, rows `h·(nope+v) .. +nope` of `kv_b_proj`, transposed.
    KB {
        kv_b: TensorRef,
        nope: usize,
        v: usize,
    },
    /// `attn_v_b`: per head, rows `h·(nope+v) + nope .. +v` of `kv_b_proj`.
    VB {
        kv_b: TensorRef,
        nope: usize,
        v: usize,
    },
    /// Expert matrices of one shape, stacked expert-major.
    Stack(Vec<TensorRef>),
}

struct Tensor {
    /// llama.cpp name, GGUF dims (innermost first), source type.
    info: TensorInfo,
    source: Source,
}

fn info(name: String, dims: Vec<u64>, ty: GgmlType) -> TensorInfo {
    TensorInfo {
        name,
        dims,
        ty,
        offset: 0,
        size: 0,
    }
}

fn whole(store: &WeightStore, gguf: &str, hf: &str) -> Result<Tensor> {
    let t = store.get(hf)?;
    Ok(Tensor {
        info: info(gguf.into(), t.shape.iter().rev().copied().collect(), t.ty),
        source: Source::Whole(t),
    })
}

/// `attn_k_b` and `attn_v_b` of `kv_b_proj` (module docs).
fn split_kv_b(store: &WeightStore, c: &DeepSeekConfig, l: usize, hf: &str) -> Result<[Tensor; 2]> {
    let kv_b = store.get(hf)?;
    let (h, r) = (c.n_heads as u64, c.kv_lora_rank as u64);
    let (nope, v) = (c.qk_nope_head_dim, c.v_head_dim);
    let k_b = Tensor {
        info: info(
            format!("blk.{l}.attn_k_b.weight"),
            vec![nope as u64, r, h],
            kv_b.ty,
        ),
        source: Source::KB {
            kv_b: kv_b.clone(),
            nope,
            v,
        },
    };
    let v_b = Tensor {
        info: info(
            format!("blk.{l}.attn_v_b.weight"),
            vec![r, v as u64, h],
            kv_b.ty,
        ),
        source: Source::VB { kv_b, nope, v },
    };
    Ok([k_b, v_b])
}

/// `blk.{l}.ffn_{proj}_exps` of the folder's `experts.{e}.{proj}_proj` matrices.
fn experts(store: &WeightStore, c: &DeepSeekConfig, l: usize, proj: &str) -> Result<Tensor> {
    let parts = (0..c.n_routed_experts)
        .map(|e| {
            store.get(&format!(
                "model.layers.{l}.mlp.experts.{e}.{proj}_proj.weight"
            ))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let (first, e) = (&parts[0], parts.len() as u64);
    if let Some(odd) = parts.iter().find(|p| p.ty != first.ty) {
        return Err(ConvertError::MixedExpertTypes {
            layer: l,
            types: [first.ty, odd.ty],
        });
    }
    let dims = vec![first.shape[1], first.shape[0], e];
    Ok(Tensor {
        info: info(format!("blk.{l}.ffn_{proj}_exps.weight"), dims, first.ty),
        source: Source::Stack(parts),
    })
}

/// The tensors of the GGUF, layer by layer.
fn tensors(store: &WeightStore, c: &DeepSeekConfig) -> Result<Vec<Tensor>> {
    let mut out = vec![whole(
        store,
        "token_embd.weight",
        "model.embed_tokens.weight",
    )?];
    for l in 0..c.n_layers {
        let hf = |k: &str| format!("model.layers.{l}.{k}.weight");
        let mut push = |gguf: &str, hf_name: &str| -> Result<()> {
            out.push(whole(store, &format!("blk.{l}.{gguf}.weight"), hf_name)?);
            Ok(())
        };
        push("attn_norm", &hf("input_layernorm"))?;
        if c.q_lora_rank.is_some() {
            push("attn_q_a", &hf("self_attn.q_a_proj"))?;
            push("attn_q_a_norm", &hf("self_attn.q_a_layernorm"))?;
            push("attn_q_b", &hf("self_attn.q_b_proj"))?;
        } else {
            push("attn_q", &hf("self_attn.q_proj"))?;
        }
        push("attn_kv_a_mqa", &hf("self_attn.kv_a_proj_with_mqa"))?;
        push("attn_kv_a_norm", &hf("self_attn.kv_a_layernorm"))?;
        push("attn_output", &hf("self_attn.o_proj"))?;
        push("ffn_norm", &hf("post_attention_layernorm"))?;
        if c.is_moe(l) {
            push("ffn_gate_inp", &hf("mlp.gate"))?;
            let bias = format!("model.layers.{l}.mlp.gate.e_score_correction_bias");
            if store.find(&bias)?.is_some() {
                out.push(whole(store, &format!("blk.{l}.exp_probs_b.bias"), &bias)?);
            }
            for proj in ["gate", "up", "down"] {
                out.push(experts(store, c, l, proj)?);
            }
            if c.n_shared_experts > 0 {
                for proj in ["gate", "up", "down"] {
                    out.push(whole(
                        store,
                        &format!("blk.{l}.ffn_{proj}_shexp.weight"),
                        &hf(&format!("mlp.shared_experts.{proj}_proj")),
                    )?);
                }
            }
        } else {
            for proj in ["gate", "up", "down"] {
                out.push(whole(
                    store,
                    &format!("blk.{l}.ffn_{proj}.weight"),
                    &hf(&format!("mlp.{proj}_proj")),
                )?);
            }
        }
        out.extend(split_kv_b(store, c, l, &hf("self_attn.kv_b_proj"))?);
    }
    out.push(whole(store, "output_norm.weight", "model.norm.weight")?);
    if store.find("lm_head.weight")?.is_some() {
        out.push(whole(store, "output.weight", "lm_head.weight")?);
    }
    Ok(out)
}

/// The bytes of `t` in GGUF order.
fn source_bytes<'a>(store: &'a WeightStore, t: &'a Tensor) -> Cow<'a, [u8]> {
    match &t.source {
        Source::Whole(r) => Cow::Borrowed(store.data(r)),
        Source::Stack(parts) => {
            Cow::Owned(parts.iter().flat_map(|p| store.data(p)).copied().collect())
        }
        Source::KB { kv_b, nope, v } => {
            let (es, r) = (kv_b.ty.type_size(), kv_b.shape[1] as usize);
            let src = store.data(kv_b);
            let mut out = Vec::with_capacity(src.len() * nope / (nope + v));
            for head in src.chunks_exact((nope + v) * r * es) {
                for c in 0..r {
                    for n in 0..*nope {
                        let at = (n * r + c) * es;
                        out.extend_from_slice(&head[at..at + es]);
                    }
                }
            }
            Cow::Owned(out)
        }
        Source::VB { kv_b, nope, v } => {
            let (es, r) = (kv_b.ty.type_size(), kv_b.shape[1] as usize);
            let src = store.data(kv_b);
            let row = r * es;
            let heads = src.chunks_exact((nope + v) * row);
            Cow::Owned(heads.flat_map(|h| &h[nope * row..]).copied().collect())
        }
    }
}

/// config.json's RoPE parameters (`rope_parameters`, else `rope_scaling`), as config.rs reads
/// them.
fn rope_params(raw: &Json) -> Json {
    match raw.get("rope_parameters") {
        Some(p @ Json::Object(_)) => p.clone(),
        _ => raw.get("rope_scaling").cloned().unwrap_or(Json::Null),
    }
}

/// The `deepseek2.*` and `general.*` metadata (module docs) of the model `c` loaded from the
/// config.json `raw`, named `name`.
fn arch_metadata(c: &DeepSeekConfig, raw: &Json, name: &str, ftype: u32) -> Vec<(String, Value)> {
    let u = |v: usize| Value::U32(v as u32);
    let f = |v: f64| Value::F32(v as f32);
    let p = rope_params(raw);
    let num = |v: &Json, k: &str| v.get(k).and_then(Json::as_f64).filter(|x| x.is_finite());
    let rope_theta = num(&p, "rope_theta")
        .or(num(raw, "rope_theta"))
        .unwrap_or(10000.0);
    let mut keys: Vec<(&str, Value)> = vec![
        ("block_count", u(c.n_layers)),
        ("context_length", u(c.context_length)),
        ("embedding_length", u(c.hidden)),
        ("feed_forward_length", u(c.ffn_hidden)),
        ("attention.head_count", u(c.n_heads)),
        ("attention.head_count_kv", u(1)),
        ("rope.freq_base", f(rope_theta)),
        ("attention.layer_norm_rms_epsilon", Value::F32(c.rms_eps)),
    ];
    let ty = p.get("rope_type").or_else(|| p.get("type"));
    if let (Some("yarn"), Some(factor)) = (ty.and_then(Json::as_str), num(&p, "factor")) {
        keys.push(("rope.scaling.type", Value::String("yarn".into())));
        keys.push(("rope.scaling.factor", f(factor)));
        if let Some(orig) = p["original_max_position_embeddings"].as_u64() {
            keys.push((
                "rope.scaling.original_context_length",
                Value::U32(orig as u32),
            ));
        }
        for (key, gguf) in [
            ("attention_factor", "rope.scaling.yarn_attn_factor"),
            ("beta_fast", "rope.scaling.yarn_beta_fast"),
            ("beta_slow", "rope.scaling.yarn_beta_slow"),
        ] {
            if let Some(v) = num(&p, key) {
                keys.push((gguf, f(v)));
            }
        }
    }
    if c.n_routed_experts > 0 {
        keys.push(("expert_count", u(c.n_routed_experts)));
        keys.push(("expert_used_count", u(c.n_experts_per_tok)));
    }
    if raw.get("n_group").is_some_and(Json::is_u64) {
        keys.push(("expert_group_count", u(c.n_group)));
    }
    if raw.get("topk_group").is_some_and(Json::is_u64) {
        keys.push(("expert_group_used_count", u(c.topk_group)));
    }
    let gating = if c.routing == Routing::Sigmoid { 2 } else { 1 };
    keys.push(("expert_gating_func", Value::U32(gating)));
    let (r, rope) = (c.kv_lora_rank, c.qk_rope_head_dim);
    keys.extend([
        ("leading_dense_block_count", u(c.first_k_dense_replace)),
        ("vocab_size", u(c.vocab_size)),
    ]);
    keys.push(("attention.q_lora_rank", u(c.q_lora_rank.unwrap_or(0))));
    keys.extend([
        ("attention.kv_lora_rank", u(r)),
        ("attention.key_length", u(r + rope)),
        ("attention.value_length", u(r)),
        ("attention.key_length_mla", u(c.qk_nope_head_dim + rope)),
        ("attention.value_length_mla", u(c.v_head_dim)),
        ("expert_feed_forward_length", u(c.moe_hidden)),
        ("expert_shared_count", u(c.n_shared_experts)),
        ("expert_weights_scale", Value::F32(c.routed_scaling_factor)),
    ]);
    if c.norm_topk_prob {
        keys.push(("expert_weights_norm", Value::Bool(true)));
    }
    keys.push(("rope.dimension_count", u(rope)));
    if let Some(m) = num(&p, "mscale_all_dim") {
        keys.push(("rope.scaling.yarn_log_multiplier", f(0.1 * m)));
    }
    let mut md: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String("deepseek2".into()),
        ),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name.into())),
    ];
    md.extend(keys.into_iter().map(|(k, v)| (format!("deepseek2.{k}"), v)));
    md.push(("general.file_type".into(), Value::U32(ftype)));
    md.push(("general.quantization_version".into(), Value::U32(2)));
    md
}

/// Exports the DeepSeek folder `dir` to `output` (module docs).
pub(crate) fn convert(
    dir: &Path,
    output: &Path,
    options: &QuantizeOptions,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<Report> {
    let load = |source| ConvertError::LoadModel {
        path: dir.to_owned(),
        source,
    };
    let model = DeepSeekModel::load_hf_dir(dir).map_err(load)?;
    let text = tokenmill_model::read_config_json(dir).map_err(load)?;
    // Parsed once already by the loader; a file changed in between is still an error, not a panic.
    let raw: Json = serde_json::from_str(&text)
        .map_err(|e| load(ModelError::BadConfig(format!("config.json: {e}"))))?;
    let (c, store) = (model.config(), model.store());
    let tensors = tensors(store, c)?;
    let name = crate::hf::model_name(dir);
    let mut meta = arch_metadata(c, &raw, &name, options.target.llama_ftype());
    meta.extend(crate::vocab::tokenizer_metadata(dir, c.vocab_size)?);
    let infos: Vec<TensorInfo> = tensors.iter().map(|t| t.info.clone()).collect();
    let router = |t: &TensorInfo| t.name.ends_with("ffn_gate_inp.weight");
    let data = |i: usize| source_bytes(store, &tensors[i]);
    crate::hf::write_export(output, &meta, &infos, router, data, options, on_tensor)
}
