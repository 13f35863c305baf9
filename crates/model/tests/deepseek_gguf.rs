//! DeepSeek V2/V3 from GGUF files written by llama.cpp's own `convert_hf_to_gguf.py`
//! (`scripts/golden/make_deepseek_gguf.py`: the tiny HF fixtures of `deepseek.rs`, `--outtype
//! f32`, arch `deepseek2`, kv_b split into `attn_k_b` / `attn_v_b`, experts stacked 3-D).
//!
//! The weights are the HF folder's, so the GGUF model must match the same HF fp32
//! reference.json (logits at every position, greedy continuation) and the HF-folder model; the
//! config read from `deepseek2.*` keys must equal the one from config.json; the legacy whole
//! `attn_kv_b` form must load too; and damaged files (a missing key or tensor, a mis-shaped
//! tensor, a key of the wrong type) must give typed errors, not panics.

mod common;

use std::path::PathBuf;

use common::{deepseek_greedy, deepseek_logits_chunked, floats, worst_rel};
use serde_json::Value as Json;
use tokenmill_gguf::{Array, GgufFile, GgufWriter, TensorInfo, TensorSpec, Value};
use tokenmill_model::deepseek::{DeepSeekConfig, DeepSeekModel, GGUF_ARCH, Routing};
use tokenmill_model::{KvShape, Model, ModelError, WeightStore};
use tokenmill_testutil::ids;
use tokenmill_tokenizer::{GgufVocab, Tokenizer, TokenizerError};

fn dir(name: &str) -> PathBuf {
    tokenmill_testutil::fixtures_dir("deepseek").join(name)
}

fn gguf_path(name: &str) -> PathBuf {
    dir(name).join("model.f32.gguf")
}

fn reference(name: &str) -> Json {
    serde_json::from_str(&std::fs::read_to_string(dir(name).join("reference.json")).unwrap())
        .unwrap()
}

#[test]
fn model_open_routes_deepseek2_gguf() {
    for name in ["v2", "v3"] {
        let model = Model::open(&gguf_path(name)).unwrap();
        assert!(matches!(model, Model::DeepSeek(_)), "{name}");
        assert_eq!(model.vocab_size(), 256);
        // 3 layers · (kv_lora_rank 16 + qk_rope_head_dim 4) f32 values per token.
        let kv = model.kv_cache(4, 16);
        assert_eq!(kv.bytes_per_token(), 3 * (16 + 4) * 4);
        assert_eq!(
            model.kv_shape(),
            KvShape::Latent {
                n_layers: 3,
                kv_lora_rank: 16,
                rope_dim: 4,
                expanded_dim: 4 * (8 + 4 + 12),
            }
        );
    }
    // A Llama GGUF still opens as Llama.
    let tiny = tokenmill_testutil::fixtures_dir("tiny").join("llama.gguf");
    assert!(matches!(Model::open(&tiny).unwrap(), Model::Llama(_)));
}

fn assert_same_config(name: &str, g: &DeepSeekConfig, h: &DeepSeekConfig) {
    let ints = |c: &DeepSeekConfig| {
        [
            c.n_layers,
            c.hidden,
            c.n_heads,
            c.vocab_size,
            c.context_length,
            c.q_lora_rank.unwrap_or(0),
            c.kv_lora_rank,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            c.ffn_hidden,
            c.moe_hidden,
            c.n_routed_experts,
            c.n_shared_experts,
            c.n_experts_per_tok,
            c.first_k_dense_replace,
            c.n_group,
            c.topk_group,
        ]
    };
    assert_eq!(ints(g), ints(h), "{name}");
    assert_eq!(
        (g.v3, g.routing, g.norm_topk_prob),
        (h.v3, h.routing, h.norm_topk_prob)
    );
    assert_eq!(g.q_lora_rank, h.q_lora_rank);
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
    assert!(close(g.rms_eps, h.rms_eps) && close(g.routed_scaling_factor, h.routed_scaling_factor));
    // YaRN from rope.scaling.* + yarn_log_multiplier (0.1 · mscale_all_dim, stored as f32).
    assert!(close(g.rope_mscale, h.rope_mscale), "{name}");
    assert!(
        close(g.attn_scale, h.attn_scale),
        "{name}: {} vs {}",
        g.attn_scale,
        h.attn_scale
    );
    assert_eq!(g.inv_freq.len(), h.inv_freq.len());
    assert!(
        g.inv_freq
            .iter()
            .zip(&h.inv_freq)
            .all(|(a, b)| close(*a, *b)),
        "{name}"
    );
}

