//! Mixture-of-experts routing and the grouped expert pass.
//!
//! Routing follows transformers' `DeepseekV2TopkRouter` / `DeepseekV3TopkRouter` exactly
//! (fp32 router logits): V2 takes the top-k softmax scores (optionally only from the
//! `topk_group` groups with the highest max score) times `routed_scaling_factor`; V3 chooses
//! by `sigmoid + e_score_correction_bias` (groups ranked by the sum of their two best biased
//! scores, masked groups scored -inf), weights by the unbiased sigmoid scores, optionally
//! normalised to sum 1 (`norm_topk_prob`), times `routed_scaling_factor`.
//!
//! Experts run grouped: every (token, expert) pair is bucketed by expert, each expert's rows
//! are gathered into one matrix and run through its SwiGLU MLP with one matmul per weight,
//! and the outputs are scattered back scaled by the routing weight.

use super::config::{DeepSeekConfig, Routing};

/// Top `k` indices of `v` by value, highest first (ties: lower index first).
fn top_k(v: &[f32], k: usize, idx: &mut Vec<usize>) {
    idx.clear();
    idx.extend(0..v.len());
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
}

/// Keeps only the experts of the `topk_group` best groups (`group_score` ranks a group's
/// slice); others are set to `fill` (transformers: 0 for V2, -inf for V3).
fn mask_groups(
    cfg: &DeepSeekConfig,
    s: &mut [f32],
    fill: f32,
    group_score: impl Fn(&[f32]) -> f32,
) {
    let per = s.len() / cfg.n_group;
    let gs: Vec<f32> = s.chunks(per).map(&group_score).collect();
    let mut keep = Vec::new();
    top_k(&gs, cfg.topk_group, &mut keep);
    for (g, chunk) in s.chunks_mut(per).enumerate() {
        if !keep.contains(&g) {
            chunk.fill(fill);
        }
    }
}

/// The experts and weights for one token with router logits `logits` (`[n_experts]`).
pub fn route(
    cfg: &DeepSeekConfig,
    logits: &[f32],
    bias: Option<&[f32]>,
    out: &mut Vec<(usize, f32)>,
) {
    out.clear();
    let k = cfg.n_experts_per_tok;
    let mut idx = Vec::with_capacity(logits.len());
    match cfg.routing {
        Routing::Softmax { group_limited } => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut s: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
            let sum: f32 = s.iter().sum();
            s.iter_mut().for_each(|v| *v /= sum);
            if group_limited {
                mask_groups(cfg, &mut s, 0.0, |g| {
                    g.iter().copied().fold(f32::MIN, f32::max)
                });
            }
            top_k(&s, k, &mut idx);
            out.extend(idx.iter().map(|&e| (e, s[e] * cfg.routed_scaling_factor)));
        }
        Routing::Sigmoid => {
            let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
            let mut choice: Vec<f32> = match bias {
                Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                None => scores.clone(),
            };
            mask_groups(cfg, &mut choice, f32::NEG_INFINITY, |g| {
                let mut two = [f32::MIN; 2];
                for &v in g {
                    if v > two[0] {
                        two = [v, two[0]];
                    } else if v > two[1] {
                        two[1] = v;
                    }
                }
                if g.len() < 2 { two[0] } else { two[0] + two[1] }
            });
            top_k(&choice, k, &mut idx);
            let norm = if cfg.norm_topk_prob {
                idx.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20
            } else {
                1.0
            };
            let f = cfg.routed_scaling_factor;
            out.extend(idx.iter().map(|&e| (e, scores[e] / norm * f)));
        }
    }
}

/// Plain f32 `y[t][n] = Σ_k x[t][k] · w[n][k]` (router logits are fp32 in the reference).
pub fn matmul_f32_ref(x: &[f32], w: &[f32], k: usize, y: &mut [f32]) {
    let n = w.len() / k;
    for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
        for (yv, wr) in yr.iter_mut().zip(w.chunks_exact(k)) {
            *yv = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(routing: Routing, n_group: usize, topk_group: usize, norm: bool) -> DeepSeekConfig {
        let json = serde_json::json!({
            "architectures": ["DeepseekV2ForCausalLM"], "num_hidden_layers": 1,
            "num_attention_heads": 1, "hidden_size": 4, "vocab_size": 8, "kv_lora_rank": 2,
            "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2,
            "intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
        });
        let mut c = DeepSeekConfig::from_hf_config(&json.to_string()).unwrap();
        (c.routing, c.n_group, c.topk_group, c.norm_topk_prob) =
            (routing, n_group, topk_group, norm);
        c.routed_scaling_factor = 2.0;
        c
    }

    #[test]
    fn softmax_top_k_scaled() {
        let c = cfg(
            Routing::Softmax {
                group_limited: false,
            },
            1,
            1,
            false,
        );
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let mut out = Vec::new();
        route(&c, &logits, None, &mut out);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
        assert!((out[0].1 - 2.0 * 2f32.exp() / z).abs() < 1e-6);
        assert!((out[1].1 - 2.0 * 1f32.exp() / z).abs() < 1e-6);
    }

    #[test]
    fn group_limited_keeps_best_group_only() {
        // Groups {0,1} (max 2.0) and {2,3} (max 1.5): only group 0 survives.
        let c = cfg(
            Routing::Softmax {
                group_limited: true,
            },
            2,
            1,
            false,
        );
        let mut out = Vec::new();
        route(&c, &[2.0, -3.0, 1.5, 1.4], None, &mut out);
        assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn sigmoid_bias_chooses_but_does_not_weight() {
        let c = cfg(Routing::Sigmoid, 1, 1, true);
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let mut out = Vec::new();
        route(&c, &logits, Some(&[5.0, 0.0, 0.0, 0.0]), &mut out);
        assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 3]);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let sum = sig(0.0) + sig(3.0);
        assert!((out[0].1 - 2.0 * sig(0.0) / sum).abs() < 1e-6);
        assert!((out[1].1 - 2.0 * sig(3.0) / sum).abs() < 1e-6);
    }

    #[test]
    fn sigmoid_groups_rank_by_top_two_sum() {
        // Group {0,1}: 0.9+0.1 sums lower than group {2,3}: 0.6+0.6.
        let c = cfg(Routing::Sigmoid, 2, 1, false);
        let logit = |p: f32| (p / (1.0 - p)).ln();
        let logits = [logit(0.9), logit(0.1), logit(0.6), logit(0.6)];
        let mut out = Vec::new();
        route(&c, &logits, None, &mut out);
        let mut chosen: Vec<usize> = out.iter().map(|p| p.0).collect();
        chosen.sort();
        assert_eq!(chosen, [2, 3]);
    }
}
