//! A Hugging Face Llama-family folder (LlamaForCausalLM, MistralForCausalLM,
//! Qwen2ForCausalLM: `config.json`, safetensors — sharded or not — `tokenizer.json`,
//! `tokenizer_config.json`) to a GGUF that tokenmill and llama.cpp load, as llama.cpp's
//! `convert_hf_to_gguf.py` followed by `llama-quantize` would write it.
//!
//! # What is written
//!
//! * Architecture `llama` for Llama and Mistral, `qwen2` for Qwen2, with the keys the
//!   converter writes: `context_length`, `embedding_length`, `block_count`,
//!   `feed_forward_length`, `attention.head_count(_kv)`, `attention.key_length` /
//!   `value_length`, `rope.freq_base`,
//!   `rope.scaling.type/factor` (linear), `attention.layer_norm_rms_epsilon`, `vocab_size`,
//!   `rope.dimension_count`, `general.name/file_type/quantization_version`; Llama 3 RoPE
//!   scaling becomes the `rope_freqs.weight` tensor (F32, the factors the model crate's
//!   `hf_config.rs` computes like the converter's `generate_extra_tensors`). The values come
//!   from the parsed [`ModelConfig`], so the GGUF describes exactly the model tokenmill runs
//!   from the folder.
//! * The tokenizer metadata of [`crate::vocab`].
//! * Tensors under llama.cpp's names (the model crate's [`Naming`] maps them): `token_embd`,
//!   `blk.N.{attn_norm, attn_q, attn_k, attn_v (+ .bias when present), attn_output,
//!   ffn_norm, ffn_gate, ffn_up, ffn_down}`, `output_norm`, and `output` unless the
//!   embedding is tied (no `lm_head.weight`).
//! * The Q/K permutation of [`crate::permute`] for `llama` only (Qwen2 is NeoX in llama.cpp
//!   too and is not permuted).
//! * Types: 1-D tensors (norms, biases, `rope_freqs`) are F32, as the converter writes them;
//!   matrices get [`choose_type`]'s type for the target (llama-quantize's rules; `f32`/`f16`
//!   convert every matrix).
//!
//! The folder is loaded as a model first (`LlamaModel::load_hf_dir`), so a config that does
//! not match its weights is refused ([`ConvertError::LoadModel`]) before anything is written.

use std::borrow::Cow;
use std::path::Path;

use tokenmill_gguf::{GgmlType, TensorInfo, TensorSpec, Value};
use tokenmill_model::{Arch, LlamaModel, ModelConfig, Naming, RopeScaling, TensorRef, WeightStore};

use crate::QuantizeOptions;
use crate::error::{ConvertError, Result};
use crate::permute::{check_head_split, permute_qk_rows};
use crate::types::{TargetType, choose_type};
use crate::write::{OutputPlan, Report, TensorReport, write_gguf};

