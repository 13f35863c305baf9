//! Corrupt files, each rejected with the specific error that names its problem.
//!
//! Variants are built precisely with the test writer (`common::Spec`), or patched/cut from the
//! real model's bytes.

mod common;

use common::{Spec, TensorSpec, W, model_bytes};
use tokenmill_gguf::{Array, DimsProblem, GgmlType, GgufError, GgufFile, MAX_ARRAY_DEPTH, Value};

/// Results of the corrupt-file cases: every name, and what went wrong.
#[derive(Default)]
struct Cases {
    names: Vec<String>,
    failures: Vec<String>,
}

/// Parses `$bytes` now and records a failure unless the error matches `$pat`.
macro_rules! case {
    ($cases:expr, $name:expr, $bytes:expr, $pat:pat $(if $guard:expr)?) => {{
        let name: String = $name.to_string();
        match GgufFile::from_bytes($bytes) {
            Ok(_) => $cases.failures.push(format!("{name}: parsed successfully")),
            Err(e) => {
                if !matches!(&e, $pat $(if $guard)?) {
                    $cases.failures.push(format!("{name}: unexpected error {e:?} ({e})"));
                }
            }
        }
        $cases.names.push(name);
    }};
}

fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn le64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// Array payload: element type, count, then `rest`.
fn array_payload(elem: u32, count: u64, rest: &[u8]) -> Vec<u8> {
    let mut w = W::default();
    w.u32(elem).u64(count).raw(rest);
    w.0
}

fn with_tensor(spec: Spec, f: impl FnOnce(&mut TensorSpec)) -> Vec<u8> {
    let mut spec = spec;
    if let Some(t) = spec.tensors.last_mut() {
        f(t);
    }
    spec.build().bytes
}

#[test]
fn the_writer_builds_valid_files() {
    for spec in [Spec::empty(), Spec::tiny(), Spec::small()] {
        let built = spec.build();
        let f = GgufFile::from_bytes(built.bytes.clone()).unwrap();
        assert_eq!(f.data_offset() as usize, built.data_offset);
        assert_eq!(f.tensors().len(), spec.tensors.len());
    }
    let f = GgufFile::from_bytes(Spec::small().build().bytes).unwrap();
    assert_eq!(f.alignment(), 64);
    let md = f.metadata();
    assert_eq!(md.get_i64("t.i64"), Some(-1 << 40));
    assert_eq!(md.get_u64("t.u16"), Some(60000));
    assert_eq!(md.get_f32("t.f32"), Some(1e-5));
    assert_eq!(md.get_bool("t.bool"), Some(true));
    assert_eq!(
        md.get_array("t.tokens")
            .and_then(Array::as_strings)
            .map(|s| s.len()),
        Some(4)
    );
    let nested = md.get_array("t.nested").and_then(Array::as_arrays).unwrap();
    assert_eq!(nested[2], Array::Array(vec![Array::I64(vec![-1])]));
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.ty, q.size), (GgmlType::Q4_1, 80));
    assert_eq!(f.tensor_data(q).len(), 80);
    let keys: Vec<&str> = md.iter().map(|(k, _)| k).take(2).collect();
    assert_eq!(keys, ["general.architecture", "general.alignment"]);
}

