//! [`GgufWriter`]: writes GGUF v3 files, streaming the tensor data.
//!
//! Format: [GGUF spec](https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), version 3,
//! little-endian — the same layout the reader in this crate accepts (see the crate doc):
//! header, metadata key/values in the order given, tensor infos in the order given (each
//! offset relative to the data section), zero padding up to `general.alignment` (default
//! 32), then each tensor's bytes followed by zero padding to the next multiple of the
//! alignment.
//!
//! # Design
//!
//! Two phases, so the data never has to be held in memory at once:
//! 1. [`GgufWriter::new`] takes the metadata and the tensor *specs* (name, dims, type),
//!    validates them all, computes every offset and writes the whole header.
//! 2. [`GgufWriter::write_tensor`] is then called once per tensor, in spec order, with exactly
//!    that tensor's bytes; [`GgufWriter::finish`] checks that every tensor was written and
//!    flushes.
//!
//! # Invariants
//!
//! A writer only produces files that [`crate::GgufFile`] accepts: keys and tensor names unique,
//! `general.alignment` (if given) a u32 power of two, 1..=[`crate::MAX_DIMS`] nonzero dims,
//! row lengths whole blocks, byte sizes free of overflow, every tensor's data exactly
//! `ty.bytes_for(n_elements)` bytes and aligned. Violations are [`WriteError`]s before a
//! single byte is written (for specs) or before the offending tensor's bytes (for data).

use std::io::{self, Write};

use tokenmill_kernels::quant::GgmlType;

use crate::file::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
use crate::tensor::MAX_DIMS;
use crate::value::{Array, Value};

/// The version this writer produces.
pub const WRITE_VERSION: u32 = 3;

/// Why a file could not be written.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum WriteError {
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("general.alignment must be a u32 power of two, got {0}")]
    BadAlignment(String),
    #[error("tensor {name:?}: bad dims {dims:?} for type {ty} ({why})")]
    BadDims {
        name: String,
        dims: Vec<u64>,
        ty: GgmlType,
        why: &'static str,
    },
    #[error("tensor {name:?}: expected {expected} bytes of data, got {got}")]
    WrongDataSize {
        name: String,
        expected: u64,
        got: u64,
    },
    #[error("all {0} tensors are written already")]
    TooManyTensors(usize),
    #[error("only {written} of {total} tensors were written")]
    MissingTensors { written: usize, total: usize },
}

/// One tensor to be written: name, ggml-order dims (`dims[0]` is the row length) and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    /// Bytes of data, or why the shape is unusable.
    pub fn byte_size(&self) -> Result<u64, &'static str> {
        if self.dims.is_empty() || self.dims.len() > MAX_DIMS as usize {
            return Err("need 1 to 4 dims");
        }
        if self.dims.contains(&0) {
            return Err("a dim is zero");
        }
        if !self.dims[0].is_multiple_of(self.ty.block_size() as u64) {
            return Err("row length is not a whole number of blocks");
        }
        let n = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or("element count overflows")?;
        self.ty.bytes_for(n).ok_or("byte size overflows")
    }
}

/// A GGUF file being written (see the module doc for the two phases).
pub struct GgufWriter<W: Write> {
    out: W,
    alignment: u64,
    /// `(name, byte size)` per tensor, in spec order.
    sizes: Vec<(String, u64)>,
    written: usize,
}

impl<W: Write> GgufWriter<W> {
    /// Validates `metadata` and `tensors` and writes the header to `out`.
    pub fn new(
        mut out: W,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> Result<GgufWriter<W>, WriteError> {
        let alignment = check_metadata(metadata)?;
        let sizes = check_tensors(tensors)?;
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        put_u32(&mut h, WRITE_VERSION);
        put_u64(&mut h, tensors.len() as u64);
        put_u64(&mut h, metadata.len() as u64);
        for (key, value) in metadata {
            put_str(&mut h, key);
            put_u32(&mut h, value_type_id(value));
            put_value(&mut h, value);
        }
        let mut offset = 0u64;
        for (t, (_, size)) in tensors.iter().zip(&sizes) {
            put_str(&mut h, &t.name);
            put_u32(&mut h, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut h, d);
            }
            put_u32(&mut h, t.ty.id());
            put_u64(&mut h, offset);
            offset = offset
                .checked_add(*size)
                .and_then(|o| o.checked_next_multiple_of(alignment))
                .ok_or_else(|| WriteError::BadDims {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                    ty: t.ty,
                    why: "file size overflows",
                })?;
        }
        pad(&mut h, alignment);
        out.write_all(&h)?;
        Ok(GgufWriter {
            out,
            alignment,
            sizes,
            written: 0,
        })
    }

