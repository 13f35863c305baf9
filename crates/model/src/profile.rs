//! Op timing of the forward pass, for two consumers:
//! - [`OpProfile`]: wall time per op kind, summed (`bench-model`'s "share of time per op
//!   kind"), on when `Workspace::profile` is `Some`;
//! - the trace recorder (`tokenmill-trace`): while a trace session runs, every op is also
//!   recorded as a complete event named [`OpKind::name`] in category `"op"`, with its layer
//!   index as the `layer` argument (no argument for ops outside the layers).
//!
//! When both are off, a timed op costs one `Option` check and one atomic load.
//!
//! The layer index is per thread (the forward pass runs on one calling thread; kernels fan
//! out to the pool inside an op): the layer loop sets it with [`set_layer`], and the
//! [`OpKind::Embed`] op — the first of every forward — clears it, so the first norm (before
//! the layers) has no layer. `Embed` and `LmHead` never carry a layer. The fused norm after a
//! layer's FFN belongs to that layer (for the last layer it is the final norm).
//!
//! The pool workers' share of each op is recorded too, once [`trace_pool_workers`] has run
//! (the engine's launch calls it): a `pool_job` event (category `"pool"`) on each worker's
//! own track ("tokenmill-worker-N") for every job it joins, so a timeline shows each thread's
//! busy strips and the gaps between them. The pool's caller (the engine thread) is worker 0:
//! its share goes on a side track of its own, "tokenmill-worker-0 (caller)", so that every
//! worker's strip reads alike rather than the caller's nesting under its ops.
//!
//! DeepSeek's forward uses the same kinds where its work is the same kind (its Q and latent
//! `kv_a` projections are `qkv_matmul`, the latent norm + RoPE + cache write `rope+kv_write`,
//! MLA `attention`, a dense layer's FFN `ffn_gate_up+silu` / `ffn_down`) and three of its own
//! for a MoE layer: the router, the routed experts and the shared experts.
//!
//! New op kinds are added to [`OpKind`], `OpKind::ALL` and `OpKind::name`; the trace and the
//! profiler's report pick them up by name.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Records the compute pool's jobs on the workers' tracks while a trace session runs (see
/// the module docs). Idempotent; costs a worker one atomic load per job when not tracing.
pub fn trace_pool_workers() {
    fn record(worker: usize, start: Instant, end: Instant) {
        if worker == 0 {
            let lane = "tokenmill-worker-0 (caller)";
            tokenmill_trace::complete_at_lane(lane, "pool_job", "pool", start, end, &[]);
        } else {
            tokenmill_trace::complete_at("pool_job", "pool", start, end, &[]);
        }
    }
    tokenmill_kernels::pool::set_job_observer(tokenmill_kernels::pool::JobObserver {
        active: tokenmill_trace::enabled,
        record,
    });
}

/// The kinds of work a forward pass does, in data-path order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Embed,
    /// Residual add fused with the next RMSNorm (and the first / final norms).
    Norm,
    /// Q, K and V in one pass, plus their biases (DeepSeek: Q and the latent `kv_a`).
    QkvMatmul,
    /// RoPE of Q, and of K fused into the cache write (DeepSeek: the latent's norm and RoPE,
    /// written into the latent cache, and RoPE of Q's rope part).
    RopeKvWrite,
    /// Attention over the KV cache (DeepSeek: MLA over the latent cache, with the absorbed
    /// `kv_b` projections).
    Attention,
    OutProj,
    /// Gate and up projections with the SiLU gate fused in.
    FfnGateUp,
    FfnDown,
    /// MoE: the router matmul, top-k routing and grouping the tokens by expert.
    MoeRouter,
    /// MoE: the routed experts' SwiGLU FFNs and their weighted sum.
    MoeExperts,
    /// MoE: the shared experts' SwiGLU FFN.
    MoeShared,
    LmHead,
}

