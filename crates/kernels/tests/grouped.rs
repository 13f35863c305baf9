//! Grouped matmuls (`tokenmill_kernels::grouped`) against the ungrouped functions: every
//! group's output rows equal `matmul` / `matmul_silu_mul` run on that group's rows alone, bit
//! for bit, on every tier the CPU has and several pool sizes; rows in no group are left
//! untouched. Per-head matmuls (`[T, H, k]` inputs, head `h` its own weight) equal each
//! head's matmul over its gathered rows. Groups of 0, 1, a few and 32+ rows (the AMX tier's tiles, where the CPU has
//! them, take the last alone); Rows16 weights of one activation format share the pool job,
//! float weights and the GGUF layout beside Rows16 run alone.

use std::ops::Range;

use tokenmill_kernels::dispatch::{Kernels, Tier};
use tokenmill_kernels::glu::matmul_silu_mul_with;
use tokenmill_kernels::grouped::{
    matmul_grouped_with, matmul_per_head_with, matmul_silu_mul_grouped_with,
};
use tokenmill_kernels::matmul::{PackedMatrix, QMatrix, matmul_with};
use tokenmill_kernels::pool::ThreadPool;
use tokenmill_kernels::quant::GgmlType;
use tokenmill_kernels::quant::testing::{SplitMix64, random_weight_row};

/// A weight of `ty`, `n × k`, in the GGUF layout (`packed: false`) or Rows16.
struct Weight {
    ty: GgmlType,
    n: usize,
    k: usize,
    bytes: Vec<u8>,
    packed: Option<PackedMatrix>,
}

impl Weight {
    fn new(rng: &mut SplitMix64, ty: GgmlType, n: usize, k: usize, packed: bool) -> Weight {
        let bytes: Vec<u8> = (0..n).flat_map(|_| random_weight_row(rng, ty, k)).collect();
        let packed = packed.then(|| PackedMatrix::pack(&QMatrix::new(ty, n, k, &bytes)).unwrap());
        Weight {
            ty,
            n,
            k,
            bytes,
            packed,
        }
    }

    fn view(&self) -> QMatrix<'_> {
        match &self.packed {
            Some(p) => p.view(),
            None => QMatrix::new(self.ty, self.n, self.k, &self.bytes),
        }
    }
}

/// Row ranges of `sizes`, ascending, with a gap of `gap` rows before each.
fn ranges(sizes: &[usize], gap: usize) -> (Vec<Range<usize>>, usize) {
    let mut at = 0;
    let rows = sizes
        .iter()
        .map(|&s| {
            at += gap;
            at += s;
            at - s..at
        })
        .collect();
    (rows, at)
}

/// The groups' weights: `types[g % types.len()]` for group `g`, Rows16 unless `ggml` says so.
fn weights(
    rng: &mut SplitMix64,
    types: &[(GgmlType, bool)],
    groups: usize,
    n: usize,
    k: usize,
) -> Vec<Weight> {
    (0..groups)
        .map(|g| {
            let (ty, ggml) = types[g % types.len()];
            Weight::new(rng, ty, n, k, !ggml)
        })
        .collect()
}

/// The weight kinds of a call's groups, in turn: (type, GGUF layout instead of Rows16).
type Kinds = Vec<(GgmlType, bool)>;

const SIZES: [usize; 7] = [3, 0, 1, 17, 2, 40, 5];

/// Weight kinds mixed in one call: one activation format in Rows16 (shared job), and runs with
/// float or GGUF-layout weights beside them (alone).
fn mixes() -> Vec<(Kinds, usize)> {
    use GgmlType::*;
    vec![
        (vec![(Q4_K, false)], 512),
        (vec![(Q5_0, false)], 96),
        (vec![(Q4_1, false), (Q8_0, false), (Q4_0, false)], 96),
        (vec![(Q6_K, false), (Q4_K, false)], 256),
        (vec![(Q4_1, false), (F32, true), (Q4_1, true)], 64),
        (vec![(F16, true)], 64),
    ]
}

#[test]
fn grouped_matmul_is_each_groups_matmul() {
    let mut rng = SplitMix64::new(31);
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for (types, k) in mixes() {
            for gap in [0, 2] {
                let n = 37;
                let (rows, n_rows) = ranges(&SIZES, gap);
                let ws = weights(&mut rng, &types, rows.len(), n, k);
                let x: Vec<f32> = (0..n_rows * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
                for (tier, a8) in Tier::supported()
                    .into_iter()
                    .flat_map(|t| [(t, false), (t, true)])
                {
                    let kern = Kernels::new(tier).unwrap().with_a8(a8);
                    let mut got = vec![f32::NAN; n_rows * n];
                    matmul_grouped_with(&pool, &kern, &x, &mut got, rows.len(), |g| {
                        (rows[g].clone(), ws[g].view())
                    });
                    let mut want = vec![f32::NAN; n_rows * n];
                    for (r, w) in rows.iter().zip(&ws) {
                        let (xr, o) = (
                            &x[r.start * k..r.end * k],
                            &mut want[r.start * n..r.end * n],
                        );
                        matmul_with(&pool, &kern, xr, &w.view(), o);
                    }
                    assert_same(
                        &got,
                        &want,
                        &format!("{types:?} {tier} a8 {a8} gap {gap} {threads}t"),
                    );
                }
            }
        }
    }
}

