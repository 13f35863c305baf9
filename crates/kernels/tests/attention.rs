//! Differential tests of paged attention: every tier this CPU supports against the plain
//! f64 reference (`attention::reference`), over odd shapes — contexts not a multiple of the
//! key tile or the block, one query and many, GQA groups of 1/3/4, head dims 16/24/64/128,
//! block sizes that hold whole tiles (16, 32) and ones that do not (4, 5), several sequences
//! with different lengths and scattered block tables.
//!
//! Error budget: outputs are convex combinations of values in [-1, 1], so an absolute
//! `4e-6` (a few ulps of the accumulation over up to 700 keys plus the ~1e-7 relative error of
//! the polynomial `exp2`; measured ≤ 1.3e-6), for flat and peaked softmaxes alike.
//!
//! Exactness properties, bit for bit within one tier: the decode path (one query, split
//! context) equals the prefill path (query tiles) row by row; a chunk's output does not depend
//! on the other chunks of its batch, on chunked prefill, or on the pool's thread count.
//!
//! An f16 or bf16 store: every tier against the reference over the same 16-bit values (same
//! budget), and bit for bit the f32 kernel of the same tier over those values widened to f32
//! (the 16-bit kernels only differ in how they load), so the properties above carry over.
//!
//! An int8 store (each row of the f32 store written again through `PagedKvMut::write`):
//! every tier against the reference over its dequantized values, within the same budget
//! (the scales multiply sums, not elements: measured ≤ 1.4e-6), and the decode = prefill
//! identity.

use half::bf16;
use tokenmill_kernels::attention::reference::attention_ref;
use tokenmill_kernels::attention::{
    AttnScratch, AttnSeq, AttnShape, K_SCALE_GROUPS, KvElem, KvLayout, PagedKv, PagedKvMut,
    attention_with, f16, segments,
};
use tokenmill_kernels::dispatch::{Kernels, Tier};
use tokenmill_kernels::pool::ThreadPool;
use tokenmill_kernels::quant::testing::SplitMix64;

const TOL: f32 = 4e-6;

fn tiers() -> Vec<Kernels> {
    Tier::supported()
        .into_iter()
        .map(|t| Kernels::new(t).unwrap())
        .collect()
}

/// A KV store with `lens[i]` random tokens for sequence `i`, blocks handed out in a
/// scattered order; returns (k, v, block tables).
struct Store<T = f32> {
    k: Vec<T>,
    v: Vec<T>,
    /// Row scales (int8 only).
    k_scale: Vec<f32>,
    v_scale: Vec<f32>,
    layout: KvLayout,
    tables: Vec<Vec<u32>>,
    lens: Vec<usize>,
}

impl<T: KvElem> Store<T> {
    /// The same store with elements of `U` (rounded or widened; NaN stays NaN).
    fn to<U: KvElem>(&self) -> Store<U> {
        let conv = |x: &Vec<T>| x.iter().map(|e| U::from_f32(e.to_f32())).collect();
        Store {
            k: conv(&self.k),
            v: conv(&self.v),
            k_scale: Vec::new(),
            v_scale: Vec::new(),
            layout: self.layout,
            tables: self.tables.clone(),
            lens: self.lens.clone(),
        }
    }

    fn view(&self) -> PagedKv<'_, T> {
        PagedKv {
            k: &self.k,
            v: &self.v,
            k_scale: &self.k_scale,
            v_scale: &self.v_scale,
            layout: self.layout,
        }
    }

    /// The same rows written into an int8 store (unused slots: quants 99, scales NaN).
    fn int8(&self) -> Store<i8> {
        let lay = self.layout;
        let n_scales = self.k.len() / lay.block_len() * lay.block_scales();
        let mut s8 = Store {
            k: vec![99i8; self.k.len()],
            v: vec![99i8; self.v.len()],
            k_scale: vec![f32::NAN; K_SCALE_GROUPS * n_scales],
            v_scale: vec![f32::NAN; n_scales],
            layout: lay,
            tables: self.tables.clone(),
            lens: self.lens.clone(),
        };
        let mut w = PagedKvMut {
            k: &mut s8.k,
            v: &mut s8.v,
            k_scale: &mut s8.k_scale,
            v_scale: &mut s8.v_scale,
            layout: lay,
        };
        let (hd, view) = (lay.head_dim, self.view());
        let (mut k, mut v) = (vec![0f32; lay.kv_dim()], vec![0f32; lay.kv_dim()]);
        for (table, &n) in self.tables.iter().zip(&self.lens) {
            for pos in 0..n {
                for h in 0..lay.n_kv_heads {
                    view.read_k(table, pos, h, &mut k[h * hd..(h + 1) * hd]);
                    view.read_v(table, pos, h, &mut v[h * hd..(h + 1) * hd]);
                }
                w.write(table, pos, &k, &v, None);
            }
        }
        s8
    }
}

