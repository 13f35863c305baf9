//! Truncated files and extreme field values: each cut gets a truncation-kind error that
//! points at or before the cut (exactly which one is pinned for a minimal file).

mod common;

use common::{Spec, TensorSpec};
use tokenmill_gguf::{GgmlType, GgufError, GgufFile, Value};

/// Every cut of a one-kv, one-tensor file, with the exact error for each byte range.
#[test]
fn truncation_at_every_byte() {
    let spec = Spec::empty()
        .kv("ab", Value::U32(7))
        .tensor(TensorSpec::new("w", &[8], GgmlType::F32));
    let bytes = spec.build().bytes;
    // 0..4 magic, 4..8 version, 8..16 / 16..24 counts; kv: 24..32 key length, 32..34 key,
    // 34..38 type, 38..42 value; tensor info 42..75; padding to 96; data 96..128.
    assert_eq!(bytes.len(), 128);
    for cut in 0..bytes.len() {
        let err = GgufFile::from_bytes(bytes[..cut].to_vec()).unwrap_err();
        let ok = match cut {
            0..4 => matches!(
                err,
                GgufError::Truncated {
                    what: "magic",
                    offset: 0
                }
            ),
            4..8 => matches!(
                err,
                GgufError::Truncated {
                    what: "version",
                    offset: 4
                }
            ),
            8..16 => matches!(
                err,
                GgufError::Truncated {
                    what: "tensor count",
                    offset: 8
                }
            ),
            16..24 => matches!(
                err,
                GgufError::Truncated {
                    what: "metadata kv count",
                    offset: 16
                }
            ),
            // One kv needs at least 13 bytes.
            24..37 => matches!(
                err,
                GgufError::CountTooLarge {
                    what: "metadata kv count",
                    count: 1,
                    ..
                }
            ),
            37..38 => matches!(
                err,
                GgufError::Truncated {
                    what: "metadata value type",
                    offset: 34
                }
            ),
            38..42 => matches!(
                err,
                GgufError::Truncated {
                    what: "metadata value",
                    offset: 38
                }
            ),
            // One tensor info needs at least 32 bytes.
            42..74 => matches!(
                err,
                GgufError::CountTooLarge {
                    what: "tensor count",
                    count: 1,
                    ..
                }
            ),
            74..75 => matches!(
                err,
                GgufError::Truncated {
                    what: "tensor offset",
                    offset: 67
                }
            ),
            _ => matches!(err, GgufError::TensorOutOfBounds { ref name, .. } if name == "w"),
        };
        assert!(ok, "cut at {cut}: {err:?}");
    }
    assert!(GgufFile::from_bytes(bytes).is_ok());
}

/// Cuts at every field boundary of a richer file: always a truncation-kind error that points
/// at or before the cut.
#[test]
fn truncation_at_every_field() {
    let built = Spec::small().build();
    let mut cuts: Vec<usize> = built
        .fields
        .iter()
        .flat_map(|f| [f.offset, f.offset + 1, f.offset + f.width - 1])
        .collect();
    cuts.extend((0..built.bytes.len()).step_by(7));
    for cut in cuts {
        let err = GgufFile::from_bytes(built.bytes[..cut].to_vec()).unwrap_err();
        let offset = match err {
            GgufError::Truncated { offset, .. }
            | GgufError::StringTooLong { offset, .. }
            | GgufError::CountTooLarge { offset, .. } => offset,
            GgufError::TensorOutOfBounds { .. } => {
                assert!(cut >= built.data_offset - 63, "cut at {cut}: {err:?}");
                continue;
            }
            _ => panic!("cut at {cut}: unexpected {err:?}"),
        };
        assert!(offset as usize <= cut, "cut at {cut}: {err:?}");
    }
}

/// Every field of the small file overwritten with extreme values: always a clean result.
#[test]
fn extreme_values_in_every_field() {
    let built = Spec::small().build();
    for field in &built.fields {
        for v in [
            0u64,
            1,
            5,
            0xff,
            u32::MAX as u64,
            1 << 32,
            i64::MAX as u64,
            u64::MAX,
        ] {
            let mut bytes = built.bytes.clone();
            let le = v.to_le_bytes();
            bytes[field.offset..field.offset + field.width].copy_from_slice(&le[..field.width]);
            // Must not panic; either outcome is fine for some values (e.g. 0 tensors).
            let _ = GgufFile::from_bytes(bytes);
        }
    }
}
