//! Mixture-of-experts routing and the grouped expert pass.
//!
//! Routing follows transformers' `DeepseekV2TopkRouter` / `DeepseekV3TopkRouter` exactly
//! (fp32 router logits, through the kernels' f32 matmul; `matmul_f32_ref` is its plain
//! reference twin): V2 takes the top-k softmax scores (optionally only from the
//! `topk_group` groups with the highest max score) times `routed_scaling_factor`; V3 chooses
//! by `sigmoid + e_score_correction_bias` (groups ranked by the sum of their two best biased
//! scores, masked groups scored -inf), weights by the unbiased sigmoid scores, optionally
//! normalised to sum 1 (`norm_topk_prob`), times `routed_scaling_factor`.
//!
//! Experts run grouped ([`moe`]): every (token, expert) pick is bucketed by expert with a
//! counting sort into flat slots (experts ascending, tokens ascending within an expert), the
//! slots' input rows are gathered into one matrix, and every expert's contiguous slice runs
//! through its SwiGLU MLP in two grouped matmuls for the whole layer (the kernels' `grouped`:
//! gate/up + SiLU of every expert in one pool job, then every down projection in another, the
//! pool's tasks spread over all the experts' weight rows, so no thread waits at a join per
//! expert; each row bit-identical to its expert's own matmul), and the outputs are scattered back scaled by the
//! routing weight — for each token in ascending expert order, then the shared experts. All of
//! it lives in a [`MoeScratch`] that only grows: no allocation once it has seen the batch.

use tokenmill_kernels::grouped::{matmul_grouped, matmul_silu_mul_grouped};
use tokenmill_kernels::matmul::{QMatrix, matmul};
use tokenmill_kernels::ops::{add_in_place, axpy, softmax};

use super::config::{DeepSeekConfig, Routing};
use super::mlp;
use super::weights::Moe;
use crate::profile::{OpKind, OpProfile, start, stop};
use crate::store::WeightStore;
use crate::workspace::resize;

/// The routing scratch of [`route`], reused across tokens (grows to the expert count once).
#[derive(Debug, Default)]
pub struct RouteScratch {
    /// Scores per expert `[n_experts]`.
    scores: Vec<f32>,
    /// V3's biased choice scores `[n_experts]`.
    choice: Vec<f32>,
    /// Candidate indices `[n_experts]`.
    idx: Vec<usize>,
    /// Score per group `[n_group]`.
    group_scores: Vec<f32>,
    /// The kept groups `[n_group]`.
    keep: Vec<usize>,
}

/// The grouped expert pass's buffers ([`moe`]), grow-only.
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    /// Router logits `[T, n_experts]`.
    logits: Vec<f32>,
    /// Each token's picks (expert, weight), `[T, k]`.
    picks: Vec<(usize, f32)>,
    /// Per expert, the end of its slots once grouped `[n_experts]`.
    ends: Vec<usize>,
    /// (token, weight) per slot, grouped by expert `[T·k]`.
    slots: Vec<(usize, f32)>,
    /// Slot input rows `[T·k, hidden]` and expert outputs `[T·k, hidden]`.
    xe: Vec<f32>,
    ye: Vec<f32>,
    /// The experts' `silu(gate) ⊙ up` of every slot `[T·k, moe_hidden]`, or the shared
    /// experts' `[T, moe_hidden · n_shared]`.
    ffn: Vec<f32>,
    /// The experts that got tokens this call, ascending.
    active: Vec<usize>,
    /// The shared experts' output `[T, hidden]`.
    shared: Vec<f32>,
    route: RouteScratch,
}

impl MoeScratch {
    /// Capacity for batches of `t` tokens of `cfg` (nothing for a model without experts).
    pub(super) fn new(cfg: &DeepSeekConfig, t: usize) -> MoeScratch {
        let (e, k, h) = (cfg.n_routed_experts, cfg.n_experts_per_tok, cfg.hidden);
        if e == 0 {
            return MoeScratch::default();
        }
        let width = cfg.moe_hidden * cfg.n_shared_experts.max(k);
        let buf = |n: usize| Vec::with_capacity(n);
        MoeScratch {
            logits: buf(t * e),
            picks: Vec::with_capacity(t * k),
            ends: Vec::with_capacity(e),
            active: Vec::with_capacity(e),
            slots: Vec::with_capacity(t * k),
            xe: buf(t * k * h),
            ye: buf(t * k * h),
            ffn: buf(t * width),
            shared: buf(t * h),
            route: RouteScratch {
                scores: buf(e),
                choice: buf(e),
                idx: Vec::with_capacity(e),
                group_scores: buf(cfg.n_group),
                keep: Vec::with_capacity(cfg.n_group),
            },
        }
    }
}

