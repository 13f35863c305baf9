//! [`Roofline`]: this machine's ceilings, measured by micro-benchmarks on the same kernels and
//! thread count the model uses.
//!
//! - **Integer dot peak** (`int_gflops`): tokenmill's own `matmul` on a cache-resident Q4_1
//!   weight (512 × 1024, ~0.3 MiB, repacked into Rows16 as the model loads it) against 64
//!   activation rows — the quantized integer path
//!   every linear layer takes, with no memory traffic to speak of. FLOPs are counted as
//!   `2 · rows · cols · tokens` like the model's.
//! - **f32 FMA peak** (`f32_gflops`): the kernel table's register-blocked `acc_rows`
//!   (`O += P · X`, the product MLA's attention runs) on a cache-resident shape, on every
//!   pool thread at once. (A plain f32 dot, which loads two vectors per FMA, read less than
//!   half of it on a Zen 4 core: a load ceiling, not the FMA one.)
//! - **AMX int8 tile peak** (`amx_int8_gflops`, AMX machines only): full-size `tdpbusd` on
//!   register-resident tiles on every pool thread at once
//!   ([`tokenmill_kernels::dispatch::amx_int8_peak_macs`]) — the unit's own ceiling, far above
//!   what the exact integer matmuls reach, so the gap to it is visible.
//! - **Memory bandwidth** (`mem_gbps`): every thread streams its share of a 256 MiB buffer
//!   (far larger than any cache) through the kernel table's SIMD f32 dot, the way decode
//!   streams weights; best of three passes. (A scalar sum read about half of what the decode
//!   kernels reach.)
//!
//! Each figure is the best of a few timed repetitions (ceilings, not averages).

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokenmill_kernels::attention::AccRows;
use tokenmill_kernels::dispatch::{amx_int8_peak_macs, kernels};
use tokenmill_kernels::matmul::{PackedMatrix, QMatrix, dot, matmul};
use tokenmill_kernels::quant::{GgmlType, quantize_row};

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    pub int_gflops: f64,
    pub f32_gflops: f64,
    pub mem_gbps: f64,
    pub threads: usize,
    /// The AMX int8 tile unit's peak (2 ops a multiply-add), where the CPU has one.
    #[serde(default)]
    pub amx_int8_gflops: Option<f64>,
}

impl Roofline {
    /// Runs the three micro-benchmarks (about a second in all).
    pub fn measure() -> Roofline {
        let threads = tokenmill_kernels::pool::global().num_threads();
        Roofline {
            int_gflops: int_dot_gflops(),
            f32_gflops: f32_fma_gflops(threads),
            mem_gbps: mem_read_gbps(threads, 256 << 20),
            threads,
            amx_int8_gflops: amx_int8_gflops(threads),
        }
    }

    /// The better of the two compute ceilings (the model's matmuls use the integer path).
    pub fn peak_gflops(&self) -> f64 {
        self.int_gflops.max(self.f32_gflops)
    }

    /// Arithmetic intensity (FLOP/byte) where the memory and compute roofs meet.
    pub fn ridge(&self) -> f64 {
        self.peak_gflops() / self.mem_gbps.max(1e-9)
    }
}

/// Best rate of `f` (which does `work` units per call) over `reps` runs of at least `min`.
fn best_rate(reps: usize, min: Duration, work: f64, mut f: impl FnMut()) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..reps {
        let t = Instant::now();
        let mut calls = 0u64;
        while t.elapsed() < min || calls == 0 {
            f();
            calls += 1;
        }
        best = best.max(work * calls as f64 / t.elapsed().as_secs_f64());
    }
    best
}

