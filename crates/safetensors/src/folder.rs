//! [`SafetensorsSet`]: the weights of a Hugging Face folder, one `model.safetensors` or the
//! shards a `model.safetensors.index.json` lists, each validated as a [`SafetensorsFile`].
//!
//! The index (`{"metadata": {...}, "weight_map": {tensor: shard file}}`) is checked against
//! the shards: shard names must be plain file names in the folder (no separators, no `..`),
//! every mapped tensor must be in its shard, every tensor of a shard must be mapped to that
//! shard (so no name is ever served by two files), and each shard is opened once.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{SafetensorsError, SafetensorsFile, TensorInfo};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

/// Every tensor of a folder, by name, across its shards.
#[derive(Debug)]
pub struct SafetensorsSet {
    shards: Vec<SafetensorsFile>,
    shard_names: Vec<String>,
    /// name → (shard, index in that shard's `tensors()`).
    by_name: HashMap<String, (usize, usize)>,
}

impl SafetensorsSet {
    /// Opens `dir/model.safetensors.index.json` and its shards, else `dir/model.safetensors`.
    pub fn open_dir(dir: &Path) -> Result<SafetensorsSet, SafetensorsError> {
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|source| SafetensorsError::Io {
                path: index.clone(),
                source,
            })?;
            return Self::from_index(dir, &text);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            let file = SafetensorsFile::open(&single)?;
            return Ok(Self::from_files(vec![(SINGLE_FILE.to_string(), file)]));
        }
        Err(SafetensorsError::NoWeights(dir.to_path_buf()))
    }

    /// The shards named by an index's text, opened from `dir` and checked against it.
    pub fn from_index(dir: &Path, index_json: &str) -> Result<SafetensorsSet, SafetensorsError> {
        let index: Index = serde_json::from_str(index_json)
            .map_err(|e| SafetensorsError::BadIndex(e.to_string()))?;
        let mut files: Vec<(String, SafetensorsFile)> = Vec::new();
        let mut shard_of: HashMap<&str, usize> = HashMap::new();
        for shard in index.weight_map.values() {
            if shard_of.contains_key(shard.as_str()) {
                continue;
            }
            if !is_plain_file_name(shard) {
                return Err(SafetensorsError::BadShardName(shard.clone()));
            }
            let path: PathBuf = dir.join(shard);
            let file = SafetensorsFile::open(&path).map_err(|e| SafetensorsError::InShard {
                file: shard.clone(),
                source: Box::new(e),
            })?;
            shard_of.insert(shard, files.len());
            files.push((shard.clone(), file));
        }
        for (name, shard) in &index.weight_map {
            if files[shard_of[shard.as_str()]].1.tensor(name).is_none() {
                return Err(SafetensorsError::MissingTensor {
                    name: name.clone(),
                    shard: shard.clone(),
                });
            }
        }
        for (shard, file) in &files {
            if let Some(t) = file
                .tensors()
                .iter()
                .find(|t| index.weight_map.get(&t.name) != Some(shard))
            {
                return Err(SafetensorsError::UnlistedTensor {
                    name: t.name.clone(),
                    shard: shard.clone(),
                });
            }
        }
        Ok(Self::from_files(files))
    }

    /// A set over already-validated files whose tensor names are disjoint.
    fn from_files(files: Vec<(String, SafetensorsFile)>) -> SafetensorsSet {
        let mut by_name = HashMap::new();
        for (s, (_, f)) in files.iter().enumerate() {
            for (i, t) in f.tensors().iter().enumerate() {
                by_name.insert(t.name.clone(), (s, i));
            }
        }
        let (shard_names, shards) = files.into_iter().unzip();
        SafetensorsSet {
            shards,
            shard_names,
            by_name,
        }
    }

    /// The tensor `name` and the index of the shard that holds it.
    pub fn tensor(&self, name: &str) -> Option<(usize, &TensorInfo)> {
        let &(s, i) = self.by_name.get(name)?;
        Some((s, &self.shards[s].tensors()[i]))
    }

    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }

    /// The shard files' names, in `shards()` order.
    pub fn shard_names(&self) -> &[String] {
        &self.shard_names
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute()
}
