//! The report: the [`Verdict`] with its evidence and next step, and the plain-text rendering
//! of an [`Analysis`] against a [`Roofline`].
//!
//! The verdict's rule, in order:
//! 1. **Overhead-bound** when more than [`OVERHEAD_BOUND`] of the wall time is not in model
//!    ops (scheduling, batch preparation, sampling, updates, glue between ops, and idle time
//!    between steps) — faster kernels cannot help much there.
//! 2. Otherwise compare the ops' time-weighted use of the two roofs: achieved bytes/s over
//!    the measured bandwidth vs achieved FLOP/s over the measured compute peak.
//!    **Memory-bound** if the bandwidth share is the larger, else **compute-bound**.

use std::fmt::Write;

use crate::analysis::{Analysis, STAGES};
use crate::roofline::Roofline;

/// Share of wall time outside model ops above which a run is overhead-bound.
pub const OVERHEAD_BOUND: f64 = 0.30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Overhead,
    Memory,
    Compute,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub bound: Bound,
    /// Wall time outside model ops, share.
    pub overhead_share: f64,
    /// Ops' achieved bandwidth and compute as shares of the roofline.
    pub mem_use: f64,
    pub compute_use: f64,
}

impl Verdict {
    pub fn of(a: &Analysis, roof: &Roofline) -> Verdict {
        let wall = a.gaps.wall_us.max(1e-9);
        let overhead_share = (1.0 - a.gaps.op_us / wall).clamp(0.0, 1.0);
        let known: Vec<_> = a.ops.iter().filter(|o| o.flops.is_some()).collect();
        let secs: f64 = known.iter().map(|o| o.total_us).sum::<f64>() / 1e6;
        let flops: f64 = known.iter().filter_map(|o| o.flops).sum();
        let bytes: f64 = known.iter().filter_map(|o| o.bytes).sum();
        let mem_use = bytes / secs.max(1e-12) / (roof.mem_gbps * 1e9).max(1e-9);
        let compute_use = flops / secs.max(1e-12) / (roof.peak_gflops() * 1e9).max(1e-9);
        let bound = if overhead_share > OVERHEAD_BOUND {
            Bound::Overhead
        } else if mem_use >= compute_use {
            Bound::Memory
        } else {
            Bound::Compute
        };
        Verdict {
            bound,
            overhead_share,
            mem_use,
            compute_use,
        }
    }

    pub fn headline(&self) -> &'static str {
        match self.bound {
            Bound::Overhead => "IO/overhead-bound: the CPU spends its time outside the model's ops",
            Bound::Memory => "memory-bound: the ops stream weights and KV faster than they compute",
            Bound::Compute => {
                "compute-bound: the ops run closer to the compute roof than to the memory roof"
            }
        }
    }

    pub fn next_step(&self, a: &Analysis) -> String {
        match self.bound {
            Bound::Overhead => {
                let g = &a.gaps;
                let worst = STAGES
                    .iter()
                    .zip(g.stage_us)
                    .filter(|(n, _)| **n != "forward")
                    .max_by(|x, y| x.1.total_cmp(&y.1))
                    .map_or("schedule", |(n, _)| n);
                if g.idle_us > g.step_us - g.op_us {
                    "the engine waits between steps: keep more requests in flight (higher \
                     concurrency), and overlap tokenization and detokenization with steps"
                        .to_string()
                } else {
                    format!(
                        "cut per-step CPU work, starting with `{worst}` (the largest stage outside \
                         the forward pass); fuse small ops to shrink glue between kernels"
                    )
                }
            }
            Bound::Memory => "raise arithmetic intensity: larger batches (more tokens per weight \
                              read), fused ops that keep activations in cache, smaller weight/KV \
                              formats"
                .to_string(),
            Bound::Compute => "faster kernels (a wider SIMD tier, better tiling) or more cores; a \
                               larger batch will not raise throughput much"
                .to_string(),
        }
    }
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1e3)
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

/// The whole report as text.
pub fn render(a: &Analysis, roof: &Roofline, top: usize) -> String {
    let mut s = String::new();
    let g = &a.gaps;
    let _ = writeln!(
        s,
        "steps: {}  wall: {}  generated: {} tok ({:.1} tok/s)  processed: {} tok",
        a.steps.len(),
        ms(g.wall_us),
        a.generated_tokens,
        a.output_tok_s(),
        a.processed_tokens
    );
    let _ = write!(
        s,
        "roofline ({} threads): int dot {:.1} GFLOP/s, f32 FMA {:.1} GFLOP/s, memory {:.1} GB/s",
        roof.threads, roof.int_gflops, roof.f32_gflops, roof.mem_gbps
    );
    match roof.amx_int8_gflops {
        Some(t) => writeln!(s, "; AMX int8 tiles {t:.0} GOP/s (%tile)"),
        None => writeln!(s),
    }
    .ok();
    render_ops(&mut s, a, roof, top);
    render_gaps(&mut s, a);
    render_workers(&mut s, a);
    render_critical(&mut s, a);
    let v = Verdict::of(a, roof);
    let _ = writeln!(s, "\n== verdict: {}", v.headline());
    let _ = writeln!(
        s,
        "evidence: {:.0}% of wall time outside model ops (threshold {:.0}%); ops use {:.0}% of \
         the memory roof and {:.0}% of the compute roof",
        v.overhead_share * 100.0,
        OVERHEAD_BOUND * 100.0,
        v.mem_use * 100.0,
        v.compute_use * 100.0
    );
    let _ = writeln!(s, "next step: {}", v.next_step(a));
    s
}

