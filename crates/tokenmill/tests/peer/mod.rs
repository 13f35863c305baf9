//! The llama.cpp peer for the quantize tests: its binaries (`llama-server`, `llama-quantize`)
//! when built (`scripts/llama-cpp-peer.sh`, which `scripts/test.sh` runs; never built here), a greedy completion
//! through `llama-server`'s `/completion`, tokenmill's greedy run with its logits, and the
//! greedy rule that compares the two. A missing peer skips a test with `SKIPPED`, or fails
//! it when `TOKENMILL_REQUIRE_PEER=1` (CI builds the peer).

use std::path::{Path, PathBuf};
use std::process::Command;

use tokenmill_model::{LogitsWanted, Model, SeqChunk};

/// The peer llama.cpp binary `name`, if built: from `LLAMA_CPP_BIN` (a folder) or the folder
/// `scripts/llama-cpp-peer.sh --where` names (its cache folder, named by the build flags).
/// Never builds it.
pub fn peer_bin(name: &str) -> Result<PathBuf, String> {
    let folder = match std::env::var_os("LLAMA_CPP_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/llama-cpp-peer.sh");
            let out = Command::new("bash")
                .arg(&script)
                .arg("--where")
                .output()
                .map_err(|e| format!("running {}: {e}", script.display()))?;
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    let bin = folder.join(name);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found (build it with scripts/llama-cpp-peer.sh llama-server llama-quantize llama-perplexity, or set LLAMA_CPP_BIN)",
            bin.display()
        ))
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; the response body, or `None` if not connected.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Kills the child on drop (the test may panic while the server runs).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The last lines of a peer's log, for a failure message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(30)..].join("\n");
    format!("the last lines of its log:\n{tail}")
}

/// llama.cpp's greedy continuation of `prompt` (token ids) on `model`.
pub fn llama_cpp_greedy(server: &Path, model: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The server's log goes to a file, so a server that never becomes ready (a crash at
    // start-up, a file it refuses) is diagnosed from the failure message itself.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Child(
        Command::new(server)
            .args(["-m", model.to_str().unwrap(), "--port", &port.to_string()])
            .args(["-c", "256", "-np", "1", "-t", "2", "--no-warmup"])
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("starting llama-server"),
    );
    // Poll /health until the model is loaded (a readiness wait, not a timing assertion); stop
    // early if the server exits.
    let mut exited = None;
    let mut ready = false;
    for _ in 0..600 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        exited = child.0.try_wait().ok().flatten();
        ready = exited.is_none() && http(port, "GET", "/health", "").is_some();
        if ready || exited.is_some() {
            break;
        }
    }
    let what = format!("llama-server ({}) on {}", server.display(), model.display());
    if !ready {
        let how = match exited {
            Some(status) => format!("exited ({status})"),
            None => "did not answer /health in 60 s".to_owned(),
        };
        panic!(
            "{what} did not become ready: {how}; {}",
            log_tail(log.path())
        );
    }
    let body = serde_json::json!({
        "prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1,
        "return_tokens": true, "cache_prompt": false, "ignore_eos": true,
    });
    let Some(resp) = http(port, "POST", "/completion", &body.to_string()) else {
        let status = child.0.try_wait().ok().flatten();
        panic!(
            "{what}: /completion failed (exit: {status:?}); {}",
            log_tail(log.path())
        );
    };
    let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens in {resp}"))
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// The llama.cpp peer, or `None` (test skipped) when it is not built — unless
/// `TOKENMILL_REQUIRE_PEER=1`, where a missing peer fails the test.
pub fn peer_or_skip(name: &str) -> Option<PathBuf> {
    match peer_bin(name) {
        Ok(s) => Some(s),
        Err(why) if std::env::var("TOKENMILL_REQUIRE_PEER").as_deref() == Ok("1") => {
            panic!("TOKENMILL_REQUIRE_PEER=1 but the llama.cpp peer is absent: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: the llama.cpp peer is absent: {why}");
            None
        }
    }
}

/// Standard deviation of one row of logits.
pub fn row_std(row: &[f32]) -> f32 {
    let row: Vec<f32> = row.iter().copied().filter(|v| v.is_finite()).collect();
    let mean = row.iter().sum::<f32>() / row.len() as f32;
    (row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / row.len() as f32).sqrt()
}

/// tokenmill's greedy continuation of `prompt` on `model` (a GGUF file or an HF folder) with
/// the logits of every step. `eos` is masked, as llama-server's `ignore_eos` does (a -inf
/// logit bias on it).
pub fn tokenmill_greedy(
    model: &Path,
    eos: Option<u32>,
    prompt: &[u32],
    n: usize,
) -> Vec<(u32, Vec<f32>)> {
    let model = Model::open(model).unwrap();
    let vocab = model.vocab_size();
    let mut kv = model.kv_cache(16, 16);
    let table: Vec<u32> = (0..16).collect();
    let mut ws = model.workspace(256, 1);
    let (mut tokens, mut start, mut out) = (prompt.to_vec(), 0, Vec::new());
    for _ in 0..n {
        let c = SeqChunk {
            tokens: &tokens[start..],
            start_pos: start,
            block_table: &table,
            logits: LogitsWanted::Last,
        };
        let mut logits = model.forward(&[c], &mut kv, &mut ws).unwrap()[..vocab].to_vec();
        if let Some(eos) = eos {
            logits[eos as usize] = f32::NEG_INFINITY;
        }
        let best = (0..vocab)
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap() as u32;
        start = tokens.len();
        tokens.push(best);
        out.push((best, logits));
    }
    out
}

/// The greedy rule between llama.cpp's tokens on a quantized file and tokenmill's fp32
/// reference (tokens with their logits): identical until a step where the reference's own
/// logits put llama.cpp's token within `margin` row standard deviations of the reference's
/// best (a near tie that quantization noise may flip); past that, sequences may differ.
/// Returns the steps compared before that point.
pub fn assert_greedy_agreement(
    reference: &[(u32, Vec<f32>)],
    theirs: &[u32],
    margin: f32,
    what: &str,
) -> usize {
    assert_eq!(
        theirs.len(),
        reference.len(),
        "{what}: llama.cpp returned {theirs:?}"
    );
    for (i, ((mine, logits), theirs)) in reference.iter().zip(theirs).enumerate() {
        if mine == theirs {
            continue;
        }
        let gap = logits[*mine as usize] - logits[*theirs as usize];
        let std = row_std(logits);
        assert!(
            gap <= margin * std,
            "{what}: step {i}: fp32 tokenmill {mine} vs llama.cpp {theirs}: gap {gap} > {margin} x row std {std}"
        );
        eprintln!("{what}: diverged at step {i} on a near tie ({gap} <= {margin} x {std})");
        return i;
    }
    reference.len()
}
