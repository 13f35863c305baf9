//! Criterion benchmarks of every kernel family, on the default model's shapes
//! (SmolLM2-135M: hidden 576, FFN 1536, 9 heads / 3 KV heads of 64, Q4_1 layers, a Q8_0
//! vocabulary projection) and for every weight type the real models use:
//!
//! ```text
//! cargo bench -p tokenmill-kernels --bench kernels              # everything
//! cargo bench -p tokenmill-kernels --bench kernels -- matmul/   # one group
//! ```
//!
//! - `matmul/{tier}/{type}/{tokens}`: one 1536×576 matmul per SIMD tier this CPU supports and
//!   the scalar tier, for 1 token (GEMV, decode) and 64 tokens (tiled GEMM, prefill/batch),
//!   on one thread so tiers compare like for like; throughput in weight elements.
//! - `matmul_pool/...`: the same on the global pool (all cores), the product's real path.
//! - `fused/...`: residual add + RMSNorm, SwiGLU gate/up matmul, Q/K/V as one matmul.
//! - `acc_rows/{tier}/...`: MLA's small products on one thread, in multiply-adds: the
//!   expanded prefill's scores (64 queries × 256 keys over 192 dims) and `P · V` (64 queries
//!   × 128 over 256 keys), and the absorbed form's latent accumulation (16 heads × 512 over
//!   a 32-key tile). `_packed`: the same with each head's rows contiguous, as the model lays
//!   them out; without it they are a head-interleaved stride apart.
//! - `attention/...`: decode (1 query per sequence, 1 and 32 sequences; the latter also over
//!   30 layers' worth of cache, streamed from memory as in a real decode step) and a
//!   512-token prefill over the paged layout.
//!
//! Benchmarks, not tests: on a shared machine compare interleaved runs, not lone numbers.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tokenmill_kernels::attention::{
    AttnScratch, AttnSeq, AttnShape, K_SCALE_GROUPS, KvElem, KvLayout, PagedKv, PagedKvMut,
    attention_with, f16,
};
use tokenmill_kernels::dispatch::{ActFormat, Kernels, Tier, kernels};
use tokenmill_kernels::glu::matmul_silu_mul_with;
use tokenmill_kernels::matmul::{PackedMatrix, QMatrix, matmul_multi_with, matmul_with};
use tokenmill_kernels::ops::add_rms_norm;
use tokenmill_kernels::pool::{ThreadPool, global};
use tokenmill_kernels::quant::GgmlType;
use tokenmill_kernels::quant::testing::{SplitMix64, random_f32_row, random_weight_row};

const HIDDEN: usize = 576;
const FFN: usize = 1536;
const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F32,
];

/// A random `rows × cols` matrix of `ty` (cols a multiple of 256 for the k-quants).
fn weights(rng: &mut SplitMix64, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows)
        .flat_map(|_| random_weight_row(rng, ty, cols))
        .collect()
}

fn matrix(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> QMatrix<'_> {
    QMatrix::new(ty, rows, cols, data)
}

/// The matrix as GGUF stores it and, for the Rows16 types, repacked into Rows16 as the model
/// loads it — with a label for the benchmark id.
fn layouts<'a>(
    m: QMatrix<'a>,
    packed: &'a Option<PackedMatrix>,
) -> Vec<(&'static str, QMatrix<'a>)> {
    let mut v = vec![("", m)];
    if let Some(p) = packed {
        v.push(("_rows16", p.view()));
    }
    v
}

