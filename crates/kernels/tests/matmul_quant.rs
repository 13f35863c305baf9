//! Differential tests of `matmul` over every weight type, kernel tier and a few pool sizes.
//!
//! * Against the reference per element: `out[t][r]` equals the scalar reference
//!   `vec_dot(w_r, quantize(x_t))` (A16 or Q8_K activations) — bit for bit on the scalar tier, within the f32 accumulation
//!   budget of `tests/simd_dot.rs` on the SIMD tiers (float weights: within f32 rounding of
//!   the f64 dot).
//! * Against the f32 product of the dequantized weight and the *unquantized* activations,
//!   within the budget of activation quantization: per block, `Σ_i |w_i|` times one
//!   quantization step — `amax / 2047` for A16 (the 32-element formats), `amax / 127` for
//!   Q8_K (the k-quants) — twice the half-step bound, plus the accumulation budget.
//! * Deterministic: the same tier gives bit-identical outputs on 1, 2 and 3 threads, because
//!   an output never depends on how rows are chunked or tiled.
//!
//! Shapes are odd on purpose: one row and one block; row counts that are not multiples of the
//! tile, the chunk or a Rows16 group; token counts 1, 7 and 33 (not multiples of the four- or
//! eight-row kernels).
//!
//! Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K also run repacked into the Rows16 layout
//! ([`PackedMatrix`], what the model loads them as), against A16 references computed on the GGUF
//! rows (the K-quants too: their Rows16 kernels take A16, not Q8_K); and a Rows16 output must not depend on the
//! other token rows of the call (batch invariance).

use tokenmill_kernels::dispatch::{ActFormat, Kernels, Tier};
use tokenmill_kernels::matmul::{Layout, PackedMatrix, QMatrix, matmul, matmul_with};
use tokenmill_kernels::pool::ThreadPool;
use tokenmill_kernels::quant::GgmlType;
use tokenmill_kernels::quant::testing::{SplitMix64, random_f32_row, random_weight_row};

const TYPES: [GgmlType; 13] = [
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
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];

/// The types with a Rows16 layout.
const ROWS16_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// `(n rows, k columns in blocks, n_tokens)`. The last has rows long enough that a chunk is
/// several weight tiles (with a ragged last tile).
const SHAPES: [(usize, usize, usize); 5] =
    [(1, 1, 1), (7, 2, 7), (37, 3, 33), (150, 2, 5), (23, 40, 9)];

struct Case {
    ty: GgmlType,
    n: usize,
    k: usize,
    t: usize,
    w: Vec<u8>,
    x: Vec<f32>,
    /// The weight repacked into Rows16, when the case runs in that layout.
    packed: Option<PackedMatrix>,
}

impl Case {
    fn new(rng: &mut SplitMix64, ty: GgmlType, n: usize, blocks: usize, t: usize) -> Case {
        let k = blocks
            * if ty.block_size() == 1 {
                32
            } else {
                ty.block_size()
            };
        let w: Vec<u8> = (0..n).flat_map(|_| random_weight_row(rng, ty, k)).collect();
        let mut x = random_f32_row(rng, t * k, 1.0);
        // A zero token row and a block of large values, when there is room.
        if t > 2 {
            x[k..2 * k].fill(0.0);
            x[..k.min(32)].iter_mut().for_each(|v| *v *= 50.0);
        }
        Case {
            ty,
            n,
            k,
            t,
            w,
            x,
            packed: None,
        }
    }

    /// The case in `layout` (`None` if its type has no such layout).
    fn in_layout(mut self, layout: Layout) -> Option<Case> {
        if layout == Layout::Rows16 {
            self.packed = Some(PackedMatrix::pack(&self.ggml())?);
        }
        Some(self)
    }

