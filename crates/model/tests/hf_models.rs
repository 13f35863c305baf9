//! Hugging Face folders (config.json + safetensors + tokenizer) on tiny random-weight models
//! made by `scripts/golden/make_hf_models.py`: Llama (F32), Qwen2 (F32, three shards with an
//! index), Mistral (BF16) and Llama 3.1 RoPE (F16).
//!
//! Logits must match the HF fp32 reference at every position, greedy continuations must be
//! identical, the Llama folder must agree with the GGUF conversion of the same weights, and
//! broken folders must fail with the error that names the problem.

mod common;

use std::path::{Path, PathBuf};

use common::{all_logits, floats, greedy, worst_rel};
use serde_json::Value;
use tokenmill_gguf::GgufFile;
use tokenmill_model::{LlamaModel, ModelError};
use tokenmill_safetensors::{Dtype, SafetensorsError, serialize};
use tokenmill_testutil::ids;
use tokenmill_tokenizer::{ChatMessage, Tokenizer};

const MODELS: [&str; 4] = ["llama", "qwen2", "mistral", "llama3-rope"];

fn dir(name: &str) -> PathBuf {
    tokenmill_testutil::fixtures_dir("hf").join(name)
}

fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir(name).join("reference.json")).unwrap())
        .unwrap()
}

#[test]
fn logits_match_hf_reference() {
    for name in MODELS {
        let model = LlamaModel::open(&dir(name)).unwrap();
        let fx = reference(name);
        let got = all_logits(&model, &ids(&fx["input_ids"]));
        let worst = worst_rel(&got, &floats(&fx["logits"]));
        assert!(worst < 1e-4, "{name}: max relative logit error {worst}");
    }
}

#[test]
fn greedy_matches_hf_reference() {
    for name in MODELS {
        let model = LlamaModel::open(&dir(name)).unwrap();
        let fx = reference(name);
        let want = ids(&fx["greedy_ids"]);
        let got = greedy(&model, &ids(&fx["input_ids"]), want.len());
        assert_eq!(got, want, "{name}");
    }
}

/// The same seeded weights as F32 safetensors (HF layout, NeoX RoPE) and as an F32 GGUF
/// (Q/K permuted, interleaved RoPE) give the same logits.
#[test]
fn hf_folder_agrees_with_gguf_of_same_weights() {
    for name in ["llama", "qwen2"] {
        let hf = LlamaModel::open(&dir(name)).unwrap();
        let gguf_path = tokenmill_testutil::fixtures_dir("tiny").join(format!("{name}.gguf"));
        let gguf = LlamaModel::load(GgufFile::open(gguf_path).unwrap()).unwrap();
        let input = ids(&reference(name)["input_ids"]);
        let (a, b) = (all_logits(&hf, &input), all_logits(&gguf, &input));
        let worst = worst_rel(&a, &b);
        assert!(worst < 1e-5, "{name}: HF folder vs GGUF differ by {worst}");
    }
}

#[test]
fn tokenizer_and_chat_template_load_from_folder() {
    for name in MODELS {
        let fx = reference(name);
        let tok = Tokenizer::from_hf_dir(&dir(name)).unwrap();
        let text = fx["prompt_text"].as_str().unwrap();
        let want = ids(&fx["input_ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), want[1..], "{name}");
        assert_eq!(tok.bos_token_id(), Some(want[0]));
        let msgs = [ChatMessage::new("user", "hi")];
        let chat = tok.chat_template().unwrap().render(&msgs, true).unwrap();
        assert_eq!(chat, "user: hi\nassistant: ");
    }
}

/// A copy of the llama fixture with `edit` applied, loaded.
fn load_edited(edit: impl FnOnce(&Path)) -> Result<LlamaModel, ModelError> {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir("llama")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    edit(tmp.path());
    LlamaModel::open(tmp.path())
}

fn edit_config(dir: &Path, key: &str, value: Value) {
    let p = dir.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    cfg[key] = value;
    std::fs::write(p, cfg.to_string()).unwrap();
}

#[test]
fn broken_folders_are_rejected() {
    let e = load_edited(|d| std::fs::remove_file(d.join("config.json")).unwrap());
    assert!(matches!(e, Err(ModelError::Io { .. })));
    let e = load_edited(|d| std::fs::remove_file(d.join("model.safetensors")).unwrap());
    assert!(matches!(
        e,
        Err(ModelError::Safetensors(SafetensorsError::NoWeights(_)))
    ));
    let e = load_edited(|d| edit_config(d, "architectures", serde_json::json!(["GPT2LMHead"])));
    assert!(matches!(e, Err(ModelError::UnsupportedArchitecture(a)) if a == "GPT2LMHead"));
    let e = load_edited(|d| edit_config(d, "intermediate_size", serde_json::json!(96)));
    assert!(matches!(e, Err(ModelError::BadShape { name, .. })
        if name == "model.layers.0.mlp.gate_proj.weight"));
    let e = load_edited(|d| edit_config(d, "num_hidden_layers", serde_json::json!(3)));
    assert!(matches!(e, Err(ModelError::MissingTensor { name })
        if name == "model.layers.2.input_layernorm.weight"));
    let e = load_edited(|d| edit_config(d, "hidden_size", serde_json::json!(0)));
    assert!(matches!(e, Err(ModelError::BadConfig(_))));
    let e = load_edited(|d| edit_config(d, "hidden_act", serde_json::json!("gelu")));
    assert!(matches!(e, Err(ModelError::BadConfig(_))));
    let e = load_edited(|d| std::fs::write(d.join("config.json"), "{").unwrap());
    assert!(matches!(e, Err(ModelError::BadConfig(_))));
    // Truncated weights: the safetensors validation names it.
    let e = load_edited(|d| {
        let p = d.join("model.safetensors");
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    });
    assert!(matches!(
        e,
        Err(ModelError::Safetensors(
            SafetensorsError::DataLenMismatch { .. }
        ))
    ));
}

#[test]
fn integer_weights_are_rejected_with_their_dtype() {
    let e = load_edited(|d| {
        let p = d.join("model.safetensors");
        let f = tokenmill_safetensors::SafetensorsFile::open(&p).unwrap();
        let tensors: Vec<_> = f
            .tensors()
            .iter()
            .map(|t| {
                let dtype = if t.name == "model.norm.weight" {
                    Dtype::I32
                } else {
                    t.dtype
                };
                (t.name.as_str(), dtype, t.shape.as_slice(), f.tensor_data(t))
            })
            .collect();
        let bytes = serialize(&tensors);
        drop(tensors);
        drop(f);
        std::fs::write(&p, bytes).unwrap();
    });
    assert!(
        matches!(e, Err(ModelError::UnsupportedDtype { name, dtype })
        if name == "model.norm.weight" && dtype == "I32")
    );
}
