//! tokenmill-safetensors: a memory-mapped safetensors reader that validates everything.
//!
//! - [`SafetensorsFile`] (`file.rs`): one file; the header is parsed and every tensor's
//!   dtype, shape, size and offsets are checked at open (the invariants are listed there), so
//!   reading tensor data afterwards cannot fail.
//! - [`SafetensorsSet`] (`folder.rs`): a Hugging Face folder's weights, single-file or sharded
//!   with `model.safetensors.index.json`, with the index checked against the shards.
//!
//! Written by hand over `serde_json` rather than on the `safetensors` crate so that every
//! rejection is its own typed variant ([`SafetensorsError`]) that the corrupt-file tests
//! (`tests/hostile.rs`) can match exactly, and so duplicate names in the header JSON are
//! reported instead of the last one silently winning.

mod dtype;
mod error;
mod file;
mod folder;

pub use dtype::Dtype;
pub use error::SafetensorsError;
pub use file::{MAX_HEADER_LEN, MAX_RANK, SafetensorsFile, TensorInfo};
pub use folder::{INDEX_FILE, SINGLE_FILE, SafetensorsSet};

/// Serialises tensors as a safetensors file: `(name, dtype, shape, data)` in that order,
/// offsets contiguous from 0, header padded with spaces to a multiple of 8 (as the reference
/// writer does). For tests and tools; performs no validation of its own.
pub fn serialize(tensors: &[(&str, Dtype, &[u64], &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, data) in tensors {
        let end = offset + data.len() as u64;
        header.insert(
            name.to_string(),
            serde_json::json!({
                "dtype": dtype_name(*dtype),
                "shape": shape,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut text = serde_json::Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Bool => "BOOL",
        Dtype::U8 => "U8",
        Dtype::I8 => "I8",
        Dtype::F8E5M2 => "F8_E5M2",
        Dtype::F8E4M3 => "F8_E4M3",
        Dtype::I16 => "I16",
        Dtype::U16 => "U16",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        Dtype::I32 => "I32",
        Dtype::U32 => "U32",
        Dtype::F32 => "F32",
        Dtype::F64 => "F64",
        Dtype::I64 => "I64",
        Dtype::U64 => "U64",
    }
}
