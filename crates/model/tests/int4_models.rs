//! AWQ and GPTQ int4 Hugging Face folders (issue 8), made by
//! `scripts/golden/make_int4_models.py` from one seeded tiny Llama quantized with group size
//! 32: `awq` (AutoAWQ GEMM), `gptq` (classic zero − 1, identity `g_idx`) and `gptq-act-order`
//! (`desc_act`, symmetric, permuted `g_idx`, int4 LM head).
//!
//! The reference is HF transformers in fp32 with every linear weight replaced by its
//! dequantized int4 weight. The int4 kernel quantizes nothing on the activation side (f32
//! activations, f16 scales widened exactly to f32; it computes `scale · Σ x q − min · Σ x`
//! per group instead of `Σ x (q − z) s`), so the only differences are f32 summation order and
//! the reference's rounding to 6 significant digits: the bar is the float HF folders' bar,
//! 1e-4 relative (measured worst: 5.6e-6 for `awq` / `gptq`, 1.2e-5 for `gptq-act-order`).
//!
//! Broken folders (bits 8, missing tensors, wrong shapes / dtypes, `g_idx` out of range)
//! must fail to load with a typed error.

mod common;

use std::path::{Path, PathBuf};

use common::{all_logits, floats, greedy, worst_rel};
use serde_json::Value;
use tokenmill_kernels::int4::{AwqTensors, Int4Error, Int4Matrix};
use tokenmill_model::{LlamaModel, Model, ModelError};
use tokenmill_safetensors::{Dtype, SafetensorsFile, serialize};
use tokenmill_testutil::ids;

const MODELS: [&str; 3] = ["awq", "gptq", "gptq-act-order"];
/// Relative logit error bar (see the module doc).
const BAR: f32 = 1e-4;

fn dir(name: &str) -> PathBuf {
    tokenmill_testutil::fixtures_dir("int4-models").join(name)
}

fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir(name).join("reference.json")).unwrap())
        .unwrap()
}

#[test]
fn logits_match_dequantized_reference() {
    for name in MODELS {
        let model = LlamaModel::open(&dir(name)).unwrap();
        assert!(model.config().quantization.is_some(), "{name}");
        let fx = reference(name);
        let got = all_logits(&model, &ids(&fx["input_ids"]));
        let worst = worst_rel(&got, &floats(&fx["logits"]));
        eprintln!("{name}: worst relative logit error {worst:e}");
        assert!(worst < BAR, "{name}: max relative logit error {worst}");
    }
}

/// Greedy decoding one token per step (the decode path, `m = 1` int4 matmuls) reproduces
/// the reference continuation.
#[test]
fn greedy_matches_dequantized_reference() {
    for name in MODELS {
        let model = LlamaModel::open(&dir(name)).unwrap();
        let fx = reference(name);
        let want = ids(&fx["greedy_ids"]);
        let got = greedy(&model, &ids(&fx["input_ids"]), want.len());
        assert_eq!(got, want, "{name}");
    }
}

/// `awq` and `gptq` pack the same codes, zeros and scales in their two layouts: they must
/// decode to the same matrices, hence bit-identical logits.
#[test]
fn awq_and_gptq_of_same_codes_agree_exactly() {
    let input = ids(&reference("awq")["input_ids"]);
    let awq = all_logits(&LlamaModel::open(&dir("awq")).unwrap(), &input);
    let gptq = all_logits(&LlamaModel::open(&dir("gptq")).unwrap(), &input);
    assert_eq!(awq, gptq);
}

/// The tests above can tell a wrong zero convention: the `gptq` folder read as `gptq_v2`
/// (zeros one lower) misses the reference by far more than the bar.
#[test]
fn wrong_zero_convention_misses_reference() {
    let model = load_edited("gptq", |d| {
        edit_quant(d, "checkpoint_format", serde_json::json!("gptq_v2"))
    })
    .unwrap();
    let fx = reference("gptq");
    let worst = worst_rel(
        &all_logits(&model, &ids(&fx["input_ids"])),
        &floats(&fx["logits"]),
    );
    assert!(worst > 100.0 * BAR, "worst relative error {worst}");
}