/// Corrupt headers and metadata.
fn header_and_metadata_cases(cases: &mut Cases) {
    let tiny = Spec::tiny();
    let with_kv = |type_id: u32, payload: Vec<u8>| {
        Spec::tiny().raw_kv(b"bad", type_id, payload).build().bytes
    };

    case!(
        cases,
        "empty file",
        vec![],
        GgufError::Truncated {
            what: "magic",
            offset: 0
        }
    );
    case!(
        cases,
        "3 bytes",
        b"GGU".to_vec(),
        GgufError::Truncated { what: "magic", .. }
    );
    let mut s = tiny.clone();
    s.magic = *b"GGML";
    case!(cases, "bad magic", s.build().bytes, GgufError::BadMagic(m) if m == b"GGML");
    for v in [0, 1, 4, 99, u32::MAX] {
        let mut s = tiny.clone();
        s.version = v;
        case!(cases, format!("version {v}"), s.build().bytes, GgufError::UnsupportedVersion(x) if *x == v);
    }
    let mut s = tiny.clone();
    s.version = 3u32.swap_bytes();
    case!(
        cases,
        "big-endian",
        s.build().bytes,
        GgufError::BigEndian(3)
    );
    case!(
        cases,
        "cut in version",
        b"GGUF\x03\x00".to_vec(),
        GgufError::Truncated {
            what: "version",
            offset: 4
        }
    );
    case!(
        cases,
        "cut in tensor count",
        b"GGUF\x03\x00\x00\x00\x01".to_vec(),
        GgufError::Truncated {
            what: "tensor count",
            offset: 8
        }
    );

    let mut s = tiny.clone();
    s.tensor_count = Some(u64::MAX);
    case!(
        cases,
        "huge tensor count",
        s.build().bytes,
        GgufError::CountTooLarge {
            what: "tensor count",
            count: u64::MAX,
            ..
        }
    );
    let mut s = tiny.clone();
    s.tensor_count = Some(1 << 20);
    case!(
        cases,
        "tensor count beyond file",
        s.build().bytes,
        GgufError::CountTooLarge {
            what: "tensor count",
            ..
        }
    );
    let mut s = tiny.clone();
    s.kv_count = Some(u64::MAX / 2);
    case!(
        cases,
        "huge kv count",
        s.build().bytes,
        GgufError::CountTooLarge {
            what: "metadata kv count",
            offset: 16,
            ..
        }
    );

    // Key length field claims 2^62 bytes.
    let mut bytes = tiny.build().bytes;
    bytes.splice(24..32, le64(1 << 62));
    case!(cases, "huge key length", bytes,
        GgufError::StringTooLong { what: "metadata key", offset: 32, len, .. } if *len == 1 << 62);
    case!(
        cases,
        "huge string value",
        with_kv(8, le64(u64::MAX)),
        GgufError::StringTooLong {
            what: "metadata string",
            len: u64::MAX,
            ..
        }
    );
    case!(cases, "huge array count", with_kv(9, array_payload(4, 1 << 40, &[])),
        GgufError::CountTooLarge { what: "array length", count, min_bytes_each: 4, .. } if *count == 1 << 40);
    case!(
        cases,
        "huge string array count",
        with_kv(9, array_payload(8, u64::MAX / 8 + 1, &[])),
        GgufError::CountTooLarge {
            what: "array length",
            min_bytes_each: 8,
            ..
        }
    );
    case!(
        cases,
        "array count overflow",
        with_kv(9, array_payload(12, u64::MAX, &[])),
        GgufError::CountTooLarge {
            what: "array length",
            ..
        }
    );
    // A string array whose count fits the bytes left but whose strings run off the end.
    case!(
        cases,
        "string array runs off the end",
        with_kv(9, array_payload(8, 64, &le64(1 << 30))),
        GgufError::CountTooLarge { .. } | GgufError::StringTooLong { .. }
    );

    // Arrays of arrays, nested far too deep: each level is a 1-element array of arrays.
    let mut bomb = Vec::new();
    for _ in 0..1000 {
        bomb.extend(array_payload(9, 1, &[]));
    }
    case!(
        cases,
        "nested array bomb (deep)",
        with_kv(9, bomb),
        GgufError::NestingTooDeep
    );
    let mut just_over = Vec::new();
    for _ in 0..MAX_ARRAY_DEPTH {
        just_over.extend(array_payload(9, 1, &[]));
    }
    just_over.extend(array_payload(0, 0, &[]));
    case!(
        cases,
        "arrays one level too deep",
        with_kv(9, just_over),
        GgufError::NestingTooDeep
    );
    // Wide: 2^40 empty inner arrays claimed.
    case!(
        cases,
        "nested array bomb (wide)",
        with_kv(9, array_payload(9, 1 << 40, &[])),
        GgufError::CountTooLarge {
            what: "array length",
            min_bytes_each: 12,
            ..
        }
    );

    case!(
        cases,
        "unknown value type",
        with_kv(13, vec![0; 8]),
        GgufError::UnknownValueType(13)
    );
    case!(
        cases,
        "unknown value type u32::MAX",
        with_kv(u32::MAX, vec![]),
        GgufError::UnknownValueType(u32::MAX)
    );
    case!(
        cases,
        "unknown array element type",
        with_kv(9, array_payload(77, 1, &[0; 8])),
        GgufError::UnknownValueType(77)
    );
    case!(
        cases,
        "bool byte 2",
        with_kv(7, vec![2]),
        GgufError::BadBool { value: 2, .. }
    );
    case!(
        cases,
        "bool array byte 0xff",
        with_kv(9, array_payload(7, 2, &[1, 0xff])),
        GgufError::BadBool { value: 0xff, .. }
    );
    let mut cut_value = Spec::empty().raw_kv(b"k", 10, vec![1, 2, 3]).build().bytes;
    cut_value.truncate(24 + 9 + 4 + 3); // the writer pads to the data section; drop that
    case!(
        cases,
        "value cut short",
        cut_value,
        GgufError::Truncated {
            what: "metadata value",
            offset: 37
        }
    );

    let bytes = Spec::tiny()
        .raw_kv(b"bad\xff\xfekey", 4, le32(1))
        .build()
        .bytes;
    case!(
        cases,
        "non-UTF-8 key",
        bytes,
        GgufError::InvalidUtf8 {
            what: "metadata key",
            ..
        }
    );
    let mut payload = le64(3);
    payload.extend_from_slice(b"a\xc0b");
    case!(
        cases,
        "non-UTF-8 string value",
        with_kv(8, payload),
        GgufError::InvalidUtf8 {
            what: "metadata string",
            ..
        }
    );
    let mut payload = array_payload(8, 2, &le64(1));
    payload.extend_from_slice(b"a");
    payload.extend_from_slice(&le64(1));
    payload.push(0x80);
    case!(
        cases,
        "non-UTF-8 array string",
        with_kv(9, payload),
        GgufError::InvalidUtf8 {
            what: "array string",
            ..
        }
    );

    let dup = Spec::tiny()
        .kv("x.y", Value::U8(1))
        .kv("general.architecture", Value::String("qwen2".into()));
    case!(cases, "duplicate key", dup.build().bytes, GgufError::DuplicateKey(k) if k == "general.architecture");

    for a in [0u32, 3, 48, 0x8000_0001] {
        let s = Spec::tiny().kv("general.alignment", Value::U32(a));
        case!(cases, format!("alignment {a}"), s.build().bytes, GgufError::BadAlignment(x) if *x == u64::from(a));
    }
    for (v, ty) in [
        (Value::U64(32), "u64"),
        (Value::String("32".into()), "string"),
        (Value::I32(32), "i32"),
    ] {
        let s = Spec::tiny().kv("general.alignment", v);
        case!(cases, format!("alignment as {ty}"), s.build().bytes,
            GgufError::WrongValueType { key: "general.alignment", expected: "u32", found } if *found == ty);
    }
}

