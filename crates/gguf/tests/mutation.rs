//! Bounded, deterministic mutation testing (runs in CI; the open-ended version is the
//! cargo-fuzz target in `fuzz/`).
//!
//! Valid files are mutated with a fixed-seed PRNG (bit flips, byte sets, extreme values written
//! over header fields, truncations, insertions, deletions) and parsed under `catch_unwind`: the
//! parser must return `Ok` or `Err`, never panic, and every `Ok` must satisfy the invariants
//! the accessors rely on.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use common::{Field, Rng, Spec, model_bytes};
use tokenmill_gguf::GgufFile;

/// Values worth writing over a count, length, type id or offset.
fn interesting(rng: &mut Rng) -> u64 {
    match rng.below(8) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u64::MAX - rng.below(64) as u64,
        4 => 1 << rng.below(64),
        5 => rng.below(300) as u64,
        6 => u32::MAX as u64 + rng.below(3) as u64,
        _ => rng.next_u64(),
    }
}

fn mutate(rng: &mut Rng, base: &[u8], fields: &[Field]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        if b.is_empty() {
            break;
        }
        let at = rng.below(b.len());
        match rng.below(7) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next_u64() as u8,
            2 | 3 if !fields.is_empty() => {
                let f = fields[rng.below(fields.len())];
                let v = interesting(rng).to_le_bytes();
                let end = (f.offset + f.width).min(b.len());
                if f.offset < end {
                    b[f.offset..end].copy_from_slice(&v[..end - f.offset]);
                }
            }
            4 => b.truncate(at),
            5 => {
                let n = 1 + rng.below(16);
                let junk: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                b.splice(at..at, junk);
            }
            _ => {
                let end = (at + 1 + rng.below(16)).min(b.len());
                b.drain(at..end);
            }
        }
    }
    b
}

/// What every successfully parsed file must satisfy.
fn check_invariants(f: &GgufFile) {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for t in f.tensors() {
        assert!(t.end() <= f.len());
        assert_eq!(t.offset % f.alignment(), 0);
        assert_eq!(f.tensor_data(t).len() as u64, t.size);
        assert_eq!(t.ty.bytes_for(t.n_elements()), Some(t.size));
        assert!(f.tensor(&t.name).is_some());
        spans.push((t.offset, t.end()));
    }
    spans.sort();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
    assert!(f.alignment().is_power_of_two());
    assert_eq!(f.metadata().iter().count(), f.metadata().len());
    for (k, v) in f.metadata().iter() {
        assert!(f.metadata().get(k).is_some());
        let _ = v.to_string();
    }
}

/// Mutates `base` `iterations` times; returns how many mutants parsed.
fn run(name: &str, seed: u64, base: &[u8], fields: &[Field], iterations: usize) -> usize {
    let mut rng = Rng(seed);
    let mut parsed = 0;
    for i in 0..iterations {
        let input = mutate(&mut rng, base, fields);
        let len = input.len();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(f) = GgufFile::from_bytes(input) {
                check_invariants(&f);
                true
            } else {
                false
            }
        }));
        match outcome {
            Ok(ok) => parsed += usize::from(ok),
            Err(_) => panic!("{name}: mutant {i} (seed {seed}, {len} bytes) panicked"),
        }
    }
    parsed
}

#[test]
fn mutated_small_files_never_panic() {
    for (i, spec) in [Spec::small(), Spec::tiny()].into_iter().enumerate() {
        let built = spec.build();
        let parsed = run(
            "small",
            0x5eed + i as u64,
            &built.bytes,
            &built.fields,
            4000,
        );
        // Some mutations land in tensor data or padding and leave the file valid.
        assert!(
            parsed > 0,
            "no mutant of spec {i} parsed: the mutations are too coarse"
        );
    }
}

#[test]
fn mutated_real_header_never_panics() {
    let real = model_bytes();
    let full = GgufFile::from_bytes(real.to_vec()).unwrap();
    let header = &real[..full.data_offset() as usize];
    // Fields: the fixed header, plus every tensor info's n_dims, dims, type and offset.
    let mut fields = vec![
        Field {
            offset: 4,
            width: 4,
            what: "version",
        },
        Field {
            offset: 8,
            width: 8,
            what: "tensor count",
        },
        Field {
            offset: 16,
            width: 8,
            what: "metadata kv count",
        },
        Field {
            offset: 24,
            width: 8,
            what: "metadata key",
        },
    ];
    let mut from = 24;
    for t in full.tensors() {
        let mut needle = (t.name.len() as u64).to_le_bytes().to_vec();
        needle.extend_from_slice(t.name.as_bytes());
        let Some(pos) = header[from..]
            .windows(needle.len())
            .position(|w| w == needle)
        else {
            continue;
        };
        let mut at = from + pos;
        fields.push(Field {
            offset: at,
            width: 8,
            what: "tensor name",
        });
        at += needle.len();
        fields.push(Field {
            offset: at,
            width: 4,
            what: "tensor n_dims",
        });
        at += 4;
        for _ in &t.dims {
            fields.push(Field {
                offset: at,
                width: 8,
                what: "tensor dims",
            });
            at += 8;
        }
        fields.push(Field {
            offset: at,
            width: 4,
            what: "tensor type",
        });
        fields.push(Field {
            offset: at + 4,
            width: 8,
            what: "tensor offset",
        });
        from = at + 12;
    }
    assert!(fields.len() > 272 * 4, "{} fields found", fields.len());
    // The header alone has no tensor data, so mutants parse only if they drop the tensors;
    // the point is that nothing panics on the way.
    run("real header", 0xf00d, header, &fields, 1000);
}