fn int_dot_gflops() -> f64 {
    let (rows, cols, tokens) = (512, 1024, 64);
    let ty = GgmlType::Q4_1;
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let mut data = vec![0u8; rows * row_bytes];
    let src: Vec<f32> = (0..cols)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
        .collect();
    for r in data.chunks_exact_mut(row_bytes) {
        quantize_row(ty, &src, r);
    }
    // Repacked into Rows16, as the model loads its Q4_1 weights.
    let packed = PackedMatrix::pack(&QMatrix::new(ty, rows, cols, &data)).expect("Q4_1 packs");
    let w = packed.view();
    let x: Vec<f32> = (0..tokens * cols).map(|i| (i % 5) as f32 * 0.1).collect();
    let mut out = vec![0f32; tokens * rows];
    let flops = 2.0 * (rows * cols * tokens) as f64;
    best_rate(3, Duration::from_millis(150), flops, || {
        matmul(black_box(&x), &w, &mut out);
        black_box(&out);
    }) / 1e9
}

fn f32_fma_gflops(threads: usize) -> f64 {
    // 16 rows × 256 columns over 192 terms: `x` is 192 KiB (L2), `p` and `o` 12 and 16 KiB.
    let shape = AccRows {
        rows: 16,
        cols: 256,
        n: 192,
        p_stride: 192,
        x_stride: 256,
    };
    let per_call = 2.0 * (shape.rows * shape.cols * shape.n) as f64;
    let rates: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(move || {
                    let p: Vec<f32> = (0..shape.rows * shape.n)
                        .map(|i| (i % 7) as f32 * 1e-3)
                        .collect();
                    let x: Vec<f32> = (0..shape.n * shape.cols)
                        .map(|i| 1.0 - (i % 11) as f32 * 1e-4)
                        .collect();
                    let mut o = vec![0f32; shape.rows * shape.cols];
                    best_rate(3, Duration::from_millis(100), per_call, || {
                        kernels().acc_rows(&shape, black_box(&mut o), &p, &x);
                        black_box(&o);
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0.0)).collect()
    });
    rates.iter().sum::<f64>() / 1e9
}

fn amx_int8_gflops(threads: usize) -> Option<f64> {
    let rates: Vec<Option<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|_| s.spawn(|| amx_int8_peak_macs(Duration::from_millis(150))))
            .collect();
        hs.into_iter().map(|h| h.join().ok().flatten()).collect()
    });
    let macs: Option<f64> = rates.into_iter().sum();
    macs.map(|m| 2.0 * m / 1e9)
}

/// Streaming-read bandwidth over a `bytes`-sized buffer split across `threads`, GB/s: each
/// thread reads its share once through the kernel table's SIMD f32 dot (its two halves
/// dotted together), as the decode kernels stream weights; best of three passes.
pub fn mem_read_gbps(threads: usize, bytes: usize) -> f64 {
    let buf: Vec<f32> = vec![1.0; bytes / 4];
    let chunk = buf.len().div_ceil(threads.max(1));
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let sum: f32 = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|c| {
                    s.spawn(move || {
                        let (x, y) = c.split_at(c.len() / 2);
                        dot(x, &y[..x.len()])
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        black_box(sum);
        best = best.max(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ridge_is_compute_over_bandwidth() {
        let r = Roofline {
            int_gflops: 200.0,
            f32_gflops: 50.0,
            mem_gbps: 20.0,
            threads: 2,
            amx_int8_gflops: None,
        };
        assert_eq!(r.peak_gflops(), 200.0);
        assert_eq!(r.ridge(), 10.0);
    }

    #[test]
    fn measured_ceilings_are_positive_and_finite() {
        let bw = mem_read_gbps(2, 8 << 20);
        assert!(bw.is_finite() && bw > 0.0, "{bw}");
        let g = int_dot_gflops();
        assert!(g.is_finite() && g > 0.0, "{g}");
        // The tile peak exists exactly where the AMX tier can run.
        let amx = amx_int8_gflops(2);
        match tokenmill_kernels::dispatch::Tier::amx_status() {
            Ok(()) => assert!(
                amx.is_some_and(|t| t.is_finite() && t > g),
                "{amx:?} vs {g}"
            ),
            Err(why) => {
                assert_eq!(amx, None);
                eprintln!("skipped: the AMX tile peak: {why}");
            }
        }
    }
}
