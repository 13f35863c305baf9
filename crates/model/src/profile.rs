//! [`OpProfile`]: optional wall time per op kind of the forward pass, for `bench-model`'s
//! "share of time per op kind" and, later, the profiler's op × layer view.
//!
//! Off by default (`Workspace::profile == None`), when a timed op costs one `Option` check.

use std::time::{Duration, Instant};

/// The kinds of work a forward pass does, in data-path order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Embed,
    Norm,
    QkvMatmul,
    RopeKvWrite,
    Attention,
    OutProj,
    FfnMatmul,
    Activation,
    LmHead,
}

impl OpKind {
    pub const ALL: [OpKind; 9] = [
        OpKind::Embed,
        OpKind::Norm,
        OpKind::QkvMatmul,
        OpKind::RopeKvWrite,
        OpKind::Attention,
        OpKind::OutProj,
        OpKind::FfnMatmul,
        OpKind::Activation,
        OpKind::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Embed => "embed",
            OpKind::Norm => "rms_norm+residual",
            OpKind::QkvMatmul => "qkv_matmul",
            OpKind::RopeKvWrite => "rope+kv_write",
            OpKind::Attention => "attention",
            OpKind::OutProj => "attn_output",
            OpKind::FfnMatmul => "ffn_matmul",
            OpKind::Activation => "silu_mul",
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

/// Starts timing an op if profiling is on.
pub(crate) fn start(p: &Option<OpProfile>) -> Option<Instant> {
    p.as_ref().map(|_| Instant::now())
}

/// Adds the time since `t` to `kind`.
pub(crate) fn stop(p: &mut Option<OpProfile>, kind: OpKind, t: Option<Instant>) {
    if let (Some(p), Some(t)) = (p.as_mut(), t) {
        p.totals[kind as usize] += t.elapsed();
    }
}
