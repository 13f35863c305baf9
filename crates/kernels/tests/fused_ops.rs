//! Fused ops against their unfused compositions, every tier this CPU supports:
//! * `matmul_multi` (Q/K/V in one pass) equals one `matmul` per matrix, bit for bit — for
//!   one shared weight type, mixed types sharing an activation format (Q4_K + Q6_K, the
//!   fused path), mixed formats (Q4_1 + Q6_K, the fallback) and float weights;
//! * the SiLU gate of every tier against an f64 reference: relative `3e-6` — `e^-g` is
//!   `2^(-g·log2 e)`, and rounding the f32 argument costs `|g| · 2^-24 · log2 e` relative
//!   (~1.3e-6 at `|g| = 30`, where the gate is ~1e-12 anyway);
//! * `acc_rows` (MLA's `O += P · X` over strided rows) against an f64 reference, within
//!   `(n + 1) · 2^-23` of the sum of absolute terms; `dot_rows` (MLA's scores `Q · Kᵀ`)
//!   likewise, within `(cols + 1) · 2^-23`;
//! * `softmax_step` (MLA's online softmax over a row of scores) against the exact step in
//!   f64: the max exactly, weights, correction and sum within a relative `2e-6` (the f32
//!   argument of `2^x` costs `|x| · 2^-24 · ln 2` relative), weights below `2^-64` flushed to
//!   0, and the keys past `valid` zeroed.

use tokenmill_kernels::dispatch::{Kernels, Tier};
use tokenmill_kernels::matmul::{QMatrix, matmul_multi_with, matmul_with};
use tokenmill_kernels::pool::ThreadPool;
use tokenmill_kernels::quant::GgmlType;
use tokenmill_kernels::quant::testing::{SplitMix64, random_weight_row};

fn weights(rng: &mut SplitMix64, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows)
        .flat_map(|_| random_weight_row(rng, ty, cols))
        .collect()
}

#[test]
fn matmul_multi_equals_separate_matmuls() {
    use GgmlType::*;
    let mut rng = SplitMix64::new(11);
    let pool = ThreadPool::new(2);
    let type_sets: [&[GgmlType]; 5] = [
        &[Q4_1, Q4_1, Q4_1],
        &[Q4_K, Q4_K, Q6_K],
        &[Q4_1, Q6_K],
        &[F32, F32, F32],
        &[Q8_0],
    ];
    for types in type_sets {
        let k = 512;
        let rows = [96, 32, 33, 7];
        let data: Vec<Vec<u8>> = types
            .iter()
            .zip(rows)
            .map(|(&ty, n)| weights(&mut rng, ty, n, k))
            .collect();
        let ws: Vec<QMatrix> = types
            .iter()
            .zip(rows)
            .zip(&data)
            .map(|((&ty, n), d)| QMatrix::new(ty, n, k, d))
            .collect();
        let n_total: usize = ws.iter().map(|w| w.rows).sum();
        for n_tok in [1, 5, 17] {
            let x: Vec<f32> = (0..n_tok * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
            for tier in Tier::supported() {
                let kern = Kernels::new(tier).unwrap();
                let mut fused = vec![f32::NAN; n_tok * n_total];
                matmul_multi_with(&pool, &kern, &x, &ws, &mut fused);
                let mut col = 0;
                for w in &ws {
                    let mut one = vec![0f32; n_tok * w.rows];
                    matmul_with(&pool, &kern, &x, w, &mut one);
                    for t in 0..n_tok {
                        assert!(
                            fused[t * n_total + col..][..w.rows] == one[t * w.rows..][..w.rows],
                            "{types:?} {tier} {n_tok} tokens"
                        );
                    }
                    col += w.rows;
                }
            }
        }
    }
}

#[test]
fn silu_mul_tiers_match_reference() {
    let mut rng = SplitMix64::new(3);
    for n in [1, 7, 8, 15, 16, 17, 100, 1536] {
        let g: Vec<f32> = (0..n).map(|_| rng.uniform(-30.0, 30.0)).collect();
        let u: Vec<f32> = (0..n).map(|_| rng.uniform(-3.0, 3.0)).collect();
        let want: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| (g as f64 / (1.0 + (-g as f64).exp()) * u as f64) as f32)
            .collect();
        for tier in Tier::supported() {
            let mut out = vec![f32::NAN; n];
            Kernels::new(tier).unwrap().silu_mul(&g, &u, &mut out);
            for (i, (o, w)) in out.iter().zip(&want).enumerate() {
                let tol = 3e-6 * w.abs() + 1e-30;
                assert!((o - w).abs() <= tol, "{tier} n={n} [{i}]: {o} vs {w}");
            }
        }
    }
}

