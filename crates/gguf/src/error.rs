//! [`GgufError`]: every way a GGUF file can be rejected, each variant naming the problem.
//!
//! Offsets are absolute byte offsets into the file, so a message can be checked against a hex
//! dump. `what` strings name the field being read (`"tensor count"`, `"metadata key"`, ...).

use std::fmt;

/// Why a file was rejected.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum GgufError {
    /// Opening, stat-ing or mapping the file failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),

    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: magic is {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),

    /// The version field reads as a supported version only when byte-swapped: a big-endian file.
    #[error("big-endian GGUF (version {0} byte-swapped) is not supported")]
    BigEndian(u32),

    /// A version other than 2 or 3 (version 1 used 32-bit counts and is long obsolete).
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),

    /// The file ends inside a fixed-size field.
    #[error("file truncated reading {what} at offset {offset}")]
    Truncated { what: &'static str, offset: u64 },

    /// A string's declared length is more than the bytes left in the file.
    #[error("{what} at offset {offset}: length {len} exceeds the {remaining} bytes left")]
    StringTooLong {
        what: &'static str,
        offset: u64,
        len: u64,
        remaining: u64,
    },

    /// A count (of metadata entries, tensors or array elements) that the bytes left in the file
    /// cannot hold, even at the smallest possible encoding of each item.
    #[error(
        "{what} at offset {offset}: count {count} needs at least {min_bytes_each} bytes each, \
         only {remaining} bytes left"
    )]
    CountTooLarge {
        what: &'static str,
        offset: u64,
        count: u64,
        min_bytes_each: u64,
        remaining: u64,
    },

    /// A key, string value or tensor name that is not UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: u64 },

    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),

    /// A boolean stored as a byte other than 0 or 1.
    #[error("boolean at offset {offset} has byte value {value} (must be 0 or 1)")]
    BadBool { offset: u64, value: u8 },

    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error("arrays nested deeper than {} levels", crate::MAX_ARRAY_DEPTH)]
    NestingTooDeep,

    /// The same metadata key appears twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),

    /// A well-known key holds a value of the wrong type (e.g. `general.alignment` not a u32).
    #[error("metadata key {key:?} has type {found}, expected {expected}")]
    WrongValueType {
        key: &'static str,
        expected: &'static str,
        found: &'static str,
    },

    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment {0} is not a nonzero power of two")]
    BadAlignment(u64),

    /// A ggml tensor type id tokenmill does not know.
    #[error("tensor {name:?} has unknown ggml type id {id}")]
    UnknownTensorType { name: String, id: u32 },

    /// A tensor with 0 or more than [`crate::MAX_DIMS`] dimensions.
    #[error(
        "tensor {name:?} has {n_dims} dimensions (must be 1..={})",
        crate::MAX_DIMS
    )]
    BadDimCount { name: String, n_dims: u32 },

    /// A tensor's shape is unusable; `problem` says why.
    #[error("tensor {name:?} with dims {dims:?}: {problem}")]
    BadDims {
        name: String,
        dims: Vec<u64>,
        problem: DimsProblem,
    },

    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error("tensor {name:?}: data offset {offset} is not a multiple of alignment {alignment}")]
    TensorMisaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },

    /// A tensor's data does not lie inside the file (or its end overflows u64).
    #[error(
        "tensor {name:?}: {size} bytes at relative offset {offset} (data section at \
         {data_offset}) do not fit in the {file_len}-byte file"
    )]
    TensorOutOfBounds {
        name: String,
        offset: u64,
        size: u64,
        data_offset: u64,
        file_len: u64,
    },

    /// Two tensors' data ranges overlap (`a` starts first).
    #[error("tensors {a:?} and {b:?} overlap")]
    TensorsOverlap { a: String, b: String },

    /// The same tensor name appears twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
}

/// Why a tensor's dims were rejected (see [`GgufError::BadDims`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimsProblem {
    /// A dimension is zero.
    ZeroDim,
    /// The element count or byte size overflows u64.
    Overflow,
    /// The row length (`dims[0]`) is not a multiple of the type's block size.
    RowNotBlockMultiple { block_size: u64 },
}

impl fmt::Display for DimsProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DimsProblem::ZeroDim => f.write_str("a dimension is zero"),
            DimsProblem::Overflow => f.write_str("element count or byte size overflows"),
            DimsProblem::RowNotBlockMultiple { block_size } => {
                write!(
                    f,
                    "row length is not a multiple of the block size {block_size}"
                )
            }
        }
    }
}