#[test]
fn grouped_silu_mul_is_each_groups_silu_mul() {
    let mut rng = SplitMix64::new(32);
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for (types, k) in mixes() {
            let n = 100;
            let (rows, n_rows) = ranges(&SIZES, 1);
            let gates = weights(&mut rng, &types, rows.len(), n, k);
            let ups = weights(&mut rng, &types, rows.len(), n, k);
            let x: Vec<f32> = (0..n_rows * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
            for (tier, a8) in Tier::supported()
                .into_iter()
                .flat_map(|t| [(t, false), (t, true)])
            {
                let kern = Kernels::new(tier).unwrap().with_a8(a8);
                let mut got = vec![f32::NAN; n_rows * n];
                matmul_silu_mul_grouped_with(&pool, &kern, &x, &mut got, rows.len(), |g| {
                    (rows[g].clone(), gates[g].view(), ups[g].view())
                });
                let mut want = vec![f32::NAN; n_rows * n];
                for ((r, gate), up) in rows.iter().zip(&gates).zip(&ups) {
                    let (xr, o) = (
                        &x[r.start * k..r.end * k],
                        &mut want[r.start * n..r.end * n],
                    );
                    matmul_silu_mul_with(&pool, &kern, xr, &gate.view(), &up.view(), o);
                }
                assert_same(&got, &want, &format!("{types:?} {tier} a8 {a8} {threads}t"));
            }
        }
    }
}

#[test]
fn per_head_matmul_is_each_heads_matmul() {
    use GgmlType::*;
    let mut rng = SplitMix64::new(35);
    // (types by head, n, k): MLA's W_UK (512 × 128, Q5_0 in a Q4_K file) and W_UV (128 × 512).
    let cases: [(Kinds, usize, usize); 4] = [
        (vec![(Q5_0, false)], 96, 128),
        (vec![(Q4_K, false)], 40, 512),
        (vec![(Q8_0, false), (F32, true)], 48, 64),
        (vec![(F32, true)], 33, 64),
    ];
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for (types, n, k) in &cases {
            let (n, k) = (*n, *k);
            for (n_tok, heads) in [(1, 4), (5, 3), (17, 2)] {
                let ws = weights(&mut rng, types, heads, n, k);
                let x: Vec<f32> = (0..n_tok * heads * k)
                    .map(|_| rng.uniform(-1.0, 1.0))
                    .collect();
                for tier in Tier::supported() {
                    let kern = Kernels::new(tier).unwrap();
                    let mut got = vec![f32::NAN; n_tok * heads * n];
                    matmul_per_head_with(&pool, &kern, &x, &mut got, heads, |h| ws[h].view());
                    let mut want = vec![f32::NAN; n_tok * heads * n];
                    for (h, w) in ws.iter().enumerate() {
                        let xh: Vec<f32> = (0..n_tok)
                            .flat_map(|t| x[(t * heads + h) * k..][..k].to_vec())
                            .collect();
                        let mut oh = vec![0f32; n_tok * n];
                        matmul_with(&pool, &kern, &xh, &w.view(), &mut oh);
                        for (t, o) in oh.chunks_exact(n).enumerate() {
                            want[(t * heads + h) * n..][..n].copy_from_slice(o);
                        }
                    }
                    let what = format!("{types:?} {n}x{k} {n_tok}x{heads} {tier} {threads}t");
                    assert_same(&got, &want, &what);
                }
            }
        }
    }
}

/// Equal bit for bit, NaN (rows in no group) where the other has NaN.
fn assert_same(got: &[f32], want: &[f32], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

#[test]
#[should_panic(expected = "not ascending and disjoint")]
fn overlapping_groups_are_refused() {
    let mut rng = SplitMix64::new(33);
    let w = Weight::new(&mut rng, GgmlType::Q4_1, 16, 32, true);
    let x = vec![0.5f32; 4 * 32];
    let mut out = vec![0f32; 4 * 16];
    let rows = [0..3, 2..4];
    let pool = ThreadPool::new(2);
    let kern = Kernels::new(Tier::Scalar).unwrap();
    matmul_grouped_with(&pool, &kern, &x, &mut out, 2, |g| {
        (rows[g].clone(), w.view())
    });
}

#[test]
#[should_panic(expected = "not 16x32")]
fn groups_of_other_shapes_are_refused() {
    let mut rng = SplitMix64::new(34);
    let a = Weight::new(&mut rng, GgmlType::Q4_1, 16, 32, true);
    let b = Weight::new(&mut rng, GgmlType::Q4_1, 32, 32, true);
    let x = vec![0.5f32; 4 * 32];
    let mut out = vec![0f32; 4 * 16];
    let pool = ThreadPool::new(2);
    let kern = Kernels::new(Tier::Scalar).unwrap();
    matmul_grouped_with(&pool, &kern, &x, &mut out, 2, |g| {
        let w = if g == 0 { a.view() } else { b.view() };
        (2 * g..2 * g + 2, w)
    });
}