/// Top `k` indices of `v` by value, highest first (ties: lower index first).
fn top_k(v: &[f32], k: usize, idx: &mut Vec<usize>) {
    let better = |a: &usize, b: &usize| v[*b].total_cmp(&v[*a]).then(a.cmp(b));
    idx.clear();
    idx.extend(0..v.len());
    if k < idx.len() {
        idx.select_nth_unstable_by(k, better);
        idx.truncate(k);
    }
    idx.sort_unstable_by(better);
}

/// Keeps only the experts of the `topk_group` best groups (`group_score` ranks a group's
/// slice); others are set to `fill` (transformers: 0 for V2, -inf for V3).
fn mask_groups(
    cfg: &DeepSeekConfig,
    s: &mut [f32],
    fill: f32,
    group_score: impl Fn(&[f32]) -> f32,
    gs: &mut Vec<f32>,
    keep: &mut Vec<usize>,
) {
    let per = s.len() / cfg.n_group;
    gs.clear();
    gs.extend(s.chunks(per).map(&group_score));
    top_k(gs, cfg.topk_group, keep);
    for (g, chunk) in s.chunks_mut(per).enumerate() {
        if !keep.contains(&g) {
            chunk.fill(fill);
        }
    }
}

/// The sum of the two largest values of a group (the largest alone for a group of one).
fn top_two_sum(g: &[f32]) -> f32 {
    let mut two = [f32::MIN; 2];
    for &v in g {
        if v > two[0] {
            two = [v, two[0]];
        } else if v > two[1] {
            two[1] = v;
        }
    }
    if g.len() < 2 { two[0] } else { two[0] + two[1] }
}

