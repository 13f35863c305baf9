//! [`SafetensorsError`]: every way a safetensors file or folder is rejected, one variant per
//! problem, naming the tensor and the numbers involved.

use std::path::PathBuf;

/// Why a safetensors file (or a sharded folder) was rejected.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum SafetensorsError {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Fewer than the 8 bytes of the header length.
    #[error("file of {len} bytes is too short for the 8-byte header length")]
    TooShort { len: u64 },
    /// The header length exceeds [`MAX_HEADER_LEN`](crate::MAX_HEADER_LEN).
    #[error("header length {len} exceeds the cap of {max} bytes")]
    HeaderTooLarge { len: u64, max: u64 },
    /// The header length runs past the end of the file.
    #[error("header length {len} runs past the end of the {file_len}-byte file")]
    HeaderOutOfBounds { len: u64, file_len: u64 },
    #[error("header is not UTF-8 (at byte {valid_up_to})")]
    HeaderNotUtf8 { valid_up_to: usize },
    /// Not a JSON object of the expected shape (syntax, a missing field, a wrong type).
    #[error("header JSON is invalid: {0}")]
    HeaderJson(String),
    #[error("tensor '{0}' appears twice")]
    DuplicateTensor(String),
    #[error("tensor '{name}' has unknown dtype '{dtype}'")]
    UnknownDtype { name: String, dtype: String },
    #[error("tensor '{name}' has {rank} dimensions (at most {max})")]
    TooManyDims {
        name: String,
        rank: usize,
        max: usize,
    },
    /// shape × dtype size does not fit in 64 bits.
    #[error("tensor '{name}': shape × dtype size overflows")]
    SizeOverflow { name: String },
    /// `data_offsets` with begin > end.
    #[error("tensor '{name}' has data_offsets [{begin}, {end}] with begin > end")]
    BadOffsets { name: String, begin: u64, end: u64 },
    /// `end - begin` differs from shape × dtype size.
    #[error("tensor '{name}' holds {found} bytes, its shape and dtype need {expected}")]
    SizeMismatch {
        name: String,
        expected: u64,
        found: u64,
    },
    /// Tensors (sorted by offset) do not start at 0 or do not follow each other exactly.
    #[error("tensor '{name}' starts at {found}, expected {expected} (a gap or an overlap)")]
    NotContiguous {
        name: String,
        expected: u64,
        found: u64,
    },
    /// Bytes after the last tensor (or tensors running past the end of the file).
    #[error("data section is {data_len} bytes but the tensors cover {covered}")]
    DataLenMismatch { data_len: u64, covered: u64 },
    // ---- sharded folders ----
    #[error("no model.safetensors or model.safetensors.index.json in {0}")]
    NoWeights(PathBuf),
    #[error("index: {0}")]
    BadIndex(String),
    #[error("index names shard '{0}', which is not a plain file name in the folder")]
    BadShardName(String),
    #[error("index maps '{name}' to {shard}, which does not hold it")]
    MissingTensor { name: String, shard: String },
    #[error("shard {shard} holds '{name}', which the index does not map to it")]
    UnlistedTensor { name: String, shard: String },
    #[error("{file}: {source}")]
    InShard {
        file: String,
        source: Box<SafetensorsError>,
    },
}