    /// Writes the next tensor's data (spec order) and its alignment padding.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), WriteError> {
        let Some((name, size)) = self.sizes.get(self.written) else {
            return Err(WriteError::TooManyTensors(self.sizes.len()));
        };
        if data.len() as u64 != *size {
            return Err(WriteError::WrongDataSize {
                name: name.clone(),
                expected: *size,
                got: data.len() as u64,
            });
        }
        self.out.write_all(data)?;
        let padding = size.next_multiple_of(self.alignment) - size;
        self.out.write_all(&vec![0u8; padding as usize])?;
        self.written += 1;
        Ok(())
    }

    /// Checks that every tensor was written, flushes, and returns the output.
    pub fn finish(mut self) -> Result<W, WriteError> {
        if self.written != self.sizes.len() {
            return Err(WriteError::MissingTensors {
                written: self.written,
                total: self.sizes.len(),
            });
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Unique keys and a valid alignment; returns the alignment.
fn check_metadata(metadata: &[(String, Value)]) -> Result<u64, WriteError> {
    let mut keys: Vec<&str> = metadata.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(WriteError::DuplicateKey(w[0].to_owned()));
    }
    match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, Value::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some((_, v)) => Err(WriteError::BadAlignment(format!("{} {v}", v.type_name()))),
    }
}

/// Unique names and valid shapes; returns `(name, byte size)` per tensor.
fn check_tensors(tensors: &[TensorSpec]) -> Result<Vec<(String, u64)>, WriteError> {
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(WriteError::DuplicateTensor(w[0].to_owned()));
    }
    tensors
        .iter()
        .map(|t| match t.byte_size() {
            Ok(size) => Ok((t.name.clone(), size)),
            Err(why) => Err(WriteError::BadDims {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
                why,
            }),
        })
        .collect()
}

fn put_u32(h: &mut Vec<u8>, v: u32) {
    h.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(h: &mut Vec<u8>, v: u64) {
    h.extend_from_slice(&v.to_le_bytes());
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    put_u64(h, s.len() as u64);
    h.extend_from_slice(s.as_bytes());
}

fn pad(h: &mut Vec<u8>, alignment: u64) {
    let len = (h.len() as u64).next_multiple_of(alignment);
    h.resize(len as usize, 0);
}

/// GGUF's value type id (`enum gguf_type`).
fn value_type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn array_elem_type_id(a: &Array) -> u32 {
    match a {
        Array::U8(_) => 0,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::String(_) => 8,
        Array::Array(_) => 9,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    }
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(u8::from(*x)),
        Value::String(s) => put_str(h, s),
        Value::Array(a) => put_array(h, a),
    }
}

