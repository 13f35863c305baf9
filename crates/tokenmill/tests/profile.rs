//! `tokenmill profile` end to end on the real default model: a tiny traced workload, then
//! the trace checked three ways — an independent stdlib-Python reader of the Chrome Trace
//! Event format (`crates/profiler/scripts/check_trace.py`: strict nesting per track, balanced
//! async spans, ops inside forward < execute_model < step), the profiler's own analysis
//! (every layer ran every op, ops cover most of each step), and `profile report` (heat map
//! PNG and a verdict).
//!
//! Perfetto's trace processor (PyPI `perfetto`) would be the natural reader, but it
//! downloads `trace_processor_shell` at run time, which CI cannot; hence the Python check.

use std::path::Path;
use std::process::{Command, Output};

use tokenmill_profiler::Analysis;
use tokenmill_trace::Trace;

fn tokenmill(args: &[&str]) -> Output {
    let model = tokenmill_testutil::model_path();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tokenmill"));
    cmd.args(args);
    if args.first() == Some(&"profile") && args.get(1) != Some(&"report") {
        cmd.arg("--model").arg(model);
    }
    let out = cmd.output().expect("running tokenmill");
    assert!(
        out.status.success(),
        "tokenmill {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn python_check(trace: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler/scripts/check_trace.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(trace)
        .output()
        .expect("python3 (CI installs it for the end-to-end tests)");
    assert!(
        out.status.success(),
        "check_trace.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("summary JSON")
}

#[test]
fn profile_writes_a_valid_trace_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("trace.json");
    let trace_arg = trace_path.to_str().unwrap();
    let out = tokenmill(&[
        "profile",
        "--concurrency",
        "2",
        "--num-prompts",
        "3",
        "--input-len",
        "24",
        "--output-len",
        "4",
        "--kv-cache-memory",
        "64MiB",
        "--max-num-batched-tokens",
        "16",
        "--max-num-seqs",
        "4",
        "--threads",
        "2",
        "--out",
        trace_arg,
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("trace:"));

    // The independent reader.
    let summary = python_check(&trace_path);
    let tracks: Vec<&str> = summary["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(tracks.contains(&"tokenmill-engine"), "{tracks:?}");
    // Two threads: the engine's (the pool's caller) and the pool worker, each its own track.
    assert!(tracks.contains(&"tokenmill-worker-1"), "{tracks:?}");
    assert_eq!(tracks.len(), 2, "{tracks:?}");
    assert!(summary["max_depth"].as_u64().unwrap() >= 4);
    assert!(summary["num_counters"].as_u64().unwrap() > 0);
    // One queue span per request.
    assert_eq!(summary["num_async_spans"].as_u64(), Some(3));

    // The profiler's reading.
    let trace = Trace::read_file(&trace_path).unwrap();
    let a = Analysis::of(&trace);
    let shape = a.shape.as_ref().expect("model shape in otherData");
    assert_eq!(a.heat.n_layers, shape.n_layers);
    let forwards = trace.complete_named("forward").count();
    assert_eq!(forwards, a.steps.len());
    for (op, row) in a.heat.ops.iter().zip(&a.heat.cells) {
        assert!(row.iter().all(|&us| us > 0.0), "{op} missing in a layer");
    }
    let per_layer = a.ops.iter().find(|o| o.name == "qkv_matmul").unwrap();
    assert_eq!(per_layer.count, forwards * shape.n_layers);
    // Prompts of 24 with a 16-token budget: chunked prefill, so more steps than requests.
    // 3 · (24 + 3) tokens at most 16 a step.
    assert!(a.steps.len() >= 6, "{} steps", a.steps.len());
    assert_eq!(a.generated_tokens, 3 * 4);
    for s in &a.steps {
        assert!(s.op_us <= s.dur + 0.01, "ops exceed their step");
    }
    let (ops, steps) = (a.gaps.op_us, a.gaps.step_us);
    assert!(ops >= 0.5 * steps, "ops cover {ops} of {steps} µs of steps");
    let c = a.critical.as_ref().expect("a request's critical path");
    assert!(
        c.prefill.len() >= 2,
        "24 tokens in 16-token chunks: {:?}",
        c.prefill
    );
    assert_eq!(c.decode_steps, 3);
    // The worker joined the forward passes' jobs, for part of their time.
    let w = a
        .workers
        .iter()
        .find(|w| w.track == "tokenmill-worker-1")
        .expect("worker track");
    assert!(w.jobs > a.steps.len(), "{w:?}");
    assert!(w.utilisation() > 0.0 && w.utilisation() <= 1.0, "{w:?}");

    // The report.
    let out_dir = dir.path().join("report");
    let out = tokenmill(&[
        "profile",
        "report",
        trace_arg,
        "--out-dir",
        out_dir.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "== top ops",
        "qkv_matmul",
        "== gaps",
        "== pool workers",
        "tokenmill-worker-1",
        "== critical path",
        "== verdict",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    let png = std::fs::read(out_dir.join("heatmap.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
}

#[test]
fn report_rejects_bad_input_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{not json").unwrap();
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, r#"{"traceEvents":[]}"#).unwrap();
    for (path, want) in [(&bad, "trace JSON"), (&empty, "no engine steps")] {
        let out = Command::new(env!("CARGO_BIN_EXE_tokenmill"))
            .args(["profile", "report"])
            .arg(path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
