//! Corrupt safetensors files and folders, each rejected with the error that names its problem;
//! and the valid files the writer builds, read back exactly.

use std::path::Path;

use tokenmill_safetensors::{
    Dtype, MAX_HEADER_LEN, SafetensorsError as E, SafetensorsFile, SafetensorsSet, serialize,
};

/// A file whose header is `json` verbatim, followed by `data_len` zero bytes.
fn raw(json: &str, data_len: usize) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.resize(out.len() + data_len, 0);
    out
}

fn err(bytes: Vec<u8>) -> E {
    SafetensorsFile::from_bytes(bytes).expect_err("corrupt file parsed")
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn valid_file_round_trips() {
    let a = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = vec![0x80, 0x3f, 0x00, 0xc0]; // bf16 [1, -2]
    let bytes = serialize(&[
        ("a", Dtype::F32, &[2, 3], &a),
        ("b", Dtype::BF16, &[2], &b),
        ("empty", Dtype::F16, &[0, 4], &[]),
    ]);
    let f = SafetensorsFile::from_bytes(bytes).unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "empty"]);
    let ta = f.tensor("a").unwrap();
    assert_eq!(
        (ta.dtype, ta.shape.as_slice()),
        (Dtype::F32, &[2u64, 3][..])
    );
    assert_eq!(f.tensor_data(ta), &a[..]);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &b[..]);
    assert!(f.tensor("missing").is_none());
}

#[test]
fn metadata_is_read() {
    let json =
        r#"{"__metadata__":{"format":"pt"},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    let f = SafetensorsFile::from_bytes(raw(json, 2)).unwrap();
    assert_eq!(f.metadata()["format"], "pt");
}

#[test]
fn header_length_problems() {
    assert!(matches!(err(vec![1, 2, 3]), E::TooShort { len: 3 }));
    let mut big = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    big.extend_from_slice(b"{}");
    assert!(matches!(err(big), E::HeaderTooLarge { .. }));
    let mut past = 100u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    assert!(matches!(
        err(past),
        E::HeaderOutOfBounds {
            len: 100,
            file_len: 10
        }
    ));
    assert!(matches!(
        err(u64::MAX.to_le_bytes().to_vec()),
        E::HeaderTooLarge { .. }
    ));
}

#[test]
fn header_text_problems() {
    let mut bad = 4u64.to_le_bytes().to_vec();
    bad.extend_from_slice(&[b'{', 0xff, 0xfe, b'}']);
    assert!(matches!(err(bad), E::HeaderNotUtf8 { valid_up_to: 1 }));
    for json in [
        "",
        "[]",
        "{",
        r#"{"x":1}"#,
        r#"{"x":{"dtype":"F32","shape":[1]}}"#,
        r#"{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}}"#,
        r#"{"__metadata__":{"k":1}}"#,
        r#"{} trailing"#,
    ] {
        assert!(matches!(err(raw(json, 4)), E::HeaderJson(_)), "{json}");
    }
}

#[test]
fn duplicate_names_are_caught() {
    let json = r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert!(matches!(err(raw(json, 2)), E::DuplicateTensor(n) if n == "x"));
    let meta = r#"{"__metadata__":{},"__metadata__":{}}"#;
    assert!(matches!(err(raw(meta, 0)), E::DuplicateTensor(n) if n == "__metadata__"));
}