impl OpKind {
    pub const ALL: [OpKind; 12] = [
        OpKind::Embed,
        OpKind::Norm,
        OpKind::QkvMatmul,
        OpKind::RopeKvWrite,
        OpKind::Attention,
        OpKind::OutProj,
        OpKind::FfnGateUp,
        OpKind::FfnDown,
        OpKind::MoeRouter,
        OpKind::MoeExperts,
        OpKind::MoeShared,
        OpKind::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Embed => "embed",
            OpKind::Norm => "add_rms_norm",
            OpKind::QkvMatmul => "qkv_matmul",
            OpKind::RopeKvWrite => "rope+kv_write",
            OpKind::Attention => "attention",
            OpKind::OutProj => "attn_output",
            OpKind::FfnGateUp => "ffn_gate_up+silu",
            OpKind::FfnDown => "ffn_down",
            OpKind::MoeRouter => "moe_router",
            OpKind::MoeExperts => "moe_experts",
            OpKind::MoeShared => "moe_shared_experts",
            OpKind::LmHead => "lm_head",
        }
    }
}

/// Accumulated wall time per [`OpKind`].
#[derive(Clone, Debug, Default)]
pub struct OpProfile {
    totals: [Duration; OpKind::ALL.len()],
}

impl OpProfile {
    pub fn total(&self, kind: OpKind) -> Duration {
        self.totals[kind as usize]
    }

    pub fn sum(&self) -> Duration {
        self.totals.iter().sum()
    }

    pub fn reset(&mut self) {
        *self = OpProfile::default();
    }
}

/// No layer (ops before and after the layer loop).
const NO_LAYER: u32 = u32::MAX;

thread_local! {
    /// Layer index of the ops this thread runs now, [`NO_LAYER`] outside the layer loop.
    static LAYER: Cell<u32> = const { Cell::new(NO_LAYER) };
}

/// Tells the trace which layer the following ops belong to (called by the layer loop).
#[inline]
pub(crate) fn set_layer(l: usize) {
    if tokenmill_trace::enabled() {
        LAYER.with(|c| c.set(l as u32));
    }
}

/// Starts timing an op if profiling or tracing is on.
#[inline]
pub(crate) fn start(p: &Option<OpProfile>) -> Option<Instant> {
    (p.is_some() || tokenmill_trace::enabled()).then(Instant::now)
}

/// Adds the time since `t` to `kind`, and records the op in the trace when it is on.
#[inline]
pub(crate) fn stop(p: &mut Option<OpProfile>, kind: OpKind, t: Option<Instant>) {
    let Some(t) = t else { return };
    let end = Instant::now();
    if let Some(p) = p.as_mut() {
        p.totals[kind as usize] += end - t;
    }
    if tokenmill_trace::enabled() {
        record(kind, t, end);
    }
}

fn record(kind: OpKind, t: Instant, end: Instant) {
    let layer = match kind {
        OpKind::Embed => {
            LAYER.with(|c| c.set(NO_LAYER));
            NO_LAYER
        }
        OpKind::LmHead => NO_LAYER,
        _ => LAYER.with(Cell::get),
    };
    let name = kind.name();
    if layer == NO_LAYER {
        tokenmill_trace::complete_at(name, "op", t, end, &[]);
    } else {
        let args = [("layer", tokenmill_trace::Arg::Int(layer.into()))];
        tokenmill_trace::complete_at(name, "op", t, end, &args);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_totals_work_without_tracing() {
        let mut p = Some(OpProfile::default());
        let t = start(&p);
        assert!(t.is_some());
        std::thread::sleep(Duration::from_millis(1));
        stop(&mut p, OpKind::Attention, t);
        let p = p.unwrap();
        assert!(p.total(OpKind::Attention) >= Duration::from_millis(1));
        assert_eq!(p.sum(), p.total(OpKind::Attention));
        // Neither profile nor trace: nothing is timed.
        assert!(start(&None).is_none() || tokenmill_trace::enabled());
    }
}
