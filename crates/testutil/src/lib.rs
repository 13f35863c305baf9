//! Test helpers shared by the workspace's test suites (a dev-dependency only).
//!
//! - [`model_path`]: the default model, fetched by `scripts/fetch-model.sh` on first use, since
//!   CI starts from a clean clone;
//! - [`fixtures_dir`]: the committed reference fixtures under `tests/fixtures/`;
//! - [`metric`]: one sample of a Prometheus `/metrics` text;
//! - `server` (feature `server`): the in-process test server over the real engine.

#[cfg(feature = "server")]
pub mod server;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `tests/fixtures/<sub>` of the workspace.
pub fn fixtures_dir(sub: &str) -> PathBuf {
    workspace_root().join("tests/fixtures").join(sub)
}

/// Path of the default model (SmolLM2-135M-Instruct Q4_1), fetching it once if missing.
pub fn model_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let root = workspace_root();
        let path = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        if path.is_file() {
            return path;
        }
        let out = Command::new("bash")
            .arg(root.join("scripts/fetch-model.sh"))
            .output()
            .expect("running scripts/fetch-model.sh");
        assert!(
            out.status.success(),
            "scripts/fetch-model.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// A JSON array of token ids (as the golden fixtures store them).
///
/// Panics if `v` is not an array of non-negative integers.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id") as u32)
        .collect()
}

/// The index of the largest logit (the last of equal ones).
pub fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .expect("a non-empty row") as u32
}

/// Lays out a Hugging Face hub cache under `cache` (as `huggingface_hub` writes one: a blob,
/// a snapshot entry linking to it, `refs/main`) holding the default model as
/// `HuggingFaceTB/SmolLM2-135M-Instruct`'s `SmolLM2-135M-Instruct.Q4_1.gguf`. The blob is a
/// symlink to the fetched model, so nothing is copied.
pub fn hf_cache_with_default_model(cache: &std::path::Path) {
    let repo = cache.join("models--HuggingFaceTB--SmolLM2-135M-Instruct");
    let commit = "5a4f5e2d0b7c1a9e8f3d6b4c2a1e0f9d8c7b6a50";
    let snapshot = repo.join("snapshots").join(commit);
    for dir in [repo.join("blobs"), repo.join("refs"), snapshot.clone()] {
        std::fs::create_dir_all(&dir).unwrap();
    }
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let blob = repo.join("blobs/2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f10");
    std::os::unix::fs::symlink(model_path(), &blob).unwrap();
    std::os::unix::fs::symlink(
        format!(
            "../../blobs/{}",
            blob.file_name().unwrap().to_string_lossy()
        ),
        snapshot.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    .unwrap();
}

/// One sample of a Prometheus text exposition (`/metrics`): the value of the first series
/// named `name` (with or without labels), or `None` when there is none.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn metric_reads_the_first_series_of_exactly_that_name() {
        let text =
            "# HELP a_total x\na_total_more 7\na_total{model_name=\"m\"} 3\na_total 4\nb 0.5\n";
        assert_eq!(metric(text, "a_total"), Some(3.0));
        assert_eq!(metric(text, "b"), Some(0.5));
        assert_eq!(metric(text, "a"), None);
        assert_eq!(metric(text, "c"), None);
    }
}