#[test]
fn config_from_gguf_equals_config_json() {
    for name in ["v2", "v3"] {
        let g = DeepSeekConfig::from_gguf(&GgufFile::open(gguf_path(name)).unwrap()).unwrap();
        let json = std::fs::read_to_string(dir(name).join("config.json")).unwrap();
        let h = DeepSeekConfig::from_hf_config(&json).unwrap();
        assert_same_config(name, &g, &h);
    }
    let v2 = DeepSeekConfig::from_gguf(&GgufFile::open(gguf_path("v2")).unwrap()).unwrap();
    // No expert_gating_func key in the v2 file: softmax, as llama.cpp assumes.
    assert_eq!(
        v2.routing,
        Routing::Softmax {
            group_limited: false
        }
    );
    let v3 = DeepSeekConfig::from_gguf(&GgufFile::open(gguf_path("v3")).unwrap()).unwrap();
    assert_eq!(
        (v3.routing, v3.n_group, v3.topk_group),
        (Routing::Sigmoid, 2, 1)
    );
}

#[test]
fn logits_match_hf_reference_and_hf_folder() {
    for name in ["v2", "v3"] {
        let fx = reference(name);
        let input = ids(&fx["input_ids"]);
        let gguf = DeepSeekModel::load_gguf(&gguf_path(name)).unwrap();
        let got = deepseek_logits_chunked(&gguf, &input, input.len());
        let worst = worst_rel(&got, &floats(&fx["logits"]));
        assert!(worst < 1e-4, "{name}: max relative logit error {worst}");
        // Same f32 weights and forward as the HF folder: the same logits.
        let hf = deepseek_logits_chunked(
            &DeepSeekModel::load_hf_dir(&dir(name)).unwrap(),
            &input,
            input.len(),
        );
        let diff = worst_rel(&got, &hf);
        assert!(diff < 1e-6, "{name}: GGUF vs HF folder differ by {diff}");
    }
}

