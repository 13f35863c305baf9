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
//!
//! A DeepSeek model ([`DeepSeekShape`]) adds MLA and MoE: its attention is counted per chunk
//! of the step, in the form the model runs it ([`DeepSeekShape::mla_expanded`]: a prefill
//! chunk expanded, a decode absorbed); its routed experts stream at most `min(E, T·k)`
//! experts' weights (every one a token picked, at most all of them).

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
    /// MLA and MoE, for a DeepSeek model (then `head_dim` is a query head's `nope + rope`,
    /// `kv_dim` the latent row, `ffn_hidden` and the FFN bytes the dense layers').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deepseek: Option<DeepSeekShape>,
}

/// DeepSeek's MLA widths, MoE shape and their weight bytes per layer (means over the layers
/// that have them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeepSeekShape {
    pub kv_lora_rank: usize,
    pub qk_nope: usize,
    pub qk_rope: usize,
    pub v_head: usize,
    /// `0` without a q LoRA.
    pub q_lora_rank: usize,
    pub n_experts: usize,
    pub experts_per_tok: usize,
    pub n_shared: usize,
    pub moe_hidden: usize,
    /// `W_UK` and `W_UV` (`attn_k_b` + `attn_v_b`).
    pub kv_b_bytes: f64,
    /// One routed expert's gate + up + down.
    pub expert_bytes: f64,
    /// The shared experts' gate + up + down.
    pub shared_bytes: f64,
}

/// Keys the expanded form expands at a time (tokenmill-model's `mla_expanded::KEY_BLOCK`).
const KEY_BLOCK: f64 = 256.0;

impl DeepSeekShape {
    /// Whether the model runs MLA over a chunk of `t` tokens after `p` cached keys in the
    /// expanded form: tokenmill's rule (`DeepSeekConfig::mla_expanded_pays`), the form with
    /// fewer multiply-adds.
    pub fn mla_expanded(&self, t: usize, p: usize) -> bool {
        let (nope, v, r) = (self.qk_nope, self.v_head, self.kv_lora_rank);
        let per_pair = (2 * r).saturating_sub(nope + v);
        let pairs = t * p + t * (t + 1) / 2;
        p * (nope + v) * r < pairs * per_pair
    }