fn bench_matmul(c: &mut Criterion) {
    let mut rng = SplitMix64::new(7);
    let one = ThreadPool::new(1);
    // K-quant rows are 256-element super-blocks: 1536 columns fit every type.
    let (rows, cols) = (HIDDEN, FFN);
    for tier in Tier::supported() {
        let kern = Kernels::new(tier).expect("supported tier");
        let kern_a8 = kern.with_a8(true);
        let mut g = c.benchmark_group(format!("matmul/{}", tier.name()));
        for ty in TYPES {
            let w = weights(&mut rng, ty, rows, cols);
            let ggml = matrix(ty, rows, cols, &w);
            let packed = PackedMatrix::pack(&ggml);
            for (layout, m) in layouts(ggml, &packed) {
                // Rows16 also against 8-bit activations (`_a8`), where this tier has the kernel.
                let a8 = kern_a8
                    .matmul_kernel_for(&m)
                    .is_some_and(|k| k.act == ActFormat::A8);
                let runs = [("", &kern), ("_a8", &kern_a8)];
                for (act, kern) in runs.into_iter().take(if a8 { 2 } else { 1 }) {
                    for tokens in [1usize, 16, 64] {
                        let x = random_f32_row(&mut rng, tokens * cols, 1.0);
                        let mut out = vec![0f32; tokens * rows];
                        g.throughput(Throughput::Elements((rows * cols * tokens) as u64));
                        let id = BenchmarkId::new(format!("{ty}{layout}{act}"), tokens);
                        g.bench_function(id, |b| {
                            b.iter(|| matmul_with(&one, kern, black_box(&x), &m, &mut out))
                        });
                    }
                }
            }
        }
        g.finish();
    }
    let mut g = c.benchmark_group("matmul_pool");
    for (ty, rows, cols) in [
        (GgmlType::Q4_1, FFN, HIDDEN),
        (GgmlType::Q4_1, HIDDEN, FFN),
        (GgmlType::Q8_0, 49152, HIDDEN),
        // Larger than the last-level cache: a Q6_K LM head of DeepSeek/Qwen-sized rows, and
        // the same shape in Q4_K and Q4_1 (one-row matmuls here stream from DRAM).
        (GgmlType::Q6_K, 32768, 2048),
        (GgmlType::Q4_K, 32768, 2048),
        (GgmlType::Q4_1, 32768, 2048),
    ] {
        let w = weights(&mut rng, ty, rows, cols);
        let ggml = matrix(ty, rows, cols, &w);
        let packed = PackedMatrix::pack(&ggml);
        for (layout, m) in layouts(ggml, &packed) {
            for tokens in [1usize, 32, 512] {
                let x = random_f32_row(&mut rng, tokens * cols, 1.0);
                let mut out = vec![0f32; tokens * rows];
                g.throughput(Throughput::Elements((rows * cols * tokens) as u64));
                let id = format!("{ty}{layout}_{rows}x{cols}");
                g.bench_function(BenchmarkId::new(id, tokens), |b| {
                    b.iter(|| matmul_with(global(), kernels(), black_box(&x), &m, &mut out))
                });
            }
        }
    }
    g.finish();
}

fn bench_fused(c: &mut Criterion) {
    let mut rng = SplitMix64::new(11);
    let mut g = c.benchmark_group("fused");
    for tokens in [1usize, 16, 64] {
        let mut x = random_f32_row(&mut rng, tokens * HIDDEN, 1.0);
        let y = random_f32_row(&mut rng, tokens * HIDDEN, 1.0);
        let norm = random_f32_row(&mut rng, HIDDEN, 1.0);
        let mut out = vec![0f32; tokens * HIDDEN];
        g.throughput(Throughput::Elements((tokens * HIDDEN) as u64));
        g.bench_function(BenchmarkId::new("add_rms_norm", tokens), |b| {
            b.iter(|| {
                for (xr, (yr, or)) in x
                    .chunks_mut(HIDDEN)
                    .zip(y.chunks(HIDDEN).zip(out.chunks_mut(HIDDEN)))
                {
                    add_rms_norm(xr, black_box(yr), &norm, 1e-5, or);
                }
            })
        });

        let ty = GgmlType::Q4_1;
        let (wg, wu) = (
            weights(&mut rng, ty, FFN, HIDDEN),
            weights(&mut rng, ty, FFN, HIDDEN),
        );
        // Repacked into Rows16, as the model loads them.
        let (pg, pu) = (
            PackedMatrix::pack(&matrix(ty, FFN, HIDDEN, &wg)).expect("Q4_1 packs"),
            PackedMatrix::pack(&matrix(ty, FFN, HIDDEN, &wu)).expect("Q4_1 packs"),
        );
        let (gate, up) = (pg.view(), pu.view());
        let xin = random_f32_row(&mut rng, tokens * HIDDEN, 1.0);
        let mut h = vec![0f32; tokens * FFN];
        g.throughput(Throughput::Elements((2 * FFN * HIDDEN * tokens) as u64));
        g.bench_function(BenchmarkId::new("gate_up_silu_q4_1", tokens), |b| {
            b.iter(|| {
                matmul_silu_mul_with(global(), kernels(), black_box(&xin), &gate, &up, &mut h)
            })
        });

        let (wq, wk, wv) = (
            weights(&mut rng, ty, HIDDEN, HIDDEN),
            weights(&mut rng, ty, 192, HIDDEN),
            weights(&mut rng, ty, 192, HIDDEN),
        );
        let qkv = [
            matrix(ty, HIDDEN, HIDDEN, &wq),
            matrix(ty, 192, HIDDEN, &wk),
            matrix(ty, 192, HIDDEN, &wv),
        ];
        let mut o = vec![0f32; tokens * (HIDDEN + 384)];
        g.throughput(Throughput::Elements(
            ((HIDDEN + 384) * HIDDEN * tokens) as u64,
        ));
        g.bench_function(BenchmarkId::new("qkv_q4_1", tokens), |b| {
            b.iter(|| matmul_multi_with(global(), kernels(), black_box(&xin), &qkv, &mut o))
        });
    }
    g.finish();
}

