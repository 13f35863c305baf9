//! `--model ORG/NAME[:QUANT]`: a model from the local Hugging Face hub cache, offline.
//!
//! The cache is the one `huggingface_hub` writes (`huggingface-cli download`, transformers,
//! vLLM): `$HF_HUB_CACHE`, else `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. A repository lives in
//! `models--ORG--NAME/`, its files in `snapshots/<commit>/` (symlinks into `blobs/`), and
//! `refs/main` names the commit to use (`refs/<REV>` with `ORG/NAME@REV`).
//!
//! In the snapshot: `:QUANT` picks the GGUF file whose name carries that tag (`:Q4_1` →
//! `*.Q4_1.gguf`, any case, as llama.cpp's `-hf` does); without it, a folder with
//! `config.json` is served as a Hugging Face model, else its one GGUF file (or the `Q4_K_M` one
//! among several, llama.cpp's default). Nothing is ever downloaded: a model that is not there
//! is an error that says where it looked.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// A parsed `ORG/NAME[@REV][:QUANT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelId {
    /// `ORG/NAME`.
    pub repo: String,
    /// The ref or commit (`main` when not given).
    pub revision: Option<String>,
    /// The GGUF quantization tag (`Q4_1`, `q4_k_m`).
    pub quant: Option<String>,
}

impl ModelId {
    /// Parses a Hugging Face model id; `None` for anything else (a path such as `./m.gguf` or
    /// `/models/x`, more than one `/`, characters a repository name cannot have).
    pub fn parse(arg: &str) -> Option<ModelId> {
        let (rest, quant) = match arg.rsplit_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (arg, None),
        };
        let (repo, revision) = match rest.split_once('@') {
            Some((r, v)) => (r, Some(v)),
            None => (rest, None),
        };
        let (org, name) = repo.split_once('/')?;
        let is_name = |s: &str| {
            !s.is_empty()
                && !s.starts_with(['.', '-'])
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        };
        let is_tag = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        };
        let valid = is_name(org)
            && is_name(name)
            && revision.is_none_or(is_tag)
            && quant.is_none_or(is_tag);
        if !valid {
            return None;
        }
        Some(ModelId {
            repo: repo.to_owned(),
            revision: revision.map(str::to_owned),
            quant: quant.map(str::to_owned),
        })
    }
}

/// The hub cache directory the environment names (see the module docs).
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
        .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"))
}

/// The file or folder `id` names in the hub cache at `cache`.
pub fn resolve_in(cache: &Path, id: &ModelId) -> anyhow::Result<PathBuf> {
    let repo_dir = cache.join(format!("models--{}", id.repo.replace('/', "--")));
    if !repo_dir.is_dir() {
        bail!(
            "{} is not in the Hugging Face cache (no {}); tokenmill never downloads: fetch it \
             with `huggingface-cli download {}`, set HF_HUB_CACHE or HF_HOME, or pass a path",
            id.repo,
            repo_dir.display(),
            id.repo
        );
    }
    let snapshot = snapshot(&repo_dir, id)?;
    match &id.quant {
        Some(tag) => {
            let ggufs = gguf_files(&snapshot)?;
            let hits: Vec<&PathBuf> = ggufs.iter().filter(|p| has_tag(p, tag)).collect();
            match hits.as_slice() {
                [one] => Ok((*one).clone()),
                [] => bail!(
                    "{} has no GGUF file tagged {tag} in {}; it has: {}",
                    id.repo,
                    snapshot.display(),
                    names(&ggufs)
                ),
                many => bail!(
                    "{}:{tag} matches several GGUF files ({}); pass the file's path",
                    id.repo,
                    names(&many.iter().map(|p| (*p).clone()).collect::<Vec<_>>())
                ),
            }
        }
        None if snapshot.join("config.json").is_file() => Ok(snapshot),
        None => {
            let ggufs = gguf_files(&snapshot)?;
            match ggufs.as_slice() {
                [one] => Ok(one.clone()),
                [] => bail!(
                    "{} in {} has neither config.json nor a GGUF file",
                    id.repo,
                    snapshot.display()
                ),
                many => match many.iter().find(|p| has_tag(p, "Q4_K_M")) {
                    Some(p) => Ok(p.clone()),
                    None => bail!(
                        "{} has several GGUF files; name one with {}:QUANT ({})",
                        id.repo,
                        id.repo,
                        names(many)
                    ),
                },
            }
        }
    }
}

/// The snapshot folder of the revision asked for: `refs/<rev>` names a commit, or the
/// revision is a commit itself; with no revision and no `refs/main`, the only snapshot.
fn snapshot(repo_dir: &Path, id: &ModelId) -> anyhow::Result<PathBuf> {
    let snapshots = repo_dir.join("snapshots");
    let rev = id.revision.as_deref().unwrap_or("main");
    let commit = match std::fs::read_to_string(repo_dir.join("refs").join(rev)) {
        Ok(c) => c.trim().to_owned(),
        Err(_) if snapshots.join(rev).is_dir() => rev.to_owned(),
        Err(_) if id.revision.is_none() => {
            let all = list_dirs(&snapshots)?;
            match all.as_slice() {
                [one] => return Ok(one.clone()),
                _ => bail!(
                    "{} has no refs/main and {} snapshots in {}; name one with {}@COMMIT",
                    id.repo,
                    all.len(),
                    snapshots.display(),
                    id.repo
                ),
            }
        }
        Err(_) => bail!(
            "{} has no revision {rev} in the cache (no {} and no snapshot of that name)",
            id.repo,
            repo_dir.join("refs").join(rev).display()
        ),
    };
    let dir = snapshots.join(&commit);
    if !dir.is_dir() {
        bail!(
            "{}: refs/{rev} names commit {commit}, but {} is missing (an interrupted download?)",
            id.repo,
            dir.display()
        );
    }
    Ok(dir)
}

