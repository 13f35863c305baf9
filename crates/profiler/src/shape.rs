//! [`ModelShape`]: the model's dimensions and weight sizes as stored in a trace's
//! `otherData.model_shape`, and [`op_cost`]: the FLOPs and bytes one traced op moved.
//!
//! The runner records each step's batch shape on its `execute_model` event
//! ([`BatchShape`]: tokens, logit rows, Σ attended context, Σ KV read); with the model shape
//! that gives every op's work. The counts follow `bench-model`'s: a matmul is `2·T·rows·cols`
//! FLOPs and streams its weight once per call plus its f32 activations; attention is
//! `4·heads·head_dim` FLOPs per (token, context position) pair and reads each chunk's K and V
//! once. Ops this table does not know (a new op kind) have no cost: the report shows their
//! time without GFLOP/s.

use serde::{Deserialize, Serialize};

/// Dimensions and per-layer weight bytes of a Llama-family model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    /// `n_kv_heads · head_dim`.
    pub kv_dim: usize,
    pub ffn_hidden: usize,
    pub vocab: usize,
    /// Bytes per element of the KV cache.
    pub kv_elem_bytes: usize,
    /// Weight bytes per layer (mean over layers) of Q+K+V, the output projection, gate+up
    /// and down.
    pub qkv_bytes: f64,
    pub out_bytes: f64,
    pub gate_up_bytes: f64,
    pub down_bytes: f64,
    pub lm_head_bytes: f64,
    /// Bytes of one row of the token embedding.
    pub embed_row_bytes: f64,
}

/// A step's batch as recorded on `execute_model`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchShape {
    pub tokens: f64,
    pub logit_rows: f64,
    /// Σ over tokens of the positions each attends to.
    pub attn_ctx: f64,
    /// Σ over chunks of the positions whose K and V attention reads.
    pub kv_read: f64,
}

/// Work of one op: floating-point (or integer multiply-add) operations and bytes moved.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub flops: f64,
    pub bytes: f64,
}

/// The work of one call of op `name` (a `tokenmill_model::OpKind` name) over batch `b`, or
/// `None` for an op this table does not know.
pub fn op_cost(m: &ModelShape, name: &str, b: &BatchShape) -> Option<Cost> {
    let t = b.tokens;
    let (h, q, kv, f) = (
        m.hidden as f64,
        (m.n_heads * m.head_dim) as f64,
        m.kv_dim as f64,
        m.ffn_hidden as f64,
    );
    let act = |cols_in: f64, cols_out: f64, rows: f64| 4.0 * rows * (cols_in + cols_out);
    let c = |flops: f64, bytes: f64| Some(Cost { flops, bytes });
    match name {
        "embed" => c(0.0, t * (m.embed_row_bytes + 4.0 * h)),
        "add_rms_norm" => c(5.0 * t * h, 4.0 * 3.0 * t * h),
        "qkv_matmul" => c(
            2.0 * t * h * (q + 2.0 * kv),
            m.qkv_bytes + act(h, q + 2.0 * kv, t),
        ),
        "rope+kv_write" => c(3.0 * t * (q + kv), 4.0 * 2.0 * t * (q + 2.0 * kv)),
        "attention" => {
            let kv_bytes = b.kv_read * kv * 2.0 * m.kv_elem_bytes as f64;
            c(
                4.0 * (m.n_heads * m.head_dim) as f64 * b.attn_ctx,
                kv_bytes + act(q, q, t),
            )
        }
        "attn_output" => c(2.0 * t * q * h, m.out_bytes + act(q, h, t)),
        "ffn_gate_up+silu" => c(2.0 * t * h * 2.0 * f, m.gate_up_bytes + act(h, f, t)),
        "ffn_down" => c(2.0 * t * f * h, m.down_bytes + act(f, h, t)),
        "lm_head" => {
            let r = b.logit_rows;
            c(
                2.0 * r * h * m.vocab as f64,
                m.lm_head_bytes + act(h, m.vocab as f64, r),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // The small model shape of the analysis tests' hand-built trace.
    use crate::analysis::tests::shape;

    #[test]
    fn matmul_and_attention_costs_by_hand() {
        let b = BatchShape {
            tokens: 3.0,
            logit_rows: 1.0,
            attn_ctx: 6.0, // one chunk of 3 tokens from position 0: 1 + 2 + 3
            kv_read: 3.0,
        };
        let m = shape();
        // 2·3·8·(8 + 2·4) = 768 FLOPs; 100 weight bytes + 4·3·(8 + 16) = 388.
        assert_eq!(
            op_cost(&m, "qkv_matmul", &b),
            Some(Cost {
                flops: 768.0,
                bytes: 388.0
            })
        );
        // 4·(2·4)·6 = 192 FLOPs; KV 3·4·2·4 = 96 bytes + 4·3·(8 + 8) = 192.
        assert_eq!(
            op_cost(&m, "attention", &b),
            Some(Cost {
                flops: 192.0,
                bytes: 288.0
            })
        );
        // LM head on one row: 2·1·8·10 = 160 FLOPs; 60 + 4·(8 + 10) = 132 bytes.
        assert_eq!(
            op_cost(&m, "lm_head", &b),
            Some(Cost {
                flops: 160.0,
                bytes: 132.0
            })
        );
        assert_eq!(op_cost(&m, "moe_experts", &b), None);
    }
}