    /// MLA's work over `chunks` (`(start, tokens)` each), `H` heads, latent rows of
    /// `kv_elem_bytes` elements. Expanded: `kv_b` expands every key (its f32 copy read once a
    /// block of keys; every latent row read once and its keys and values written), then a
    /// head's score and value accumulation per pair; absorbed: `W_UK_hᵀ` and `W_UV_h` per
    /// token (their stored bytes read once), then the latent score and accumulation per pair,
    /// each pair reading its latent row.
    fn attention(&self, nh: f64, kv_elem_bytes: f64, chunks: &[(usize, usize)]) -> Cost {
        let (r, rope) = (self.kv_lora_rank as f64, self.qk_rope as f64);
        let (nope, v) = (self.qk_nope as f64, self.v_head as f64);
        let row = (r + rope) * kv_elem_bytes;
        let proj = 2.0 * nh * (nope + v) * r; // kv_b over one key, or both halves over one query
        let mut cost = Cost::default();
        for &(p, t) in chunks {
            let pairs = (t * p + t * (t + 1) / 2) as f64;
            let (keys, t) = ((p + t) as f64, t as f64);
            let (flops, bytes) = match self.mla_expanded(t as usize, p) {
                true => (
                    keys * proj + pairs * 2.0 * nh * (nope + rope + v),
                    keys * (row + 4.0 * nh * (nope + rope + v))
                        + (keys / KEY_BLOCK).ceil() * 4.0 * proj / 2.0,
                ),
                false => (
                    t * proj + pairs * 2.0 * nh * (2.0 * r + rope),
                    pairs * row + self.kv_b_bytes,
                ),
            };
            let act = 4.0 * t * nh * (nope + rope + v);
            cost.flops += flops;
            cost.bytes += bytes + act;
        }
        cost
    }
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

/// The work of one call of op `name` (a `tokenmill_model::OpKind` name) over batch `b`, whose
/// chunks are `chunks` (`(start, tokens)` each; DeepSeek's MLA is counted per chunk), or
/// `None` for an op this table does not know.
pub fn op_cost(
    m: &ModelShape,
    name: &str,
    b: &BatchShape,
    chunks: &[(usize, usize)],
) -> Option<Cost> {
    if let Some(d) = &m.deepseek
        && let Some(cost) = deepseek_cost(m, d, name, b, chunks)
    {
        return Some(cost);
    }
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

/// The ops whose work differs in a DeepSeek model (`None`: as the Llama family's, from the
/// shared fields).
fn deepseek_cost(
    m: &ModelShape,
    d: &DeepSeekShape,
    name: &str,
    b: &BatchShape,
    chunks: &[(usize, usize)],
) -> Option<Cost> {
    let (t, h, nh) = (b.tokens, m.hidden as f64, m.n_heads as f64);
    let q_out = nh * (d.qk_nope + d.qk_rope) as f64;
    let latent = (d.kv_lora_rank + d.qk_rope) as f64;
    let act = |cols_in: f64, cols_out: f64, rows: f64| 4.0 * rows * (cols_in + cols_out);
    let c = |flops: f64, bytes: f64| Some(Cost { flops, bytes });
    let (e, k, mh) = (
        d.n_experts as f64,
        d.experts_per_tok as f64,
        d.moe_hidden as f64,
    );
    match name {
        "qkv_matmul" => {
            let q = match d.q_lora_rank {
                0 => h * q_out,
                ql => (h + q_out) * ql as f64,
            };
            c(
                2.0 * t * (q + h * latent),
                m.qkv_bytes + act(h, q_out + latent, t),
            )
        }
        "rope+kv_write" => c(
            3.0 * t * (q_out + latent),
            4.0 * 2.0 * t * (q_out + latent) + t * latent * m.kv_elem_bytes as f64,
        ),
        "attention" => {
            let whole = [(0, b.tokens as usize)];
            let chunks = if chunks.is_empty() {
                &whole[..]
            } else {
                chunks
            };
            let a = d.attention(nh, m.kv_elem_bytes as f64, chunks);
            Some(a)
        }
        "attn_output" => {
            let o = nh * d.v_head as f64;
            c(2.0 * t * o * h, m.out_bytes + act(o, h, t))
        }
        "moe_router" => c(2.0 * t * h * e, 4.0 * h * e + act(h, e, t)),
        "moe_experts" => c(
            2.0 * t * k * 3.0 * h * mh,
            (t * k).min(e) * d.expert_bytes + act(h, 3.0 * mh, t * k),
        ),
        "moe_shared_experts" => {
            let w = mh * d.n_shared as f64;
            c(2.0 * t * 3.0 * h * w, d.shared_bytes + act(h, 3.0 * w, t))
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
            op_cost(&m, "qkv_matmul", &b, &[]),
            Some(Cost {
                flops: 768.0,
                bytes: 388.0
            })
        );
        // 4·(2·4)·6 = 192 FLOPs; KV 3·4·2·4 = 96 bytes + 4·3·(8 + 8) = 192.
        assert_eq!(
            op_cost(&m, "attention", &b, &[]),
            Some(Cost {
                flops: 192.0,
                bytes: 288.0
            })
        );
        // LM head on one row: 2·1·8·10 = 160 FLOPs; 60 + 4·(8 + 10) = 132 bytes.
        assert_eq!(
            op_cost(&m, "lm_head", &b, &[]),
            Some(Cost {
                flops: 160.0,
                bytes: 132.0
            })
        );
        assert_eq!(op_cost(&m, "moe_experts", &b, &[]), None);
    }

    /// A DeepSeek shape: 2 heads, r 8, nope 4, rope 2, v 4, 4 experts (2 a token, 1 shared,
    /// width 3).
    fn deepseek_shape() -> ModelShape {
        ModelShape {
            n_heads: 2,
            head_dim: 6,
            kv_dim: 10,
            deepseek: Some(DeepSeekShape {
                kv_lora_rank: 8,
                qk_nope: 4,
                qk_rope: 2,
                v_head: 4,
                q_lora_rank: 0,
                n_experts: 4,
                experts_per_tok: 2,
                n_shared: 1,
                moe_hidden: 3,
                kv_b_bytes: 70.0,
                expert_bytes: 30.0,
                shared_bytes: 20.0,
            }),
            ..shape()
        }
    }

    #[test]
    fn mla_is_counted_per_chunk_in_the_form_that_runs() {
        let m = deepseek_shape();
        let d = m.deepseek.as_ref().unwrap();
        // 2r − nope − v = 8 per pair saved; (nope + v)·r = 64 per cached key spent.
        assert!(d.mla_expanded(3, 0), "a first chunk");
        assert!(!d.mla_expanded(1, 5), "a decode: 5·64 > 6·8");
        assert!(d.mla_expanded(20, 5), "a long chunk: 320 < (100 + 210)·8");
        // A step of a first chunk of 3 tokens and a decode at position 5 (6 keys).
        let b = BatchShape {
            tokens: 4.0,
            logit_rows: 2.0,
            attn_ctx: 12.0,
            kv_read: 9.0,
        };
        let got = op_cost(&m, "attention", &b, &[(0, 3), (5, 1)]).unwrap();
        // Expanded chunk: 3 keys · 2·2·(4 + 4)·8 = 768, 6 pairs · 2·2·(4 + 2 + 4) = 240.
        // Absorbed decode: 1 token · 256, 6 pairs · 2·2·(16 + 2) = 432.
        assert_eq!(got.flops, 768.0 + 240.0 + 256.0 + 432.0);
        // Expanded: 3 keys · (40-byte rows + 4·2·10 written) + one block of f32 kv_b
        // (4·128); absorbed: 6 rows of 40 + kv_b 70; activations 4·t·2·10 each.
        assert_eq!(
            got.bytes,
            3.0 * 120.0 + 512.0 + 240.0 + 6.0 * 40.0 + 70.0 + 80.0
        );
        // Experts: 4 tokens · 2 experts · 2·3·8·3 FLOPs; min(4, 8) experts' bytes.
        let e = op_cost(&m, "moe_experts", &b, &[]).unwrap();
        assert_eq!(e.flops, 4.0 * 2.0 * 2.0 * 3.0 * 8.0 * 3.0);
        assert_eq!(e.bytes, 4.0 * 30.0 + 4.0 * 8.0 * (8.0 + 9.0));
        // The LM head is the Llama family's.
        assert_eq!(
            op_cost(&m, "lm_head", &b, &[]),
            op_cost(&shape(), "lm_head", &b, &[])
        );
    }
}