/// One attention case: `b` sequences of `ctx` positions, the last `n_q` of them queries, over
/// a K/V store of `T` (f32, f16 or int8: every row written through `PagedKvMut::write`);
/// successive calls take successive copies of the cache out of `layers` (a model's layers:
/// with many, each call streams its K/V from memory as a decode step does, not from cache).
fn bench_attention_case<T: KvElem>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    (b, ctx, n_q): (usize, usize, usize),
    layers: usize,
) {
    let shape = AttnShape {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
    };
    let layout = KvLayout {
        block_size: 16,
        n_kv_heads: 3,
        head_dim: 64,
    };
    let per_seq = ctx.div_ceil(layout.block_size);
    let len = b * per_seq * layout.block_len();
    let n_scales = if T::SCALED {
        b * per_seq * layout.block_scales()
    } else {
        0
    };
    let mut rng = SplitMix64::new(13);
    let (mut kbuf, mut vbuf) = (
        vec![T::default(); layers * len],
        vec![T::default(); layers * len],
    );
    let mut ksbuf = vec![0f32; layers * K_SCALE_GROUPS * n_scales];
    let mut vsbuf = vec![0f32; layers * n_scales];
    // Interleaved block tables, as sequences that grew side by side get them.
    let tables: Vec<Vec<u32>> = (0..b)
        .map(|s| (0..per_seq).map(|i| (i * b + s) as u32).collect())
        .collect();
    for l in 0..layers {
        let ks = K_SCALE_GROUPS * n_scales;
        let mut w = PagedKvMut {
            k: &mut kbuf[l * len..(l + 1) * len],
            v: &mut vbuf[l * len..(l + 1) * len],
            k_scale: &mut ksbuf[l * ks..(l + 1) * ks],
            v_scale: &mut vsbuf[l * n_scales..(l + 1) * n_scales],
            layout,
        };
        for t in &tables {
            for pos in 0..ctx {
                let k = random_f32_row(&mut rng, layout.kv_dim(), 0.5);
                let v = random_f32_row(&mut rng, layout.kv_dim(), 0.5);
                w.write(t, pos, &k, &v, None);
            }
        }
    }
    let kvs: Vec<PagedKv<T>> = (0..layers)
        .map(|l| {
            let ks = K_SCALE_GROUPS * n_scales;
            PagedKv {
                k: &kbuf[l * len..(l + 1) * len],
                v: &vbuf[l * len..(l + 1) * len],
                k_scale: &ksbuf[l * ks..(l + 1) * ks],
                v_scale: &vsbuf[l * n_scales..(l + 1) * n_scales],
                layout,
            }
        })
        .collect();
    let mut layer = 0;
    let seqs: Vec<AttnSeq> = tables
        .iter()
        .map(|t| AttnSeq {
            n_q,
            start_pos: ctx - n_q,
            block_table: t,
        })
        .collect();
    let q_dim = shape.q_dim();
    let q = random_f32_row(&mut rng, b * n_q * q_dim, 1.0);
    let mut out = vec![0f32; b * n_q * q_dim];
    let mut scratch = AttnScratch::new(&shape, b);
    // Score + value multiply-adds per head: queries × visible keys (causal) × 2 · head dim.
    let visible: usize = (0..n_q).map(|i| ctx - n_q + i + 1).sum();
    c.throughput(Throughput::Elements(
        (b * visible * shape.n_heads * 2 * 64) as u64,
    ));
    c.bench_function(name, |bch| {
        bch.iter(|| {
            layer = (layer + 1) % layers;
            attention_with(
                global(),
                kernels(),
                black_box(&q),
                q_dim,
                &kvs[layer],
                seqs.as_slice(),
                &shape,
                &mut scratch,
                &mut out,
            )
        })
    });
}