fn render_workers(s: &mut String, a: &Analysis) {
    let _ = writeln!(s, "\n== pool workers (busy share of the forward passes)");
    if a.workers.is_empty() {
        let _ = writeln!(
            s,
            "none traced (one thread, or a trace from before worker tracks)"
        );
    }
    for w in &a.workers {
        let _ = writeln!(
            s,
            "{:<22} {:>5.1}%  {} jobs, {} busy of {} forward",
            w.track,
            w.utilisation() * 100.0,
            w.jobs,
            ms(w.busy_us),
            ms(w.forward_us)
        );
    }
}

/// The compute roof of op `name`, GFLOP/s: the f32 FMA roof for the ops that compute in f32
/// (attention, the router's f32 matmul, RoPE and the norms), the integer dot roof for the
/// quantized matmuls — or for float weights, the better of the two.
fn op_roof(roof: &Roofline, name: &str) -> f64 {
    if is_f32_op(name) {
        roof.f32_gflops
    } else {
        roof.peak_gflops()
    }
}

/// Whether op `name` computes in f32 (not on the integer matmul path).
fn is_f32_op(name: &str) -> bool {
    matches!(
        name,
        "attention" | "moe_router" | "rope+kv_write" | "add_rms_norm"
    )
}

fn render_ops(s: &mut String, a: &Analysis, roof: &Roofline, top: usize) {
    let total: f64 = a.ops.iter().map(|o| o.total_us).sum();
    let _ = writeln!(s, "\n== top ops");
    // On an AMX machine, the integer matmuls' share of the tile unit's peak as well.
    let tile = roof.amx_int8_gflops;
    let _ = write!(
        s,
        "{:<18} {:>7} {:>11} {:>9} {:>6} {:>9} {:>8} {:>6} {:>6}",
        "op", "count", "total", "mean µs", "share", "GFLOP/s", "GB/s", "%cmp", "%mem"
    );
    let _ = writeln!(s, "{}", if tile.is_some() { "  %tile" } else { "" });
    for o in a.ops.iter().take(top) {
        let pct = |v: Option<f64>, peak: f64| opt(v.map(|v| 100.0 * v / peak.max(1e-9)), 0);
        let tile_pct = match tile {
            Some(t) if !is_f32_op(&o.name) => format!(" {:>6}", pct(o.gflops(), t)),
            Some(_) => format!(" {:>6}", "-"),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "{:<18} {:>7} {:>11} {:>9.1} {:>5.1}% {:>9} {:>8} {:>6} {:>6}{}",
            o.name,
            o.count,
            ms(o.total_us),
            o.mean_us(),
            100.0 * o.total_us / total.max(1e-9),
            opt(o.gflops(), 1),
            opt(o.gbps(), 1),
            pct(o.gflops(), op_roof(roof, &o.name)),
            pct(o.gbps(), roof.mem_gbps),
            tile_pct,
        );
    }
}

fn render_gaps(s: &mut String, a: &Analysis) {
    let g = &a.gaps;
    let _ = writeln!(s, "\n== gaps");
    let _ = writeln!(
        s,
        "step time {}: model ops {} , outside ops {} ({:.1}% of step time)",
        ms(g.step_us),
        ms(g.op_us),
        ms(g.step_us - g.op_us),
        100.0 * g.outside_share()
    );
    for (name, us) in STAGES.iter().zip(g.stage_us) {
        if *name == "forward" {
            let _ = writeln!(
                s,
                "  {name:<14} {} (glue between ops {})",
                ms(us),
                ms(g.forward_glue_us)
            );
        } else {
            let share = 100.0 * us / g.step_us.max(1e-9);
            let _ = writeln!(s, "  {name:<14} {} ({share:.1}%)", ms(us));
        }
    }
    let _ = writeln!(
        s,
        "idle between steps: {} ({:.1}% of wall), largest gap {}, {} gaps over 1 ms",
        ms(g.idle_us),
        100.0 * g.idle_share(),
        ms(g.max_gap_us),
        g.num_gaps_over_1ms
    );
}

