//! Differential tests of the AWQ / GPTQ int4 path.
//!
//! * Fixtures (`scripts/golden/make_int4_fixtures.py`, format documented there): checkpoint
//!   tensors packed by the script from fixed-seed fp32 weights, with an independent numpy
//!   unpacking `W_deq` and `out = x @ W_deq` (float64). Our repacked
//!   [`Int4Matrix::dequantize_row`] must equal `W_deq` **bit for bit** (`(q - z) * s` in f32 on
//!   both sides), and both [`matmul_ref`] and [`matmul`] must match `out` within the f32
//!   budget below.
//! * Random checkpoints (every bit pattern of `qweight`/`qzeros` is valid) over odd shapes —
//!   one row, many rows, group sizes 32/64/128, act-order permutations — compare [`matmul`]
//!   with [`matmul_ref`].
//! * Hostile tensors give typed [`Int4Error`]s.
//!
//! Budget: an f32 dot of length K in any summation order is within about
//! `K * eps * Σ |x_k w_k|` of the exact value; we allow `1e-5 * Σ |x_k w_k| + 1e-6`.

use std::path::PathBuf;

use half::f16;
use tokenmill_kernels::int4::{
    AwqTensors, GptqTensors, Int4Error, Int4Kernel, Int4Matrix, ZeroFormat, matmul, matmul_ref,
    matmul_with,
};
use tokenmill_kernels::quant::testing::SplitMix64;

struct Fixture {
    name: String,
    matrix: Int4Matrix,
    m: usize,
    x: Vec<f32>,
    /// `[K, N]`, input order.
    w_deq: Vec<f32>,
    /// `[m, N]`
    out: Vec<f32>,
}

fn u32_at(b: &[u8], i: usize) -> usize {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn load(name: &str) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/int4")
        .join(format!("{name}.bin"));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..4], b"TMI4");
    assert_eq!(u32_at(&b, 4), 1);
    let (fmt, zf, has_g) = (u32_at(&b, 8), u32_at(&b, 12), u32_at(&b, 16) == 1);
    let (k, n, group, m) = (
        u32_at(&b, 20),
        u32_at(&b, 24),
        u32_at(&b, 28),
        u32_at(&b, 32),
    );
    let mut at = 36;
    let mut take = |len: usize| {
        let s = &b[at..at + len];
        at += len;
        s
    };
    let ng = k / group;
    let (qweight, qzeros, scales) = (take(k * n / 2), take(ng * n / 2), take(ng * n * 2));
    let g_idx = has_g.then(|| take(4 * k));
    let (x, w_deq, out) = (
        f32s(take(4 * m * k)),
        f32s(take(4 * k * n)),
        f32s(take(4 * m * n)),
    );
    let matrix = if fmt == 0 {
        Int4Matrix::from_awq(&AwqTensors {
            qweight,
            qzeros,
            scales,
            in_features: k,
            out_features: n,
            group_size: group,
        })
    } else {
        Int4Matrix::from_gptq(&GptqTensors {
            qweight,
            qzeros,
            scales,
            g_idx,
            in_features: k,
            out_features: n,
            group_size: group,
            zero_format: if zf == 0 {
                ZeroFormat::Classic
            } else {
                ZeroFormat::V2
            },
        })
    }
    .unwrap();
    Fixture {
        name: name.into(),
        matrix,
        m,
        x,
        w_deq,
        out,
    }
}

const FIXTURES: [&str; 9] = [
    "awq_g32_m1",
    "awq_g128_m3",
    "awq_g64_m5",
    "gptq_g32_m1_zero_quirk",
    "gptq_g64_m4_act_order",
    "gptq_g128_m2_identity_g_idx",
    "gptq_v2_g32_m2_act_order",
    "same_awq",
    "same_gptq",
];