#[test]
fn entry_problems() {
    let one = |dtype: &str, shape: &str, offs: &str, data: usize| {
        err(raw(
            &format!(r#"{{"x":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offs}}}}}"#),
            data,
        ))
    };
    assert!(matches!(one("F4", "[2]", "[0,1]", 1), E::UnknownDtype { dtype, .. } if dtype == "F4"));
    assert!(matches!(
        one("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]", 1),
        E::TooManyDims {
            rank: 9,
            max: 8,
            ..
        }
    ));
    let huge = format!("[{},{}]", u64::MAX / 2, 3);
    assert!(matches!(
        one("U8", &huge, "[0,1]", 1),
        E::SizeOverflow { .. }
    ));
    assert!(matches!(
        one("F16", "[4]", "[8,0]", 8),
        E::BadOffsets {
            begin: 8,
            end: 0,
            ..
        }
    ));
    assert!(matches!(
        one("F32", "[3]", "[0,8]", 8),
        E::SizeMismatch {
            expected: 12,
            found: 8,
            ..
        }
    ));
    // Offsets beyond any usize (and beyond the file): a tiling error, never a panic.
    let far = format!("[{},{}]", u64::MAX - 1, u64::MAX);
    assert!(matches!(
        one("U8", "[1]", &far, 1),
        E::NotContiguous { expected: 0, .. }
    ));
}

#[test]
fn tiling_problems() {
    let two = |a: [u64; 2], b: [u64; 2], data: usize| {
        err(raw(
            &format!(
                r#"{{"a":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}},"b":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}}}}"#,
                a[1] - a[0],
                a[0],
                a[1],
                b[1] - b[0],
                b[0],
                b[1]
            ),
            data,
        ))
    };
    // Not starting at 0.
    assert!(matches!(
        two([2, 4], [4, 6], 6),
        E::NotContiguous {
            expected: 0,
            found: 2,
            ..
        }
    ));
    // A gap between a and b.
    assert!(matches!(
        two([0, 2], [3, 5], 5),
        E::NotContiguous { name, expected: 2, found: 3 } if name == "b"
    ));
    // Overlap.
    assert!(matches!(
        two([0, 4], [2, 6], 6),
        E::NotContiguous {
            expected: 4,
            found: 2,
            ..
        }
    ));
    // Trailing bytes after the last tensor.
    assert!(matches!(
        two([0, 2], [2, 4], 5),
        E::DataLenMismatch {
            data_len: 5,
            covered: 4
        }
    ));
    // Tensors running past the end of the file.
    assert!(matches!(
        two([0, 2], [2, 4], 3),
        E::DataLenMismatch {
            data_len: 3,
            covered: 4
        }
    ));
    // No tensors but data bytes.
    assert!(matches!(
        err(raw("{}", 1)),
        E::DataLenMismatch {
            data_len: 1,
            covered: 0
        }
    ));
}

#[test]
fn every_truncation_is_rejected() {
    let a = f32_bytes(&[1.0; 12]);
    let bytes = serialize(&[
        ("a", Dtype::F32, &[3, 4], &a),
        ("b", Dtype::U8, &[3], &[1, 2, 3]),
    ]);
    for cut in 0..bytes.len() {
        assert!(
            SafetensorsFile::from_bytes(bytes[..cut].to_vec()).is_err(),
            "cut {cut}"
        );
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// A folder with two shards holding `a` and `b`, and `index` as the index text.
fn sharded(index: &str) -> (tempfile::TempDir, Result<SafetensorsSet, E>) {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "s1.safetensors",
        &serialize(&[("a", Dtype::U8, &[2], &[1, 2])]),
    );
    write(
        dir.path(),
        "s2.safetensors",
        &serialize(&[("b", Dtype::U8, &[1], &[9])]),
    );
    write(dir.path(), "model.safetensors.index.json", index.as_bytes());
    let set = SafetensorsSet::open_dir(dir.path());
    (dir, set)
}

#[test]
fn sharded_folder_reads_across_shards() {
    let (_d, set) =
        sharded(r#"{"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}"#);
    let set = set.unwrap();
    assert_eq!(set.len(), 2);
    let (s, t) = set.tensor("b").unwrap();
    assert_eq!(set.shard_names()[s], "s2.safetensors");
    assert_eq!(set.shards()[s].tensor_data(t), &[9]);
    assert!(set.tensor("c").is_none());
}

#[test]
fn sharded_folder_problems() {
    let case = |index: &str| sharded(index).1.expect_err(index);
    assert!(matches!(case("{"), E::BadIndex(_)));
    assert!(matches!(case(r#"{"metadata":{}}"#), E::BadIndex(_)));
    assert!(matches!(
        case(r#"{"weight_map":{"a":"../s1.safetensors","b":"s2.safetensors"}}"#),
        E::BadShardName(n) if n == "../s1.safetensors"
    ));
    assert!(matches!(
        case(r#"{"weight_map":{"a":"/etc/passwd","b":"s2.safetensors"}}"#),
        E::BadShardName(_)
    ));
    assert!(matches!(
        case(r#"{"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}}"#),
        E::MissingTensor { name, shard } if name == "b" && shard == "s1.safetensors"
    ));
    // `b` lives in s2, which the index never names: not loaded, so `a` alone is consistent.
    assert!(
        sharded(r#"{"weight_map":{"a":"s1.safetensors"}}"#)
            .1
            .is_ok()
    );
    assert!(matches!(
        case(r#"{"weight_map":{"a":"s1.safetensors","b":"s3.safetensors"}}"#),
        E::InShard { file, source } if file == "s3.safetensors" && matches!(*source, E::Io { .. })
    ));
}

#[test]
fn shard_holding_an_unlisted_tensor_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let s1 = serialize(&[("a", Dtype::U8, &[1], &[1]), ("b", Dtype::U8, &[1], &[2])]);
    write(dir.path(), "s1.safetensors", &s1);
    write(
        dir.path(),
        "s2.safetensors",
        &serialize(&[("b", Dtype::U8, &[1], &[3])]),
    );
    let index = r#"{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}"#;
    write(dir.path(), "model.safetensors.index.json", index.as_bytes());
    let e = SafetensorsSet::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&e, E::UnlistedTensor { name, shard } if name == "b" && shard == "s1.safetensors"),
        "{e:?}"
    );
}

#[test]
fn corrupt_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s1.safetensors", &[1, 2, 3]);
    let index = r#"{"weight_map":{"a":"s1.safetensors"}}"#;
    write(dir.path(), "model.safetensors.index.json", index.as_bytes());
    let e = SafetensorsSet::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&e, E::InShard { file, source } if file == "s1.safetensors"
        && matches!(**source, E::TooShort { len: 3 })),
        "{e:?}"
    );
}

#[test]
fn folder_without_weights() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        SafetensorsSet::open_dir(dir.path()),
        Err(E::NoWeights(_))
    ));
    write(
        dir.path(),
        "model.safetensors",
        &serialize(&[("w", Dtype::F32, &[1], &[0; 4])]),
    );
    let set = SafetensorsSet::open_dir(dir.path()).unwrap();
    assert_eq!(set.shard_names(), ["model.safetensors"]);
}
