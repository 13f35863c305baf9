//! `tokenmill perplexity` on the real default model and the shipped text
//! (`tests/eval/prose.txt`): its PPL agrees with llama.cpp's `llama-perplexity` on the same
//! file, chunking and text; splitting a chunk into smaller forward passes changes nothing; bad
//! arguments are clear errors.

#[path = "peer/mod.rs"]
#[allow(dead_code)]
mod peer;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn prose() -> PathBuf {
    tokenmill_testutil::workspace_root().join("tests/eval/prose.txt")
}

fn perplexity(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokenmill"))
        .arg("perplexity")
        .arg("--model")
        .arg(tokenmill_testutil::model_path())
        .args(args)
        .output()
        .expect("running tokenmill perplexity")
}

/// `(ppl, ppl_err, tokens_scored)` from `--json`.
fn estimate(args: &[&str]) -> (f64, f64, u64) {
    let out = perplexity(&[args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    (
        v["ppl"].as_f64().unwrap(),
        v["ppl_err"].as_f64().unwrap(),
        v["tokens_scored"].as_u64().unwrap(),
    )
}

#[test]
fn agrees_with_llama_perplexity() {
    let file = prose();
    let file = file.to_str().unwrap();
    let (ppl, err, scored) = estimate(&[file, "--ctx-size", "256"]);
    // 1,776 tokens: 6 chunks of 256, 127 scored in each.
    assert_eq!(scored, 6 * 127);
    assert!(
        ppl > 1.0 && ppl < 1000.0 && err > 0.0 && err < ppl,
        "{ppl} ± {err}"
    );

    let Some(bin) = peer::peer_or_skip("llama-perplexity") else {
        return;
    };
    let out = Command::new(bin)
        .arg("-m")
        .arg(tokenmill_testutil::model_path())
        .args(["-f", file, "-c", "256", "-b", "256", "-t", "2"])
        .output()
        .expect("running llama-perplexity");
    let log =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("no final estimate in:\n{log}"));
    let rest = line.split("PPL = ").nth(1).unwrap();
    let theirs: f64 = rest.split_whitespace().next().unwrap().parse().unwrap();
    eprintln!("tokenmill PPL {ppl:.4} ± {err:.4}, llama.cpp {theirs:.4}");
    // Same method, file and weights; the kernels differ (llama.cpp quantizes activations to
    // 8 bits), so allow 2%, well inside the estimate's own standard error.
    assert!(
        (ppl - theirs).abs() / theirs < 0.02,
        "tokenmill {ppl} vs llama.cpp {theirs}"
    );
}

/// `--activation-bits 8` runs the 8-bit kernels where the tier has them (the summary says so
/// and the estimate moves) and costs under 2% of perplexity, the bar llama.cpp's 8-bit
/// activations meet against the 12-bit default above (measured: 18.612 → 18.670).
#[test]
fn eight_bit_activations_cost_little_perplexity() {
    let file = prose();
    let file = file.to_str().unwrap();
    let args = [file, "--ctx-size", "256", "--chunks", "3"];
    let (ppl12, _, n12) = estimate(&args);
    let (ppl8, _, n8) = estimate(&[&args[..], &["--activation-bits", "8"]].concat());
    assert_eq!(n12, n8);
    eprintln!("PPL with 12-bit activations {ppl12:.4}, with 8-bit {ppl8:.4}");
    assert!((ppl8 - ppl12).abs() / ppl12 < 0.02, "{ppl12} vs {ppl8}");
    let out = perplexity(&[file, "--chunks", "1", "--activation-bits", "8"]);
    let log = String::from_utf8_lossy(&out.stderr);
    if log.contains("has no 8-bit kernels") {
        eprintln!("skipped: 8-bit activations on this tier ({log})");
        return;
    }
    assert!(log.contains("8-bit activations"), "{log}");
    assert_ne!(ppl8, ppl12, "the 8-bit kernels did not run");
}

#[test]
fn smaller_forward_passes_and_fewer_chunks_score_the_same_tokens() {
    let file = prose();
    let file = file.to_str().unwrap();
    let whole = estimate(&[file, "--ctx-size", "256", "--chunks", "2"]);
    let split = estimate(&[
        file,
        "--ctx-size",
        "256",
        "--chunks",
        "2",
        "--batch-size",
        "100",
    ]);
    assert_eq!(whole.2, 2 * 127);
    assert_eq!(split.2, whole.2);
    assert!(
        (whole.0 - split.0).abs() / whole.0 < 1e-3,
        "{whole:?} vs {split:?}"
    );
    // The plain output is llama-perplexity's last line.
    let out = perplexity(&[file, "--ctx-size", "256", "--chunks", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Final estimate: PPL = "), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("[1]"));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "Too short to fill one chunk.").unwrap();
    let missing = dir.path().join("missing.txt");
    let file = prose();
    for (args, needle) in [
        (vec![short.to_str().unwrap()], "fewer than one chunk"),
        (vec![missing.to_str().unwrap()], "reading"),
        (
            vec![file.to_str().unwrap(), "--ctx-size", "100000"],
            "longer than the model's context",
        ),
        (
            vec![file.to_str().unwrap(), "--ctx-size", "2"],
            "at least 4",
        ),
        (
            vec![file.to_str().unwrap(), "--batch-size", "0"],
            "at least 1",
        ),
    ] {
        let out = perplexity(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains(needle) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}