/// MLA's latent accumulation `O += P · X` (strided `X` rows) on every tier this CPU has
/// against an f64 reference, for shapes that exercise the 4-row blocks and the single rows
/// after them, the pairs of vectors, one vector and the scalar column tail: relative to the
/// sum of absolute terms, within `n · 2^-23`.
#[test]
fn acc_rows_tiers_match_reference() {
    use tokenmill_kernels::attention::AccRows;
    let mut rng = SplitMix64::new(5);
    for tier in Tier::ALL {
        if !Tier::supported().contains(&tier) {
            eprintln!("skipped: acc_rows_tiers_match_reference: tier {tier} (this CPU lacks it)");
        }
    }
    for (rows, cols, n) in [
        (1, 1, 1),
        (3, 8, 5),
        (4, 16, 32),
        (5, 40, 7),
        (16, 512, 32),
        (7, 33, 1),
    ] {
        let (p_stride, x_stride) = (n + 3, cols + 64);
        let s = AccRows {
            rows,
            cols,
            n,
            p_stride,
            x_stride,
        };
        let p: Vec<f32> = (0..rows * p_stride)
            .map(|_| rng.uniform(0.0, 1.0))
            .collect();
        let x: Vec<f32> = (0..n * x_stride).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let o0: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
        for tier in Tier::supported() {
            let mut o = o0.clone();
            Kernels::new(tier).unwrap().acc_rows(&s, &mut o, &p, &x);
            for h in 0..rows {
                for c in 0..cols {
                    let terms =
                        (0..n).map(|j| p[h * p_stride + j] as f64 * x[j * x_stride + c] as f64);
                    let (sum, mag) = terms.fold(
                        (o0[h * cols + c] as f64, o0[h * cols + c].abs() as f64),
                        |(s, m), t| (s + t, m + t.abs()),
                    );
                    let got = o[h * cols + c] as f64;
                    let tol = (n as f64 + 1.0) * f32::EPSILON as f64 * mag;
                    assert!(
                        (got - sum).abs() <= tol,
                        "{tier} {rows}x{cols} n={n} [{h}][{c}]: {got} vs {sum}"
                    );
                }
            }
        }
    }
}

/// MLA's scores `S = Q · Kᵀ` over strided rows on every tier this CPU has against an f64
/// reference, for shapes that exercise the 4-row × 4-key (or × 2) blocks, the single rows and
/// keys after them, and the column tail past the last vector: within `(cols + 1) · 2^-23` of
/// the sum of absolute terms; entries outside the shape are left as they were.
#[test]
fn dot_rows_tiers_match_reference() {
    use tokenmill_kernels::attention::DotRows;
    let mut rng = SplitMix64::new(6);
    for tier in Tier::ALL {
        if !Tier::supported().contains(&tier) {
            eprintln!("skipped: dot_rows_tiers_match_reference: tier {tier} (this CPU lacks it)");
        }
    }
    for (rows, n, cols) in [
        (1, 1, 1),
        (3, 5, 8),
        (4, 4, 16),
        (5, 7, 40),
        (16, 32, 576),
        (7, 1, 33),
        (9, 30, 100),
    ] {
        let (q_stride, k_stride, s_stride) = (cols + 5, cols + 64, n + 3);
        let d = DotRows {
            rows,
            n,
            cols,
            q_stride,
            k_stride,
            s_stride,
        };
        let q: Vec<f32> = (0..rows * q_stride)
            .map(|_| rng.uniform(-1.0, 1.0))
            .collect();
        let k: Vec<f32> = (0..n * k_stride).map(|_| rng.uniform(-2.0, 2.0)).collect();
        for tier in Tier::supported() {
            let mut s = vec![f32::NAN; rows * s_stride];
            Kernels::new(tier).unwrap().dot_rows(&d, &mut s, &q, &k);
            for i in 0..rows {
                for j in 0..s_stride {
                    let got = s[i * s_stride + j];
                    if j >= n {
                        assert!(got.is_nan(), "{tier}: [{i}][{j}] outside the shape written");
                        continue;
                    }
                    let terms =
                        (0..cols).map(|c| q[i * q_stride + c] as f64 * k[j * k_stride + c] as f64);
                    let (sum, mag) = terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()));
                    let tol = (cols as f64 + 1.0) * f32::EPSILON as f64 * mag;
                    assert!(
                        (got as f64 - sum).abs() <= tol,
                        "{tier} {rows}x{n}x{cols} [{i}][{j}]: {got} vs {sum}"
                    );
                }
            }
        }
    }
}