/// Appends the `k` experts and weights of one token with router logits `logits`
/// (`[n_experts]`) to `out`, best first.
pub fn route(
    cfg: &DeepSeekConfig,
    logits: &[f32],
    bias: Option<&[f32]>,
    scratch: &mut RouteScratch,
    out: &mut Vec<(usize, f32)>,
) {
    let k = cfg.n_experts_per_tok;
    let RouteScratch {
        scores,
        choice,
        idx,
        group_scores,
        keep,
    } = scratch;
    scores.clear();
    match cfg.routing {
        Routing::Softmax { group_limited } => {
            scores.extend_from_slice(logits);
            softmax(scores);
            if group_limited {
                let max = |g: &[f32]| g.iter().copied().fold(f32::MIN, f32::max);
                mask_groups(cfg, scores, 0.0, max, group_scores, keep);
            }
            top_k(scores, k, idx);
            out.extend(
                idx.iter()
                    .map(|&e| (e, scores[e] * cfg.routed_scaling_factor)),
            );
        }
        Routing::Sigmoid => {
            scores.extend(logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())));
            choice.clear();
            match bias {
                Some(b) => choice.extend(scores.iter().zip(b).map(|(s, b)| s + b)),
                None => choice.extend_from_slice(scores),
            }
            let inf = f32::NEG_INFINITY;
            mask_groups(cfg, choice, inf, top_two_sum, group_scores, keep);
            top_k(choice, k, idx);
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

/// `out` `[T, hidden]` = the routed experts (grouped per expert over the tokens routed to
/// it, module docs) plus the shared experts, of `xn` `[T, hidden]`; the three stages are timed
/// as [`OpKind::MoeRouter`], [`OpKind::MoeExperts`] and [`OpKind::MoeShared`].
pub(super) fn moe(
    store: &WeightStore,
    cfg: &DeepSeekConfig,
    m: &Moe,
    xn: &[f32],
    s: &mut MoeScratch,
    out: &mut [f32],
    prof: &mut Option<OpProfile>,
) {
    let t = start(prof);
    let (h, e) = (cfg.hidden, cfg.n_routed_experts);
    let n_tok = xn.len() / h;
    let logits = resize(&mut s.logits, n_tok * e);
    matmul(xn, &QMatrix::from_f32(e, h, &m.router), logits);
    s.picks.clear();
    for lrow in logits.chunks_exact(e) {
        route(cfg, lrow, m.bias.as_deref(), &mut s.route, &mut s.picks);
    }
    group_by_expert(
        &s.picks,
        cfg.n_experts_per_tok,
        e,
        &mut s.ends,
        &mut s.slots,
    );
    let xe = resize(&mut s.xe, s.slots.len() * h);
    for (row, &(t, _)) in xe.chunks_exact_mut(h).zip(&s.slots) {
        row.copy_from_slice(&xn[t * h..(t + 1) * h]);
    }
    stop(prof, OpKind::MoeRouter, t);
    let t = start(prof);
    let ye = resize(&mut s.ye, s.slots.len() * h);
    // Only the experts that got tokens: the grouped matmuls' tasks are per group.
    s.active.clear();
    s.active
        .extend((0..e).filter(|&x| !expert_slots(&s.ends, x).is_empty()));
    let (active, ends, store) = (&s.active, &s.ends, store);
    let ffn = resize(&mut s.ffn, s.slots.len() * cfg.moe_hidden); // [T·k, moe_hidden]
    matmul_silu_mul_grouped(xe, ffn, active.len(), |i| {
        let expert = &m.experts[active[i]];
        let rows = expert_slots(ends, active[i]);
        (rows, expert.gate.view(store), expert.up.view(store))
    });
    matmul_grouped(ffn, ye, active.len(), |i| {
        let rows = expert_slots(ends, active[i]);
        (rows, m.experts[active[i]].down.view(store))
    });
    out.fill(0.0);
    for (&(t, w), y) in s.slots.iter().zip(ye.chunks_exact(h)) {
        axpy(&mut out[t * h..(t + 1) * h], w, y);
    }
    stop(prof, OpKind::MoeExperts, t);
    if let Some(shared) = &m.shared {
        let t = start(prof);
        let ys = resize(&mut s.shared, n_tok * h);
        mlp(store, shared, xn, &mut s.ffn, ys);
        add_in_place(out, ys);
        stop(prof, OpKind::MoeShared, t);
    }
}

/// Expert `x`'s slots once grouped ([`group_by_expert`]'s `ends`).
fn expert_slots(ends: &[usize], x: usize) -> std::ops::Range<usize> {
    (if x == 0 { 0 } else { ends[x - 1] })..ends[x]
}

/// Counting sort of `picks` (`k` per token, token order) by expert: `slots` holds each pick's
/// (token, weight), experts ascending and tokens ascending within an expert; expert `x`'s
/// slots are `ends[x - 1]..ends[x]` (from 0 for the first).
fn group_by_expert(
    picks: &[(usize, f32)],
    k: usize,
    n_experts: usize,
    ends: &mut Vec<usize>,
    slots: &mut Vec<(usize, f32)>,
) {
    debug_assert!(picks.len().is_multiple_of(k.max(1)));
    ends.clear();
    ends.resize(n_experts, 0);
    for &(x, _) in picks {
        ends[x] += 1;
    }
    let mut total = 0;
    for n in ends.iter_mut() {
        (*n, total) = (total, total + *n);
    }
    slots.clear();
    slots.resize(picks.len(), (0, 0.0));
    for (i, &(x, w)) in picks.iter().enumerate() {
        slots[ends[x]] = (i / k, w);
        ends[x] += 1;
    }
}

/// Plain f32 `y[t][n] = Σ_k x[t][k] · w[n][k]`: the reference twin of the router matmul
/// (`matmul` over [`QMatrix::from_f32`]).
#[cfg(test)]
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
    fn router_matmul_matches_reference() {
        // Below and above the float path's gemm threshold (16 token rows).
        for (t, e, h) in [(1, 4, 64), (3, 8, 24), (17, 16, 40), (40, 64, 96)] {
            let val = |i: usize, seed: usize| ((i * 2654435761 + seed) % 1999) as f32 / 999.5 - 1.0;
            let x: Vec<f32> = (0..t * h).map(|i| val(i, 11)).collect();
            let w: Vec<f32> = (0..e * h).map(|i| val(i, 5)).collect();
            let (mut got, mut want) = (vec![0f32; t * e], vec![0f32; t * e]);
            matmul(&x, &QMatrix::from_f32(e, h, &w), &mut got);
            matmul_f32_ref(&x, &w, h, &mut want);
            let peak = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (g, r) in got.iter().zip(&want) {
                assert!((g - r).abs() <= 1e-5 * peak, "[{t}, {e}, {h}]: {g} vs {r}");
            }
        }
    }

    /// Tokens per expert in the last MoE layer of the last forward on `ws`.
    fn tokens_per_expert(ws: &crate::Workspace) -> Vec<usize> {
        let ends = &ws.deepseek.moe.ends;
        (0..ends.len())
            .map(|x| expert_slots(ends, x).len())
            .collect()
    }

    #[test]
    fn decode_tokens_spread_over_experts() {
        use crate::{LogitsWanted, SeqChunk};
        // The schedule of `tests/zero_alloc_deepseek.rs`: 4 prompts, then decode steps.
        for name in ["v2", "v3"] {
            let dir = tokenmill_testutil::fixtures_dir("deepseek").join(name);
            let model = super::super::DeepSeekModel::load_hf_dir(&dir).unwrap();
            let vocab = model.config().vocab_size;
            let mut kv = model.kv_cache(64, 4);
            let tables: Vec<Vec<u32>> = (0..4)
                .map(|s| (0..16).map(|i| i * 4 + s).collect())
                .collect();
            let mut ws = model.workspace(256, 4);
            let mut seqs: Vec<Vec<u32>> = [5, 31, 50, 40]
                .iter()
                .enumerate()
                .map(|(s, &n)| (0..n).map(|i| ((i * 31 + s * 7) % vocab) as u32).collect())
                .collect();
            let mut start = [0usize; 4];
            let mut counts = Vec::new();
            for _ in 0..8 {
                let chunks: Vec<SeqChunk> = (0..4)
                    .map(|s| SeqChunk {
                        tokens: &seqs[s][start[s]..],
                        start_pos: start[s],
                        block_table: &tables[s],
                        logits: LogitsWanted::Last,
                    })
                    .collect();
                let logits = model.forward(&chunks, &mut kv, &mut ws).unwrap().to_vec();
                counts.push(tokens_per_expert(&ws));
                for (s, seq) in seqs.iter_mut().enumerate() {
                    start[s] = seq.len();
                    seq.push(tokenmill_testutil::argmax(&logits[s * vocab..][..vocab]));
                }
            }
            let decode = &counts[1..];
            assert!(
                decode.iter().all(|c| c.iter().sum::<usize>() == 4 * 2),
                "{name}"
            );
            assert!(
                decode
                    .iter()
                    .any(|c| c.iter().filter(|&&n| n > 0).count() > 2),
                "{name}: the batch's tokens never spread over more than two experts: {decode:?}"
            );
            assert!(
                decode.iter().any(|c| c != &decode[0]),
                "{name}: the same grouping every step: {decode:?}"
            );
        }
    }

    #[test]
    fn grouping_is_by_expert_then_token() {
        // 3 tokens, k = 2, 4 experts.
        let picks = [(2, 0.5), (0, 0.25), (2, 0.75), (3, 1.0), (0, 2.0), (1, 3.0)];
        let (mut ends, mut slots) = (Vec::new(), Vec::new());
        group_by_expert(&picks, 2, 4, &mut ends, &mut slots);
        assert_eq!(ends, [2, 3, 5, 6]);
        let want = [(0, 0.25), (2, 2.0), (2, 3.0), (0, 0.5), (1, 0.75), (1, 1.0)];
        assert_eq!(slots, want);
    }

    #[test]
    fn top_k_is_a_stable_sort_prefix() {
        let v = [0.5, 2.0, 0.5, -1.0, 2.0, 0.0];
        let mut idx = Vec::new();
        for k in 0..=v.len() {
            top_k(&v, k, &mut idx);
            assert_eq!(idx, [1, 4, 0, 2, 5, 3][..k], "k {k}");
        }
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
        route(&c, &logits, None, &mut RouteScratch::default(), &mut out);
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
        route(
            &c,
            &[2.0, -3.0, 1.5, 1.4],
            None,
            &mut RouteScratch::default(),
            &mut out,
        );
        assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn sigmoid_bias_chooses_but_does_not_weight() {
        let c = cfg(Routing::Sigmoid, 1, 1, true);
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let mut out = Vec::new();
        let bias = [5.0, 0.0, 0.0, 0.0];
        route(
            &c,
            &logits,
            Some(&bias),
            &mut RouteScratch::default(),
            &mut out,
        );
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
        route(&c, &logits, None, &mut RouteScratch::default(), &mut out);
        let mut chosen: Vec<usize> = out.iter().map(|p| p.0).collect();
        chosen.sort();
        assert_eq!(chosen, [2, 3]);
    }
}