/// Element type, count, elements (arrays of arrays recurse).
fn put_array(h: &mut Vec<u8>, a: &Array) {
    put_u32(h, array_elem_type_id(a));
    put_u64(h, a.len() as u64);
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                h.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => h.extend_from_slice(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::F64(v) => le!(v),
        Array::Bool(v) => h.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(h, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(h, inner)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufFile;

    fn spec(name: &str, dims: &[u64], ty: GgmlType) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        }
    }

    fn write(meta: &[(String, Value)], specs: &[TensorSpec], data: &[Vec<u8>]) -> Vec<u8> {
        let mut w = GgufWriter::new(Vec::new(), meta, specs).unwrap();
        for d in data {
            w.write_tensor(d).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn every_value_type_round_trips() {
        let meta: Vec<(String, Value)> = vec![
            ("u8".into(), Value::U8(7)),
            ("i8".into(), Value::I8(-7)),
            ("u16".into(), Value::U16(700)),
            ("i16".into(), Value::I16(-700)),
            ("u32".into(), Value::U32(70_000)),
            ("i32".into(), Value::I32(-70_000)),
            ("u64".into(), Value::U64(1 << 40)),
            ("i64".into(), Value::I64(-(1 << 40))),
            ("f32".into(), Value::F32(1.5)),
            ("f64".into(), Value::F64(-2.25)),
            ("bool".into(), Value::Bool(true)),
            ("str".into(), Value::String("héllo".into())),
            (
                "a.str".into(),
                Value::Array(Array::String(vec!["a".into(), "".into()])),
            ),
            (
                "a.bool".into(),
                Value::Array(Array::Bool(vec![true, false])),
            ),
            ("a.f64".into(), Value::Array(Array::F64(vec![1.0, -0.5]))),
            (
                "a.nested".into(),
                Value::Array(Array::Array(vec![
                    Array::U8(vec![1, 2]),
                    Array::I64(vec![]),
                ])),
            ),
            (ALIGNMENT_KEY.into(), Value::U32(64)),
        ];
        let specs = [
            spec("w", &[32, 3], GgmlType::Q8_0),
            spec("b", &[5], GgmlType::F32),
        ];
        let data = [vec![9u8; 3 * 34], vec![1u8; 20]];
        let f = GgufFile::from_bytes(write(&meta, &specs, &data)).unwrap();
        assert_eq!((f.version(), f.alignment()), (3, 64));
        let got: Vec<(String, Value)> = f
            .metadata()
            .iter()
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect();
        assert_eq!(got, meta);
        for (s, d) in specs.iter().zip(&data) {
            let t = f.tensor(&s.name).unwrap();
            assert_eq!((&t.dims, t.ty, t.offset % 64), (&s.dims, s.ty, 0));
            assert_eq!(f.tensor_data(t), &d[..]);
        }
    }

    #[test]
    fn bad_specs_are_typed_errors() {
        let new = |meta: &[(String, Value)], specs: &[TensorSpec]| {
            GgufWriter::new(Vec::new(), meta, specs).err().unwrap()
        };
        let dup = [("k".into(), Value::U8(1)), ("k".into(), Value::U8(2))];
        assert!(matches!(new(&dup, &[]), WriteError::DuplicateKey(k) if k == "k"));
        let align = [(ALIGNMENT_KEY.into(), Value::U32(48))];
        assert!(matches!(new(&align, &[]), WriteError::BadAlignment(_)));
        let align64 = [(ALIGNMENT_KEY.into(), Value::U64(64))];
        assert!(matches!(new(&align64, &[]), WriteError::BadAlignment(_)));
        for dims in [&[33u64, 2][..], &[32, 0], &[], &[32, 1, 1, 1, 1]] {
            let s = [spec("w", dims, GgmlType::Q4_0)];
            assert!(
                matches!(new(&[], &s), WriteError::BadDims { .. }),
                "{dims:?}"
            );
        }
        let s = [
            spec("w", &[4], GgmlType::F32),
            spec("w", &[4], GgmlType::F32),
        ];
        assert!(matches!(new(&[], &s), WriteError::DuplicateTensor(_)));
    }

    #[test]
    fn bad_data_is_a_typed_error() {
        let s = [spec("w", &[4], GgmlType::F32)];
        let mut w = GgufWriter::new(Vec::new(), &[], &s).unwrap();
        assert!(matches!(
            w.write_tensor(&[0; 15]),
            Err(WriteError::WrongDataSize {
                expected: 16,
                got: 15,
                ..
            })
        ));
        let w = GgufWriter::new(Vec::new(), &[], &s).unwrap();
        assert!(matches!(
            w.finish(),
            Err(WriteError::MissingTensors {
                written: 0,
                total: 1
            })
        ));
        let mut w = GgufWriter::new(Vec::new(), &[], &s).unwrap();
        w.write_tensor(&[0; 16]).unwrap();
        assert!(matches!(
            w.write_tensor(&[0; 16]),
            Err(WriteError::TooManyTensors(1))
        ));
    }
}