/// Asserts `got` matches `want` within the budget, per element of `[m, n]`.
fn assert_close(got: &[f32], want: &[f32], x: &[f32], w: &Int4Matrix, what: &str) {
    let (k, n) = (w.cols(), w.rows());
    let mut row = vec![0f32; k];
    for r in 0..n {
        w.dequantize_row(r, &mut row);
        for (t, xt) in x.chunks_exact(k).enumerate() {
            let mag: f32 = xt.iter().zip(&row).map(|(a, b)| (a * b).abs()).sum();
            let (g, e) = (got[t * n + r], want[t * n + r]);
            assert!(
                (g - e).abs() <= 1e-5 * mag + 1e-6,
                "{what}: out[{t}, {r}] = {g}, want {e} (|x w| sum {mag})"
            );
        }
    }
}

#[test]
fn repacked_rows_equal_the_checkpoint_dequantization_bit_for_bit() {
    for name in FIXTURES {
        let f = load(name);
        let (k, n) = (f.matrix.cols(), f.matrix.rows());
        let mut row = vec![0f32; k];
        for r in 0..n {
            f.matrix.dequantize_row(r, &mut row);
            for (kk, &v) in row.iter().enumerate() {
                let want = f.w_deq[kk * n + r];
                assert_eq!(v.to_bits(), want.to_bits(), "{name}: W[{kk}, {r}]");
            }
        }
    }
}

#[test]
fn matmul_and_its_reference_match_the_fixture_outputs() {
    for name in FIXTURES {
        let f = load(name);
        let n = f.matrix.rows();
        let (mut got, mut reference) = (vec![0f32; f.m * n], vec![0f32; f.m * n]);
        matmul(&f.x, &f.matrix, &mut got);
        matmul_ref(&f.x, &f.matrix, &mut reference);
        assert_close(
            &reference,
            &f.out,
            &f.x,
            &f.matrix,
            &format!("{} ref", f.name),
        );
        assert_close(&got, &f.out, &f.x, &f.matrix, &format!("{} kernel", f.name));
    }
}

#[test]
fn act_order_is_stored_permuted_and_identity_is_not() {
    assert!(load("gptq_g64_m4_act_order").matrix.is_permuted());
    assert!(load("gptq_v2_g32_m2_act_order").matrix.is_permuted());
    assert!(!load("gptq_g128_m2_identity_g_idx").matrix.is_permuted());
    assert!(!load("awq_g64_m5").matrix.is_permuted());
}

#[test]
fn awq_and_gptq_packings_of_the_same_weights_agree() {
    let (a, g) = (load("same_awq"), load("same_gptq"));
    assert_eq!(a.w_deq, g.w_deq, "the script packed the same codes");
    let (k, n) = (a.matrix.cols(), a.matrix.rows());
    let (mut ra, mut rg) = (vec![0f32; k], vec![0f32; k]);
    for r in 0..n {
        a.matrix.dequantize_row(r, &mut ra);
        g.matrix.dequantize_row(r, &mut rg);
        assert_eq!(ra, rg, "row {r}");
    }
}

/// A random GPTQ checkpoint (random codes, zeros, f16 scales; act-order when `act_order`).
fn random_gptq(
    rng: &mut SplitMix64,
    k: usize,
    n: usize,
    group: usize,
    act_order: bool,
) -> Int4Matrix {
    let ng = k / group;
    let mut bytes = |len: usize| {
        let mut v = vec![0u8; len];
        rng.fill_bytes(&mut v);
        v
    };
    let (qweight, qzeros) = (bytes(k * n / 2), bytes(ng * n / 2));
    let scales: Vec<u8> = (0..ng * n)
        .flat_map(|_| f16::from_f32(rng.uniform(1e-3, 2e-2)).to_le_bytes())
        .collect();
    let mut g: Vec<i32> = (0..k).map(|r| (r / group) as i32).collect();
    if act_order {
        for i in (1..k).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            g.swap(i, j);
        }
    }
    let g_idx: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
    Int4Matrix::from_gptq(&GptqTensors {
        qweight: &qweight,
        qzeros: &qzeros,
        scales: &scales,
        g_idx: Some(&g_idx),
        in_features: k,
        out_features: n,
        group_size: group,
        zero_format: ZeroFormat::Classic,
    })
    .unwrap()
}