fn render_critical(s: &mut String, a: &Analysis) {
    let _ = writeln!(s, "\n== critical path (slowest first token)");
    let Some(c) = &a.critical else {
        let _ = writeln!(s, "no request's queue wait is in the trace");
        return;
    };
    let _ = writeln!(
        s,
        "request {} ({} prompt tokens): TTFT {} (median over requests {})",
        c.req,
        c.prompt_tokens,
        ms(c.ttft_us),
        ms(a.median_ttft_us.unwrap_or(0.0))
    );
    let pct = |us: f64| 100.0 * us / c.ttft_us.max(1e-9);
    let _ = writeln!(
        s,
        "  queue wait       {} ({:.0}%)",
        ms(c.queue_us),
        pct(c.queue_us)
    );
    let own: usize = c.prefill.iter().map(|p| p.1).sum();
    let batch: usize = c.prefill.iter().map(|p| p.2).sum();
    let _ = writeln!(
        s,
        "  prefill steps    {} ({:.0}%) in {} chunk(s); its {} tokens shared those steps with {} others",
        ms(c.prefill_steps_us()),
        pct(c.prefill_steps_us()),
        c.prefill.len(),
        own,
        batch.saturating_sub(own)
    );
    let _ = writeln!(
        s,
        "  between steps    {} ({:.0}%)",
        ms(c.between_steps_us()),
        pct(c.between_steps_us())
    );
    let _ = writeln!(
        s,
        "  then {} decode steps, {} each on average",
        c.decode_steps,
        ms(c.mean_decode_step_us)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::tests::hand_trace;
    use crate::analysis::{GapStats, OpStat};

    fn roof() -> Roofline {
        Roofline {
            int_gflops: 100.0,
            f32_gflops: 10.0,
            mem_gbps: 10.0,
            threads: 2,
            amx_int8_gflops: None,
        }
    }

    fn busy(flops: f64, bytes: f64) -> Analysis {
        // 1 s of wall, 0.9 s of which in one op.
        Analysis {
            gaps: GapStats {
                wall_us: 1e6,
                step_us: 1e6,
                op_us: 0.9e6,
                ..GapStats::default()
            },
            ops: vec![OpStat {
                name: "ffn_down".into(),
                count: 10,
                total_us: 0.9e6,
                flops: Some(flops),
                bytes: Some(bytes),
            }],
            ..Analysis::default()
        }
    }

    #[test]
    fn hand_trace_is_overhead_bound() {
        let a = Analysis::of(&hand_trace());
        let v = Verdict::of(&a, &roof());
        // 115 µs of ops in 240 µs of wall: 125/240 outside.
        assert!((v.overhead_share - 125.0 / 240.0).abs() < 1e-12);
        assert_eq!(v.bound, Bound::Overhead);
        let text = render(&a, &roof(), 10);
        assert!(text.contains("IO/overhead-bound"), "{text}");
        assert!(
            text.contains("request 1 (4 prompt tokens): TTFT 0.11 ms"),
            "{text}"
        );
    }

    #[test]
    fn memory_vs_compute_by_roof_shares() {
        // 0.9 s: 7.2 GB → 8 GB/s = 80% of memory; 9 GFLOP → 10 GFLOP/s = 10% of compute.
        let v = Verdict::of(&busy(9e9, 7.2e9), &roof());
        assert_eq!(v.bound, Bound::Memory);
        assert!((v.mem_use - 0.8).abs() < 1e-9 && (v.compute_use - 0.1).abs() < 1e-9);
        assert!((v.overhead_share - 0.1).abs() < 1e-9);
        // 72 GFLOP → 80 GFLOP/s = 80% of compute; 0.9 GB → 10% of memory.
        let v = Verdict::of(&busy(72e9, 0.9e9), &roof());
        assert_eq!(v.bound, Bound::Compute);
    }

    #[test]
    fn an_amx_roof_adds_the_tile_share_of_integer_ops() {
        let a = busy(72e9, 0.9e9);
        let text = render(&a, &roof(), 10);
        assert!(!text.contains("%tile"), "{text}");
        let amx = Roofline {
            amx_int8_gflops: Some(1000.0),
            ..roof()
        };
        let text = render(&a, &amx, 10);
        assert!(text.contains("AMX int8 tiles 1000 GOP/s (%tile)"), "{text}");
        // ffn_down: 80 GFLOP/s (80% of the int dot roof, 8% of the tiles'), 1 GB/s (10%).
        let row = text
            .lines()
            .find(|l| l.starts_with("ffn_down"))
            .expect(&text);
        assert!(row.ends_with("80     10      8"), "{row}");
        // The verdict still weighs the kernels' own roof.
        assert_eq!(Verdict::of(&a, &amx).bound, Bound::Compute);
    }
}