fn bench_attention(c: &mut Criterion) {
    let mut g = c.benchmark_group("attention");
    bench_attention_case::<f32>(&mut g, "decode_b1_ctx1024", (1, 1024, 1), 1);
    bench_attention_case::<f32>(&mut g, "decode_b32_ctx192", (32, 192, 1), 1);
    // SmolLM2's 30 layers of K/V for 32 sequences (283 MB): the memory-bound batched decode;
    // and in the 16-bit and int8 stores (142 and 82 MB).
    bench_attention_case::<f32>(&mut g, "decode_b32_ctx192_30_layers", (32, 192, 1), 30);
    bench_attention_case::<f16>(&mut g, "decode_b32_ctx192_30_layers_f16", (32, 192, 1), 30);
    bench_attention_case::<i8>(&mut g, "decode_b32_ctx192_30_layers_int8", (32, 192, 1), 30);
    // The 1K-context batched decode of BENCHMARKS.md's int8 section: 126 MB of f16 K/V.
    bench_attention_case::<f16>(
        &mut g,
        "decode_b16_ctx1024_10_layers_f16",
        (16, 1024, 1),
        10,
    );
    bench_attention_case::<i8>(
        &mut g,
        "decode_b16_ctx1024_10_layers_int8",
        (16, 1024, 1),
        10,
    );
    bench_attention_case::<f32>(&mut g, "prefill_512", (1, 512, 512), 1);
    // A speculative verification chunk (the last token and five drafts) beside a plain
    // decode of the same context.
    bench_attention_case::<f32>(&mut g, "decode_b1_ctx128", (1, 128, 1), 1);
    bench_attention_case::<f32>(&mut g, "decode_b1_ctx320", (1, 320, 1), 1);
    bench_attention_case::<f32>(&mut g, "verify6_b1_ctx320", (1, 320, 6), 1);
    // The same from memory: 30 layers' K/V of a 400-token context, as a served stream's.
    bench_attention_case::<f32>(&mut g, "decode_b1_ctx400_30_layers", (1, 400, 1), 30);
    bench_attention_case::<f32>(&mut g, "verify6_b1_ctx400_30_layers", (1, 400, 6), 30);
    g.finish();
}

fn bench_acc_rows(c: &mut Criterion) {
    use tokenmill_kernels::attention::AccRows;
    let mut rng = SplitMix64::new(11);
    // (name, rows, cols, n, p_stride, x_stride)
    let cases = [
        ("expanded_scores", 64, 256, 192, 16 * 192, 256),
        ("expanded_scores_packed", 64, 256, 192, 192, 256),
        ("expanded_pv", 64, 128, 256, 256, 16 * 256),
        ("expanded_pv_packed", 64, 128, 256, 256, 128),
        ("absorbed_pv", 16, 512, 32, 32, 576),
    ];
    for tier in Tier::supported() {
        let k = Kernels::new(tier).unwrap();
        let mut g = c.benchmark_group(format!("acc_rows/{}", tier.name()));
        for (name, rows, cols, n, p_stride, x_stride) in cases {
            let s = AccRows {
                rows,
                cols,
                n,
                p_stride,
                x_stride,
            };
            let p = random_f32_row(&mut rng, (rows - 1) * p_stride + n, 1.0);
            let x = random_f32_row(&mut rng, (n - 1) * x_stride + cols, 1.0);
            let mut o = vec![0f32; rows * cols];
            g.throughput(Throughput::Elements((rows * cols * n) as u64));
            g.bench_function(name, |b| {
                b.iter(|| k.acc_rows(&s, black_box(&mut o), &p, &x))
            });
        }
        g.finish();
    }
}

criterion_group!(
    benches,
    bench_matmul,
    bench_fused,
    bench_attention,
    bench_acc_rows
);
criterion_main!(benches);