/// A layer's tensors, in the converter's order (biases only when the folder has them).
const LAYER_TENSORS: [&str; 12] = [
    "attn_norm",
    "attn_q",
    "attn_q.bias",
    "attn_k",
    "attn_k.bias",
    "attn_v",
    "attn_v.bias",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// Where a GGUF tensor's source bytes come from.
enum Source {
    /// A folder tensor; `permute_heads`: the Q/K row permutation over that many heads.
    Store {
        t: TensorRef,
        permute_heads: Option<usize>,
    },
    /// Generated values (`rope_freqs.weight`).
    F32(Vec<f32>),
}

struct Tensor {
    /// The source as a GGUF tensor: llama.cpp name, GGUF dims (innermost first), source type.
    info: TensorInfo,
    source: Source,
}

fn tensor(store: &WeightStore, gguf: String, hf: &str, permute: Option<usize>) -> Result<Tensor> {
    let t = store.get(hf)?;
    let info = TensorInfo {
        name: gguf,
        dims: t.shape.iter().rev().copied().collect(),
        ty: t.ty,
        offset: 0,
        size: 0,
    };
    if let Some(heads) = permute {
        check_head_split(hf, t.shape[0] as usize, heads)?;
    }
    Ok(Tensor {
        info,
        source: Source::Store {
            t,
            permute_heads: permute,
        },
    })
}

/// The `rope_freqs.weight` tensor of Llama 3 RoPE scaling.
fn rope_freqs(factors: &[f32]) -> Tensor {
    let info = TensorInfo {
        name: "rope_freqs.weight".into(),
        dims: vec![factors.len() as u64],
        ty: GgmlType::F32,
        offset: 0,
        size: 0,
    };
    Tensor {
        info,
        source: Source::F32(factors.to_vec()),
    }
}

/// The tensors of the GGUF, in the converter's order.
fn tensors(store: &WeightStore, cfg: &ModelConfig) -> Result<Vec<Tensor>> {
    let (g, h) = (Naming::Gguf, Naming::Hf);
    let permute = cfg.arch != Arch::Qwen2;
    let global = |name: &str| tensor(store, g.global(name), &h.global(name), None);
    let mut out = vec![global("token_embd")?];
    if let RopeScaling::FreqFactors(ff) = &cfg.rope_scaling {
        out.push(rope_freqs(ff));
    }
    for i in 0..cfg.n_layers {
        for name in LAYER_TENSORS {
            let hf = h.layer(i, name);
            if name.ends_with(".bias") && store.find(&hf)?.is_none() {
                continue;
            }
            let heads = match name.split('.').next() {
                Some("attn_q") if permute => Some(cfg.n_heads),
                Some("attn_k") if permute => Some(cfg.n_kv_heads),
                _ => None,
            };
            out.push(tensor(store, g.layer(i, name), &hf, heads)?);
        }
    }
    out.push(global("output_norm")?);
    if store.find(&h.global("output"))?.is_some() {
        out.push(global("output")?);
    }
    Ok(out)
}

/// The architecture metadata (see the module doc) for `cfg`, named `name`.
fn arch_metadata(cfg: &ModelConfig, name: &str, target: TargetType) -> Vec<(String, Value)> {
    let arch = if cfg.arch == Arch::Qwen2 {
        "qwen2"
    } else {
        "llama"
    };
    let u = |v: usize| Value::U32(v as u32);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name.into())),
    ];
    let mut keys: Vec<(&str, Value)> = vec![
        ("block_count", u(cfg.n_layers)),
        ("context_length", u(cfg.context_length)),
        ("embedding_length", u(cfg.hidden)),
        ("feed_forward_length", u(cfg.ffn_hidden)),
        ("attention.head_count", u(cfg.n_heads)),
        ("attention.head_count_kv", u(cfg.n_kv_heads)),
        ("rope.freq_base", Value::F32(cfg.rope_theta)),
        ("attention.layer_norm_rms_epsilon", Value::F32(cfg.rms_eps)),
    ];
    keys.push(("attention.key_length", u(cfg.head_dim)));
    keys.push(("attention.value_length", u(cfg.head_dim)));
    if let RopeScaling::Linear { factor } = cfg.rope_scaling {
        keys.push(("rope.scaling.type", Value::String("linear".into())));
        keys.push(("rope.scaling.factor", Value::F32(factor)));
    }
    keys.push(("vocab_size", u(cfg.vocab_size)));
    keys.push(("rope.dimension_count", u(cfg.rope_dim)));
    md.extend(keys.into_iter().map(|(k, v)| (format!("{arch}.{k}"), v)));
    md.push(("general.file_type".into(), Value::U32(target.llama_ftype())));
    md.push(("general.quantization_version".into(), Value::U32(2)));
    md
}

/// The bytes of `t` in GGUF row order.
fn source_bytes<'a>(store: &'a WeightStore, t: &'a Tensor) -> Cow<'a, [u8]> {
    match &t.source {
        Source::Store {
            t: r,
            permute_heads: None,
        } => Cow::Borrowed(store.data(r)),
        Source::Store {
            t: r,
            permute_heads: Some(heads),
        } => Cow::Owned(permute_qk_rows(store.data(r), r.shape[0] as usize, *heads)),
        Source::F32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    }
}

/// `general.name`: the folder's own name (after resolving `.` and links), else `model`.
pub(crate) fn model_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into())
}

