//! Differential test of the k-quant weight quantizers (Q2_K..Q6_K) against ggml's own
//! `quantize_row_q*_K_ref`, run by `scripts/golden/make_kquant_vectors.py` through the peer
//! llama.cpp build (file format documented there).
//!
//! Tolerance: **byte-exact**. The Rust port performs the same f32 operations in the same order
//! (no FMA contraction in Rust), so every block must carry the same bytes as ggml's; a
//! difference names the row, block and both byte strings.

use std::path::PathBuf;

use tokenmill_kernels::quant::{GgmlType, dequantize_row, quantize_row};

struct Fixture {
    num_rows: usize,
    num_cols: usize,
    src: Vec<f32>,
    bytes: Vec<u8>,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

fn load(ty: GgmlType) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "tests/fixtures/kquant/{}.bin",
        ty.name().to_lowercase()
    ));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..4], b"TMKQ");
    assert_eq!(u32_at(&b, 4), 1, "fixture version");
    assert_eq!(GgmlType::from_id(u32_at(&b, 8)), Some(ty));
    let (num_rows, num_cols) = (u32_at(&b, 12) as usize, u32_at(&b, 16) as usize);
    let n = num_rows * num_cols;
    let src: Vec<f32> = b[20..20 + 4 * n]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let bytes = b[20 + 4 * n..].to_vec();
    assert_eq!(
        bytes.len() as u64,
        num_rows as u64 * ty.bytes_for(num_cols as u64).unwrap()
    );
    Fixture {
        num_rows,
        num_cols,
        src,
        bytes,
    }
}

const TYPES: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn k_quantizers_match_ggml_bytes() {
    for ty in TYPES {
        let f = load(ty);
        let row_bytes = f.bytes.len() / f.num_rows;
        let mut out = vec![0u8; row_bytes];
        for r in 0..f.num_rows {
            quantize_row(ty, &f.src[r * f.num_cols..(r + 1) * f.num_cols], &mut out);
            let want = &f.bytes[r * row_bytes..(r + 1) * row_bytes];
            if let Some(i) = out.iter().zip(want).position(|(a, b)| a != b) {
                let bs = ty.type_size();
                let blk = i / bs;
                panic!(
                    "{ty} row {r}: first difference at byte {i} (block {blk}):\n ours {:?}\n ggml {:?}",
                    &out[blk * bs..(blk + 1) * bs],
                    &want[blk * bs..(blk + 1) * bs]
                );
            }
        }
    }
}

/// Round-trip error budgets per type on the fixture's normal row: relative rms error of
/// dequantize(quantize(x)) against x.
#[test]
fn k_quant_round_trip_error_budgets() {
    for (ty, budget) in [
        (GgmlType::Q2_K, 0.45),
        (GgmlType::Q3_K, 0.25),
        (GgmlType::Q4_K, 0.12),
        (GgmlType::Q5_K, 0.06),
        (GgmlType::Q6_K, 0.03),
    ] {
        let f = load(ty);
        let x = &f.src[..f.num_cols];
        let mut q = vec![0u8; f.bytes.len() / f.num_rows];
        quantize_row(ty, x, &mut q);
        let mut y = vec![0f32; f.num_cols];
        dequantize_row(ty, &q, &mut y);
        let se: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let norm: f32 = x.iter().map(|a| a * a).sum();
        let rel = (se / norm).sqrt();
        assert!(rel < budget, "{ty}: relative rms error {rel} over {budget}");
    }
}
