//! Metadata values: [`Value`] and [`Array`], how they are decoded, and their short `Display`.
//!
//! Decoding rules (see the module doc of the crate for the full list):
//! - a value type id outside 0..=12 is [`GgufError::UnknownValueType`];
//! - an array's count is checked against the bytes left (at the element type's smallest
//!   encoding) before anything is reserved, and reservations are capped by [`bounded_vec`];
//! - fixed-size element arrays are decoded from one bounds-checked slice;
//! - arrays nest at most [`MAX_ARRAY_DEPTH`] levels, so recursion depth is bounded;
//! - booleans must be 0 or 1, strings must be UTF-8.

use std::fmt;

use crate::error::GgufError;
use crate::reader::{Reader, bounded_vec};

/// How many levels of arrays may nest (an array of scalars is one level).
pub const MAX_ARRAY_DEPTH: u32 = 8;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A homogeneous metadata array. Arrays of arrays may mix element types between the inner
/// arrays, as the format allows.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

/// GGUF's value type ids (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub(crate) fn from_id(id: u32) -> Result<ValueType, GgufError> {
        use ValueType::*;
        Ok(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return Err(GgufError::UnknownValueType(id)),
        })
    }

    /// The fewest bytes one value of this type can take in the file.
    fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,    // u64 length, empty string
            Array => 4 + 8, // element type + count, empty array
        }
    }
}

/// The smallest encoding of a whole metadata entry: empty key, type id, one-byte value.
pub(crate) const MIN_KV_SIZE: u64 = 8 + 4 + 1;

