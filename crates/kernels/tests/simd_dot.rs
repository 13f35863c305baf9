//! Differential tests of the kernel tiers: every tier this CPU supports against the scalar
//! reference twins of `quant::dot` / `quant::q8`, on odd shapes.
//!
//! Pairs: the 32-element weight formats against both ggml's Q8_0/Q8_1 partner and A16
//! (`matmul`'s format); the k-quants against Q8_K.
//!
//! Error budgets, per type:
//! * Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 (either activation format): the integer block sums are
//!   exact in every tier; only the
//!   f32 accumulation differs (per-lane FMAs over two interleaved accumulators, then a
//!   horizontal sum, versus the reference's block-by-block sum). Budget:
//!   `(nb + 16) · 2^-22 · Σ_b (|d_w d_a sumi_b| + |m_b s_b|)` — a few ulps per addition, bounded
//!   by `Σ |w_i a_i|` of the dequantized rows (plus the `m · s` terms of Q8_1 / A16);
//! * Q4_K / Q5_K / Q6_K: bit-identical (same exact i32 super-block sums, same f32 operations);
//! * Q2_K / Q3_K: every tier runs the reference, so bit-identical too;
//! * activation quantizers (A8 too): byte-identical, ties included;
//! * tiles (1, 2, 5 weight rows × 1..=4 activation rows, strided output): every output matches
//!   a one-row call — bit for bit where the accumulation order is the same, else within the
//!   accumulation budget — and nothing outside the tile is written;
//! * A16 tiles of 2, 3 and 4 activation rows: a row's bits do not depend on which rows share
//!   its tile.

use tokenmill_kernels::dispatch::{ActFormat, Kernels, Tier};
use tokenmill_kernels::quant::testing::{SplitMix64, random_f32_row, random_weight_row};
use tokenmill_kernels::quant::{
    A16_QMAX, F16Le, GgmlType, a16_blocks_mut, dequantize_row, quantize_row, quantize_row_a16,
};

const Q32_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];
const K_TYPES: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn tiers() -> Vec<Kernels> {
    let tiers: Vec<Kernels> = Tier::supported()
        .into_iter()
        .map(|t| Kernels::new(t).unwrap())
        .collect();
    eprintln!(
        "tiers: {:?}",
        tiers.iter().map(|k| k.tier().name()).collect::<Vec<_>>()
    );
    tiers
}

fn scalar() -> Kernels {
    Kernels::new(Tier::Scalar).unwrap()
}

/// Activations with zero, constant and large blocks mixed in.
fn activations(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    let mut x = random_f32_row(rng, n, 1.0);
    for (b, chunk) in x.chunks_mut(32).enumerate() {
        match b % 5 {
            1 => chunk.fill(0.0),
            3 => chunk.fill(-0.375),
            4 => chunk.iter_mut().for_each(|v| *v *= 100.0),
            _ => {}
        }
    }
    x
}

/// A weight row of raw random bytes with moderate f16 scales (every bit pattern of the quants,
/// including Q8_0's -128), for the 32-element formats.
fn raw_q32_row(rng: &mut SplitMix64, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
    rng.fill_bytes(&mut bytes);
    let has_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    for b in bytes.chunks_mut(ty.type_size()) {
        b[..2].copy_from_slice(&rng.f16_scale(1e-3, 1e-1).0);
        if has_min {
            b[2..4].copy_from_slice(&rng.f16_scale(1e-3, 1e-1).0);
        }
    }
    bytes
}

fn quantize_act(k: &Kernels, act: ActFormat, x: &[f32]) -> Vec<u8> {
    let mut y = vec![0u8; x.len() / act.block_size() * act.block_bytes()];
    k.quantize_act(act, x, &mut y);
    y
}

/// The activation formats weight type `ty` pairs with: ggml's partner, and A16 for the
/// 32-element formats.
fn acts(ty: GgmlType) -> Vec<ActFormat> {
    let mut v = vec![ActFormat::ggml_partner(ty).unwrap()];
    if ty.block_size() == 32 {
        v.push(ActFormat::A16);
    }
    v
}

/// `Σ |w_i a_i|` of the dequantized rows, plus `Σ |m_b s_b|` for Q4_1 / Q5_1.
fn magnitude(ty: GgmlType, act: ActFormat, n: usize, w: &[u8], a: &[u8]) -> f64 {
    let (mut wd, mut ad) = (vec![0f32; n], vec![0f32; n]);
    dequantize_row(ty, w, &mut wd);
    act.dequantize(a, &mut ad);
    let mut mag: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&w, &a)| (w as f64 * a as f64).abs())
        .sum();
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        for (wb, ab) in w.chunks(ty.type_size()).zip(a.chunks(act.block_bytes())) {
            let m = F16Le([wb[2], wb[3]]).to_f32() as f64;
            let s = match act {
                ActFormat::A16 => f32::from_le_bytes([ab[4], ab[5], ab[6], ab[7]]),
                _ => F16Le([ab[2], ab[3]]).to_f32(),
            } as f64;
            mag += (m * s).abs();
        }
    }
    mag
}

