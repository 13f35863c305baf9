//! Times `attention` on decode and prefill shapes of the default model (SmolLM2-135M: 9 heads,
//! 3 KV heads, head dim 64): `cargo run --release -p tokenmill-kernels --example attention`.
//! A benchmark, not a test: quote ratios of interleaved runs, not lone numbers.
//! `KV=f16` (or `bf16`, `f32`: the default) picks the cache's element type.

use std::time::Instant;

use half::bf16;

use tokenmill_kernels::attention::{
    AttnScratch, AttnSeq, AttnShape, KvElem, KvLayout, PagedKv, attention_with, f16,
};
use tokenmill_kernels::dispatch::kernels;
use tokenmill_kernels::pool::{ThreadPool, global};

fn main() {
    match std::env::var("KV").as_deref() {
        Ok("f16") => run::<f16>(),
        Ok("bf16") => run::<bf16>(),
        Ok("f32") | Err(_) => run::<f32>(),
        Ok(other) => panic!("KV={other}: f32, f16 or bf16"),
    }
}

fn run<E: KvElem>() {
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
    // `ATTN_THREADS=1` runs on the calling thread only: steadier on a shared machine, where
    // a descheduled worker stalls a whole call. Optional argument: run only the cases whose
    // name contains it (`b32`, `prefill`, ...).
    let threads = std::env::var("ATTN_THREADS")
        .ok()
        .and_then(|t| t.parse().ok());
    let own = threads.map(ThreadPool::new);
    let (pool, k) = (own.as_ref().unwrap_or_else(|| global()), kernels());
    println!(
        "tier {}, {} threads, {:?} K/V",
        k.tier(),
        pool.num_threads(),
        E::DTYPE
    );
    let only = std::env::args().nth(1);
    // `layers` separate caches, visited in turn: with 30 (the default model's depth) the K/V
    // come from memory, as in a real decode step, not from a warm cache.
    for (name, b, ctx, n_q, layers) in [
        ("warm-up", 1usize, 16usize, 1usize, 1usize),
        ("decode b1 ctx64", 1, 64, 1, 1),
        ("decode b1 ctx1024", 1, 1024, 1, 1),
        ("decode b32 ctx192", 32, 192, 1, 1),
        ("decode b32 ctx192 x30 layers", 32, 192, 1, 30),
        ("prefill 512", 1, 512, 512, 1),
        ("decode b1 ctx320", 1, 320, 1, 1),
        ("verify6 b1 ctx320", 1, 320, 6, 1),
    ] {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let per_seq = ctx.div_ceil(16);
        let blocks = b * per_seq;
        let len = blocks * layout.block_len();
        let kbuf: Vec<E> = (0..len)
            .map(|i| E::from_f32(((i * 7919) % 1000) as f32 / 1000.0 - 0.5))
            .collect();
        let vbuf: Vec<E> = (0..len)
            .map(|i| E::from_f32(((i * 104729) % 1000) as f32 / 1000.0 - 0.5))
            .collect();
        let kv = PagedKv::new(&kbuf, &vbuf, layout);
        let tables: Vec<Vec<u32>> = (0..b)
            .map(|s| (0..per_seq).map(|i| (i * b + s) as u32).collect())
            .collect();
        let seqs: Vec<AttnSeq> = tables
            .iter()
            .map(|t| AttnSeq {
                n_q,
                start_pos: ctx - n_q,
                block_table: t,
            })
            .collect();
        let rows = b * n_q;
        let q: Vec<f32> = (0..rows * 576)
            .map(|i| ((i * 31) % 100) as f32 / 50.0 - 1.0)
            .collect();
        let mut out = vec![0f32; rows * 576];
        let mut scratch = AttnScratch::default();
        // The best of many short batches: on a shared machine, some batch runs undisturbed.
        let (reps, batches) = if n_q > 1 || layers > 1 {
            (1, 40)
        } else {
            (20, 200)
        };
        let mut best = f64::INFINITY;
        for _ in 0..batches {
            let t = Instant::now();
            for _ in 0..reps {
                attention_with(
                    pool,
                    k,
                    &q,
                    576,
                    &kv,
                    &seqs[..],
                    &shape,
                    &mut scratch,
                    &mut out,
                );
            }
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        // Visible keys, causal: query i of a chunk sees ctx - n_q + i + 1 of them.
        let keys = (b * (0..n_q).map(|i| ctx - n_q + i + 1).sum::<usize>()) as f64;
        let flops = 4.0 * 9.0 * 64.0 * keys;
        println!(
            "{name:<20} {:>9.1} µs  {:>6.1} GFLOP/s",
            best * 1e6,
            flops / best / 1e9
        );
    }
}