    /// The weight as stored in GGUF.
    fn ggml(&self) -> QMatrix<'_> {
        QMatrix::new(self.ty, self.n, self.k, &self.w)
    }

    /// The weight `matmul` runs on: repacked, or as stored.
    fn matrix(&self) -> QMatrix<'_> {
        self.packed
            .as_ref()
            .map_or_else(|| self.ggml(), |p| p.view())
    }

    fn run(&self, pool: &ThreadPool, kernels: &Kernels) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.t * self.n];
        matmul_with(pool, kernels, &self.x, &self.matrix(), &mut out);
        out
    }

    /// The activation format `matmul` quantizes to for this case: A16 for every Rows16 type.
    fn act(&self) -> Option<ActFormat> {
        match self.packed {
            Some(_) => Some(ActFormat::A16),
            None => ActFormat::for_matmul(self.ty),
        }
    }

    fn w_row(&self, r: usize) -> Vec<f32> {
        let mut row = vec![0f32; self.k];
        self.matrix().dequantize_row_into(r, &mut row);
        row
    }
}

/// The scalar reference for one output, and its accumulation budget.
fn reference(case: &Case, t: usize, r: usize) -> (f64, f64) {
    let k = case.k;
    let x = &case.x[t * k..(t + 1) * k];
    let w = case.ggml().row(r);
    let wd = case.w_row(r);
    let Some(act) = case.act() else {
        let exact: f64 = wd.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mag: f64 = wd
            .iter()
            .zip(x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        return (exact, (k as f64 + 8.0) * 2f64.powi(-23) * mag + 1e-30);
    };
    let scalar = Kernels::new(Tier::Scalar).unwrap();
    let mut a = vec![0u8; k / act.block_size() * act.block_bytes()];
    // (`vec_dot` of Q4_K / Q6_K with A16 is the scalar tier's reference of the Rows16 kernels.)
    scalar.quantize_act(act, x, &mut a);
    let want = scalar.vec_dot(case.ty, act, k, w, &a) as f64;
    let mut ad = vec![0f32; k];
    act.dequantize(&a, &mut ad);
    let mag: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    // The `m · s` terms are at most Σ|w| · amax; fold them into the magnitude generously.
    let mag = mag + quant_budget(&wd, x, act.block_size(), 1.0);
    let nb = (k / case.ty.block_size()) as f64;
    (want, (nb + 16.0) * 2f64.powi(-22) * mag + 1e-30)
}

/// `Σ_blocks Σ_i |w_i| · amax_block(x) / levels`: one quantization step per element.
fn quant_budget(w: &[f32], x: &[f32], block: usize, levels: f64) -> f64 {
    w.chunks(block)
        .zip(x.chunks(block))
        .map(|(wb, xb)| {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            wb.iter().map(|&v| (v as f64).abs()).sum::<f64>() * amax / levels
        })
        .sum()
}

#[test]
fn matmul_matches_reference_on_every_tier_and_pool() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut rng = SplitMix64::new(0xAB);
    for (ty, layout) in cases() {
        for (n, blocks, t) in SHAPES {
            let Some(case) = Case::new(&mut rng, ty, n, blocks, t).in_layout(layout) else {
                continue;
            };
            let refs: Vec<(f64, f64)> = (0..t)
                .flat_map(|ti| (0..n).map(move |r| (ti, r)))
                .map(|(ti, r)| reference(&case, ti, r))
                .collect();
            for tier in Tier::supported() {
                let kernels = Kernels::new(tier).unwrap();
                let first = case.run(&pools[0], &kernels);
                for pool in &pools[1..] {
                    let other = case.run(pool, &kernels);
                    assert!(
                        first
                            .iter()
                            .zip(&other)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{tier} {ty} {layout:?} {n}x{} T={t}: {} threads differ from 1",
                        case.k,
                        pool.num_threads()
                    );
                }
                for (i, (&got, &(want, budget))) in first.iter().zip(&refs).enumerate() {
                    let err = (got as f64 - want).abs();
                    let exact_tier = tier == Tier::Scalar && ty.vec_dot_type().is_some();
                    assert!(
                        if exact_tier {
                            got as f64 == want
                        } else {
                            err <= budget
                        },
                        "{tier} {ty} {layout:?} {n}x{} T={t} out[{i}]: {got:e} vs {want:e} (budget {budget:e})",
                        case.k
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_is_close_to_the_f32_product() {
    let pool = ThreadPool::new(2);
    let kernels = tokenmill_kernels::dispatch::kernels();
    let mut rng = SplitMix64::new(0xF32);
    for (ty, layout) in cases() {
        let Some(case) = Case::new(&mut rng, ty, 33, 3, 7).in_layout(layout) else {
            continue;
        };
        let out = case.run(&pool, kernels);
        let act = case.act();
        let block = act.map_or(32, |a| a.block_size());
        // A16 has 2047 levels a side, Q8_K 127.
        let levels = if act == Some(ActFormat::A16) {
            tokenmill_kernels::quant::A16_QMAX as f64
        } else {
            127.0
        };
        for t in 0..case.t {
            let x = &case.x[t * case.k..(t + 1) * case.k];
            for r in 0..case.n {
                let wd = case.w_row(r);
                let exact: f64 = wd.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wd
                    .iter()
                    .zip(x)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let mut budget = 1e-5 * mag + 1e-30;
                if act.is_some() {
                    budget += quant_budget(&wd, x, block, levels);
                }
                let got = out[t * case.n + r] as f64;
                assert!(
                    (got - exact).abs() <= budget,
                    "{ty} t={t} r={r}: {got:e} vs {exact:e} (budget {budget:e})"
                );
            }
        }
    }
}

/// Every type in GGUF layout, and the Rows16 types repacked too.
fn cases() -> impl Iterator<Item = (GgmlType, Layout)> {
    TYPES
        .into_iter()
        .flat_map(|ty| [(ty, Layout::Ggml), (ty, Layout::Rows16)])
}

/// A token row's Rows16 output is bit-identical whatever else is in the call: alone, or at
/// any position of a batch (any group of the eight-row kernel, any remainder).
#[test]
fn rows16_outputs_do_not_depend_on_the_other_token_rows() {
    let pool = ThreadPool::new(2);
    let mut rng = SplitMix64::new(0xB1);
    for ty in ROWS16_TYPES {
        let case = Case::new(&mut rng, ty, 37, 5, 19)
            .in_layout(Layout::Rows16)
            .unwrap();
        for tier in Tier::supported() {
            let kernels = Kernels::new(tier).unwrap();
            let all = case.run(&pool, &kernels);
            for t in 0..case.t {
                for (t0, t1) in [(t, t + 1), (t.saturating_sub(3), (t + 2).min(case.t))] {
                    let x = &case.x[t0 * case.k..t1 * case.k];
                    let mut out = vec![f32::NAN; (t1 - t0) * case.n];
                    matmul_with(&pool, &kernels, x, &case.matrix(), &mut out);
                    let got = &out[(t - t0) * case.n..(t - t0 + 1) * case.n];
                    let want = &all[t * case.n..(t + 1) * case.n];
                    assert!(
                        got.iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{tier} {ty} token {t} of rows {t0}..{t1}"
                    );
                }
            }
        }
    }
}

/// Dequantizing a Rows16 row gives the GGUF row's values.
#[test]
fn rows16_rows_dequantize_like_the_gguf_rows() {
    let mut rng = SplitMix64::new(0xDE);
    for ty in ROWS16_TYPES {
        let case = Case::new(&mut rng, ty, 21, 3, 1)
            .in_layout(Layout::Rows16)
            .unwrap();
        let (mut a, mut b) = (vec![0f32; case.k], vec![0f32; case.k]);
        for r in 0..case.n {
            case.ggml().dequantize_row_into(r, &mut a);
            case.matrix().dequantize_row_into(r, &mut b);
            assert_eq!(a, b, "{ty} row {r}");
        }
    }
}

#[test]
fn global_matmul_entry_point_and_empty_inputs() {
    let mut rng = SplitMix64::new(5);
    let case = Case::new(&mut rng, GgmlType::Q4_1, 40, 18, 3);
    let mut out = vec![0f32; case.t * case.n];
    matmul(&case.x, &case.matrix(), &mut out);
    let kernels = tokenmill_kernels::dispatch::kernels();
    assert_eq!(out, case.run(&ThreadPool::new(1), kernels));
    // Zero tokens: nothing to do.
    let mut empty: Vec<f32> = Vec::new();
    matmul(&[], &case.matrix(), &mut empty);
}

/// The Rows16 types, all with an A8 reference (`rows16::vec_dot_a8`).
const A8_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// The A8 reference of one output: `vec_dot_a8` of the packed row and the scalar A8 quants.
fn a8_reference(case: &Case, t: usize, r: usize) -> f64 {
    use tokenmill_kernels::quant::rows16::{GROUP, vec_dot_a8};
    let k = case.k;
    let x = &case.x[t * k..(t + 1) * k];
    let scalar = Kernels::new(Tier::Scalar).unwrap();
    let mut a = vec![0u8; k / 32 * ActFormat::A8.block_bytes()];
    scalar.quantize_act(ActFormat::A8, x, &mut a);
    let nb = k / case.ty.block_size();
    let group =
        &case.packed.as_ref().unwrap().view().data[r / GROUP * nb * GROUP * case.ty.type_size()..];
    vec_dot_a8(
        case.ty,
        nb,
        group,
        r % GROUP,
        tokenmill_kernels::quant::a8_blocks(&a),
    ) as f64
}

/// The A8 kernels' integer sums hold at their extremes: every weight quant at its largest
/// stored value against activations of all +1 and all −1 (every A8 quant ±127). A kernel that
/// kept more products in an i16 lane than fit (the AVX2 kernels widen 4-bit blocks once, Q5_0
/// twice, Q6_K every two `vpmaddubsw`) would wrap here, far outside the budget; random weights
/// and activations would not find it. Q6_K's sub-block scales are −128, the largest i8 in
/// magnitude (the AVX2 kernel multiplies its i16 sums by them).
#[test]
fn a8_kernels_hold_the_largest_block_sums() {
    use tokenmill_kernels::quant::rows16::GROUP;
    let pool = ThreadPool::new(1);
    let mut rng = SplitMix64::new(0x5A7);
    for ty in A8_TYPES {
        let mut case = Case::new(&mut rng, ty, GROUP, 2, 2);
        let one = half::f16::from_f32(1.0).to_le_bytes();
        // The block's f16 scales (and Q6_K's i8 sub-block scales); every other byte 0xFF.
        let scales: &[(usize, &[u8])] = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[(0, &one)],
            GgmlType::Q4_1 => &[(0, &one), (2, &one)],
            GgmlType::Q4_K => &[(0, &one), (2, &one)],
            GgmlType::Q6_K => &[(192, &[0x80; 16]), (208, &one)],
            _ => unreachable!(),
        };
        for b in case.w.chunks_mut(ty.type_size()) {
            b.fill(0xFF);
            for &(at, v) in scales {
                b[at..at + v.len()].copy_from_slice(v);
            }
        }
        if ty == GgmlType::Q8_0 {
            // Its largest quant is 127 (0xFF is −1).
            case.w.chunks_mut(34).for_each(|b| b[2..].fill(0x7F));
        }
        let k = case.k;
        case.x[..k].fill(1.0);
        case.x[k..].fill(-1.0);
        let case = case.in_layout(Layout::Rows16).unwrap();
        for tier in Tier::supported() {
            let kernels = Kernels::new(tier).unwrap().with_a8(true);
            if kernels.matmul_kernel_for(&case.matrix()).unwrap().act != ActFormat::A8 {
                continue;
            }
            let got = case.run(&pool, &kernels);
            for (i, &got) in got.iter().enumerate() {
                let want = a8_reference(&case, i / GROUP, i % GROUP);
                assert!(
                    (got as f64 - want).abs() <= 1e-5 * want.abs(),
                    "{tier} {ty} out[{i}]: {got:e} vs {want:e}"
                );
            }
        }
    }
}

/// With `with_a8(true)`, Rows16 weights run against 8-bit A8 activations on every tier that
/// has the kernel (all but Q8_0 on the 256-bit tiers, which keep A16 and are named as
/// skipped): each output matches the A8 reference within the accumulation budget
/// (bit for bit on the scalar tier), does not depend on the thread count or the other token
/// rows, and is the f32 product within one 8-bit step per element.
#[test]
fn a8_matmul_matches_its_reference_where_a_tier_has_it() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut rng = SplitMix64::new(0xA8);
    // SHAPES, and 2, 3, 4 and 6 token rows (every width of the eight-row kernel is checked).
    let shapes = SHAPES.into_iter().chain([2, 3, 4, 6].map(|t| (21, 2, t)));
    for ty in A8_TYPES {
        for (n, blocks, t) in shapes.clone() {
            let mut case = Case::new(&mut rng, ty, n, blocks, t);
            if ty == GgmlType::Q8_0 {
                // An i8 quant of −128 (no quantizer writes one, a file may): biased to 0.
                case.w
                    .chunks_mut(34)
                    .for_each(|b| b[2 + b[3] as usize % 32] = 0x80);
            }
            let case = case.in_layout(Layout::Rows16).unwrap();
            let refs: Vec<f64> = (0..t)
                .flat_map(|ti| (0..n).map(move |r| (ti, r)))
                .map(|(ti, r)| a8_reference(&case, ti, r))
                .collect();
            for tier in Tier::supported() {
                let kernels = Kernels::new(tier).unwrap().with_a8(true);
                let act = kernels.matmul_kernel_for(&case.matrix()).unwrap().act;
                // What the serve log reports is what runs.
                assert_eq!(
                    kernels.rows16_types_at_12_bits().contains(&ty),
                    act != ActFormat::A8,
                    "{tier} {ty}"
                );
                if act != ActFormat::A8 {
                    if (n, blocks, t) == SHAPES[0] {
                        eprintln!("skipped: {tier} has no A8 kernel for Rows16 {ty} (runs A16)");
                    }
                    // Only Q8_0 on the 256-bit tiers runs A16 (its biased bytes would
                    // saturate `vpmaddubsw`).
                    assert!(
                        ty == GgmlType::Q8_0 && matches!(tier, Tier::Avx2 | Tier::AvxVnni),
                        "{tier} {ty} should run A8"
                    );
                    continue;
                }
                let first = case.run(&pools[0], &kernels);
                assert!(
                    first
                        .iter()
                        .zip(&case.run(&pools[1], &kernels))
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{tier} {ty} {n}x{} T={t}: 3 threads differ from 1",
                    case.k
                );
                for (i, (&got, &want)) in first.iter().zip(&refs).enumerate() {
                    let (ti, r) = (i / n, i % n);
                    let x = &case.x[ti * case.k..(ti + 1) * case.k];
                    let wd = case.w_row(r);
                    let mag: f64 = wd
                        .iter()
                        .zip(x)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum::<f64>()
                        + quant_budget(&wd, x, 32, 1.0);
                    let budget = (case.k as f64 / 32.0 + 16.0) * 2f64.powi(-22) * mag + 1e-30;
                    let ok = if tier == Tier::Scalar {
                        got as f64 == want
                    } else {
                        (got as f64 - want).abs() <= budget
                    };
                    assert!(
                        ok,
                        "{tier} {ty} {n}x{} T={t} out[{i}]: {got:e} vs {want:e} (budget {budget:e})",
                        case.k
                    );
                    // Against the unquantized product: one 8-bit step per element.
                    let exact: f64 = wd.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let qb = quant_budget(&wd, x, 32, 127.0) + 1e-5 * mag;
                    assert!(
                        (got as f64 - exact).abs() <= qb,
                        "{tier} {ty} out[{i}]: {got:e} vs f32 {exact:e} ({qb:e})"
                    );
                }
                // Batch invariance: each token row alone gives the same bits.
                for ti in 0..t {
                    let x = &case.x[ti * case.k..(ti + 1) * case.k];
                    let mut out = vec![f32::NAN; n];
                    matmul_with(&pools[0], &kernels, x, &case.matrix(), &mut out);
                    assert!(
                        out.iter()
                            .zip(&first[ti * n..(ti + 1) * n])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{tier} {ty} token {ti} alone"
                    );
                }
            }
        }
    }
}
