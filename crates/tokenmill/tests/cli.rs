//! End-to-end tests of the `tokenmill` binary on the real default model.

use std::process::{Command, Output};

use serde_json::Value;

fn tokenmill(args: &[&str]) -> Output {
    let model = tokenmill_testutil::model_path();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tokenmill"));
    cmd.args(args);
    if args[0] != "inspect" {
        cmd.arg("--model").arg(model);
    }
    cmd.output().expect("running tokenmill")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tokenmill failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn generate_continues_a_prompt_greedily_and_reports_speed() {
    let out = tokenmill(&[
        "generate",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "20",
    ]);
    let text = stdout(&out);
    // The HF reference's greedy continuation (tests/fixtures/smollm2/greedy.json) starts so.
    assert!(text.starts_with(" Paris.\n\nThe answer is"), "{text:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prefill: 5 tokens") && err.contains("decode: 19 tokens"),
        "{err}"
    );
}

#[test]
fn generate_with_f32_bf16_and_int8_kv_caches_and_a_clear_error_for_unknown_dtypes() {
    // f16 is the default, which the other tests run.
    for dtype in ["f32", "bf16", "int8"] {
        let out = tokenmill(&[
            "generate",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "8",
            "--kv-cache-dtype",
            dtype,
        ]);
        let text = stdout(&out);
        assert!(text.starts_with(" Paris."), "{dtype}: {text:?}");
    }
    let out = tokenmill(&["generate", "--prompt", "hi", "--kv-cache-dtype", "fp8"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'fp8'") && err.contains("f32, f16, bf16, int8"),
        "{err}"
    );
}

#[test]
fn chat_generation_stops_at_end_of_turn() {
    let out = tokenmill(&[
        "generate",
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "40",
    ]);
    let text = stdout(&out);
    assert!(text.contains("Paris"), "{text:?}");
    assert!(!text.contains("<|im_end|>"), "{text:?}");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let args = [
        "generate",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "12",
        "--temperature",
        "0.9",
        "--seed",
        "7",
    ];
    assert_eq!(stdout(&tokenmill(&args)), stdout(&tokenmill(&args)));
}

#[test]
fn tokenize_agrees_with_hf_fixtures() {
    let path = tokenmill_testutil::fixtures_dir("smollm2").join("tokenize.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in fixture["cases"].as_array().unwrap().iter().take(12) {
        let text = case["text"].as_str().unwrap();
        if text.is_empty() || text.starts_with('-') {
            continue; // clap would read these as flags; the tokenizer tests cover them
        }
        let got: Value = serde_json::from_str(&stdout(&tokenmill(&["tokenize", text]))).unwrap();
        assert_eq!(got, case["ids"], "{text:?}");
    }
}

#[test]
fn inspect_prints_metadata_and_tensors() {
    let model = tokenmill_testutil::model_path();
    let text = stdout(&tokenmill(&["inspect", model.to_str().unwrap()]));
    assert!(text.contains("general.architecture = \"llama\""), "{text}");
    assert!(text.contains("token_embd.weight") && text.contains("q8_0"));
    assert!(text.contains("blk.29.ffn_down.weight"));
}

/// `--model ORG/NAME[:QUANT]` is found in the local Hugging Face cache (`HF_HUB_CACHE`, or
/// `HF_HOME/hub`), offline; an id that is not there is a clear error naming where it looked.
#[test]
fn a_hugging_face_id_resolves_from_the_local_cache() {
    let home = tempfile::tempdir().unwrap();
    tokenmill_testutil::hf_cache_with_default_model(&home.path().join("hub"));
    let run = |model: &str, env: (&str, &std::path::Path)| {
        Command::new(env!("CARGO_BIN_EXE_tokenmill"))
            .args([
                "generate",
                "--prompt",
                "The capital of France is",
                "--max-tokens",
                "4",
            ])
            .args(["--model", model])
            .env_remove("HF_HUB_CACHE")
            .env_remove("HUGGINGFACE_HUB_CACHE")
            .env(env.0, env.1)
            .output()
            .unwrap()
    };
    let hub = home.path().join("hub");
    for (model, env) in [
        (
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            ("HF_HUB_CACHE", hub.as_path()),
        ),
        (
            "HuggingFaceTB/SmolLM2-135M-Instruct:q4_1",
            ("HF_HOME", home.path()),
        ),
    ] {
        let text = stdout(&run(model, env));
        assert!(text.starts_with(" Paris."), "{model}: {text:?}");
    }
    for (model, needle) in [
        (
            "HuggingFaceTB/SmolLM2-360M-Instruct",
            "not in the Hugging Face cache",
        ),
        (
            "HuggingFaceTB/SmolLM2-135M-Instruct:Q8_0",
            "no GGUF file tagged Q8_0",
        ),
    ] {
        let out = run(model, ("HF_HUB_CACHE", &hub));
        assert!(!out.status.success(), "{model}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle) && !err.contains("panicked"), "{err}");
    }
}

#[test]
fn bad_input_fails_cleanly() {
    let out = tokenmill(&["generate", "--prompt", "hi", "--top-p", "0"]);
    assert!(!out.status.success());
    let dir = std::env::temp_dir().join(format!("tokenmill-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0garbage").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmill"))
        .arg("inspect")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Error") && !err.contains("panicked"), "{err}");
}