#[test]
fn kernel_matches_reference_over_odd_shapes() {
    let mut rng = SplitMix64::new(44);
    for (k, n, group) in [
        (32, 8, 32),
        (128, 8, 64),
        (256, 40, 128),
        (384, 24, 32),
        (512, 136, 128),
        // Groups of an odd number of 8-weight steps (the decode kernel's tail step).
        (48, 16, 24),
        (72, 8, 72),
    ] {
        for act_order in [false, true] {
            let w = random_gptq(&mut rng, k, n, group, act_order);
            // One group: every order is the identity.
            assert_eq!(w.is_permuted(), act_order && k > group, "{k}x{n}");
            for m in [1, 2, 3, 7, 17] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
                let (mut got, mut want) = (vec![0f32; m * n], vec![0f32; m * n]);
                matmul_ref(&x, &w, &mut want);
                for kernel in Int4Kernel::ALL.into_iter().filter(|k| k.is_supported()) {
                    matmul_with(kernel, &x, &w, &mut got);
                    assert_close(
                        &got,
                        &want,
                        &x,
                        &w,
                        &format!("{kernel:?} {k}x{n} g{group} act {act_order} m {m}"),
                    );
                }
                matmul(&x, &w, &mut got);
                assert_close(
                    &got,
                    &want,
                    &x,
                    &w,
                    &format!("{k}x{n} g{group} act {act_order} m {m}"),
                );
            }
        }
    }
}

#[test]
fn hostile_tensors_are_typed_errors() {
    let (k, n, group) = (64usize, 8usize, 32usize);
    let (qweight, qzeros, scales) = (vec![0u8; k * n / 2], vec![0u8; n], vec![0u8; 2 * 2 * n]);
    let g_ok: Vec<u8> = (0..k)
        .flat_map(|r| ((r / group) as i32).to_le_bytes())
        .collect();
    let gptq = |qweight: &[u8], g_idx: Option<&[u8]>, group_size: usize| {
        Int4Matrix::from_gptq(&GptqTensors {
            qweight,
            qzeros: &qzeros,
            scales: &scales,
            g_idx,
            in_features: k,
            out_features: n,
            group_size,
            zero_format: ZeroFormat::Classic,
        })
        .unwrap_err()
    };
    assert!(matches!(
        gptq(&qweight[1..], Some(&g_ok), group),
        Int4Error::TensorSize {
            name: "qweight",
            ..
        }
    ));
    assert!(matches!(
        gptq(&qweight, Some(&g_ok[4..]), group),
        Int4Error::TensorSize { name: "g_idx", .. }
    ));
    for bad_group in [0, 12, 48, 128] {
        assert!(
            matches!(gptq(&qweight, None, bad_group), Int4Error::Shape { .. }),
            "{bad_group}"
        );
    }
    let mut g_far = g_ok.clone();
    g_far[..4].copy_from_slice(&2i32.to_le_bytes());
    assert!(matches!(
        gptq(&qweight, Some(&g_far), group),
        Int4Error::GroupIndex { row: 0, .. }
    ));
    let mut g_neg = g_ok.clone();
    g_neg[4..8].copy_from_slice(&(-1i32).to_le_bytes());
    assert!(matches!(
        gptq(&qweight, Some(&g_neg), group),
        Int4Error::GroupIndex { row: 1, .. }
    ));
    let mut g_uneven = g_ok.clone();
    g_uneven[..4].copy_from_slice(&1i32.to_le_bytes());
    assert!(matches!(
        gptq(&qweight, Some(&g_uneven), group),
        Int4Error::UnevenGroups { .. }
    ));
    let awq = Int4Matrix::from_awq(&AwqTensors {
        qweight: &qweight,
        qzeros: &qzeros,
        scales: &scales[1..],
        in_features: k,
        out_features: n,
        group_size: group,
    });
    assert!(matches!(
        awq,
        Err(Int4Error::TensorSize { name: "scales", .. })
    ));
    let awq_shape = Int4Matrix::from_awq(&AwqTensors {
        qweight: &qweight,
        qzeros: &qzeros,
        scales: &scales,
        in_features: k,
        out_features: 12,
        group_size: group,
    });
    assert!(matches!(awq_shape, Err(Int4Error::Shape { .. })));
}
