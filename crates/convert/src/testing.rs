//! Test helpers: the HF fixture folders, and edited copies of them.

use std::path::{Path, PathBuf};

/// The committed fixture folder `tests/fixtures/hf/<name>`.
pub fn hf_fixture(name: &str) -> PathBuf {
    tokenmill_testutil::fixtures_dir("hf").join(name)
}

/// A temporary copy of the fixture folder `name`, changed by `edit` (given the copy's path).
pub fn edited_copy(name: &str, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(hf_fixture(name)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    dir
}

/// Rewrites the JSON file `path` through `f`.
pub fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}
