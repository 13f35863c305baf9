//! `tokenmill serve` as a process: SIGTERM drains streams and exits 0, no arguments mean the
//! default model on 127.0.0.1:8080, and the official `openai` Python client works against it
//! (installed into `.venv-test` by `scripts/test-deps.sh`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A running `tokenmill serve`.
struct Server {
    child: Child,
    base: String,
}

/// Flags that keep the test server small.
const SMALL: &[&str] = &["--kv-cache-memory", "128MiB", "--max-model-len", "1024"];

fn spawn(args: &[&str]) -> Server {
    spawn_cmd("serve", "serving", args)
}

/// Starts `tokenmill SUBCOMMAND ARGS` and waits for the log line with `marker` and its
/// `address=`.
fn spawn_cmd(subcommand: &str, marker: &'static str, args: &[&str]) -> Server {
    spawn_env(subcommand, marker, args, &[])
}

/// [`spawn_cmd`] with extra environment variables.
fn spawn_env(
    subcommand: &str,
    marker: &'static str,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Server {
    // The binary finds the default model itself; make sure it is there.
    tokenmill_testutil::model_path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmill"))
        .arg(subcommand)
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .env_remove("TOKENMILL_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning tokenmill serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            if line.contains(marker)
                && let Some(rest) = line.split("address=").nth(1)
            {
                let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server did not report its address");
    Server {
        child,
        base: format!("http://{addr}"),
    }
}

impl Server {
    fn sigterm(&self) {
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0);
    }

    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t.elapsed() < timeout, "the server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn sigterm_during_streams_finishes_them_and_exits_zero() {
    let mut s = spawn(&[&["--port", "0", "--drain-timeout", "60"], SMALL].concat());
    let base = s.base.clone();
    let rt = rt();
    let c = reqwest::Client::new();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": true,
                      "stream": true});
    let mut responses = Vec::new();
    for _ in 0..2 {
        let mut r = rt
            .block_on(c.post(format!("{base}/v1/completions")).json(&body).send())
            .unwrap();
        assert_eq!(r.status(), 200);
        let first = rt.block_on(r.chunk()).unwrap().unwrap();
        assert!(first.starts_with(b"data: "));
        responses.push((r, first.to_vec()));
    }
    s.sigterm();
    for (mut r, mut text) in responses {
        while let Some(chunk) = rt.block_on(r.chunk()).unwrap() {
            text.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(text).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    }
    let status = s.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn serve_without_arguments_listens_on_127_0_0_1_8080() {
    if std::net::TcpListener::bind("127.0.0.1:8080").is_err() {
        eprintln!("port 8080 is in use here; skipping the default-address check");
        return;
    }
    let mut s = spawn(&[]);
    assert_eq!(s.base, "http://127.0.0.1:8080");
    let rt = rt();
    let r = rt
        .block_on(reqwest::get("http://127.0.0.1:8080/v1/models"))
        .unwrap();
    let v: Value = rt.block_on(r.json()).unwrap();
    assert_eq!(v["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
}

/// Runs the install script `scripts/NAME` (idempotent) and returns the path it prints: the
/// Python of its venv, or the browser.
fn install_deps(name: &str) -> PathBuf {
    let script = tokenmill_testutil::workspace_root()
        .join("scripts")
        .join(name);
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `serve --model ORG/NAME:QUANT` from the local Hugging Face cache serves the model under that
/// id, as vLLM does, with the bare repository as an alias.
#[test]
fn serve_a_hugging_face_id_under_its_name() {
    let hub = tempfile::tempdir().unwrap();
    tokenmill_testutil::hf_cache_with_default_model(hub.path());
    let id = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1";
    let args = [&["--port", "0", "--model", id], SMALL].concat();
    let mut s = spawn_env(
        "serve",
        "serving",
        &args,
        &[("HF_HUB_CACHE", hub.path().as_os_str())],
    );
    let rt = rt();
    let c = reqwest::Client::new();
    let models: Value = rt
        .block_on(async {
            c.get(format!("{}/v1/models", s.base))
                .send()
                .await?
                .json()
                .await
        })
        .unwrap();
    assert_eq!(models["data"][0]["id"], id, "{models}");
    for model in [id, "HuggingFaceTB/SmolLM2-135M-Instruct"] {
        let body = json!({"model": model, "prompt": "The capital of France is", "max_tokens": 2,
            "temperature": 0});
        let v: Value = rt
            .block_on(async {
                let r = c
                    .post(format!("{}/v1/completions", s.base))
                    .json(&body)
                    .send()
                    .await?;
                r.json().await
            })
            .unwrap();
        assert_eq!(v["choices"][0]["text"], " Paris.", "{v}");
        // As vLLM: the response names the primary served name, whichever alias was asked.
        assert_eq!(v["model"], id, "{v}");
    }
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
}

/// EleutherAI's lm-evaluation-harness (`lm-eval[api]`, installed into `.venv-lmeval` by
/// `scripts/lm-eval-deps.sh`) against the server on the tasks shipped in `tests/eval/lm_eval`:
/// `local-completions` for loglikelihood (multiple choice, `echo` + `logprobs`, tokenized
/// through the server's `/tokenizer_info` + `/tokenize`) and `generate_until`, and
/// `local-chat-completions` with the chat template. The loglikelihoods lm-eval records are
/// recomputed here from the model's own logits, so its alignment of our echo logprobs is
/// checked, not assumed. Offline: the tasks are local JSONL files.
#[test]
fn lm_eval_harness_against_the_server() {
    let root = tokenmill_testutil::workspace_root();
    let python = install_deps("lm-eval-deps.sh");
    let mut s = spawn(&[&["--port", "0", "--served-model-name", "smollm2"], SMALL].concat());
    let work = tempfile::tempdir().unwrap();
    let run = |model: &str, route: &str, extra: &[&str], tasks: &str| -> Value {
        let out_dir = work.path().join(model);
        let mut args = format!(
            "model=smollm2,base_url={}{route},num_concurrent=2,max_retries=1",
            s.base
        );
        if model == "local-completions" {
            // Rolling windows as long as the server's context (`SMALL`).
            args.push_str(",tokenizer_backend=remote,max_length=1024");
        }
        let out = Command::new(&python)
            .args([
                "-m",
                "lm_eval",
                "run",
                "--model",
                model,
                "--model_args",
                &args,
            ])
            .args([
                "--tasks",
                tasks,
                "--include_path",
                "tests/eval/lm_eval",
                "--log_samples",
            ])
            .arg("--output_path")
            .arg(&out_dir)
            .args(extra)
            .current_dir(&root)
            .env("HF_HOME", work.path().join("hf"))
            .env("HF_DATASETS_OFFLINE", "1")
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .expect("running lm_eval");
        let log = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "lm_eval {model} failed:\n{log}");
        println!("{}", String::from_utf8_lossy(&out.stdout));
        // <output_path>/<model name>/results_*.json and samples_<task>_*.jsonl
        let dir = std::fs::read_dir(&out_dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut results = Value::Null;
        let mut samples = serde_json::Map::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap();
            if name.starts_with("results_") {
                results = serde_json::from_str(&text).unwrap();
            } else if let Some(rest) = name.strip_prefix("samples_") {
                let task = rest.rsplit_once('_').unwrap().0.to_string();
                let rows: Vec<Value> = text
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                samples.insert(task, Value::Array(rows));
            }
        }
        json!({"results": results["results"], "samples": samples})
    };

    let base = run(
        "local-completions",
        "/v1/completions",
        &[],
        "tokenmill_choice,tokenmill_gen,tokenmill_prose",
    );
    let metric = |v: &Value, task: &str, key: &str| v["results"][task][key].as_f64().unwrap();
    // 20 four-way questions (chance 0.25) and 10 one-word completions, greedy: deterministic.
    let acc = metric(&base, "tokenmill_choice", "acc,none");
    let em = metric(&base, "tokenmill_gen", "exact_match,first_word");
    let word_ppl = metric(&base, "tokenmill_prose", "word_perplexity,none");
    eprintln!(
        "lm-eval: tokenmill_choice acc {acc}, tokenmill_gen exact_match {em}, \
         tokenmill_prose word_perplexity {word_ppl}"
    );
    assert!(acc >= 0.6, "{acc}");
    assert!(em >= 0.6, "{em}");

    // lm-eval's loglikelihoods equal the model's own: context and continuation tokenized as
    // lm-eval does (the whole text, split at the context's length), the continuation's
    // log-softmax summed over the rows before each of its tokens.
    let tok =
        tokenmill_tokenizer::Tokenizer::from_gguf_path(tokenmill_testutil::model_path()).unwrap();
    let model = tokenmill_model::Model::open(&tokenmill_testutil::model_path()).unwrap();
    let vocab = model.vocab_size();
    // Σ log p(tokens[pos] | tokens[..pos]) for pos in from..len, from one forward pass.
    let model_ll = |tokens: &[u32], from: usize| -> f64 {
        let blocks = tokens.len().div_ceil(16);
        // The cache `serve` runs by default (f16): the server's numbers, not f32's.
        let mut kv = model.kv_cache_with_dtype(blocks, 16, tokenmill_model::KvDtype::F16);
        let table: Vec<u32> = (0..blocks as u32).collect();
        let mut ws = tokenmill_model::Workspace::default();
        let c = tokenmill_model::SeqChunk {
            tokens,
            start_pos: 0,
            block_table: &table,
            logits: tokenmill_model::LogitsWanted::All,
        };
        let logits = model.forward(&[c], &mut kv, &mut ws).unwrap();
        let mut ll = 0f64;
        for pos in from..tokens.len() {
            let row = &logits[(pos - 1) * vocab..pos * vocab];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            ll += row[tokens[pos] as usize] as f64 - max - sum.ln();
        }
        ll
    };
    let rows = base["samples"]["tokenmill_choice"].as_array().unwrap();
    for sample in &rows[..3] {
        let args = sample["arguments"].as_object().unwrap();
        for (i, arg) in args.values().enumerate() {
            let (ctx, cont) = (
                arg["arg_0"].as_str().unwrap(),
                arg["arg_1"].as_str().unwrap(),
            );
            let whole = tok.encode(&format!("{ctx}{cont}"), false).unwrap();
            let n_ctx = tok.encode(ctx, false).unwrap().len();
            let ll = model_ll(&whole, n_ctx);
            let theirs: f64 = sample["resps"][i][0][0].as_str().unwrap().parse().unwrap();
            assert!(
                (ll - theirs).abs() < 1e-2,
                "{ctx:?} + {cont:?}: lm-eval recorded {theirs}, the model gives {ll}"
            );
        }
    }

    // The rolling loglikelihood of a paragraph (shorter than a window): every token of it
    // after the BOS token lm-eval puts first.
    let bos = tok.bos_token_id().unwrap();
    for sample in &base["samples"]["tokenmill_prose"].as_array().unwrap()[..2] {
        let text = sample["doc"]["text"].as_str().unwrap();
        let tokens: Vec<u32> = std::iter::once(bos)
            .chain(tok.encode(text, false).unwrap())
            .collect();
        let ll = model_ll(&tokens, 1);
        let theirs: f64 = sample["resps"][0][0].as_str().unwrap().parse().unwrap();
        // The server's batched kernels and this one pass differ by ~1e-4 per token; a token
        // out of place would cost whole units.
        assert!(
            (ll - theirs).abs() < 1e-3 * tokens.len() as f64,
            "{text:?}: lm-eval recorded {theirs}, the model gives {ll}"
        );
    }
    // Word perplexity on prose a 135M model reads well: near its token perplexity of ~19
    // (`tokenmill perplexity`) to the power tokens per word.
    assert!((20.0..80.0).contains(&word_ppl), "{word_ppl}");

    let chat = run(
        "local-chat-completions",
        "/v1/chat/completions",
        &["--apply_chat_template"],
        "tokenmill_gen_chat",
    );
    let em_chat = metric(&chat, "tokenmill_gen_chat", "exact_match,last_word");
    eprintln!("lm-eval chat: tokenmill_gen_chat exact_match {em_chat}");
    let answers = chat["samples"]["tokenmill_gen_chat"].as_array().unwrap();
    assert_eq!(answers.len(), 10);
    for a in answers {
        let text = a["resps"][0][0].as_str().unwrap();
        assert!(!text.trim().is_empty(), "{a}");
    }
    assert!(em_chat >= 0.2, "{em_chat}");
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
}

/// `/dashboard` in a real headless Chromium (Debian's, installed by `scripts/browser-deps.sh`)
/// while a load runs: the page's own samples of `/metrics` show requests running and a
/// measured step time, and its screenshot has the charts drawn — pixels of the
/// running-requests line's colour, and the TPOT target as a red dashed line.
#[test]
fn dashboard_renders_live_numbers_in_headless_chromium() {
    let chromium = install_deps("browser-deps.sh");
    let mut s = spawn(&[&["--port", "0", "--target-tpot-ms", "50"], SMALL].concat());
    let base = s.base.clone();
    let load = std::thread::spawn(move || {
        let rt = rt();
        rt.block_on(async {
            let c = reqwest::Client::new();
            let tasks: Vec<_> = (0..32)
                .map(|i| {
                    let (c, url) = (c.clone(), format!("{base}/v1/completions"));
                    tokio::spawn(async move {
                        let body = json!({"prompt": format!("Story {i}:"), "max_tokens": 128,
                            "ignore_eos": true});
                        c.post(url).json(&body).send().await.map(|r| r.status())
                    })
                })
                .collect();
            for t in tasks {
                assert_eq!(t.await.unwrap().unwrap(), 200);
            }
        });
    });
    // The page's samples must see the load: wait until the engine has stepped with requests
    // running (a fixed second was too short for a CI run's parallel tests, where the page
    // then sampled a server that had not yet run a step).
    let (rt, c) = (rt(), reqwest::Client::new());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let url = format!("{}/metrics", s.base);
        let text = rt
            .block_on(async { c.get(url).send().await?.text().await })
            .unwrap_or_default();
        let value = |name: &str| tokenmill_testutil::metric(&text, name).unwrap_or(0.0);
        let stepped = value("tokenmill_step_time_measured_seconds") > 0.0;
        if stepped && value("vllm:num_requests_running") >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no step with requests running in 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let work = tempfile::tempdir().unwrap();
    let chrome = |name: &str, extra: &[&str]| -> Vec<u8> {
        let out = Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
            ])
            .args(["--no-first-run", "--disable-background-networking"])
            .args(["--disable-component-update", "--disable-sync"])
            .arg(format!(
                "--user-data-dir={}",
                work.path().join(name).display()
            ))
            .args(["--window-size=1280,1000", "--virtual-time-budget=5000"])
            .args(extra)
            .arg(format!("{}/dashboard", s.base))
            .output()
            .expect("running chromium");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let dom = String::from_utf8(chrome("dom", &["--dump-dom"])).unwrap();
    let field = |pat: &str| -> String {
        let start = dom
            .find(pat)
            .unwrap_or_else(|| panic!("no {pat} in\n{dom}"))
            + pat.len();
        dom[start..].split(['"', '<']).next().unwrap().to_string()
    };
    let samples: u32 = field("data-samples=\"").parse().unwrap();
    assert!(samples >= 3, "{samples} samples");
    let running: f64 = field("id=\"v-running\">").parse().unwrap();
    let step: f64 = field("id=\"v-step\">").parse().unwrap();
    assert!(
        running >= 1.0 && step > 0.0,
        "running {running}, step {step} ms"
    );

    // Pixels of each chart colour in a screenshot (within `tol` of it per channel).
    let screenshot = |k: usize| -> [usize; 3] {
        let shot = work.path().join(format!("dashboard-{k}.png"));
        chrome(
            &format!("png-{k}"),
            &[&format!("--screenshot={}", shot.display())],
        );
        let decoder = png::Decoder::new(std::fs::File::open(&shot).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        let channels = info.color_type.samples();
        let count = |rgb: [u8; 3], tol: u8| {
            buf[..info.buffer_size()]
                .chunks(channels)
                .filter(|p| (0..3).all(|k| p[k].abs_diff(rgb[k]) <= tol))
                .count()
        };
        // The target line's red is told apart from the ITL line's (#c62828) by a tight match.
        [
            count([0x2e, 0x7d, 0x32], 24),
            count([0x6a, 0x1b, 0x9a], 24),
            count([0xd3, 0x2f, 0x2f], 10),
        ]
    };
    // The page draws the target once its `/server_info` came back, which a loaded machine
    // may not manage within one screenshot's virtual time: up to three tries.
    let mut shots = Vec::new();
    for k in 0..3 {
        shots.push(screenshot(k));
        if shots[k][2] > 50 {
            break;
        }
    }
    let [green, purple, red] = *shots.last().unwrap();
    // A few seconds of samples draw short lines; the page's own white and grey are far away
    // from these colours.
    assert!(
        green >= 6,
        "{green} pixels of the running-requests line ({shots:?})"
    );
    assert!(
        purple >= 6,
        "{purple} pixels of the batch-size line ({shots:?})"
    );
    assert!(red > 50, "{red} pixels of the TPOT target line ({shots:?})");
    load.join().unwrap();
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
}

/// Runs `tests/openai_client/<script>` with the official `openai` client (installed by
/// `scripts/test-deps.sh`) against a fresh server; every test in it must pass.
fn run_openai_client_script(script: &str) {
    run_openai_client_script_with(script, &[], &[]);
}

/// [`run_openai_client_script`] with more `serve` flags and more arguments for the script.
fn run_openai_client_script_with(script: &str, serve_args: &[&str], script_args: &[&str]) {
    run_openai_client_script_env(script, serve_args, script_args, &[]);
}

/// [`run_openai_client_script_with`] with environment variables for the server.
fn run_openai_client_script_env(
    script: &str,
    serve_args: &[&str],
    script_args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) {
    let root = tokenmill_testutil::workspace_root();
    let python = install_deps("test-deps.sh");
    let base = ["--port", "0", "--served-model-name", "smollm2"];
    // Later flags win: `serve_args` may override `SMALL`'s.
    let mut s = spawn_env(
        "serve",
        "serving",
        &[&base, SMALL, serve_args].concat(),
        env,
    );
    let out = Command::new(python)
        .arg(root.join("tests/openai_client").join(script))
        .arg(&s.base)
        .arg("smollm2")
        .args(script_args)
        .output()
        .expect("running the openai client tests");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "openai client tests failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"));
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
}

#[test]
fn official_openai_python_client() {
    run_openai_client_script("test_openai.py");
}

#[test]
fn official_openai_python_client_responses_api() {
    run_openai_client_script("test_responses.py");
}

/// A real Prometheus (Debian's) scrapes two workers with `deploy/prometheus/rules.yml`: both
/// targets are up, the recording rules have values from the load, and every query of the
/// Grafana dashboard (`deploy/grafana/tokenmill.json`) evaluates.
#[test]
fn prometheus_scrapes_two_workers_with_the_slo_rules() {
    let bin = install_deps("prometheus-deps.sh");
    let root = tokenmill_testutil::workspace_root();
    let args = [&["--port", "0", "--target-tpot-ms", "200"], SMALL].concat();
    let mut workers = [spawn(&args), spawn(&args)];
    let work = tempfile::tempdir().unwrap();
    // The rules as shipped, evaluated every second instead of every 15 s.
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/rules.yml")).unwrap();
    let rules_path = work.path().join("rules.yml");
    std::fs::write(&rules_path, rules.replace("interval: 15s", "interval: 1s")).unwrap();
    let targets: Vec<String> = workers
        .iter()
        .map(|w| format!("\"{}\"", w.base.trim_start_matches("http://")))
        .collect();
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [\"{}\"]\n\
         scrape_configs:\n  - job_name: tokenmill\n    static_configs:\n      - targets: [{}]\n",
        rules_path.display(),
        targets.join(", ")
    );
    let config_path = work.path().join("prometheus.yml");
    std::fs::write(&config_path, config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut prometheus = Command::new(bin.join("prometheus"))
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            work.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting prometheus");
    let rt = rt();
    let c = reqwest::Client::new();
    let query = |q: &str| -> Value {
        let url = format!("http://127.0.0.1:{port}/api/v1/query");
        rt.block_on(async {
            match c.get(&url).query(&[("query", q)]).send().await {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            }
        })
    };
    let values = |v: &Value| -> Vec<f64> {
        let rows = v["data"]["result"].as_array().cloned().unwrap_or_default();
        rows.iter()
            .filter_map(|r| r["value"][1].as_str()?.parse().ok())
            .collect()
    };
    let until = |what: &str, ok: &dyn Fn() -> bool| {
        let t = Instant::now();
        while !ok() {
            assert!(t.elapsed() < Duration::from_secs(60), "waiting for {what}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    until("both workers scraped", &|| {
        values(&query("up{job=\"tokenmill\"}")) == [1.0, 1.0]
    });
    // Load on both workers at once, for a few seconds of samples.
    rt.block_on(async {
        for round in 0..4 {
            let body = json!({"prompt": format!("Count to ten, round {round}:"),
                "max_tokens": 24, "ignore_eos": true});
            let send = |w: &Server| {
                c.post(format!("{}/v1/completions", w.base))
                    .json(&body)
                    .send()
            };
            let (a, b) = tokio::join!(send(&workers[0]), send(&workers[1]));
            assert_eq!(a.unwrap().status(), 200);
            assert_eq!(b.unwrap().status(), 200);
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    });
    let positive = |q: &str| values(&query(q)).first().is_some_and(|&v| v > 0.0);
    until("the rules' output tokens per second", &|| {
        positive("tokenmill:generation_tokens:rate1m")
    });
    until("the rules' p95 TTFT", &|| {
        positive("tokenmill:time_to_first_token_seconds:p95")
    });
    let load = values(&query("tokenmill:sla_tpot_load:max"));
    assert!(load.len() == 1 && load[0] >= 0.0, "{load:?}");
    // Every panel's query is valid PromQL over what the workers and the rules provide.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/tokenmill.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for target in panels.iter().flat_map(|p| p["targets"].as_array().unwrap()) {
        let expr = target["expr"].as_str().unwrap();
        let r = query(expr);
        assert_eq!(r["status"], "success", "{expr}: {r}");
        assert!(!values(&r).is_empty(), "{expr} has no series");
    }
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    for w in &mut workers {
        w.sigterm();
        assert_eq!(w.wait(Duration::from_secs(60)).code(), Some(0));
    }
}

/// A free loopback port (racy, but only against ourselves).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A gateway process (`smg launch` or `vllm-router`) over `workers`, once it answers
/// `/v1/models`; killed on drop.
struct Gateway {
    child: Child,
    url: String,
}

impl Gateway {
    fn start(bin: &std::path::Path, gateway: &str, policy: &str, workers: &[&Server]) -> Gateway {
        let (port, metrics) = (free_port(), free_port());
        let mut cmd = Command::new(bin.join(gateway));
        if gateway == "smg" {
            // smg registers workers in the background after a `/health` probe, retried every
            // 30 s by default: a worker slow to answer the first would miss the test.
            cmd.args(["launch", "--worker-startup-check-interval", "1"]);
        }
        let child = cmd
            .args(["--host", "127.0.0.1", "--policy", policy])
            .args(["--port", &port.to_string()])
            .args(["--prometheus-port", &metrics.to_string()])
            .arg("--worker-urls")
            .args(workers.iter().map(|w| &w.base))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {gateway}: {e}"));
        let g = Gateway {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let t = Instant::now();
        let models = format!("{}/v1/models", g.url);
        let rt = rt();
        while !rt
            .block_on(reqwest::get(&models))
            .is_ok_and(|r| r.status() == 200)
        {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{gateway} never came up"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // smg answers (and routes) as soon as one worker is registered: wait for all of them,
        // healthy, on its `/workers` list.
        if gateway == "smg" {
            let list = format!("{}/workers", g.url);
            let all_ready = |v: &Value| {
                v["total"].as_u64() == Some(workers.len() as u64)
                    && v["workers"].as_array().is_some_and(|ws| {
                        ws.iter()
                            .all(|w| w["is_healthy"] == true && w["status"] == "ready")
                    })
            };
            loop {
                let v: Option<Value> =
                    rt.block_on(async { reqwest::get(&list).await.ok()?.json().await.ok() });
                if v.as_ref().is_some_and(all_ready) {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(90),
                    "smg never listed {} ready workers: {v:?}",
                    workers.len()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        g
    }

    /// Runs a phase of `tests/openai_client/test_gateway.py` through this gateway; its JSON.
    fn phase(&self, phase: &str, workers: &[&Server]) -> Value {
        let out = self.phase_cmd(phase, workers).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{phase}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
    }

    fn phase_cmd(&self, phase: &str, workers: &[&Server]) -> Command {
        let root = tokenmill_testutil::workspace_root();
        let mut cmd = Command::new(install_deps("test-deps.sh"));
        cmd.arg(root.join("tests/openai_client/test_gateway.py"))
            .args([&self.url, "smollm2", phase])
            .args(workers.iter().map(|w| &w.base));
        cmd
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two workers with KV caches of ~3 of the `prefixes` phase's five prompts each.
fn gateway_workers() -> [Server; 2] {
    let args = [
        "--port",
        "0",
        "--served-model-name",
        "smollm2",
        // 75 blocks of 16 tokens in the default f16 cache (53 MiB of f32).
        "--kv-cache-memory",
        "27136KiB",
        "--max-model-len",
        "512",
    ];
    [spawn(&args), spawn(&args)]
}

/// tokenmill behind SGLang's model gateway (`smg`, PyPI): its cache-aware policy sends requests
/// sharing a prefix to the worker that holds it — with five long prefixes and caches of three,
/// the workers' own prefix-cache counters show at least twice the hit rate of round robin,
/// which spreads every prefix over both and evicts them; load is spread; a worker killed with
/// SIGKILL is taken out of rotation; one stopped with SIGTERM finishes its requests.
#[test]
fn behind_sglangs_model_gateway() {
    let bin = install_deps("gateway-deps.sh");
    // The comparison presumes the first round of five new prefixes reached both workers: smg
    // breaks cold-start ties at random, and a burst occasionally lands whole on one worker
    // (whose cache of three then evicts its way through five: hit rate 0.08 in a CI run; a
    // 4/1 split still gives ~0.6). Such a run is smg's coin, not tokenmill's behaviour, so it
    // is run again on fresh workers — at most twice, so a systematic lopsidedness still fails.
    let hit_rate = |policy: &str| {
        let mut attempt = 1;
        loop {
            let w = gateway_workers();
            let g = Gateway::start(&bin, "smg", policy, &[&w[0], &w[1]]);
            let r = g.phase("prefixes", &[&w[0], &w[1]]);
            eprintln!("smg {policy} (attempt {attempt}): {r}");
            let first: Vec<f64> = serde_json::from_value(r["first_round"].clone()).unwrap();
            if first.iter().all(|&n| n > 0.0) || attempt == 3 {
                return r["hit_rate"].as_f64().unwrap();
            }
            attempt += 1;
        }
    };
    let (cache_aware, round_robin) = (hit_rate("cache_aware"), hit_rate("round_robin"));
    assert!(cache_aware > 0.3, "{cache_aware}");
    assert!(
        cache_aware >= 2.0 * round_robin,
        "cache_aware {cache_aware} vs round_robin {round_robin}"
    );

    let mut w = gateway_workers();
    let g = Gateway::start(&bin, "smg", "round_robin", &[&w[0], &w[1]]);
    let spread = g.phase("spread", &[&w[0], &w[1]]);
    let per_worker: Vec<f64> = serde_json::from_value(spread["per_worker"].clone()).unwrap();
    assert!(per_worker.iter().all(|&n| n >= 6.0), "{spread}");
    // SIGKILL: later requests succeed on the other worker.
    let _ = w[1].child.kill();
    let _ = w[1].child.wait();
    let survived = g.phase("survive", &[&w[0]]);
    eprintln!("smg after SIGKILL: {survived}");
    drop(g);

    // SIGTERM while requests run on both: every one of them completes.
    let w = gateway_workers();
    let g = Gateway::start(&bin, "smg", "round_robin", &[&w[0], &w[1]]);
    let mut drain = g
        .phase_cmd("drain", &[&w[0], &w[1]])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(drain.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "started");
    w[1].sigterm();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(drain.wait().unwrap().success(), "{rest:?}");
    let mut w = w;
    assert_eq!(w[1].wait(Duration::from_secs(60)).code(), Some(0));
}

/// The same workers behind `vllm-router` (PyPI): requests spread over both and succeed.
#[test]
fn behind_vllm_router() {
    let bin = install_deps("gateway-deps.sh");
    let w = gateway_workers();
    let g = Gateway::start(&bin, "vllm-router", "round_robin", &[&w[0], &w[1]]);
    let spread = g.phase("spread", &[&w[0], &w[1]]);
    let per_worker: Vec<f64> = serde_json::from_value(spread["per_worker"].clone()).unwrap();
    assert!(per_worker.iter().all(|&n| n >= 6.0), "{spread}");
}

#[test]
fn official_openai_python_client_embeddings_with_either_pooling() {
    run_openai_client_script_with("test_embeddings.py", &[], &["last"]);
    run_openai_client_script_with("test_embeddings.py", &["--pooling", "mean"], &["mean"]);
}

/// `--kv-events-config`: an independent subscriber (pyzmq + msgpack) rebuilds the prefix cache
/// from the events and predicts every request's prefix hit from it, through evictions of a
/// cache of a few blocks; the replay socket returns every batch published.
#[test]
fn kv_cache_events_rebuild_the_workers_prefix_cache() {
    let free_port = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let (publish, replay) = (free_port(), free_port());
    let topic = "kv@127.0.0.1@smollm2";
    let config = format!(
        r#"{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{publish}",
            "replay_endpoint": "tcp://*:{replay}", "topic": "{topic}"}}"#
    );
    // 24 blocks of 16 tokens (f16, the default): three 48-token system prompts and their tails
    // do not all fit.
    let serve = [
        "--kv-cache-memory",
        "8704KiB",
        "--max-model-len",
        "256",
        "--kv-events-config",
        &config,
    ];
    run_openai_client_script_with("test_kv_events.py", &serve, &[&publish, &replay, topic]);
}

#[test]
fn official_openai_python_client_structured_outputs_and_tools() {
    run_openai_client_script("test_structured.py");
}

/// `--activation-bits 8` reaches the engine: `/server_info` reports 8-bit activations where
/// the tier has the kernels (AVX-512 VNNI, AVX-VNNI and AVX2) and 12 elsewhere, and the
/// server answers.
#[test]
fn activation_bits_flag_reaches_the_kernels() {
    let args = [
        "--port",
        "0",
        "--served-model-name",
        "smollm2",
        "--activation-bits",
        "8",
    ];
    let mut s = spawn(&[&args[..], SMALL].concat());
    let rt = rt();
    let c = reqwest::Client::new();
    let v: Value = rt
        .block_on(async {
            let r = c.get(format!("{}/server_info", s.base)).send().await?;
            r.json().await
        })
        .unwrap();
    use tokenmill_kernels::dispatch::{Kernels, Tier};
    let a8 = Kernels::new(Tier::best()).unwrap().with_a8(true).runs_a8();
    assert_eq!(v["activation_bits"], if a8 { 8 } else { 12 }, "{v}");
    assert!(
        v["kernels"].as_str().unwrap().contains("8-bit") == a8,
        "{v}"
    );
    let r: Value = rt
        .block_on(async {
            let r = c
                .post(format!("{}/v1/completions", s.base))
                .json(&json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}))
                .send()
                .await?;
            r.json().await
        })
        .unwrap();
    assert_eq!(r["usage"]["completion_tokens"], 4, "{r}");
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
}

#[test]
fn serve_with_a_tokenizer_server_endpoint() {
    let mut tok = spawn_cmd("tokenizer-server", "tokenizer service", &["--port", "0"]);
    let endpoint = tok.base.clone();
    let mut s = spawn(&[&["--port", "0", "--tokenizer-endpoint", &endpoint], SMALL].concat());
    let rt = rt();
    let c = reqwest::Client::new();
    let r = rt
        .block_on(
            c.post(format!("{}/tokenize", s.base))
                .json(&json!({"prompt": "Hello, world!"}))
                .send(),
        )
        .unwrap();
    let v: Value = rt.block_on(r.json()).unwrap();
    assert_eq!(v["tokens"], json!([19556, 28, 905, 17]));
    let r = rt
        .block_on(c.get(format!("{}/server_info", s.base)).send())
        .unwrap();
    let v: Value = rt.block_on(r.json()).unwrap();
    assert_eq!(v["remote_tokenizer"], true);
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
    tok.sigterm();
    assert_eq!(tok.wait(Duration::from_secs(60)).code(), Some(0));
}

/// `serve --otlp-traces-endpoint` over OTLP/HTTP protobuf, received by an independent
/// Python receiver (`opentelemetry-proto`'s classes decode the bodies) while the official
/// `openai` client sends the requests (`tests/openai_client/test_otlp.py`).
#[test]
fn otlp_traces_over_http_protobuf_to_an_independent_receiver() {
    let port = free_port().to_string();
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
    let env = [
        (
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "http/protobuf".as_ref(),
        ),
        // Batches every 200 ms rather than 5 s: the test waits for each span.
        ("OTEL_BSP_SCHEDULE_DELAY", "200".as_ref()),
    ];
    run_openai_client_script_env(
        "test_otlp.py",
        &["--otlp-traces-endpoint", &endpoint],
        &[&port],
        &env,
    );
}

/// An OTLP/gRPC collector inside the test: opentelemetry-proto's generated service decodes
/// every export, and the spans are kept.
#[derive(Clone, Default)]
struct Collector(std::sync::Arc<std::sync::Mutex<Vec<otlp_trace::Span>>>);

use opentelemetry_proto::tonic::collector::trace::v1 as otlp_collector;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1 as otlp_trace;

#[tonic::async_trait]
impl otlp_collector::trace_service_server::TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<otlp_collector::ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<otlp_collector::ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone());
            assert_eq!(service, Some(AnyValue::StringValue("tokenmill".into())));
            spans.extend(rs.scope_spans.into_iter().flat_map(|s| s.spans));
        }
        Ok(tonic::Response::new(
            otlp_collector::ExportTraceServiceResponse::default(),
        ))
    }
}

impl Collector {
    fn spans(&self) -> Vec<otlp_trace::Span> {
        self.0.lock().unwrap().clone()
    }

    /// The `llm_request` spans whose `gen_ai.request.id` is `id`.
    fn requests(&self, id: &str) -> Vec<otlp_trace::Span> {
        let want = AnyValue::StringValue(id.into());
        self.spans()
            .into_iter()
            .filter(|s| s.name == "llm_request" && attr(s, "gen_ai.request.id") == Some(&want))
            .collect()
    }

    /// Waits up to a minute for `n` request spans of `id`.
    fn wait_for(&self, id: &str, n: usize) -> Vec<otlp_trace::Span> {
        let t = Instant::now();
        loop {
            let got = self.requests(id);
            if got.len() >= n || t.elapsed() > Duration::from_secs(60) {
                return got;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn attr<'a>(s: &'a otlp_trace::Span, key: &str) -> Option<&'a AnyValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn int_attr(s: &otlp_trace::Span, key: &str) -> i64 {
    match attr(s, key) {
        Some(AnyValue::IntValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `serve --otlp-traces-endpoint` (gRPC, the default protocol) against a real OTLP receiver:
/// a streamed chat request under a client's `traceparent` becomes an `llm_request` span in
/// that trace, child of the client's span, with vLLM's attributes and `queue` → `prefill` →
/// `decode` children that tile it; `n` = 2 makes a span per choice; a `traceparent` whose
/// sampled flag is off exports nothing; and the last request's span is flushed at SIGTERM.
#[test]
fn otlp_traces_over_grpc_follow_the_clients_traceparent() {
    let rt = rt();
    let collector = Collector::default();
    let port = free_port();
    let svc = otlp_collector::trace_service_server::TraceServiceServer::new(collector.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let receiver = rt.spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_shutdown(addr, async {
                let _ = stop_rx.await;
            }),
    );
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut s = spawn(
        &[
            &["--port", "0", "--served-model-name", "smollm2"],
            SMALL,
            &["--otlp-traces-endpoint", &endpoint],
        ]
        .concat(),
    );
    let c = reqwest::Client::new();
    let post = |path: &str, id: &str, traceparent: Option<&str>, body: Value| {
        let mut r = c
            .post(format!("{}{path}", s.base))
            .header("x-request-id", id)
            .json(&body);
        if let Some(tp) = traceparent {
            r = r.header("traceparent", tp);
        }
        let resp = rt.block_on(r.send()).unwrap();
        assert_eq!(resp.status(), 200);
        rt.block_on(resp.text()).unwrap()
    };
    let (trace_id, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let body = post(
        "/v1/chat/completions",
        "otel-chat",
        Some(&format!("00-{trace_id}-{parent}-01")),
        json!({"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}],
               "max_tokens": 8, "ignore_eos": true, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let usage: Value = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .unwrap()["usage"]
        .clone();
    post(
        "/v1/completions",
        "otel-n2",
        None,
        json!({"model": "smollm2", "prompt": "One, two,", "max_tokens": 5, "n": 2,
               "temperature": 0.8, "seed": 3}),
    );
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    post(
        "/v1/completions",
        "otel-unsampled",
        Some(&format!("00-{unsampled}-b7ad6b7169203331-00")),
        json!({"model": "smollm2", "prompt": "Three,", "max_tokens": 3}),
    );

    // Exported while the server runs (the batch processor's schedule).
    let chat = collector.wait_for("otel-chat", 1);
    assert_eq!(chat.len(), 1, "{:?}", collector.spans());
    let req = &chat[0];
    assert_eq!(req.trace_id, hex(trace_id));
    assert_eq!(req.parent_span_id, hex(parent));
    assert_eq!(req.kind, otlp_trace::span::SpanKind::Server as i32);
    let status = req.status.as_ref().unwrap();
    assert_eq!(status.code, otlp_trace::status::StatusCode::Ok as i32);
    assert_eq!(
        attr(req, "gen_ai.response.model"),
        Some(&AnyValue::StringValue("smollm2".into()))
    );
    assert_eq!(
        attr(req, "gen_ai.response.finish_reasons"),
        Some(&AnyValue::StringValue("length".into()))
    );
    assert_eq!(
        int_attr(req, "gen_ai.usage.prompt_tokens"),
        usage["prompt_tokens"].as_i64().unwrap()
    );
    assert_eq!(int_attr(req, "gen_ai.usage.completion_tokens"), 8);
    assert_eq!(int_attr(req, "gen_ai.request.max_tokens"), 8);
    // queue, prefill, decode: children of the request span that tile it, in that order.
    let mut children: Vec<_> = collector
        .spans()
        .into_iter()
        .filter(|c| c.parent_span_id == req.span_id)
        .collect();
    children.sort_by_key(|c| c.start_time_unix_nano);
    let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["queue", "prefill", "decode"]);
    assert!(children.iter().all(|c| c.trace_id == req.trace_id));
    assert_eq!(children[0].start_time_unix_nano, req.start_time_unix_nano);
    assert_eq!(
        children[0].end_time_unix_nano,
        children[1].start_time_unix_nano
    );
    assert_eq!(
        children[1].end_time_unix_nano,
        children[2].start_time_unix_nano
    );
    assert_eq!(children[2].end_time_unix_nano, req.end_time_unix_nano);
    assert!(
        children
            .iter()
            .all(|c| c.start_time_unix_nano <= c.end_time_unix_nano)
    );
    assert!(children[1].end_time_unix_nano > children[1].start_time_unix_nano);
    let ttft = match attr(req, "gen_ai.latency.time_to_first_token") {
        Some(AnyValue::DoubleValue(v)) => *v,
        other => panic!("{other:?}"),
    };
    let spans_ttft = (children[1].end_time_unix_nano - req.start_time_unix_nano) as f64 / 1e9;
    assert!((ttft - spans_ttft).abs() < 1e-5, "{ttft} vs {spans_ttft}");

    // n = 2: a span per choice, each a root (no traceparent came).
    let n2 = collector.wait_for("otel-n2", 2);
    let mut choices: Vec<i64> = n2
        .iter()
        .map(|s| int_attr(s, "tokenmill.choice_index"))
        .collect();
    choices.sort();
    assert_eq!(choices, [0, 1]);
    assert!(n2.iter().all(|s| s.parent_span_id.is_empty()));
    assert_eq!(int_attr(&n2[0], "gen_ai.request.n"), 2);

    // The last request's span leaves with the server: SIGTERM flushes the queue.
    post(
        "/v1/completions",
        "otel-last",
        None,
        json!({"model": "smollm2", "prompt": "Four,", "max_tokens": 3}),
    );
    s.sigterm();
    assert_eq!(s.wait(Duration::from_secs(60)).code(), Some(0));
    assert_eq!(collector.requests("otel-last").len(), 1);
    // Not sampled by the caller: nothing of it was exported.
    assert!(collector.requests("otel-unsampled").is_empty());
    let unsampled = hex(unsampled);
    assert!(collector.spans().iter().all(|s| s.trace_id != unsampled));
    let _ = stop_tx.send(());
    rt.block_on(receiver).unwrap().unwrap();
}