#[test]
fn q32_tiers_match_reference_within_accumulation_budget() {
    let reference = scalar();
    let mut rng = SplitMix64::new(0xD07);
    for k in tiers() {
        let mut worst = 0f64;
        for ty in Q32_TYPES {
            for act in acts(ty) {
                for nb in [1usize, 2, 3, 7, 18, 48, 129] {
                    let n = nb * 32;
                    let x = activations(&mut rng, n);
                    let a = quantize_act(&reference, act, &x);
                    for row in 0..6 {
                        let w = if row % 2 == 0 {
                            random_weight_row(&mut rng, ty, n)
                        } else {
                            raw_q32_row(&mut rng, ty, n)
                        };
                        let want = reference.vec_dot(ty, act, n, &w, &a) as f64;
                        let got = k.vec_dot(ty, act, n, &w, &a) as f64;
                        let budget =
                            (nb as f64 + 16.0) * 2f64.powi(-22) * magnitude(ty, act, n, &w, &a)
                                + 1e-30;
                        let err = (got - want).abs();
                        assert!(
                            err <= budget,
                            "{} {ty}·{act:?} nb={nb}: got {got:e} want {want:e} err {err:e} > {budget:e}",
                            k.tier()
                        );
                        worst = worst.max(err / budget);
                    }
                }
            }
        }
        eprintln!("{}: worst q32 error {:.3} of budget", k.tier(), worst);
    }
}

#[test]
fn k_quant_tiers_are_bit_identical_to_reference() {
    let reference = scalar();
    let mut rng = SplitMix64::new(0xC0FFEE);
    for k in tiers() {
        for ty in K_TYPES {
            for nb in [1usize, 2, 3, 5] {
                let n = nb * 256;
                let x = activations(&mut rng, n);
                let a = quantize_act(&reference, ActFormat::Q8_K, &x);
                for _ in 0..6 {
                    let w = random_weight_row(&mut rng, ty, n);
                    let want = reference.vec_dot(ty, ActFormat::Q8_K, n, &w, &a);
                    let got = k.vec_dot(ty, ActFormat::Q8_K, n, &w, &a);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} {ty} nb={nb}: {got:e} vs {want:e}",
                        k.tier()
                    );
                }
            }
        }
    }
}