/// Exports the folder `dir` to `output` with matrices of the options' target (see the module
/// doc).
pub(crate) fn convert(
    dir: &Path,
    output: &Path,
    options: &QuantizeOptions,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<Report> {
    // Loading the model checks the config and every weight's shape against it.
    let model = LlamaModel::load_hf_dir(dir).map_err(|source| ConvertError::LoadModel {
        path: dir.to_owned(),
        source,
    })?;
    let (cfg, store) = (model.config(), model.store());
    if cfg.arch == Arch::Qwen2 && matches!(cfg.rope_scaling, RopeScaling::FreqFactors(_)) {
        return Err(ConvertError::UnsupportedRopeScaling);
    }
    let tensors = tensors(store, cfg)?;
    let mut meta = arch_metadata(cfg, &model_name(dir), options.target);
    meta.extend(crate::vocab::tokenizer_metadata(dir, cfg.vocab_size)?);
    let infos: Vec<TensorInfo> = tensors.iter().map(|t| t.info.clone()).collect();
    let data = |i: usize| source_bytes(store, &tensors[i]);
    write_export(output, &meta, &infos, |_| false, data, options, on_tensor)
}

/// Writes a folder's export: the tensors `infos` (sources, in file order) with bytes from
/// `data`, 1-D tensors and those `keep_f32` picks as F32, every other matrix of
/// [`choose_type`]'s type for the target (the output rule applying to a tied embedding when
/// there is no `output.weight`).
pub(crate) fn write_export<'a>(
    output: &Path,
    meta: &[(String, Value)],
    infos: &[TensorInfo],
    keep_f32: impl Fn(&TensorInfo) -> bool,
    data: impl Fn(usize) -> Cow<'a, [u8]>,
    options: &QuantizeOptions,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<Report> {
    let tied = infos.iter().all(|t| t.name != "output.weight");
    let specs: Vec<TensorSpec> = infos
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: if t.dims.len() == 1 || keep_f32(t) {
                GgmlType::F32
            } else {
                choose_type(t, options.target, tied)
            },
        })
        .collect();
    let plan = OutputPlan {
        meta,
        sources: infos,
        specs: &specs,
    };
    write_gguf(output, &plan, data, options.threads, on_tensor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{edit_json, edited_copy, hf_fixture};
    use tokenmill_gguf::GgufFile;
    use tokenmill_model::ModelError;

    fn export(dir: &Path, target: TargetType) -> (tempfile::TempDir, Report) {
        let out = tempfile::tempdir().unwrap();
        let opts = QuantizeOptions::new(target);
        let report = convert(dir, &out.path().join("m.gguf"), &opts, &mut |_| {}).unwrap();
        (out, report)
    }

    #[test]
    fn llama_q_and_k_rows_are_permuted_and_everything_else_copied() {
        let folder = hf_fixture("llama");
        let (out, report) = export(&folder, TargetType::F32);
        let g = GgufFile::open(out.path().join("m.gguf")).unwrap();
        let store = WeightStore::open_hf_dir(&folder).unwrap();
        let hf = |name: &str| store.data(&store.get(name).unwrap()).to_vec();
        let gguf = |name: &str| g.tensor_data(g.tensor(name).unwrap()).to_vec();
        let attn = "model.layers.1.self_attn";
        // 4 heads of 16 (Q), 2 KV heads (K); 64 rows of Q, 32 of K.
        let q = hf(&format!("{attn}.q_proj.weight"));
        assert_ne!(gguf("blk.1.attn_q.weight"), q);
        assert_eq!(gguf("blk.1.attn_q.weight"), permute_qk_rows(&q, 64, 4));
        let k = hf(&format!("{attn}.k_proj.weight"));
        assert_eq!(gguf("blk.1.attn_k.weight"), permute_qk_rows(&k, 32, 2));
        assert_eq!(
            gguf("blk.1.attn_v.weight"),
            hf(&format!("{attn}.v_proj.weight"))
        );
        assert_eq!(gguf("output.weight"), hf("lm_head.weight"));
        // The report lists the file's tensors in the converter's order.
        let names: Vec<&str> = report.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), 1 + 2 * 9 + 2);
        assert_eq!(
            names[..3],
            [
                "token_embd.weight",
                "blk.0.attn_norm.weight",
                "blk.0.attn_q.weight"
            ]
        );
        assert_eq!(
            names[names.len() - 2..],
            ["output_norm.weight", "output.weight"]
        );
    }

    #[test]
    fn qwen2_is_not_permuted_and_keeps_its_biases() {
        let folder = hf_fixture("qwen2");
        let (out, report) = export(&folder, TargetType::F32);
        let g = GgufFile::open(out.path().join("m.gguf")).unwrap();
        let store = WeightStore::open_hf_dir(&folder).unwrap();
        let q = store.get("model.layers.0.self_attn.q_proj.weight").unwrap();
        let t = g.tensor("blk.0.attn_q.weight").unwrap();
        assert_eq!(g.tensor_data(t), store.data(&q));
        assert!(report.tensor("blk.0.attn_k.bias").is_some());
        // Tied embedding: no output.weight, and token_embd gets the output rule (Q8_0 here:
        // 64-wide rows are no whole Q6_K block).
        assert!(report.tensor("output.weight").is_none());
        let (_out, q4) = export(&folder, TargetType::Q4_0);
        assert_eq!(q4.tensor("token_embd.weight").unwrap().to, GgmlType::Q8_0);
        assert_eq!(q4.tensor("blk.0.ffn_up.weight").unwrap().to, GgmlType::Q4_0);
        assert_eq!(q4.tensor("blk.0.attn_k.bias").unwrap().to, GgmlType::F32);
    }

    #[test]
    fn architecture_metadata_comes_from_the_config() {
        let cfg_text = tokenmill_model::read_config_json(&hf_fixture("llama")).unwrap();
        let cfg = ModelConfig::from_hf_config(&cfg_text).unwrap();
        let md = arch_metadata(&cfg, "tiny", TargetType::Q4K);
        let u32_of = |key: &str| match md.iter().find(|(k, _)| k == key) {
            Some((_, Value::U32(v))) => *v,
            other => panic!("{key}: {other:?}"),
        };
        for (key, want) in [
            ("llama.block_count", 2),
            ("llama.embedding_length", 64),
            ("llama.feed_forward_length", 128),
            ("llama.attention.head_count", 4),
            ("llama.attention.head_count_kv", 2),
            ("llama.attention.key_length", 16),
            ("llama.rope.dimension_count", 16),
            ("llama.vocab_size", 256),
            ("general.file_type", 14),
            ("general.quantization_version", 2),
        ] {
            assert_eq!(u32_of(key), want, "{key}");
        }
        assert!(md.iter().all(|(k, _)| !k.contains("rope.scaling")));
        assert!(
            matches!(&md[0], (k, Value::String(a)) if k == "general.architecture" && a == "llama")
        );
    }

    #[test]
    fn llama3_rope_travels_as_rope_freqs() {
        let (_out, report) = export(&hf_fixture("llama3-rope"), TargetType::F16);
        let ff = report.tensor("rope_freqs.weight").unwrap();
        assert_eq!(
            (ff.dims.as_slice(), ff.from, ff.to),
            (&[8u64][..], GgmlType::F32, GgmlType::F32)
        );
        assert_eq!(report.tensors[1].name, "rope_freqs.weight");
    }

    #[test]
    fn folder_problems_are_the_right_errors() {
        let empty = tempfile::tempdir().unwrap();
        let out = empty.path().join("out.gguf");
        let opts = QuantizeOptions::new(TargetType::Q8_0);
        match convert(empty.path(), &out, &opts, &mut |_| {}) {
            Err(ConvertError::LoadModel {
                path,
                source: ModelError::Io { path: config, .. },
            }) => {
                assert_eq!(path, empty.path());
                assert_eq!(config, empty.path().join("config.json"));
            }
            other => panic!("{other:?}"),
        }
        let gpt2 = edited_copy("llama", |d| {
            edit_json(&d.join("config.json"), |v| {
                v["architectures"][0] = "GPT2LMHeadModel".into()
            })
        });
        let err = convert(gpt2.path(), &out, &opts, &mut |_| {}).unwrap_err();
        match &err {
            ConvertError::LoadModel {
                source: ModelError::UnsupportedArchitecture(a),
                ..
            } => assert_eq!(a, "GPT2LMHeadModel"),
            other => panic!("{other:?}"),
        }
        let qwen_llama3 = edited_copy("qwen2", |d| {
            edit_json(&d.join("config.json"), |v| {
                v["rope_parameters"] = serde_json::json!({"factor": 8.0, "high_freq_factor": 4.0,
                    "low_freq_factor": 1.0, "original_max_position_embeddings": 64,
                    "rope_theta": 10000.0, "rope_type": "llama3"})
            })
        });
        let err = convert(qwen_llama3.path(), &out, &opts, &mut |_| {}).unwrap_err();
        assert!(
            matches!(err, ConvertError::UnsupportedRopeScaling),
            "{err:?}"
        );
        assert!(!out.exists(), "nothing written for a refused folder");
    }
}
