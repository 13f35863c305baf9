//! Shared test helpers: locating the default model, and a tiny GGUF writer for building exact
//! (valid or corrupt) files.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use tokenmill_gguf::{Array, GgmlType, Value};

/// Path of the default model, fetched on first use.
pub fn model_path() -> PathBuf {
    tokenmill_testutil::model_path()
}

/// The default model's bytes (read once per test binary).
pub fn model_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| std::fs::read(model_path()).expect("reading the default model"))
}

// ---- Writer ----

/// Little-endian byte writer.
#[derive(Default)]
pub struct W(pub Vec<u8>);

impl W {
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// A GGUF string: u64 length, bytes.
    pub fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).raw(s)
    }
    pub fn pos(&self) -> usize {
        self.0.len()
    }
}

/// GGUF's type id of a value.
pub fn value_type_id(v: &Value) -> u32 {
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

fn array_type_id(a: &Array) -> u32 {
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

/// A value's payload (without its type id).
pub fn put_payload(w: &mut W, v: &Value) {
    match v {
        Value::U8(x) => w.raw(&x.to_le_bytes()),
        Value::I8(x) => w.raw(&x.to_le_bytes()),
        Value::U16(x) => w.raw(&x.to_le_bytes()),
        Value::I16(x) => w.raw(&x.to_le_bytes()),
        Value::U32(x) => w.raw(&x.to_le_bytes()),
        Value::I32(x) => w.raw(&x.to_le_bytes()),
        Value::U64(x) => w.raw(&x.to_le_bytes()),
        Value::I64(x) => w.raw(&x.to_le_bytes()),
        Value::F32(x) => w.raw(&x.to_le_bytes()),
        Value::F64(x) => w.raw(&x.to_le_bytes()),
        Value::Bool(x) => w.raw(&[u8::from(*x)]),
        Value::String(s) => w.str(s.as_bytes()),
        Value::Array(a) => {
            put_array(w, a);
            w
        }
    };
}

/// An array: element type, count, elements.
pub fn put_array(w: &mut W, a: &Array) {
    w.u32(array_type_id(a)).u64(a.len() as u64);
    fn each<T: Clone>(w: &mut W, v: &[T], f: fn(T) -> Value) {
        for x in v {
            put_payload(w, &f(x.clone()));
        }
    }
    match a {
        Array::U8(v) => each(w, v, Value::U8),
        Array::I8(v) => each(w, v, Value::I8),
        Array::U16(v) => each(w, v, Value::U16),
        Array::I16(v) => each(w, v, Value::I16),
        Array::U32(v) => each(w, v, Value::U32),
        Array::I32(v) => each(w, v, Value::I32),
        Array::U64(v) => each(w, v, Value::U64),
        Array::I64(v) => each(w, v, Value::I64),
        Array::F32(v) => each(w, v, Value::F32),
        Array::F64(v) => each(w, v, Value::F64),
        Array::Bool(v) => each(w, v, Value::Bool),
        Array::String(v) => each(w, v, Value::String),
        Array::Array(v) => {
            for inner in v {
                put_array(w, inner);
            }
        }
    }
}

/// A metadata value: a real one, or a raw type id + payload for corrupt files.
#[derive(Clone)]
pub enum Kv {
    Value(Value),
    Raw { type_id: u32, payload: Vec<u8> },
}

/// One tensor info as it will be written.
#[derive(Clone)]
pub struct TensorSpec {
    pub name: Vec<u8>,
    /// Written instead of `dims.len()` when set.
    pub n_dims: Option<u32>,
    pub dims: Vec<u64>,
    pub ty: u32,
    /// Relative offset; laid out after the previous tensor (aligned) when `None`.
    pub offset: Option<u64>,
}

impl TensorSpec {
    pub fn new(name: &str, dims: &[u64], ty: GgmlType) -> TensorSpec {
        TensorSpec {
            name: name.as_bytes().to_vec(),
            n_dims: None,
            dims: dims.to_vec(),
            ty: ty.id(),
            offset: None,
        }
    }

    /// Byte size if the type and dims are valid.
    fn size(&self) -> Option<u64> {
        let n = self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        GgmlType::from_id(self.ty)?.bytes_for(n)
    }

    /// End of the data at relative `offset`, if the size is valid and the end small enough
    /// to actually write.
    fn end(&self, offset: u64) -> Option<u64> {
        self.size()
            .and_then(|s| s.checked_add(offset))
            .filter(|&e| e < 1 << 24)
    }
}

/// A whole file, with every header field overridable.
#[derive(Clone)]
pub struct Spec {
    pub magic: [u8; 4],
    pub version: u32,
    /// Written instead of `tensors.len()` when set.
    pub tensor_count: Option<u64>,
    /// Written instead of `kvs.len()` when set.
    pub kv_count: Option<u64>,
    pub kvs: Vec<(Vec<u8>, Kv)>,
    pub tensors: Vec<TensorSpec>,
    /// Alignment used to lay out the file (independent of any `general.alignment` kv).
    pub alignment: u64,
}

/// One fixed-width header field of a built file (for targeted mutations).
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub offset: usize,
    pub width: usize,
    pub what: &'static str,
}

pub struct Built {
    pub bytes: Vec<u8>,
    pub fields: Vec<Field>,
    /// Absolute start of the data section.
    pub data_offset: usize,
}

impl Spec {
    /// An empty valid v3 file.
    pub fn empty() -> Spec {
        Spec {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    /// One string kv and one 8-element f32 tensor.
    pub fn tiny() -> Spec {
        Spec::empty()
            .kv("general.architecture", Value::String("llama".into()))
            .tensor(TensorSpec::new("w", &[8], GgmlType::F32))
    }

    /// Every value type, nested arrays, and tensors of several types.
    pub fn small() -> Spec {
        let strings = |v: &[&str]| Array::String(v.iter().map(|s| s.to_string()).collect());
        Spec::empty()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("general.alignment", Value::U32(64))
            .kv("llama.block_count", Value::U32(2))
            .kv("llama.embedding_length", Value::U64(64))
            .kv("t.u8", Value::U8(200))
            .kv("t.i8", Value::I8(-5))
            .kv("t.u16", Value::U16(60000))
            .kv("t.i16", Value::I16(-30000))
            .kv("t.i32", Value::I32(-7))
            .kv("t.i64", Value::I64(-1 << 40))
            .kv("t.f32", Value::F32(1e-5))
            .kv("t.f64", Value::F64(0.125))
            .kv("t.bool", Value::Bool(true))
            .kv(
                "t.tokens",
                Value::Array(strings(&["<s>", "</s>", "a", "é"])),
            )
            .kv("t.scores", Value::Array(Array::F32(vec![0.0, -1.5, 2.0])))
            .kv("t.types", Value::Array(Array::I32(vec![1, 3, 1, 1])))
            .kv("t.bools", Value::Array(Array::Bool(vec![true, false])))
            .kv(
                "t.nested",
                Value::Array(Array::Array(vec![
                    Array::U16(vec![1, 2]),
                    strings(&["x"]),
                    Array::Array(vec![Array::I64(vec![-1])]),
                ])),
            )
            .with_alignment(64)
            .tensor(TensorSpec::new(
                "token_embd.weight",
                &[64, 4],
                GgmlType::Q8_0,
            ))
            .tensor(TensorSpec::new(
                "blk.0.attn_q.weight",
                &[64, 2],
                GgmlType::Q4_1,
            ))
            .tensor(TensorSpec::new(
                "blk.0.attn_norm.weight",
                &[64],
                GgmlType::F32,
            ))
            .tensor(TensorSpec::new(
                "blk.0.ffn_down.weight",
                &[4, 3],
                GgmlType::F16,
            ))
    }

    pub fn kv(mut self, key: &str, v: Value) -> Spec {
        self.kvs.push((key.as_bytes().to_vec(), Kv::Value(v)));
        self
    }

    pub fn raw_kv(mut self, key: &[u8], type_id: u32, payload: Vec<u8>) -> Spec {
        self.kvs.push((key.to_vec(), Kv::Raw { type_id, payload }));
        self
    }

    pub fn tensor(mut self, t: TensorSpec) -> Spec {
        self.tensors.push(t);
        self
    }

    pub fn with_alignment(mut self, alignment: u64) -> Spec {
        self.alignment = alignment;
        self
    }

    /// Serializes the file: header, kvs, tensor infos, padding, then each tensor's data filled
    /// with a byte pattern (tensors whose size is invalid or huge get no data).
    pub fn build(&self) -> Built {
        let mut w = W::default();
        let mut fields = Vec::new();
        let mut field = |offset, width, what| {
            fields.push(Field {
                offset,
                width,
                what,
            })
        };
        field(0, 4, "magic");
        w.raw(&self.magic);
        field(w.pos(), 4, "version");
        w.u32(self.version);
        field(w.pos(), 8, "tensor count");
        w.u64(self.tensor_count.unwrap_or(self.tensors.len() as u64));
        field(w.pos(), 8, "metadata kv count");
        w.u64(self.kv_count.unwrap_or(self.kvs.len() as u64));
        for (key, kv) in &self.kvs {
            field(w.pos(), 8, "metadata key");
            w.str(key);
            field(w.pos(), 4, "metadata value type");
            match kv {
                Kv::Value(v) => {
                    w.u32(value_type_id(v));
                    if let Value::Array(_) = v {
                        field(w.pos(), 4, "array element type");
                        field(w.pos() + 4, 8, "array length");
                    }
                    put_payload(&mut w, v);
                }
                Kv::Raw { type_id, payload } => {
                    w.u32(*type_id).raw(payload);
                }
            }
        }
        let offsets = self.layout();
        for (t, offset) in self.tensors.iter().zip(&offsets) {
            field(w.pos(), 8, "tensor name");
            w.str(&t.name);
            field(w.pos(), 4, "tensor n_dims");
            w.u32(t.n_dims.unwrap_or(t.dims.len() as u32));
            for &d in &t.dims {
                field(w.pos(), 8, "tensor dims");
                w.u64(d);
            }
            field(w.pos(), 4, "tensor type");
            w.u32(t.ty);
            field(w.pos(), 8, "tensor offset");
            w.u64(*offset);
        }
        let data_offset = w.pos().next_multiple_of(self.alignment as usize);
        w.0.resize(data_offset, 0);
        let mut end = data_offset;
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            if let Some(t_end) = t.end(offset) {
                end = end.max(data_offset + t_end as usize);
            }
        }
        w.0.extend((data_offset..end).map(|i| (i * 31 + 7) as u8));
        Built {
            bytes: w.0,
            fields,
            data_offset,
        }
    }

    /// Relative offsets: explicit ones as given, the rest packed in order, aligned.
    fn layout(&self) -> Vec<u64> {
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let offset = t.offset.unwrap_or(next);
                if let Some(end) = t.end(offset) {
                    next = next.max(end.next_multiple_of(self.alignment));
                }
                offset
            })
            .collect()
    }
}

/// Splitmix64: a tiny deterministic PRNG for mutation tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