#[test]
fn tiles_equal_one_row_calls() {
    let mut rng = SplitMix64::new(77);
    for k in tiers() {
        for ty in Q32_TYPES.into_iter().chain(K_TYPES) {
            for act in acts(ty) {
                let kern = k.dot_kernel(ty, act).unwrap();
                let nb = if ty.block_size() == 32 { 19 } else { 3 };
                let n = nb * ty.block_size();
                // Five contiguous weight rows.
                let w_rows: Vec<Vec<u8>> =
                    (0..5).map(|_| random_weight_row(&mut rng, ty, n)).collect();
                let w_all: Vec<u8> = w_rows.concat();
                let a_row = nb * kern.a_block_bytes;
                // Four activation rows, with a gap between rows (stride > row bytes).
                let stride = a_row + 7;
                let mut a = vec![0u8; 4 * stride];
                for j in 0..4 {
                    let x = activations(&mut rng, n);
                    k.quantize_act(act, &x, &mut a[j * stride..j * stride + a_row]);
                }
                let a_j = |j: usize| &a[j * stride..j * stride + a_row];
                for n_w in [1usize, 2, 5] {
                    for n_a in 1..=4 {
                        let out_stride = n_w + 3;
                        let mut out = vec![f32::NAN; n_a * out_stride];
                        let w = &w_all[..n_w * w_rows[0].len()];
                        kern.dot_tile_into(nb, w, n_w, &a, stride, n_a, &mut out, out_stride);
                        for j in 0..n_a {
                            for (i, w_i) in w_rows.iter().enumerate().take(n_w) {
                                let got = out[j * out_stride + i];
                                let single = k.vec_dot(ty, act, n, w_i, a_j(j));
                                // With one activation row, the kernels alternate two
                                // accumulators; with several they do not, so only the
                                // accumulation budget holds there.
                                let budget = (nb as f64 + 16.0)
                                    * 2f64.powi(-22)
                                    * magnitude(ty, act, n, w_i, a_j(j))
                                    + 1e-30;
                                let same = got.to_bits() == single.to_bits();
                                let close = ((got - single) as f64).abs() <= budget;
                                assert!(
                                    same || (n_a > 1 && close),
                                    "{} {ty}·{act:?} {n_w}x{n_a} tile ({i}, {j}): {got} vs {single}",
                                    k.tier()
                                );
                            }
                            // Outputs outside the tile are untouched.
                            for i in n_w..out_stride {
                                assert!(out[j * out_stride + i].is_nan());
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A row of a tile of several activation rows (a batch) must not depend on which rows share
/// its tile — what keeps a sequence's batched-decode logits independent of the rest of the
/// batch: the two-, three- and four-row kernels give the same bits, within the accumulation
/// budget of the scalar reference.
#[test]
fn a16_tile_rows_do_not_depend_on_their_group() {
    let reference = scalar();
    let mut rng = SplitMix64::new(0xB47C);
    for k in tiers() {
        for ty in Q32_TYPES {
            let kern = k.dot_kernel(ty, ActFormat::A16).unwrap();
            for nb in [1usize, 19, 48, 129] {
                let n = nb * 32;
                let w_rows: Vec<Vec<u8>> =
                    (0..3).map(|_| random_weight_row(&mut rng, ty, n)).collect();
                let w_all = w_rows.concat();
                let a_row = nb * kern.a_block_bytes;
                let stride = a_row + 5;
                let mut a = vec![0u8; 4 * stride];
                for j in 0..4 {
                    let x = activations(&mut rng, n);
                    k.quantize_act(ActFormat::A16, &x, &mut a[j * stride..j * stride + a_row]);
                }
                // Rows j0..j0 + n_a as one tile: out[j][i] for weight row i.
                let tile = |j0: usize, n_a: usize| {
                    let mut out = vec![f32::NAN; n_a * 3];
                    kern.dot_tile_into(nb, &w_all, 3, &a[j0 * stride..], stride, n_a, &mut out, 3);
                    out
                };
                let four = tile(0, 4);
                let groups = [tile(0, 2), tile(2, 2), tile(1, 3)];
                let firsts = [0usize, 2, 1];
                for (g, j0) in groups.iter().zip(firsts) {
                    for (jj, row) in g.chunks_exact(3).enumerate() {
                        let want = &four[(j0 + jj) * 3..(j0 + jj + 1) * 3];
                        for (i, (&got, &want)) in row.iter().zip(want).enumerate() {
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} {ty} nb={nb} row {} weight {i}: {got} in a group vs {want} in four",
                                k.tier(),
                                j0 + jj
                            );
                        }
                    }
                }
                for (j, row) in four.chunks_exact(3).enumerate() {
                    let a_j = &a[j * stride..j * stride + a_row];
                    for (i, w_i) in w_rows.iter().enumerate() {
                        let want = reference.vec_dot(ty, ActFormat::A16, n, w_i, a_j) as f64;
                        let budget = (nb as f64 + 16.0)
                            * 2f64.powi(-22)
                            * magnitude(ty, ActFormat::A16, n, w_i, a_j)
                            + 1e-30;
                        let err = (row[i] as f64 - want).abs();
                        assert!(
                            err <= budget,
                            "{} {ty} nb={nb}: {err:e} > {budget:e}",
                            k.tier()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn activation_quantizers_are_byte_identical_to_reference() {
    let reference = scalar();
    let mut rng = SplitMix64::new(3);
    // Exact ties: with amax = 127 the scale is 1 and x · (1/d) keeps the .5 fractions (Q8);
    // with amax = 2047, likewise for A16.
    let mut ties = vec![0f32; 256];
    for (i, v) in ties.iter_mut().enumerate() {
        *v = match i % 8 {
            0 => 127.0,
            1 => 2.5,
            2 => -2.5,
            3 => 0.5,
            4 => -0.5,
            5 => 126.5,
            6 => -3.5,
            _ => 1.4999999,
        };
    }
    let a16_ties: Vec<f32> = ties
        .iter()
        .map(|&v| if v == 127.0 { 2047.0 } else { v * 3.0 })
        .collect();
    let mut rows = vec![ties, a16_ties];
    for n in [32usize, 256, 576, 1536] {
        rows.push(activations(&mut rng, n));
        rows.push(random_f32_row(&mut rng, n, 1e-6));
    }
    for k in tiers() {
        for act in [
            ActFormat::Q8_0,
            ActFormat::Q8_1,
            ActFormat::Q8_K,
            ActFormat::A16,
            ActFormat::A8,
        ] {
            for x in rows.iter().filter(|x| x.len() % act.block_size() == 0) {
                let bytes = x.len() / act.block_size() * act.block_bytes();
                let (mut want, mut got) = (vec![0u8; bytes], vec![0u8; bytes]);
                match act {
                    ActFormat::Q8_0 => quantize_row(GgmlType::Q8_0, x, &mut want),
                    ActFormat::Q8_1 => quantize_row(GgmlType::Q8_1, x, &mut want),
                    ActFormat::Q8_K => quantize_row(GgmlType::Q8_K, x, &mut want),
                    ActFormat::A16 => quantize_row_a16(x, a16_blocks_mut(&mut want)),
                    ActFormat::A8 => tokenmill_kernels::quant::quantize_row_a8(
                        x,
                        tokenmill_kernels::quant::a8_blocks_mut(&mut want),
                    ),
                }
                k.quantize_act(act, x, &mut got);
                assert_eq!(got, want, "{} {act:?} n={}", k.tier(), x.len());
                reference.quantize_act(act, x, &mut got);
                assert_eq!(got, want, "scalar {act:?}");
            }
        }
    }
}

/// A16 blocks the model should never make but a bad file could: one so small that its scale
/// is subnormal and `1 / d` overflows (it quantizes to zeros, not to saturated quants), and
/// one holding an infinity (every quant 0). Every tier writes the reference's bytes, and no
/// quant leaves ±`A16_QMAX`, the range the AMX tier's digit split is exact on.
#[test]
fn a16_quantizers_agree_on_tiny_and_infinite_blocks() {
    let mut x = vec![0f32; 96];
    for (i, v) in x[..32].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 1e-37;
    }
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = i as f32 - 16.0;
    }
    x[40] = f32::INFINITY;
    x[64..].copy_from_slice(&random_f32_row(&mut SplitMix64::new(5), 32, 1.0));
    let bytes = 3 * ActFormat::A16.block_bytes();
    let mut want = vec![0u8; bytes];
    quantize_row_a16(&x, a16_blocks_mut(&mut want));
    let blocks = a16_blocks_mut(&mut want);
    assert!(
        blocks[0].quants().iter().all(|&q| q == 0),
        "{:?}",
        blocks[0]
    );
    assert!(
        blocks[1].quants().iter().all(|&q| q == 0),
        "{:?}",
        blocks[1]
    );
    assert!(blocks[2].quants().iter().any(|&q| q.abs() == A16_QMAX));
    for k in tiers() {
        let mut got = vec![0u8; bytes];
        k.quantize_act(ActFormat::A16, &x, &mut got);
        assert_eq!(got, want, "{}", k.tier());
    }
}

#[test]
fn f32_dot_tiers_agree() {
    let mut rng = SplitMix64::new(11);
    for k in tiers() {
        for n in [0usize, 1, 7, 8, 31, 33, 64, 100, 577] {
            let a = random_f32_row(&mut rng, n, 1.0);
            let b = random_f32_row(&mut rng, n, 1.0);
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum();
            let got = k.dot_f32(&a, &b) as f64;
            assert!(
                (got - exact).abs() <= (n as f64 + 8.0) * 2f64.powi(-23) * mag + 1e-30,
                "{} n={n}: {got} vs {exact}",
                k.tier()
            );
        }
    }
}

#[test]
fn tables_exist_only_for_supported_tiers() {
    for t in Tier::ALL {
        assert_eq!(Kernels::new(t).is_some(), t.is_supported(), "{t}");
        assert_eq!(Tier::from_name(t.name()), Some(t));
    }
    assert!(Tier::Scalar.is_supported());
    let best = tokenmill_kernels::dispatch::kernels().tier();
    assert_eq!(best, Tier::best());
    // AMX runs exactly when the CPU reports it and Linux granted the tile state.
    assert_eq!(
        Tier::Amx.is_supported(),
        Tier::amx_status().is_ok() && Tier::Avx512Vnni.is_supported()
    );
    for ty in GgmlType::ALL {
        assert_eq!(
            scalar().matmul_kernel(ty).is_some(),
            ty.vec_dot_type().is_some(),
            "{ty}"
        );
        let want = match ty.vec_dot_type() {
            None => None,
            Some(GgmlType::Q8_K) => Some(ActFormat::Q8_K),
            Some(_) => Some(ActFormat::A16),
        };
        assert_eq!(ActFormat::for_matmul(ty), want, "{ty}");
    }
}