/// Reads a value of type `type_id` nested inside `depth` arrays.
pub(crate) fn read_value(r: &mut Reader<'_>, type_id: u32, depth: u32) -> Result<Value, GgufError> {
    const WHAT: &str = "metadata value";
    Ok(match ValueType::from_id(type_id)? {
        ValueType::U8 => Value::U8(r.u8(WHAT)?),
        ValueType::I8 => Value::I8(i8::from_le_bytes(r.array(WHAT)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(r.array(WHAT)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(r.array(WHAT)?)),
        ValueType::U32 => Value::U32(r.u32(WHAT)?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(r.array(WHAT)?)),
        ValueType::U64 => Value::U64(r.u64(WHAT)?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(r.array(WHAT)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(r.array(WHAT)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(r.array(WHAT)?)),
        ValueType::Bool => Value::Bool(r.bool(WHAT)?),
        ValueType::String => Value::String(r.string("metadata string")?),
        ValueType::Array => Value::Array(read_array(r, depth + 1)?),
    })
}

/// Reads an array header and its elements; `depth` counts this array.
fn read_array(r: &mut Reader<'_>, depth: u32) -> Result<Array, GgufError> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep);
    }
    let elem = ValueType::from_id(r.u32("array element type")?)?;
    let count_offset = r.offset();
    let count = r.u64("array length")?;
    r.check_count(count, elem.min_encoded_size(), "array length", count_offset)?;
    const WHAT: &str = "array elements";
    Ok(match elem {
        ValueType::U8 => Array::U8(r.bytes(count, WHAT)?.to_vec()),
        ValueType::I8 => Array::I8(fixed(r, count, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(fixed(r, count, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(r, count, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(r, count, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(r, count, i32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(r, count, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(r, count, i64::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(r, count, f32::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(r, count, f64::from_le_bytes)?),
        ValueType::Bool => {
            let mut out = bounded_vec(count, r.remaining());
            for _ in 0..count {
                out.push(r.bool(WHAT)?);
            }
            Array::Bool(out)
        }
        ValueType::String => {
            let mut out = bounded_vec(count, r.remaining());
            for _ in 0..count {
                out.push(r.string("array string")?);
            }
            Array::String(out)
        }
        ValueType::Array => {
            let mut out = bounded_vec(count, r.remaining());
            for _ in 0..count {
                out.push(read_array(r, depth + 1)?);
            }
            Array::Array(out)
        }
    })
}

/// `count` fixed-size little-endian elements from one slice (count already checked).
fn fixed<T, const N: usize>(
    r: &mut Reader<'_>,
    count: u64,
    decode: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    let len = count.checked_mul(N as u64).ok_or(GgufError::Truncated {
        what: "array elements",
        offset: r.offset(),
    })?;
    let (chunks, _) = r.bytes(len, "array elements")?.as_chunks::<N>();
    Ok(chunks.iter().map(|c| decode(*c)).collect())
}

impl Value {
    /// The GGUF name of this value's type (`"u32"`, `"string"`, `"array"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type holding a value that fits in `i128` (all of them), else `None`.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type holding a value that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An f32 or f64 (narrowed), or an integer (converted).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => self.as_i128().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

macro_rules! slice_accessors {
    ($($(#[$doc:meta])* $name:ident => $variant:ident: $t:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name(&self) -> Option<&[$t]> {
            match self {
                Array::$variant(v) => Some(v),
                _ => None,
            }
        }
    )*};
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the element type (`"string"`, `"i32"`, ...).
    pub fn elem_type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "u8",
            Array::I8(_) => "i8",
            Array::U16(_) => "u16",
            Array::I16(_) => "i16",
            Array::U32(_) => "u32",
            Array::I32(_) => "i32",
            Array::U64(_) => "u64",
            Array::I64(_) => "i64",
            Array::F32(_) => "f32",
            Array::F64(_) => "f64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }

    slice_accessors! {
        as_u8s => U8: u8;
        as_i8s => I8: i8;
        as_u16s => U16: u16;
        as_i16s => I16: i16;
        as_u32s => U32: u32;
        /// Token types (`tokenizer.ggml.token_type`) are i32 arrays.
        as_i32s => I32: i32;
        as_u64s => U64: u64;
        as_i64s => I64: i64;
        /// Token scores (`tokenizer.ggml.scores`) are f32 arrays.
        as_f32s => F32: f32;
        as_f64s => F64: f64;
        as_bools => Bool: bool;
        /// Vocabularies and merges are string arrays.
        as_strings => String: String;
        as_arrays => Array: Array;
    }
}

// ---- Display: short, one-line renderings for `inspect`-style listings. ----

/// Arrays up to this long are shown whole.
const SHOW_ALL: usize = 8;
/// Longer arrays show this many leading elements.
const SHOW_HEAD: usize = 3;
/// Strings longer than this many chars are cut (top-level values get twice as many).
const STR_CHARS: usize = 40;

/// Writes `s` quoted and escaped, cut after `max_chars` chars with a note of its full length.
fn fmt_str(f: &mut fmt::Formatter<'_>, s: &str, max_chars: usize) -> fmt::Result {
    match s.char_indices().nth(max_chars) {
        None => write!(f, "{s:?}"),
        Some((cut, _)) => {
            let head = s.get(..cut).unwrap_or_default();
            write!(f, "{head:?}... ({} bytes)", s.len())
        }
    }
}

/// Writes `[a, b, c]`, or `[n types: a, b, c, ...]` when there are more than [`SHOW_ALL`].
fn fmt_list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    type_name: &str,
    each: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    let long = items.len() > SHOW_ALL;
    f.write_str("[")?;
    if long {
        write!(f, "{} {type_name}s: ", items.len())?;
    }
    let shown = if long { SHOW_HEAD } else { items.len() };
    for (i, item) in items.iter().take(shown).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, item)?;
    }
    if long {
        f.write_str(", ...")?;
    }
    f.write_str("]")
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn plain<T: fmt::Display>(f: &mut fmt::Formatter<'_>, v: &T) -> fmt::Result {
            write!(f, "{v}")
        }
        let name = self.elem_type_name();
        match self {
            Array::U8(v) => fmt_list(f, v, name, plain),
            Array::I8(v) => fmt_list(f, v, name, plain),
            Array::U16(v) => fmt_list(f, v, name, plain),
            Array::I16(v) => fmt_list(f, v, name, plain),
            Array::U32(v) => fmt_list(f, v, name, plain),
            Array::I32(v) => fmt_list(f, v, name, plain),
            Array::U64(v) => fmt_list(f, v, name, plain),
            Array::I64(v) => fmt_list(f, v, name, plain),
            Array::F32(v) => fmt_list(f, v, name, plain),
            Array::F64(v) => fmt_list(f, v, name, plain),
            Array::Bool(v) => fmt_list(f, v, name, plain),
            Array::String(v) => fmt_list(f, v, name, |f, s| fmt_str(f, s, STR_CHARS)),
            Array::Array(v) => fmt_list(f, v, name, plain),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => fmt_str(f, s, 2 * STR_CHARS),
            Value::Array(a) => write!(f, "{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8], type_id: u32) -> Result<Value, GgufError> {
        read_value(&mut Reader::new(bytes), type_id, 0)
    }

    fn array_header(elem: u32, count: u64) -> Vec<u8> {
        let mut b = elem.to_le_bytes().to_vec();
        b.extend_from_slice(&count.to_le_bytes());
        b
    }

    #[test]
    fn scalars_decode_little_endian() {
        assert_eq!(decode(&[0xfe], 1).unwrap(), Value::I8(-2));
        assert_eq!(decode(&[1, 2], 2).unwrap(), Value::U16(0x0201));
        assert_eq!(decode(&1.5f32.to_le_bytes(), 6).unwrap(), Value::F32(1.5));
        assert_eq!(decode(&(-3i64).to_le_bytes(), 11).unwrap(), Value::I64(-3));
        assert_eq!(decode(&[1], 7).unwrap(), Value::Bool(true));
        assert!(matches!(
            decode(&[2], 7),
            Err(GgufError::BadBool {
                offset: 0,
                value: 2
            })
        ));
        assert!(matches!(
            decode(&[], 13),
            Err(GgufError::UnknownValueType(13))
        ));
    }

    #[test]
    fn arrays_decode_and_check_counts() {
        let mut b = array_header(5, 2);
        b.extend_from_slice(&(-1i32).to_le_bytes());
        b.extend_from_slice(&7i32.to_le_bytes());
        let v = decode(&b, 9).unwrap();
        assert_eq!(v.as_array().and_then(Array::as_i32s), Some(&[-1, 7][..]));

        let huge = array_header(8, u64::MAX / 4);
        assert!(matches!(
            decode(&huge, 9),
            Err(GgufError::CountTooLarge { .. })
        ));
    }

    #[test]
    fn nesting_is_limited() {
        let mut b = Vec::new();
        for _ in 0..MAX_ARRAY_DEPTH + 1 {
            b.extend_from_slice(&array_header(9, 1));
        }
        b.extend_from_slice(&array_header(0, 0));
        assert!(matches!(decode(&b, 9), Err(GgufError::NestingTooDeep)));

        let mut ok = Vec::new();
        for _ in 0..MAX_ARRAY_DEPTH - 1 {
            ok.extend_from_slice(&array_header(9, 1));
        }
        ok.extend_from_slice(&array_header(0, 0));
        assert!(decode(&ok, 9).is_ok());
    }

    #[test]
    fn integer_conversions() {
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(5).as_u64(), Some(5));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U8(3).as_f32(), Some(3.0));
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::String("x".into()).as_u64(), None);
    }

    #[test]
    fn display_abbreviates() {
        assert_eq!(Value::U32(7).to_string(), "7");
        assert_eq!(Value::String("a\"b".into()).to_string(), r#""a\"b""#);
        let short = Value::Array(Array::I32(vec![1, 2, 3]));
        assert_eq!(short.to_string(), "[1, 2, 3]");
        let tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            .iter()
            .cycle()
            .take(49152)
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            Value::Array(Array::String(tokens)).to_string(),
            r#"[49152 strings: "<|endoftext|>", "<|im_start|>", "<|im_end|>", ...]"#
        );
        let long = "é".repeat(100);
        let shown = Value::String(long).to_string();
        assert!(shown.ends_with("... (200 bytes)"), "{shown}");
        let nested = Array::Array(vec![Array::U8(vec![1]), Array::Bool(vec![])]);
        assert_eq!(nested.to_string(), "[[1], []]");
    }
}