/// `Model::open` takes the folder, and the weight bytes are the int4 matrices' (nibbles plus
/// per-group f32 scale, f32 min and u8 zero per output row, plus the act-order permutation),
/// not a dequantized size; the LM head is F16, except in `gptq-act-order`, which quantized it.
#[test]
fn model_open_reports_int4_weight_bytes() {
    let (h, f, q, kv, vocab, layers, group) = (64, 128, 64, 32, 256, 2, 32);
    // (out, in) of q, k, v, o, gate, up, down.
    let shapes = [(q, h), (kv, h), (kv, h), (h, q), (f, h), (f, h), (h, f)];
    for name in MODELS {
        let Model::Llama(m) = Model::open(&dir(name)).unwrap() else {
            panic!("{name}: not a Llama-family model");
        };
        let act_order = name == "gptq-act-order";
        let perm = if act_order { 4 } else { 0 };
        let int4 = |(n, k): (usize, usize)| n * k / 2 + n * (k / group) * 9 + perm * k;
        let lm_head = if act_order {
            int4((vocab, h))
        } else {
            vocab * h * 2
        };
        let per_layer: usize = shapes.into_iter().map(int4).sum();
        assert_eq!(
            m.matmul_weight_bytes(),
            layers * per_layer + lm_head,
            "{name}"
        );
        let f16: usize = shapes.iter().map(|&(n, k)| n * k * 2).sum();
        assert!(
            m.matmul_weight_bytes() < layers * f16 + vocab * h * 2,
            "{name}"
        );
    }
}

/// A copy of fixture `name` with `edit` applied, loaded.
fn load_edited(name: &str, edit: impl FnOnce(&Path)) -> Result<LlamaModel, ModelError> {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    edit(tmp.path());
    LlamaModel::open(tmp.path())
}

fn edit_quant(dir: &Path, key: &str, value: Value) {
    let p = dir.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    match key {
        "" => cfg["quantization_config"] = value,
        _ => cfg["quantization_config"][key] = value,
    }
    std::fs::write(p, cfg.to_string()).unwrap();
}

/// A replacement for one tensor: `None` drops it.
type Replacement = Option<(Dtype, Vec<u64>, Vec<u8>)>;

/// Rewrites `model.safetensors` with tensor `name` replaced by `edit(dtype, shape, bytes)`.
fn edit_tensor(dir: &Path, name: &str, edit: impl FnOnce(Dtype, &[u64], &[u8]) -> Replacement) {
    let p = dir.join("model.safetensors");
    let f = SafetensorsFile::open(&p).unwrap();
    let t = f.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
    let new = edit(t.dtype, &t.shape, f.tensor_data(t));
    rewrite(
        &p,
        f,
        |n| n == name,
        new.map(|(d, s, b)| (name.to_string(), d, s, b)),
    );
}

/// Rewrites the safetensors file `p` (open as `f`) without the tensors `drop` names, plus
/// `add` when given.
fn rewrite(
    p: &Path,
    f: SafetensorsFile,
    drop: impl Fn(&str) -> bool,
    add: Option<(String, Dtype, Vec<u64>, Vec<u8>)>,
) {
    let mut tensors: Vec<_> = f
        .tensors()
        .iter()
        .filter(|t| !drop(&t.name))
        .map(|t| {
            (
                t.name.as_str(),
                t.dtype,
                t.shape.as_slice(),
                f.tensor_data(t),
            )
        })
        .collect();
    if let Some((name, dtype, shape, bytes)) = &add {
        tensors.push((name, *dtype, shape, bytes));
    }
    let bytes = serialize(&tensors);
    std::mem::drop(tensors);
    std::mem::drop(f);
    std::fs::write(p, bytes).unwrap();
}

const Q0: &str = "model.layers.0.self_attn.q_proj";

/// Replaces AWQ layer `base` (`n` outputs × `k` inputs) by its dequantized F32 `weight`, as
/// a checkpoint that left the layer unquantized (`modules_to_not_convert`) stores it.
fn dequantize_awq_layer(d: &Path, base: &str, n: usize, k: usize) {
    let p = d.join("model.safetensors");
    let f = SafetensorsFile::open(&p).unwrap();
    let get = |s: &str| f.tensor_data(f.tensor(&format!("{base}.{s}")).unwrap());
    let m = Int4Matrix::from_awq(&AwqTensors {
        qweight: get("qweight"),
        qzeros: get("qzeros"),
        scales: get("scales"),
        in_features: k,
        out_features: n,
        group_size: 32,
    })
    .unwrap();
    let mut w = vec![0f32; n * k];
    for (r, row) in w.chunks_exact_mut(k).enumerate() {
        m.dequantize_row(r, row);
    }
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let prefix = format!("{base}.");
    let weight = (
        format!("{base}.weight"),
        Dtype::F32,
        vec![n as u64, k as u64],
        bytes,
    );
    rewrite(&p, f, |name| name.starts_with(&prefix), Some(weight));
}

/// Float layers beside int4 ones: layer 0's k_proj and gate_proj stored as F32 (their
/// dequantized int4 weights) run the unfused Q/K/V and gate/up paths with mixed weights and
/// still match the reference.
#[test]
fn mixed_float_and_int4_layers_match_reference() {
    let model = load_edited("awq", |d| {
        dequantize_awq_layer(d, "model.layers.0.self_attn.k_proj", 32, 64);
        dequantize_awq_layer(d, "model.layers.0.mlp.gate_proj", 128, 64);
    })
    .unwrap();
    let awq = LlamaModel::open(&dir("awq")).unwrap();
    assert!(model.matmul_weight_bytes() > awq.matmul_weight_bytes());
    let fx = reference("awq");
    let got = all_logits(&model, &ids(&fx["input_ids"]));
    let worst = worst_rel(&got, &floats(&fx["logits"]));
    assert!(worst < BAR, "max relative logit error {worst}");
}