#[test]
fn greedy_matches_hf_reference() {
    for name in ["v2", "v3"] {
        let fx = reference(name);
        let model = DeepSeekModel::load_gguf(&gguf_path(name)).unwrap();
        let want = ids(&fx["greedy_ids"]);
        let got = deepseek_greedy(&model, &ids(&fx["input_ids"]), want.len());
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn stacked_experts_are_views_of_the_hf_experts() {
    let gguf = WeightStore::Gguf(GgufFile::open(gguf_path("v3")).unwrap());
    let hf = WeightStore::open_hf_dir(&dir("v3")).unwrap();
    for (g, h, rows, cols) in [("gate", "gate_proj", 32, 64), ("down", "down_proj", 64, 32)] {
        let experts = gguf
            .linear_stack(&format!("blk.2.ffn_{g}_exps.weight"), 4, rows, cols)
            .unwrap();
        for (e, lin) in experts.iter().enumerate() {
            let want = hf
                .linear(
                    &format!("model.layers.2.mlp.experts.{e}.{h}.weight"),
                    rows,
                    cols,
                )
                .unwrap();
            assert_eq!(lin.view(&gguf).data, want.view(&hf).data, "{g} expert {e}");
        }
    }
    let err = gguf.linear_stack("blk.2.ffn_gate_exps.weight", 3, 32, 64);
    assert!(matches!(err, Err(ModelError::BadShape { .. })));
}

#[test]
fn linear_stack_slices_a_safetensors_tensor_too() {
    // A 3-D [3, 2, 4] f32 tensor of values 0..24 in a single-file folder.
    let tmp = tempfile::tempdir().unwrap();
    let header = r#"{"w":{"dtype":"F32","shape":[3,2,4],"data_offsets":[0,96]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend((0..24).flat_map(|i| (i as f32).to_le_bytes()));
    std::fs::write(tmp.path().join("model.safetensors"), bytes).unwrap();
    let store = WeightStore::open_hf_dir(tmp.path()).unwrap();
    let parts = store.linear_stack("w", 3, 2, 4).unwrap();
    for (e, lin) in parts.iter().enumerate() {
        let v = lin.view(&store);
        assert_eq!((v.rows, v.cols), (2, 4));
        let got: Vec<f32> = v
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let want: Vec<f32> = (e * 8..(e + 1) * 8).map(|i| i as f32).collect();
        assert_eq!(got, want, "matrix {e}");
    }
    assert!(matches!(
        store.linear_stack("w", 2, 3, 4),
        Err(ModelError::BadShape { .. })
    ));
    assert!(matches!(
        store.linear_stack("nope", 3, 2, 4),
        Err(ModelError::MissingTensor { .. })
    ));
}

#[test]
fn tiny_tokenizer_loses_its_merges_key_in_conversion() {
    // The tiny byte-level BPE has no merges, and the converter then writes no
    // `tokenizer.ggml.merges` at all; llama.cpp refuses such a file ("cannot find tokenizer
    // merges in model file") and so do we, with a typed error. Everything else survived.
    let file = GgufFile::open(gguf_path("v2")).unwrap();
    match Tokenizer::from_gguf(&file) {
        Err(TokenizerError::MissingMetadata(key)) => assert_eq!(key, "tokenizer.ggml.merges"),
        other => panic!(
            "expected the missing merges key, got {:?}",
            other.map(|_| ())
        ),
    }
    let vocab = GgufVocab::from_metadata(file.metadata()).unwrap();
    assert_eq!(
        (vocab.model.as_str(), vocab.pre.as_deref()),
        ("gpt2", Some("gpt-2"))
    );
    assert_eq!(vocab.tokens.len(), 256);
    // With the (empty) merges list present, as a real checkpoint's would be, the GGUF
    // tokenizer encodes like the HF folder's tokenizer.json.
    let with_merges = rebuild(
        "v2",
        keep,
        same,
        &[(
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(vec![])),
        )],
    );
    let tok = Tokenizer::from_gguf(&with_merges).unwrap();
    let hf = Tokenizer::from_hf_dir(&dir("v2")).unwrap();
    let input = ids(&reference("v2")["input_ids"]);
    let text = "Tiny \u{1f999} GGUF!";
    assert_eq!(tok.encode(text, false).unwrap(), input[1..]);
    for s in [text, "hello  world\n\tok", "ünïcödé 123"] {
        assert_eq!(
            tok.encode(s, false).unwrap(),
            hf.encode(s, false).unwrap(),
            "{s:?}"
        );
    }
    assert_eq!((tok.bos_token_id(), tok.eos_token_id()), (Some(1), Some(2)));
}

/// A tensor as [`rebuild`] writes it: name, ggml dims, bytes.
type Part = (String, Vec<u64>, Vec<u8>);

/// The fixture `name` rewritten in memory: metadata through `meta` (`None` drops a key) and
/// tensors through `tensor` (`None` drops one), `extra` keys appended.
fn rebuild(
    name: &str,
    meta: impl Fn(&str, &Value) -> Option<Value>,
    tensor: impl Fn(&TensorInfo, &[u8]) -> Option<Part>,
    extra: &[(String, Value)],
) -> GgufFile {
    let src = GgufFile::open(gguf_path(name)).unwrap();
    let md: Vec<(String, Value)> = src
        .metadata()
        .iter()
        .filter_map(|(k, v)| meta(k, v).map(|v| (k.to_string(), v)))
        .chain(extra.iter().cloned())
        .collect();
    let parts: Vec<Part> = src
        .tensors()
        .iter()
        .filter_map(|t| tensor(t, src.tensor_data(t)))
        .collect();
    let specs: Vec<TensorSpec> = parts
        .iter()
        .zip(src.tensors())
        .map(|((name, dims, _), t)| TensorSpec {
            name: name.clone(),
            dims: dims.clone(),
            ty: t.ty,
        })
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &md, &specs).unwrap();
    for (_, _, data) in &parts {
        w.write_tensor(data).unwrap();
    }
    GgufFile::from_bytes(w.finish().unwrap()).unwrap()
}

fn keep(_: &str, v: &Value) -> Option<Value> {
    Some(v.clone())
}

fn same(t: &TensorInfo, d: &[u8]) -> Option<Part> {
    Some((t.name.clone(), t.dims.clone(), d.to_vec()))
}

#[test]
fn legacy_whole_kv_b_loads_too() {
    // Files from before the MLA split: one attn_kv_b [r, H·(nope+v)] (ggml order) per layer,
    // key/value_length holding the per-head sizes, no *_mla keys. kv_b comes straight from the
    // HF safetensors here, independent of the split tensors.
    let hf = WeightStore::open_hf_dir(&dir("v2")).unwrap();
    let meta = |k: &str, v: &Value| match k {
        "deepseek2.attention.key_length_mla" | "deepseek2.attention.value_length_mla" => None,
        "deepseek2.attention.key_length" | "deepseek2.attention.value_length" => {
            Some(Value::U32(12))
        }
        _ => Some(v.clone()),
    };
    let tensor = |t: &TensorInfo, d: &[u8]| {
        let Some(prefix) = t.name.strip_suffix("attn_k_b.weight") else {
            return (!t.name.ends_with("attn_v_b.weight"))
                .then(|| same(t, d))
                .flatten();
        };
        let l = prefix.trim_start_matches("blk.").trim_end_matches('.');
        let kv_b = hf
            .get(&format!("model.layers.{l}.self_attn.kv_b_proj.weight"))
            .unwrap();
        let name = format!("{prefix}attn_kv_b.weight");
        Some((name, vec![16, 4 * (8 + 12)], hf.data(&kv_b).to_vec()))
    };
    let file = rebuild("v2", meta, tensor, &[]);
    assert!(file.tensor("blk.1.attn_kv_b.weight").is_some());
    assert!(file.tensor("blk.1.attn_k_b.weight").is_none());
    let model = DeepSeekModel::from_gguf(file).unwrap();
    let fx = reference("v2");
    let input = ids(&fx["input_ids"]);
    let got = deepseek_logits_chunked(&model, &input, input.len());
    let worst = worst_rel(&got, &floats(&fx["logits"]));
    assert!(
        worst < 1e-4,
        "legacy attn_kv_b: max relative logit error {worst}"
    );
}

