//! Rough per-matmul timings with the default model's shapes (SmolLM2-135M: hidden 576, ffn
//! 1536, Q4_1 layers, Q8_0 vocab projection of 49152 rows), then Q5_0 and Q4_K matrices of
//! similar sizes. Not a benchmark harness and never
//! an assertion — a quick look at one tier and pool size:
//!
//! ```text
//! cargo run --release -p tokenmill-kernels --example matmul_timing -- [threads] [tokens] [tier] [layout] [type] [stream MiB]
//! ```
//!
//! `tier` is `scalar`, `avx2`, `avx-vnni`, `avx512-vnni` or `amx` (default: the best
//! supported);
//! `layout` is `rows16` (default: the weights repacked as the model loads them), `rows16-a8`
//! (the same against 8-bit activations, `--activation-bits 8`) or `ggml`;
//! `type` (`q4_1`, `q8_0`, ...) keeps only that format's shapes (`all`: every shape);
//! `stream MiB` (default 0) cycles each shape through copies of its weights filling that many
//! MiB, so that, as in a model's forward pass, every call reads its weights from memory
//! rather than from cache.
//! Prints the best of five runs per shape: µs per call, ns per 32-element weight block and
//! token, and multiply-adds per second.

use std::time::Instant;

use tokenmill_kernels::dispatch::{Kernels, Tier};
use tokenmill_kernels::matmul::{PackedMatrix, QMatrix, matmul_with};
use tokenmill_kernels::pool::ThreadPool;
use tokenmill_kernels::quant::GgmlType;
use tokenmill_kernels::quant::testing::{SplitMix64, random_f32_row, random_weight_row};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(1, |s| s.parse().expect("threads"));
    let tokens: usize = args.get(2).map_or(1, |s| s.parse().expect("tokens"));
    let tier = match args.get(3) {
        Some(name) => Tier::from_name(name).expect("a tier name"),
        None => Tier::best(),
    };
    let layout = args.get(4).map_or("rows16", String::as_str);
    let rows16 = layout.starts_with("rows16");
    let kernels = Kernels::new(tier)
        .expect("a tier this CPU supports")
        .with_a8(layout == "rows16-a8");
    let only = args.get(5).filter(|t| t.as_str() != "all");
    // Weights cycled through per shape, so that calls stream them from memory as a model's
    // layers do (0: one matrix, which stays in cache).
    let stream_bytes: usize = args.get(6).map_or(0, |s| s.parse().expect("stream MiB")) << 20;
    let pool = ThreadPool::new(threads);
    let mut rng = SplitMix64::new(1);
    for (ty, n, k) in [
        (GgmlType::Q4_1, 576, 576),
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 49152, 576),
        // The other formats the AMX tier takes, at similar sizes (K-quant rows are whole
        // 256-column blocks).
        (GgmlType::Q5_0, 1536, 576),
        (GgmlType::Q4_K, 1536, 768),
        (GgmlType::Q4_K, 768, 1536),
        (GgmlType::Q6_K, 1536, 768),
        // The DeepSeek-V2-Lite-shaped bench model's LM head (172 MB: it streams from memory).
        (GgmlType::Q6_K, 102400, 2048),
        // A DeepSeek-V2-Lite expert of the Q4_K bench model: gate (or up), then down (Q5_0:
        // 1408 columns are no whole K-quant super-blocks).
        (GgmlType::Q4_K, 1408, 2048),
        (GgmlType::Q5_0, 2048, 1408),
    ] {
        if only.is_some_and(|t| !t.eq_ignore_ascii_case(&ty.to_string())) {
            continue;
        }
        let w: Vec<u8> = (0..n)
            .flat_map(|_| random_weight_row(&mut rng, ty, k))
            .collect();
        let x = random_f32_row(&mut rng, tokens * k, 1.0);
        let mut out = vec![0f32; tokens * n];
        // Distinct buffers, so that cycling through them streams from memory in either layout.
        let copies = (stream_bytes / w.len()).max(1);
        let ws = vec![w; copies];
        let ggml: Vec<QMatrix> = ws.iter().map(|w| QMatrix::new(ty, n, k, w)).collect();
        let packed: Vec<PackedMatrix> = if rows16 {
            ggml.iter().filter_map(|g| PackedMatrix::pack(g)).collect()
        } else {
            Vec::new()
        };
        let ms: Vec<QMatrix> = if packed.is_empty() {
            ggml
        } else {
            packed.iter().map(|p| p.view()).collect()
        };
        let m = ms[0];
        let macs = (n * k * tokens) as f64;
        let reps = ((2e8 / macs) as usize).max(2).max(copies);
        matmul_with(&pool, &kernels, &x, &m, &mut out);
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            for r in 0..reps {
                matmul_with(&pool, &kernels, &x, &ms[r % copies], &mut out);
            }
            best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
        }
        println!(
            "{tier} {:?} {threads} threads, {tokens} tokens, {ty} {n}x{k}: {:9.1} µs {:6.2} ns/block {:6.1} GMAC/s",
            m.layout,
            best * 1e6,
            best * 1e9 / (macs / 32.0),
            macs / best / 1e9
        );
    }
}