impl Store {
    fn new(layout: KvLayout, lens: &[usize], rng: &mut SplitMix64) -> Store {
        let blocks: Vec<usize> = lens
            .iter()
            .map(|&n| n.div_ceil(layout.block_size))
            .collect();
        let total: usize = blocks.iter().sum::<usize>() + 1;
        // Scatter: block ids in a permuted order (a stride coprime to the total).
        let stride = (1..)
            .map(|s| 2 * s + 1)
            .find(|s| gcd(*s, total) == 1)
            .unwrap();
        let mut next = (0..total).map(|i| ((i * stride + 3) % total) as u32);
        let tables: Vec<Vec<u32>> = blocks
            .iter()
            .map(|&b| (&mut next).take(b).collect())
            .collect();
        // Unused slots hold NaN: attention must never read them into a result.
        let len = total * layout.block_len();
        let (mut k, mut v) = (vec![f32::NAN; len], vec![f32::NAN; len]);
        let mut w = PagedKvMut::new(&mut k, &mut v, layout);
        let kv_dim = layout.kv_dim();
        for (table, &n) in tables.iter().zip(lens) {
            for pos in 0..n {
                let kt: Vec<f32> = (0..kv_dim).map(|_| rng.uniform(-1.0, 1.0)).collect();
                let vt: Vec<f32> = (0..kv_dim).map(|_| rng.uniform(-1.0, 1.0)).collect();
                w.write(table, pos, &kt, &vt, None);
            }
        }
        Store {
            k,
            v,
            k_scale: Vec::new(),
            v_scale: Vec::new(),
            layout,
            tables,
            lens: lens.to_vec(),
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Scores of standard deviation about `sharpness` (q in [-2, 2], k in [-1, 1]): 1 gives a
/// flat softmax, 8 a peaked one.
fn shape(n_heads: usize, n_kv_heads: usize, head_dim: usize, sharpness: f32) -> AttnShape {
    AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: sharpness * 0.75 / (head_dim as f32).sqrt(),
    }
}

fn run<T: KvElem>(
    pool: &ThreadPool,
    k: &Kernels,
    q: &[f32],
    store: &Store<T>,
    seqs: &[AttnSeq<'_>],
    shape: &AttnShape,
) -> Vec<f32> {
    let n: usize = seqs.iter().map(|s| s.n_q).sum();
    let mut out = vec![f32::NAN; n * shape.q_dim()];
    let mut scratch = AttnScratch::default();
    let view = store.view();
    attention_with(
        pool,
        k,
        q,
        shape.q_dim(),
        &view,
        seqs,
        shape,
        &mut scratch,
        &mut out,
    );
    out
}

fn random_q(rng: &mut SplitMix64, rows: usize, shape: &AttnShape) -> Vec<f32> {
    (0..rows * shape.q_dim())
        .map(|_| rng.uniform(-2.0, 2.0))
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0f32, f32::max)
}

/// (n_heads, n_kv_heads, head_dim, block_size) cases: GQA 1/3/4, head dims on and off the
/// SIMD lane counts, block sizes with and without whole tiles.
const CASES: [(usize, usize, usize, usize); 7] = [
    (9, 3, 64, 16),
    (4, 4, 64, 4),
    (8, 2, 128, 32),
    (6, 2, 64, 5),
    (3, 1, 16, 16),
    (4, 1, 24, 16),
    (12, 3, 128, 16),
];

/// Runs `check(case, shape, store, batch, q)` on each case's mixed batch: decode steps at the
/// end of each sequence, plus prefill chunks (from 0, and mid-sequence) over some of them.
fn mixed_batches(mut check: impl FnMut(usize, &AttnShape, &Store, &[AttnSeq<'_>], &[f32])) {
    for (ci, &(nh, nkv, hd, bs)) in CASES.iter().enumerate() {
        let mut rng = SplitMix64::new(ci as u64 + 1);
        let sh = shape(nh, nkv, hd, if ci % 2 == 0 { 8.0 } else { 1.0 });
        let layout = KvLayout {
            block_size: bs,
            n_kv_heads: nkv,
            head_dim: hd,
        };
        // Contexts: 1 token, just under/over a tile, several segments, long.
        let lens = [1, 15, 17, 40, 100, 333, 700];
        let store = Store::new(layout, &lens, &mut rng);
        // A mixed batch: decode steps at the end of each sequence, plus prefill chunks
        // (from 0, and mid-sequence) over some of them.
        let t = &store.tables;
        let seqs = [
            AttnSeq {
                n_q: 1,
                start_pos: 0,
                block_table: &t[0],
            },
            AttnSeq {
                n_q: 15,
                start_pos: 0,
                block_table: &t[1],
            },
            AttnSeq {
                n_q: 1,
                start_pos: 16,
                block_table: &t[2],
            },
            AttnSeq {
                n_q: 23,
                start_pos: 17,
                block_table: &t[3],
            },
            AttnSeq {
                n_q: 1,
                start_pos: 99,
                block_table: &t[4],
            },
            AttnSeq {
                n_q: 2,
                start_pos: 331,
                block_table: &t[5],
            },
            AttnSeq {
                n_q: 1,
                start_pos: 699,
                block_table: &t[6],
            },
            AttnSeq {
                n_q: 57,
                start_pos: 0,
                block_table: &t[6],
            },
        ];
        let rows: usize = seqs.iter().map(|s| s.n_q).sum();
        let q = random_q(&mut rng, rows, &sh);
        check(ci, &sh, &store, &seqs, &q);
    }
}

#[test]
fn every_tier_matches_reference_on_mixed_batches() {
    let pool = ThreadPool::new(3);
    mixed_batches(|ci, sh, store, seqs, q| {
        let want = attention_ref(q, sh.q_dim(), &store.view(), seqs, sh);
        for k in tiers() {
            let got = run(&pool, &k, q, store, seqs, sh);
            let d = max_diff(&got, &want);
            eprintln!("{} case {ci}: max |Δ| {d:.2e}", k.tier());
            assert!(d <= TOL, "{} case {ci}: max |Δ| {d}", k.tier());
        }
    });
}

/// Every tier over a store of `E` against the reference on the same values, and bit for bit
/// the f32 kernel over them widened; the rounding itself moves outputs by less than `moved`.
fn sixteen_bit_store_matches<E: KvElem>(name: &str, moved: f32) {
    let pool = ThreadPool::new(3);
    mixed_batches(|ci, sh, store, seqs, q| {
        let s16 = store.to::<E>();
        // The 16-bit values, widened: what the 16-bit kernels must compute on.
        let widened = s16.to::<f32>();
        assert!(widened.k != store.k, "{name}: rounding changed nothing");
        let want = attention_ref(q, sh.q_dim(), &s16.view(), seqs, sh);
        for k in tiers() {
            let got = run(&pool, &k, q, &s16, seqs, sh);
            let d = max_diff(&got, &want);
            eprintln!("{} {name} case {ci}: max |Δ| {d:.2e}", k.tier());
            assert!(d <= TOL, "{} {name} case {ci}: max |Δ| {d}", k.tier());
            let f32_kernel = run(&pool, &k, q, &widened, seqs, sh);
            assert!(
                got == f32_kernel,
                "{} {name} case {ci}: differs from the f32 kernel on the same values",
                k.tier()
            );
        }
        // And the rounding's own effect stays small (keys and values in [-1, 1]).
        let exact = attention_ref(q, sh.q_dim(), &store.view(), seqs, sh);
        let d = max_diff(&want, &exact);
        assert!(d < moved, "{name} rounding moved case {ci} by {d}");
    });
}

#[test]
fn f16_store_every_tier_matches_reference_and_the_f32_kernel_on_its_values() {
    sixteen_bit_store_matches::<f16>("f16", 5e-3);
}

#[test]
fn bf16_store_every_tier_matches_reference_and_the_f32_kernel_on_its_values() {
    // bf16 keeps 8 bits of mantissa to f16's 11: eight times the rounding.
    sixteen_bit_store_matches::<bf16>("bf16", 4e-2);
}

#[test]
fn int8_store_every_tier_matches_reference_on_its_dequantized_values() {
    let pool = ThreadPool::new(3);
    mixed_batches(|ci, sh, store, seqs, q| {
        let s8 = store.int8();
        let want = attention_ref(q, sh.q_dim(), &s8.view(), seqs, sh);
        for k in tiers() {
            let got = run(&pool, &k, q, &s8, seqs, sh);
            let d = max_diff(&got, &want);
            eprintln!("{} int8 case {ci}: max |Δ| {d:.2e}", k.tier());
            assert!(d <= TOL, "{} int8 case {ci}: max |Δ| {d}", k.tier());
        }
        // The quantization's own effect: values in [-1, 1] within half a step of 1/127.
        let exact = attention_ref(q, sh.q_dim(), &store.view(), seqs, sh);
        let d = max_diff(&want, &exact);
        eprintln!("int8 quantization moved case {ci} by {d:.2e}");
        assert!(
            d > 0.0 && d < 5e-2,
            "int8 quantization moved case {ci} by {d}"
        );
    });
}

#[test]
fn decode_path_equals_prefill_path_bit_for_bit() {
    let pool = ThreadPool::new(2);
    for &(nh, nkv, hd, bs) in &CASES {
        let mut rng = SplitMix64::new(99);
        let sh = shape(nh, nkv, hd, 4.0);
        let layout = KvLayout {
            block_size: bs,
            n_kv_heads: nkv,
            head_dim: hd,
        };
        let n = 300;
        let store = Store::new(layout, &[n], &mut rng);
        let q = random_q(&mut rng, n, &sh);
        decode_equals_prefill(&pool, &store, &q, &sh);
        decode_equals_prefill(&pool, &store.int8(), &q, &sh);
    }
}

/// The decode path equals the prefill path (and chunked prefill) bit for bit over the first
/// sequence of `store` (every position queried by a row of `q`).
fn decode_equals_prefill<T: KvElem>(
    pool: &ThreadPool,
    store: &Store<T>,
    q: &[f32],
    sh: &AttnShape,
) {
    let (table, n) = (&store.tables[0], store.lens[0]);
    let (hd, bs) = (store.layout.head_dim, store.layout.block_size);
    for k in tiers() {
        let whole = run(
            pool,
            &k,
            q,
            store,
            &[AttnSeq {
                n_q: n,
                start_pos: 0,
                block_table: table,
            }],
            sh,
        );
        // Every position as a decode step, all in one batch.
        let steps: Vec<AttnSeq> = (0..n)
            .map(|p| AttnSeq {
                n_q: 1,
                start_pos: p,
                block_table: table,
            })
            .collect();
        let decoded = run(pool, &k, q, store, &steps, sh);
        assert!(
            whole == decoded,
            "{}: decode != prefill (hd {hd}, bs {bs})",
            k.tier()
        );
        // Chunked prefill: chunks of 7 (and a last partial one), and of 6 after a first
        // token — a decode and 5 drafts, as speculative verification runs them.
        for (len, first) in [(7, 0), (6, 1)] {
            let head = (first > 0).then_some((0, first));
            let rest = (first..n).step_by(len).map(|p| (p, len.min(n - p)));
            let chunks: Vec<AttnSeq> = head
                .into_iter()
                .chain(rest)
                .map(|(p, n_q)| AttnSeq {
                    n_q,
                    start_pos: p,
                    block_table: table,
                })
                .collect();
            assert_eq!(chunks.iter().map(|c| c.n_q).sum::<usize>(), n);
            let chunked = run(pool, &k, q, store, &chunks, sh);
            assert!(
                whole == chunked,
                "{}: chunks of {len} != whole (hd {hd}, bs {bs})",
                k.tier()
            );
        }
    }
}

#[test]
fn output_is_independent_of_batch_and_thread_count() {
    let mut rng = SplitMix64::new(7);
    let sh = shape(9, 3, 64, 2.0);
    let layout = KvLayout {
        block_size: 16,
        n_kv_heads: 3,
        head_dim: 64,
    };
    let lens = [200, 1000, 37];
    let store = Store::new(layout, &lens, &mut rng);
    let t = &store.tables;
    let batch = [
        AttnSeq {
            n_q: 1,
            start_pos: 199,
            block_table: &t[0],
        },
        AttnSeq {
            n_q: 1,
            start_pos: 999,
            block_table: &t[1],
        },
        AttnSeq {
            n_q: 30,
            start_pos: 7,
            block_table: &t[2],
        },
    ];
    let q = random_q(&mut rng, 32, &sh);
    let qd = sh.q_dim();
    for k in tiers() {
        let all = run(&ThreadPool::new(2), &k, &q, &store, &batch, &sh);
        // Each chunk alone, at its rows of q.
        let mut row = 0;
        for s in &batch {
            let alone = run(
                &ThreadPool::new(2),
                &k,
                &q[row * qd..(row + s.n_q) * qd],
                &store,
                &[*s],
                &sh,
            );
            assert!(
                alone[..] == all[row * qd..(row + s.n_q) * qd],
                "{}: batch composition",
                k.tier()
            );
            row += s.n_q;
        }
        for threads in [1, 3, 5] {
            let other = run(&ThreadPool::new(threads), &k, &q, &store, &batch, &sh);
            assert!(other == all, "{}: {threads} threads", k.tier());
        }
    }
}

#[test]
fn segments_cover_the_context_without_empty_segments() {
    for n in 1..5000 {
        let (n_seg, tps) = segments(n);
        let tiles = n.div_ceil(16);
        assert!(
            n_seg >= 1 && n_seg * tps >= tiles && (n_seg - 1) * tps < tiles,
            "{n}"
        );
    }
}