fn load_err(file: GgufFile) -> ModelError {
    match DeepSeekModel::from_gguf(file) {
        Ok(_) => panic!("a damaged file loaded"),
        Err(e) => e,
    }
}

#[test]
fn missing_or_bad_keys_are_typed_errors() {
    for key in [
        "deepseek2.attention.kv_lora_rank",
        "deepseek2.block_count",
        "deepseek2.expert_feed_forward_length",
        "deepseek2.attention.layer_norm_rms_epsilon",
    ] {
        let f = rebuild("v3", |k, v| (k != key).then(|| v.clone()), same, &[]);
        match load_err(f) {
            ModelError::MissingMetadata { key: k } => assert_eq!(k, key),
            e => panic!("{key}: {e}"),
        }
    }
    let set = |key: &'static str, val: Value| {
        rebuild(
            "v3",
            move |k, v| Some(if k == key { val.clone() } else { v.clone() }),
            same,
            &[],
        )
    };
    for (key, val) in [
        ("deepseek2.expert_count", Value::String("4".into())),
        ("deepseek2.expert_gating_func", Value::U32(7)),
        ("deepseek2.expert_used_count", Value::U32(5)),
        ("deepseek2.expert_group_count", Value::U32(3)),
        ("deepseek2.rope.dimension_count", Value::U32(3)),
        (
            "deepseek2.rope.scaling.type",
            Value::String("longrope".into()),
        ),
        ("deepseek2.block_count", Value::U64(1 << 40)),
        ("deepseek2.expert_weights_norm", Value::U8(1)),
    ] {
        match load_err(set(key, val)) {
            ModelError::BadConfig(_) => {}
            e => panic!("{key}: {e}"),
        }
    }
    let llama = rebuild(
        "v2",
        |k, v| {
            Some(if k == "general.architecture" {
                Value::String("llama".into())
            } else {
                v.clone()
            })
        },
        same,
        &[],
    );
    assert!(matches!(load_err(llama), ModelError::UnsupportedArchitecture(a) if a == "llama"));
    assert_eq!(GGUF_ARCH, "deepseek2");
}

#[test]
fn missing_or_misshaped_tensors_are_typed_errors() {
    for gone in [
        "blk.2.attn_v_b.weight",
        "blk.1.ffn_up_exps.weight",
        "blk.0.ffn_down.weight",
        "blk.2.ffn_gate_inp.weight",
        "output_norm.weight",
    ] {
        let f = rebuild(
            "v3",
            keep,
            |t, d| (t.name != gone).then(|| same(t, d)).flatten(),
            &[],
        );
        match load_err(f) {
            ModelError::MissingTensor { name } => assert_eq!(name, gone),
            e => panic!("{gone}: {e}"),
        }
    }
    // Same bytes, other shapes: 3 experts of 32 × 64 instead of 4; k_b not transposed; a
    // 2-D "stack" of experts.
    let reshape = |target: &'static str, dims: Vec<u64>, keep_bytes: usize| {
        rebuild(
            "v3",
            keep,
            move |t, d| {
                let (name, old, data) = same(t, d)?;
                Some(match name == target {
                    true => (name, dims.clone(), data[..keep_bytes].to_vec()),
                    false => (name, old, data),
                })
            },
            &[],
        )
    };
    let cases = [
        (
            "blk.1.ffn_gate_exps.weight",
            vec![64, 32, 3],
            3 * 32 * 64 * 4,
        ),
        ("blk.0.attn_k_b.weight", vec![16, 8, 4], 4 * 8 * 16 * 4),
        ("blk.2.ffn_down_exps.weight", vec![32, 256], 32 * 256 * 4),
        ("blk.1.exp_probs_b.bias", vec![2], 2 * 4),
    ];
    for (name, dims, bytes) in cases {
        match load_err(reshape(name, dims, bytes)) {
            ModelError::BadShape { name: n, .. } => assert_eq!(n, name),
            e => panic!("{name}: {e}"),
        }
    }
}