#[test]
fn unsupported_quantization_configs_are_rejected() {
    let cases = [
        ("awq", "bits", serde_json::json!(8)),
        ("gptq", "bits", serde_json::json!(3)),
        ("awq", "version", serde_json::json!("gemv")),
        ("gptq", "checkpoint_format", serde_json::json!("marlin")),
        ("gptq", "quant_method", serde_json::json!("fp8")),
        ("awq", "", Value::Null),
    ];
    for (name, key, value) in cases {
        let e = load_edited(name, |d| edit_quant(d, key, value.clone()));
        assert!(
            matches!(e, Err(ModelError::UnsupportedQuantization(_))),
            "{name} {key}={value}: {:?}",
            e.err()
        );
    }
}

#[test]
fn missing_or_misshaped_tensors_are_rejected() {
    let e = load_edited("awq", |d| {
        edit_tensor(d, &format!("{Q0}.qzeros"), |_, _, _| None)
    });
    assert!(matches!(e, Err(ModelError::MissingTensor { name }) if name == format!("{Q0}.qzeros")));
    // desc_act needs g_idx.
    let e = load_edited("gptq-act-order", |d| {
        edit_tensor(d, &format!("{Q0}.g_idx"), |_, _, _| None)
    });
    assert!(matches!(e, Err(ModelError::MissingTensor { name }) if name == format!("{Q0}.g_idx")));
    // Scales of the wrong shape (one group short).
    let e = load_edited("gptq", |d| {
        edit_tensor(d, &format!("{Q0}.scales"), |ty, shape, b| {
            let half = b.len() / 2;
            Some((ty, vec![shape[0] - 1, shape[1]], b[..half].to_vec()))
        })
    });
    assert!(matches!(e, Err(ModelError::BadShape { name, .. }) if name == format!("{Q0}.scales")));
    // A group size that disagrees with the tensors.
    let e = load_edited("awq", |d| {
        edit_quant(d, "group_size", serde_json::json!(64))
    });
    assert!(
        matches!(e, Err(ModelError::BadShape { .. })),
        "{:?}",
        e.err()
    );
    // A group size the layout cannot have (not a multiple of 8 / not dividing the inputs).
    let e = load_edited("gptq", |d| {
        edit_quant(d, "group_size", serde_json::json!(12))
    });
    assert!(
        matches!(&e, Err(ModelError::Int4 { name, source: Int4Error::Shape { group_size: 12, .. } })
            if name == Q0),
        "{:?}",
        e.err()
    );
    // qweight stored as F32.
    let e = load_edited("awq", |d| {
        edit_tensor(d, &format!("{Q0}.qweight"), |_, s, b| {
            Some((Dtype::F32, s.to_vec(), b.to_vec()))
        })
    });
    assert!(
        matches!(e, Err(ModelError::UnsupportedQuantization(_))),
        "{:?}",
        e.err()
    );
    // qweight tensors without a quantization_config.
    let e = load_edited("awq", |d| {
        let p = d.join("config.json");
        let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        cfg.as_object_mut().unwrap().remove("quantization_config");
        std::fs::write(p, cfg.to_string()).unwrap();
    });
    assert!(
        matches!(e, Err(ModelError::UnsupportedQuantization(_))),
        "{:?}",
        e.err()
    );
}

/// Writes `g_idx[row] = value` into layer 0's q_proj of `gptq-act-order`.
fn set_g_idx(d: &Path, row: usize, value: i32) {
    edit_tensor(d, &format!("{Q0}.g_idx"), |ty, s, b| {
        let mut b = b.to_vec();
        b[4 * row..4 * row + 4].copy_from_slice(&value.to_le_bytes());
        Some((ty, s.to_vec(), b))
    });
}

#[test]
fn bad_g_idx_is_rejected() {
    for (value, row) in [(2, 5), (-1, 0)] {
        let e = load_edited("gptq-act-order", |d| set_g_idx(d, row, value));
        assert!(
            matches!(&e, Err(ModelError::Int4 { source: Int4Error::GroupIndex { row: r, .. }, .. }) if *r == row),
            "{:?}",
            e.err()
        );
    }
    // In range, but group 0 gets 33 members and group 1 gets 31.
    let e = load_edited("gptq", |d| set_g_idx(d, 40, 0));
    assert!(
        matches!(
            &e,
            Err(ModelError::Int4 {
                source: Int4Error::UnevenGroups { .. },
                ..
            })
        ),
        "{:?}",
        e.err()
    );
}