/// Corrupt tensor infos and layouts.
fn tensor_cases(cases: &mut Cases) {
    let two = || {
        Spec::empty()
            .tensor(TensorSpec::new("a", &[64, 2], GgmlType::Q8_0))
            .tensor(TensorSpec::new("b", &[32], GgmlType::F32))
    };
    let is = |n: &str, want: &str| n == want;

    case!(cases, "unknown tensor type 4", with_tensor(two(), |t| t.ty = 4),
        GgufError::UnknownTensorType { name, id: 4 } if is(name, "b"));
    case!(
        cases,
        "unknown tensor type 1000",
        with_tensor(two(), |t| t.ty = 1000),
        GgufError::UnknownTensorType { id: 1000, .. }
    );
    case!(
        cases,
        "n_dims 0",
        with_tensor(two(), |t| {
            t.n_dims = Some(0);
            t.dims.clear();
        }),
        GgufError::BadDimCount { n_dims: 0, .. }
    );
    case!(cases, "n_dims 5", with_tensor(two(), |t| t.dims = vec![32, 1, 1, 1, 1]),
        GgufError::BadDimCount { name, n_dims: 5 } if is(name, "b"));
    case!(
        cases,
        "n_dims u32::MAX",
        with_tensor(two(), |t| t.n_dims = Some(u32::MAX)),
        GgufError::BadDimCount {
            n_dims: u32::MAX,
            ..
        }
    );
    case!(
        cases,
        "zero dim",
        with_tensor(two(), |t| t.dims = vec![32, 0]),
        GgufError::BadDims {
            problem: DimsProblem::ZeroDim,
            ..
        }
    );
    case!(
        cases,
        "dims overflow element count",
        with_tensor(two(), |t| t.dims = vec![1 << 32, 1 << 32, 1 << 32]),
        GgufError::BadDims {
            problem: DimsProblem::Overflow,
            ..
        }
    );
    case!(
        cases,
        "dims overflow byte size",
        with_tensor(two(), |t| t.dims = vec![1 << 61, 4]),
        GgufError::BadDims {
            problem: DimsProblem::Overflow,
            ..
        }
    );
    let q41 = Spec::empty().tensor(TensorSpec::new("q", &[33, 2], GgmlType::Q4_1));
    case!(
        cases,
        "row not multiple of block",
        q41.build().bytes,
        GgufError::BadDims {
            problem: DimsProblem::RowNotBlockMultiple { block_size: 32 },
            ..
        }
    );
    let k = Spec::empty().tensor(TensorSpec::new("k", &[128, 4], GgmlType::Q6_K));
    case!(
        cases,
        "row not multiple of super-block",
        k.build().bytes,
        GgufError::BadDims {
            problem: DimsProblem::RowNotBlockMultiple { block_size: 256 },
            ..
        }
    );

    case!(cases, "offset out of range", with_tensor(two(), |t| t.offset = Some(1 << 40)),
        GgufError::TensorOutOfBounds { name, offset, .. } if is(name, "b") && *offset == 1 << 40);
    case!(
        cases,
        "offset overflows",
        with_tensor(two(), |t| t.offset = Some(u64::MAX - 31)),
        GgufError::TensorOutOfBounds { .. }
    );
    // Valid dims, but far more data than the file holds.
    case!(cases, "size past EOF", with_tensor(two(), |t| t.dims = vec![4096, 4096]),
        GgufError::TensorOutOfBounds { name, size, .. } if is(name, "b") && *size == 4096 * 4096 * 4);
    let mut cut = two().build().bytes;
    cut.pop();
    case!(cases, "data one byte short", cut, GgufError::TensorOutOfBounds { name, .. } if is(name, "b"));
    case!(cases, "overlapping tensors", with_tensor(two(), |t| t.offset = Some(64)),
        GgufError::TensorsOverlap { a, b } if is(a, "a") && is(b, "b"));
    case!(
        cases,
        "same offset",
        with_tensor(two(), |t| t.offset = Some(0)),
        GgufError::TensorsOverlap { .. }
    );
    case!(cases, "misaligned offset", with_tensor(two(), |t| t.offset = Some(160 + 4)),
        GgufError::TensorMisaligned { name, offset: 164, alignment: 32 } if is(name, "b"));
    let aligned64 = two()
        .kv("general.alignment", Value::U32(64))
        .with_alignment(64);
    case!(
        cases,
        "offset aligned to 32 but not 64",
        with_tensor(aligned64, |t| t.offset = Some(192 + 32)),
        GgufError::TensorMisaligned { alignment: 64, .. }
    );

    let bad_name = with_tensor(two(), |t| t.name = b"blk.\xff".to_vec());
    case!(
        cases,
        "non-UTF-8 tensor name",
        bad_name,
        GgufError::InvalidUtf8 {
            what: "tensor name",
            ..
        }
    );
    let mut spec = two();
    spec.tensors[1].name.clear();
    let built = spec.build();
    let len_field = built
        .fields
        .iter()
        .rfind(|f| f.what == "tensor name")
        .unwrap();
    let mut huge_name = built.bytes.clone();
    huge_name.splice(len_field.offset..len_field.offset + 8, le64(u64::MAX - 1));
    case!(
        cases,
        "huge tensor name length",
        huge_name,
        GgufError::StringTooLong {
            what: "tensor name",
            ..
        }
    );
    case!(cases, "duplicate tensor name", with_tensor(two(), |t| t.name = b"a".to_vec()),
        GgufError::DuplicateTensor(n) if is(n, "a"));
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Patches and cuts of the real model.
fn real_file_cases(cases: &mut Cases) {
    let real = model_bytes();
    let parsed = GgufFile::from_bytes(real.to_vec()).unwrap();
    let patched = |at: usize, with: &[u8]| {
        let mut b = real.to_vec();
        b.splice(at..at + with.len(), with.iter().copied());
        b
    };

    case!(
        cases,
        "real: bad magic",
        patched(0, b"GGUG"),
        GgufError::BadMagic(_)
    );
    case!(
        cases,
        "real: version 1",
        patched(4, &le32(1)),
        GgufError::UnsupportedVersion(1)
    );
    case!(
        cases,
        "real: huge tensor count",
        patched(8, &le64(u64::MAX)),
        GgufError::CountTooLarge {
            what: "tensor count",
            ..
        }
    );
    case!(
        cases,
        "real: huge kv count",
        patched(16, &le64(1 << 50)),
        GgufError::CountTooLarge {
            what: "metadata kv count",
            ..
        }
    );
    // The first key's value type.
    let key_len = u64::from_le_bytes(real[24..32].try_into().unwrap()) as usize;
    case!(
        cases,
        "real: unknown value type",
        patched(32 + key_len, &le32(200)),
        GgufError::UnknownValueType(200)
    );
    case!(
        cases,
        "real: non-UTF-8 first key",
        patched(32, &[0xff]),
        GgufError::InvalidUtf8 {
            what: "metadata key",
            ..
        }
    );

    // The tokens array: cut shortly after its header.
    let tokens_key = b"tokenizer.ggml.tokens";
    let at = find(real, tokens_key, 0).unwrap() + tokens_key.len();
    case!(
        cases,
        "real: cut inside the vocabulary",
        real[..at + 4 + 4 + 8 + 100].to_vec(),
        GgufError::CountTooLarge {
            what: "array length",
            count: 49152,
            ..
        }
    );
    case!(
        cases,
        "real: vocabulary count 2^60",
        patched(at + 8, &le64(1 << 60)),
        GgufError::CountTooLarge {
            what: "array length",
            ..
        }
    );

    // Tensor infos: locate the first two by their length-prefixed names.
    let locate = |name: &str| {
        let mut needle = le64(name.len() as u64);
        needle.extend_from_slice(name.as_bytes());
        find(real, &needle, 24).unwrap() + needle.len()
    };
    let t0 = &parsed.tensors()[0];
    let t1 = &parsed.tensors()[1];
    let after0 = locate(&t0.name); // n_dims of tensor 0
    let type0 = after0 + 4 + 8 * t0.dims.len();
    case!(cases, "real: unknown tensor type", patched(type0, &le32(4)),
        GgufError::UnknownTensorType { name, id: 4 } if *name == t0.name);
    case!(
        cases,
        "real: n_dims 5",
        patched(after0, &le32(5)),
        GgufError::BadDimCount { n_dims: 5, .. }
    );
    case!(
        cases,
        "real: zero dim",
        patched(after0 + 4, &le64(0)),
        GgufError::BadDims {
            problem: DimsProblem::ZeroDim,
            ..
        }
    );
    let rel0 = t0.offset - parsed.data_offset();
    let off1 = locate(&t1.name) + 4 + 8 * t1.dims.len() + 4;
    case!(
        cases,
        "real: overlapping tensors",
        patched(off1, &le64(rel0)),
        GgufError::TensorsOverlap { .. }
    );
    case!(cases, "real: misaligned tensor", patched(off1, &le64(t1.offset - parsed.data_offset() + 16)),
        GgufError::TensorMisaligned { name, .. } if *name == t1.name);
    let k_name = locate("blk.0.attn_k.weight") - "blk.0.attn_k.weight".len();
    case!(cases, "real: duplicate tensor name", patched(k_name, b"blk.0.attn_q.weight"),
        GgufError::DuplicateTensor(n) if n == "blk.0.attn_q.weight");

    // Cuts in the data section.
    let last = parsed
        .tensors()
        .iter()
        .max_by_key(|t| t.end())
        .unwrap()
        .name
        .clone();
    case!(cases, "real: last byte missing", real[..real.len() - 1].to_vec(),
        GgufError::TensorOutOfBounds { name, .. } if *name == last);
    let first = parsed
        .tensors()
        .iter()
        .find(|t| t.size > 0)
        .unwrap()
        .name
        .clone();
    case!(cases, "real: cut at data section", real[..parsed.data_offset() as usize].to_vec(),
        GgufError::TensorOutOfBounds { name, .. } if *name == first);
}

#[test]
fn corrupt_files_get_specific_errors() {
    let mut cases = Cases::default();
    header_and_metadata_cases(&mut cases);
    tensor_cases(&mut cases);
    real_file_cases(&mut cases);
    let mut names = cases.names.clone();
    names.sort();
    names.dedup();
    assert_eq!(
        names.len(),
        cases.names.len(),
        "case names must be distinct"
    );
    assert!(cases.names.len() >= 60, "{} cases", cases.names.len());
    assert!(
        cases.failures.is_empty(),
        "{} of {} cases failed:\n{}",
        cases.failures.len(),
        cases.names.len(),
        cases.failures.join("\n")
    );
}
