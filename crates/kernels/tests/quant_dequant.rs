//! Differential tests of the reference dequantizers and quantizers against golden vectors from
//! the Python `gguf` package (`scripts/golden/make_quant_vectors.py`; file format documented
//! there).
//!
//! Tolerance: **bit-exact**. Our dequantizers perform the same IEEE-754 f32 operations in the
//! same order as ggml and as the package's numpy code (e.g. `(d * sc) * q - (dmin * m)`), f16
//! and bf16 widen exactly, and neither Rust nor numpy contracts `a * b + c` into an FMA, so
//! every element must have the same bits. Likewise the quantizers must reproduce the package's
//! bytes exactly (same `d`, same `1 / d`, same truncation or rounding, f16 rounding to nearest
//! even). The only exception is NaN payloads, compared as "both NaN" for the float types.

use std::path::PathBuf;

use tokenmill_kernels::quant::{GgmlType, QK_K, dequantize_row, quantize_row};

/// One golden vector file.
struct Fixture {
    ty: GgmlType,
    num_rows: usize,
    num_cols: usize,
    /// `[num_rows * num_cols]`, present when the package quantized `bytes` from it.
    src: Option<Vec<f32>>,
    /// `[num_rows * row_bytes]`
    bytes: Vec<u8>,
    /// `[num_rows * num_cols]`, the package's dequantization of `bytes`.
    dequant: Vec<f32>,
}

impl Fixture {
    fn row_bytes(&self) -> usize {
        self.ty.bytes_for(self.num_cols as u64).unwrap() as usize
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn load(ty: GgmlType) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "tests/fixtures/quant/{}.bin",
        ty.name().to_lowercase()
    ));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..4], b"TMQV", "{}", path.display());
    assert_eq!(u32_at(&b, 4), 1, "fixture version");
    assert_eq!(GgmlType::from_id(u32_at(&b, 8)), Some(ty));
    let (num_rows, num_cols, flags) = (
        u32_at(&b, 12) as usize,
        u32_at(&b, 16) as usize,
        u32_at(&b, 20),
    );
    let n = num_rows * num_cols;
    let num_bytes = num_rows * ty.bytes_for(num_cols as u64).unwrap() as usize;
    let mut at = 24;
    let src = (flags & 1 != 0).then(|| {
        at += 4 * n;
        f32s(&b[at - 4 * n..at])
    });
    let bytes = b[at..at + num_bytes].to_vec();
    at += num_bytes;
    let dequant = f32s(&b[at..at + 4 * n]);
    assert_eq!(at + 4 * n, b.len(), "trailing bytes in {}", path.display());
    Fixture {
        ty,
        num_rows,
        num_cols,
        src,
        bytes,
        dequant,
    }
}

/// Every GGUF weight type the package can dequantize (Q8_1 and Q8_K are activation-only and
/// not in the package; their unit tests live next to the quantizers).
const FIXTURE_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn dequantize_row_matches_gguf_package_bit_exactly() {
    for ty in FIXTURE_TYPES {
        let f = load(ty);
        let mut out = vec![0f32; f.num_cols];
        for r in 0..f.num_rows {
            // Dequantize from an odd address too: GGUF gives no alignment beyond 32 bytes per
            // tensor, and blocks of 18, 22, 34 ... bytes land anywhere.
            let row = &f.bytes[r * f.row_bytes()..(r + 1) * f.row_bytes()];
            let mut shifted = vec![0u8; row.len() + 1];
            shifted[1..].copy_from_slice(row);
            for src in [row, &shifted[1..]] {
                dequantize_row(ty, src, &mut out);
                let want = &f.dequant[r * f.num_cols..(r + 1) * f.num_cols];
                for (i, (&got, &want)) in out.iter().zip(want).enumerate() {
                    assert!(
                        same_bits(got, want),
                        "{ty} row {r} element {i}: got {got:e}, package {want:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn dequantize_row_handles_partial_rows_block_by_block() {
    // One block at a time gives the same values as whole rows.
    for ty in FIXTURE_TYPES {
        let f = load(ty);
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let mut out = vec![0f32; bs];
        for (b, want) in f.bytes.chunks_exact(ts).zip(f.dequant.chunks_exact(bs)) {
            dequantize_row(ty, b, &mut out);
            assert!(out.iter().zip(want).all(|(&g, &w)| same_bits(g, w)), "{ty}");
        }
    }
}

#[test]
fn quantize_row_matches_gguf_package_bytes() {
    let mut num_checked = 0;
    for ty in FIXTURE_TYPES {
        let f = load(ty);
        let Some(src) = &f.src else {
            // The package cannot quantize k-quants; ours are checked against ggml's own
            // quantizer in tests/kquant_quantize.rs.
            assert!(
                !ty.has_ref_quantizer() || ty.block_size() == QK_K,
                "{ty} fixture lacks its source data"
            );
            continue;
        };
        assert!(ty.has_ref_quantizer());
        let mut out = vec![0u8; f.row_bytes()];
        for r in 0..f.num_rows {
            quantize_row(ty, &src[r * f.num_cols..(r + 1) * f.num_cols], &mut out);
            let want = &f.bytes[r * f.row_bytes()..(r + 1) * f.row_bytes()];
            if let Some(i) = out.iter().zip(want).position(|(a, b)| a != b) {
                let bs = ty.type_size();
                panic!(
                    "{ty} row {r}: first difference at byte {i} (block {}):\n ours    {:?}\n package {:?}",
                    i / bs,
                    &out[i / bs * bs..(i / bs + 1) * bs],
                    &want[i / bs * bs..(i / bs + 1) * bs]
                );
            }
            num_checked += 1;
        }
    }
    assert_eq!(
        num_checked,
        8 * 4,
        "F32, F16, BF16 and Q4_0..Q8_0, 4 rows each"
    );
}

#[test]
fn fixtures_cover_the_corner_cases() {
    // Guard against a regenerated fixture silently losing its special blocks.
    let f = load(GgmlType::Q8_0);
    let src = f.src.as_ref().unwrap();
    let row3 = &src[3 * f.num_cols..4 * f.num_cols];
    assert!(row3[..32].iter().all(|&v| v == 0.0), "all-zero block");
    assert!(row3[32..64].iter().all(|&v| v == -0.75), "constant block");
    assert_eq!(row3[96], 127.0, "exact .5 ties block");
    let f = load(GgmlType::F16);
    assert!(
        f.src.as_ref().unwrap().iter().any(|v| v.is_nan()),
        "float specials"
    );
    let f = load(GgmlType::Q4_K);
    assert!(
        f.bytes[144 + 4..2 * 144].iter().all(|&b| b == 0xFF),
        "all-ones k-quant block"
    );
}
