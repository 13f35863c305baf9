//! tokenmill-gguf: a memory-mapped GGUF reader that is safe on hostile input.
//!
//! [`GgufFile::open`] maps the file and parses its header once: metadata key/values into
//! [`Metadata`] (decoded into owned [`Value`]s), tensor infos into [`TensorInfo`]s. Tensor data
//! is never copied: [`GgufFile::tensor_data`] hands out slices of the map. [`GgufWriter`]
//! writes v3 files this reader accepts (`writer.rs`).
//!
//! Format: [GGUF spec](https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), versions 2
//! and 3, little-endian. Layout: `"GGUF"`, u32 version, u64 tensor count, u64 kv count; the
//! kvs (string key, u32 type, value); the tensor infos (string name, u32 n_dims, u64 dims, u32
//! ggml type, u64 offset relative to the data section); padding up to `general.alignment`
//! (default 32); the data section.
//!
//! # Design
//!
//! - One pass over a bounds-checked cursor (`reader.rs`), no seeking back. Files are
//!   rejected whole: a `GgufFile` exists only if every check below passed, which is why its
//!   accessors are infallible.
//! - Lookups by key or tensor name are binary searches over an index sorted at parse time;
//!   duplicates are neighbours in that index, so they are found for free.
//! - Errors are one [`GgufError`] enum whose variants name the problem, the field and the offset.
//!
//! # Invariants on hostile input
//!
//! Parsing never panics, never reads out of bounds, never overflows, and its memory use is
//! linear in the file size:
//!
//! - Every length and count is compared with the bytes left *before* use: a string's length
//!   must be `<= remaining` ([`GgufError::StringTooLong`]); a count of items must satisfy
//!   `count * smallest_encoding_of_one_item <= remaining` ([`GgufError::CountTooLarge`]).
//! - No single reservation exceeds the bytes left in the file: vectors are pre-sized to
//!   `min(count, remaining / size_of::<T>())`, and fixed-size arrays are decoded from one
//!   already-bounds-checked slice. A file claiming 2^60 entries costs nothing.
//! - All offset/size arithmetic is `checked_*`; an overflow is an error, never a wrap.
//! - Arrays nest at most [`MAX_ARRAY_DEPTH`] levels ([`GgufError::NestingTooDeep`]), so
//!   recursion is bounded.
//! - Keys, string values and tensor names must be UTF-8; keys and tensor names must be unique;
//!   booleans must be 0 or 1; value type ids must be 0..=12; tensor types must be ones
//!   [`GgmlType`] knows.
//! - `general.alignment`, when present, must be a u32 holding a nonzero power of two.
//! - Tensors: `1 <= n_dims <= MAX_DIMS`, every dim nonzero, element count and byte size free of
//!   overflow, row length (`dims[0]`) a multiple of the type's block size, relative offset a
//!   multiple of the alignment, data inside the file, and no two tensors' data overlapping.
//! - Big-endian files are recognised (their version reads byte-swapped) and rejected with
//!   [`GgufError::BigEndian`]; version 1 (32-bit counts) is rejected.
//!
//! The tests exercise each rule with a hand-built corrupt file (`tests/hostile.rs`), run a
//! fixed-seed mutation loop under `catch_unwind` (`tests/mutation.rs`), and check with a counting
//! allocator that hostile counts never cause an allocation larger than the file
//! (`tests/alloc_bound.rs`). A cargo-fuzz target lives in the repository's `fuzz/` folder:
//! `cargo +nightly fuzz run gguf_parse` (see `fuzz/README.md`).

mod error;
mod file;
mod metadata;
mod reader;
mod tensor;
mod value;
mod writer;

pub use error::{DimsProblem, GgufError};
pub use file::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GgufFile, MAGIC, SUPPORTED_VERSIONS};
pub use metadata::Metadata;
pub use tensor::{MAX_DIMS, TensorInfo};
pub use value::{Array, MAX_ARRAY_DEPTH, Value};
pub use writer::{GgufWriter, TensorSpec, WRITE_VERSION, WriteError};

/// Re-exported so users can name tensor types without depending on the kernels crate.
pub use tokenmill_kernels::quant::GgmlType;