#[test]
fn softmax_step_tiers_match_reference() {
    let mut rng = SplitMix64::new(9);
    for tier in Tier::ALL {
        if !Tier::supported().contains(&tier) {
            eprintln!(
                "skipped: softmax_step_tiers_match_reference: tier {tier} (this CPU lacks it)"
            );
        }
    }
    let scale = 0.125 * std::f32::consts::LOG2_E;
    for (len, valid) in [
        (1, 0),
        (1, 1),
        (5, 3),
        (16, 16),
        (17, 17),
        (40, 33),
        (256, 200),
        (300, 300),
    ] {
        for (m0, l0) in [(f32::NEG_INFINITY, 0.0), (-3.0, 1.5), (40.0, 7.0)] {
            let mut raw: Vec<f32> = (0..len).map(|_| rng.uniform(-60.0, 60.0)).collect();
            if valid > 2 {
                raw[1] = -2000.0; // weight below 2^-64 of the max: flushed to exactly 0
            }
            // The exact step in f64.
            let xs: Vec<f64> = raw[..valid].iter().map(|&s| (s * scale) as f64).collect();
            let m_want = xs.iter().copied().fold(m0 as f64, f64::max);
            let p_want: Vec<f64> = xs.iter().map(|x| (x - m_want).exp2()).collect();
            let corr_want = if valid == 0 {
                1.0
            } else {
                (m0 as f64 - m_want).exp2()
            };
            let l_want = l0 as f64 * corr_want + p_want.iter().sum::<f64>();
            for tier in Tier::supported() {
                let (mut s, mut m, mut l) = (raw.clone(), m0, l0);
                let corr = Kernels::new(tier)
                    .unwrap()
                    .softmax_step(&mut s, valid, scale, &mut m, &mut l);
                let what = format!("{tier}, {valid} of {len} valid, m {m0}, l {l0}");
                assert!(
                    s[valid..].iter().all(|&v| v == 0.0),
                    "{what}: future keys not zeroed"
                );
                assert_eq!(m as f64, m_want.max(m0 as f64), "{what}: max");
                let close = |got: f32, want: f64| {
                    let tiny = want < 2f64.powi(-64);
                    if tiny {
                        got == 0.0 || (got as f64) < 2f64.powi(-60)
                    } else {
                        (got as f64 - want).abs() <= 2e-6 * want
                    }
                };
                for (j, (&got, &want)) in s.iter().zip(&p_want).enumerate() {
                    assert!(close(got, want), "{what}: weight {j}: {got} vs {want}");
                }
                if valid > 2 {
                    assert_eq!(s[1], 0.0, "{what}: a weight below 2^-64 is flushed");
                }
                assert!(
                    close(corr, corr_want),
                    "{what}: correction {corr} vs {corr_want}"
                );
                assert!(
                    (l as f64 - l_want).abs() <= 2e-6 * l_want,
                    "{what}: sum {l} vs {l_want}"
                );
            }
        }
    }
}
