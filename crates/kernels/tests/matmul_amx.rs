//! The AMX tier's matmul against its plain twin, the AVX-512 VNNI Rows16 kernels: every output
//! bit-identical (the tiles compute the same exact integer block sums, and the f32 side repeats
//! the VNNI kernel's operations in its order), for each weight type the tiles take (Q4_0, Q4_1,
//! Q5_0, Q8_0, Q4_K), on shapes around the tile sizes (activation rows from the tier's
//! threshold, 16·m ± 1, partial weight groups, one block and many), with extreme activations
//! (quants of ±2047, whose high digit `q >> 4` is -128 or 127 and low digit 1 or 15) and
//! Q8_0 weights of -128, on 1
//! and 2 threads, and inside a fused multi-matrix call. The reference-twin and batch-invariance tests
//! of `tests/matmul_quant.rs` run on this tier too.
//!
//! On a CPU without AMX (or where Linux refuses the tile state) every test here says it was
//! skipped, and why.

use tokenmill_kernels::dispatch::{Kernels, Tier};
use tokenmill_kernels::matmul::{PackedMatrix, QMatrix, matmul_multi_with, matmul_with};
use tokenmill_kernels::pool::ThreadPool;
use tokenmill_kernels::quant::GgmlType;
use tokenmill_kernels::quant::testing::{SplitMix64, random_f32_row, random_weight_row};

const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
];

/// The AMX tier and its twin, or `None` (after saying why) where this CPU cannot run it.
fn tiers(test: &str) -> Option<(Kernels, Kernels)> {
    match Tier::amx_status() {
        Ok(()) => Some((
            Kernels::new(Tier::Amx).expect("AMX tier"),
            Kernels::new(Tier::Avx512Vnni).expect("the AMX tier implies AVX-512 VNNI"),
        )),
        Err(why) => {
            eprintln!("skipped: {test}: the amx tier cannot run here ({why})");
            None
        }
    }
}

fn weights(rng: &mut SplitMix64, ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..n).flat_map(|_| random_weight_row(rng, ty, k)).collect();
    if ty == GgmlType::Q8_0 && n > 0 {
        // A quant of -128 in every block of the first row (bytes 2..34 of a 34-byte block).
        for b in 0..k / 32 {
            w[b * 34 + 2 + b % 32] = 0x80;
        }
    }
    w
}

fn activations(rng: &mut SplitMix64, t: usize, k: usize) -> Vec<f32> {
    let mut x = random_f32_row(rng, t * k, 1.0);
    if t > 2 {
        // A zero row, a row of one large value per block (quants of ±2047 beside small ones),
        // and a row of equal negative values (every quant -2047: high digit -128).
        x[k..2 * k].fill(0.0);
        for (j, v) in x[2 * k..3 * k].iter_mut().enumerate() {
            if j % 32 == 5 {
                *v = if j % 64 == 5 { 300.0 } else { -300.0 };
            }
        }
    }
    if t > 3 {
        x[3 * k..4 * k].fill(-2.5);
    }
    x
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn amx_matmul_is_bit_identical_to_the_vnni_kernels() {
    let Some((amx, vnni)) = tiers("amx_matmul_is_bit_identical_to_the_vnni_kernels") else {
        return;
    };
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut rng = SplitMix64::new(0xA3);
    assert_eq!(
        tokenmill_kernels::matmul::AMX_MIN_ROWS,
        32,
        "the shapes below assume it"
    );
    // (weight rows, blocks of 32 columns, activation rows): from AMX_MIN_ROWS rows (fewer
    // run on the VNNI kernels on this tier too), row counts 16·m ± 1.
    let shapes: [(usize, usize, usize); 7] = [
        (16, 1, 32),
        (17, 2, 33),
        (1, 3, 47),
        (40, 18, 32),
        (100, 5, 49),
        (48, 2, 64),
        (33, 7, 70),
    ];
    for ty in TYPES {
        for (n, nb, t) in shapes {
            // Whole blocks of the type: Q4_K's 256 columns are eight blocks of 32.
            let k = 32 * nb.next_multiple_of(ty.block_size() / 32);
            let w = weights(&mut rng, ty, n, k);
            let packed = PackedMatrix::pack(&QMatrix::new(ty, n, k, &w)).expect("Rows16 type");
            let x = activations(&mut rng, t, k);
            let mut want = vec![f32::NAN; t * n];
            matmul_with(&pools[0], &vnni, &x, &packed.view(), &mut want);
            for pool in &pools {
                let mut got = vec![f32::NAN; t * n];
                matmul_with(pool, &amx, &x, &packed.view(), &mut got);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{ty} {n}x{k}, {t} rows, {} threads",
                    pool.num_threads()
                );
            }
        }
    }
}

/// Q/K/V-shaped matrices of different types in one call: each output column range equals its
/// matrix alone on the VNNI kernels.
#[test]
fn amx_fused_matmul_matches_each_matrix_alone() {
    let Some((amx, vnni)) = tiers("amx_fused_matmul_matches_each_matrix_alone") else {
        return;
    };
    let pool = ThreadPool::new(2);
    let mut rng = SplitMix64::new(0xF0);
    let (k, t) = (96, 37);
    let mats: Vec<(GgmlType, usize, Vec<u8>)> = [
        (GgmlType::Q4_1, 48),
        (GgmlType::Q8_0, 20),
        (GgmlType::Q4_0, 16),
        (GgmlType::Q5_0, 24),
    ]
    .into_iter()
    .map(|(ty, n)| (ty, n, weights(&mut rng, ty, n, k)))
    .collect();
    let packed: Vec<PackedMatrix> = mats
        .iter()
        .map(|(ty, n, w)| PackedMatrix::pack(&QMatrix::new(*ty, *n, k, w)).unwrap())
        .collect();
    let views: Vec<QMatrix<'_>> = packed.iter().map(|p| p.view()).collect();
    let x = activations(&mut rng, t, k);
    let total: usize = mats.iter().map(|m| m.1).sum();
    let mut got = vec![f32::NAN; t * total];
    matmul_multi_with(&pool, &amx, &x, &views, &mut got);
    let mut col = 0;
    for (view, (ty, n, _)) in views.iter().zip(&mats) {
        let mut want = vec![f32::NAN; t * n];
        matmul_with(&pool, &vnni, &x, view, &mut want);
        for r in 0..t {
            assert_eq!(
                bits(&got[r * total + col..r * total + col + n]),
                bits(&want[r * n..(r + 1) * n]),
                "{ty} rows of token {r}"
            );
        }
        col += n;
    }
}