fn list_dirs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// GGUF files in the snapshot and its subfolders (repositories put quantizations in folders).
fn gguf_files(snapshot: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![(snapshot.to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() && depth < 3 {
                stack.push((p, depth + 1));
            } else if p
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                && p.is_file()
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether the file name carries `tag` as a whole word: `x.Q4_1.gguf` has `q4_1`, not `q4`.
fn has_tag(path: &Path, tag: &str) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let tag = tag.to_ascii_lowercase();
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    name.match_indices(&tag).any(|(i, _)| {
        !word(name[..i].chars().next_back()) && !word(name[i + tag.len()..].chars().next())
    })
}

fn names(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "no GGUF files".into();
    }
    paths
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ids_and_leaves_paths_alone() {
        let id = ModelId::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
        assert_eq!(id.repo, "HuggingFaceTB/SmolLM2-135M-Instruct");
        assert_eq!((id.revision, id.quant), (None, None));
        let id = ModelId::parse("bartowski/Qwen2.5-0.5B-GGUF@v1.0:Q4_K_M").unwrap();
        assert_eq!(id.repo, "bartowski/Qwen2.5-0.5B-GGUF");
        assert_eq!(id.revision.as_deref(), Some("v1.0"));
        assert_eq!(id.quant.as_deref(), Some("Q4_K_M"));
        for path in [
            "model.gguf",
            "./a/b",
            "../a/b",
            "/models/a",
            "a/b/c",
            "~/m",
            "a/",
            "/b",
            "a/b:",
            "a/b@",
            "a b/c",
            ".a/b",
        ] {
            assert_eq!(ModelId::parse(path), None, "{path}");
        }
    }

    #[test]
    fn tags_match_whole_words_in_any_case() {
        let p = Path::new("SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(has_tag(p, "Q4_1") && has_tag(p, "q4_1"));
        assert!(!has_tag(p, "Q4") && !has_tag(p, "4_1") && !has_tag(p, "Q4_1_L"));
        assert!(has_tag(Path::new("m-q4_k_m.gguf"), "Q4_K_M"));
    }

    /// A cache laid out as `huggingface_hub` writes it: blobs, a snapshot of symlinks, refs.
    fn cache_with(files: &[&str], config: bool) -> (tempfile::TempDir, PathBuf) {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--model");
        let snap = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        let mut all: Vec<&str> = files.to_vec();
        if config {
            all.push("config.json");
        }
        for (i, f) in all.iter().enumerate() {
            let blob = repo.join(format!("blobs/{i:040}"));
            std::fs::write(&blob, f.as_bytes()).unwrap();
            let link = snap.join(f);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(&blob, &link).unwrap();
        }
        (cache, snap)
    }

    fn id(s: &str) -> ModelId {
        ModelId::parse(s).unwrap()
    }

    #[test]
    fn resolves_the_snapshot_refs_main_names() {
        let (cache, snap) = cache_with(&["m.Q4_1.gguf", "sub/m.Q8_0.gguf"], false);
        let c = cache.path();
        assert_eq!(
            resolve_in(c, &id("org/model:q4_1")).unwrap(),
            snap.join("m.Q4_1.gguf")
        );
        assert_eq!(
            resolve_in(c, &id("org/model:Q8_0")).unwrap(),
            snap.join("sub/m.Q8_0.gguf")
        );
        let err = resolve_in(c, &id("org/model")).unwrap_err().to_string();
        assert!(
            err.contains("several GGUF files") && err.contains("m.Q8_0.gguf"),
            "{err}"
        );
        let err = resolve_in(c, &id("org/model:Q2_K"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no GGUF file tagged Q2_K") && err.contains("m.Q4_1.gguf"),
            "{err}"
        );
        let err = resolve_in(c, &id("org/other")).unwrap_err().to_string();
        assert!(
            err.contains("not in the Hugging Face cache") && err.contains("models--org--other")
        );
        let err = resolve_in(c, &id("org/model@v2")).unwrap_err().to_string();
        assert!(err.contains("no revision v2"), "{err}");
        assert_eq!(
            resolve_in(c, &id("org/model@abc123:Q4_1")).unwrap(),
            snap.join("m.Q4_1.gguf")
        );
    }

    #[test]
    fn a_folder_with_config_json_is_a_hf_model_and_one_gguf_needs_no_tag() {
        let (cache, snap) = cache_with(&["model.safetensors"], true);
        assert_eq!(resolve_in(cache.path(), &id("org/model")).unwrap(), snap);
        let (cache, snap) = cache_with(&["only.gguf"], false);
        assert_eq!(
            resolve_in(cache.path(), &id("org/model")).unwrap(),
            snap.join("only.gguf")
        );
        let (cache, snap) = cache_with(&["m-Q2_K.gguf", "m-Q4_K_M.gguf"], false);
        assert_eq!(
            resolve_in(cache.path(), &id("org/model")).unwrap(),
            snap.join("m-Q4_K_M.gguf")
        );
    }

    #[test]
    fn a_ref_to_a_missing_snapshot_is_a_clear_error() {
        let (cache, _) = cache_with(&["m.gguf"], false);
        let repo = cache.path().join("models--org--model");
        std::fs::write(repo.join("refs/main"), "fff").unwrap();
        let err = resolve_in(cache.path(), &id("org/model"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("interrupted download"), "{err}");
        // No refs at all: the one snapshot there is.
        std::fs::remove_file(repo.join("refs/main")).unwrap();
        assert!(resolve_in(cache.path(), &id("org/model")).is_ok());
    }
}
