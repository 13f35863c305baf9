//! Quantized tensor formats as stored in GGUF files (ggml's block formats).
//!
//! A tensor row of `n` elements of type `t` is `n / t.block_size()` blocks of
//! `t.type_size()` bytes. Type ids follow ggml's `enum ggml_type` so they can be read
//! straight from a GGUF tensor info.

mod types;

pub use types::GgmlType;
