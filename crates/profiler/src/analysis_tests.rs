//! Analysis of a hand-built trace with hand-computed figures.
//!
//! Three steps on track 1 (times in µs):
//! - step 0 `[0, 100)`: request 0 prefills 4 tokens and samples. schedule 5, prepare 5,
//!   forward 70 holding ops qkv L0 20, qkv L1 20, attention L0 10, lm_head 15 (65 of ops),
//!   sample 10, update 10.
//! - step 1 `[150, 200)`: request 0 decodes 1, request 1 prefills 2 (both sample); forward 30
//!   with qkv L0 10, attention L1 20.
//! - step 2 `[200, 240)`: request 1 decodes; forward 30 with qkv L1 20.
//!
//! Queue: request 0 arrives at 0, scheduled at 2; request 1 arrives at 90, scheduled at 150.

use super::*;
use crate::shape::ModelShape;
use serde_json::Value;
use tokenmill_trace::TraceEvent;

fn x(name: &str, cat: &str, ts: f64, dur: f64) -> TraceEvent {
    TraceEvent::complete(name, cat, 1, ts, dur)
}

fn op(name: &str, layer: Option<i64>, ts: f64, dur: f64) -> TraceEvent {
    let e = x(name, "op", ts, dur);
    match layer {
        Some(l) => e.with_arg("layer", l),
        None => e,
    }
}

fn exec(ts: f64, dur: f64, tokens: i64, rows: i64) -> TraceEvent {
    x("execute_model", "engine", ts, dur)
        .with_arg("tokens", tokens)
        .with_arg("logit_rows", rows)
        .with_arg("attn_ctx", 10)
        .with_arg("kv_read", 4)
}

fn queue(ph: &str, id: u64, ts: f64) -> TraceEvent {
    let mut e = x("queue", "request", ts, 0.0);
    e.ph = ph.into();
    e.dur = None;
    e.id = Some(Value::from(id));
    e.with_arg("prompt_tokens", 4)
}

pub(crate) fn shape() -> ModelShape {
    ModelShape {
        n_layers: 2,
        hidden: 8,
        n_heads: 2,
        head_dim: 4,
        kv_dim: 4,
        ffn_hidden: 16,
        vocab: 10,
        kv_elem_bytes: 4,
        qkv_bytes: 100.0,
        out_bytes: 50.0,
        gate_up_bytes: 200.0,
        down_bytes: 100.0,
        lm_head_bytes: 60.0,
        embed_row_bytes: 6.0,
        deepseek: None,
    }
}

pub(crate) fn hand_trace() -> Trace {
    let mut t = Trace::new(vec![
        TraceEvent::thread_name(1, 1, "tokenmill-engine"),
        queue("b", 0, 0.0),
        x("step", "engine", 0.0, 100.0).with_arg("reqs", "0:0:4:1"),
        queue("e", 0, 2.0),
        x("schedule", "engine", 0.0, 5.0),
        exec(5.0, 85.0, 4, 1),
        x("prepare_batch", "engine", 5.0, 5.0),
        x("forward", "engine", 10.0, 70.0),
        op("qkv_matmul", Some(0), 10.0, 20.0),
        op("qkv_matmul", Some(1), 30.0, 20.0),
        op("attention", Some(0), 50.0, 10.0),
        op("lm_head", None, 60.0, 15.0),
        x("sample", "engine", 80.0, 10.0),
        x("update", "engine", 90.0, 10.0),
        queue("b", 1, 90.0),
        x("step", "engine", 150.0, 50.0).with_arg("reqs", "0:4:1:1,1:0:2:1"),
        queue("e", 1, 150.0),
        x("schedule", "engine", 150.0, 5.0),
        exec(155.0, 35.0, 3, 2),
        x("forward", "engine", 160.0, 30.0),
        op("qkv_matmul", Some(0), 160.0, 10.0),
        op("attention", Some(1), 170.0, 20.0),
        x("update", "engine", 190.0, 10.0),
        x("step", "engine", 200.0, 40.0).with_arg("reqs", "1:2:1:1"),
        exec(205.0, 30.0, 1, 1),
        x("forward", "engine", 205.0, 30.0),
        op("qkv_matmul", Some(1), 210.0, 20.0),
        // Outside any step: ignored.
        op("qkv_matmul", Some(0), 500.0, 7.0),
    ]);
    t.metadata
        .insert("model_shape".into(), serde_json::to_value(shape()).unwrap());
    t
}

#[test]
fn heat_map_cells_sum_each_op_and_layer() {
    let a = Analysis::of(&hand_trace());
    assert_eq!(a.heat.ops, ["qkv_matmul", "attention"]);
    assert_eq!(a.heat.n_layers, 2);
    assert_eq!(a.heat.cells, vec![vec![30.0, 40.0], vec![10.0, 20.0]]);
}

#[test]
fn top_ops_count_time_and_work() {
    let a = Analysis::of(&hand_trace());
    let names: Vec<&str> = a.ops.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["qkv_matmul", "attention", "lm_head"]);
    let qkv = &a.ops[0];
    assert_eq!((qkv.count, qkv.total_us), (4, 70.0));
    assert_eq!(qkv.mean_us(), 17.5);
    // 2·T·8·16 FLOPs per call: T = 4, 4, 3, 1 → 256 · 12 = 3072.
    assert_eq!(qkv.flops, Some(3072.0));
    // 3072 FLOP in 70 µs = 0.0439 GFLOP/s.
    assert!((qkv.gflops().unwrap() - 3072.0 / 70e3).abs() < 1e-12);
    // lm_head: 2·R·8·10 with R = 1.
    assert_eq!(a.ops[2].flops, Some(160.0));
}

#[test]
fn gaps_split_step_time_and_idle_time() {
    let a = Analysis::of(&hand_trace());
    let g = &a.gaps;
    assert_eq!(g.step_us, 190.0);
    assert_eq!(g.op_us, 115.0);
    assert!((g.outside_share() - 75.0 / 190.0).abs() < 1e-12);
    assert_eq!(g.stage_us, [10.0, 5.0, 130.0, 10.0, 20.0]);
    assert_eq!(g.forward_glue_us, 15.0);
    assert_eq!(
        (g.idle_us, g.max_gap_us, g.num_gaps_over_1ms),
        (50.0, 50.0, 0)
    );
    assert_eq!(g.wall_us, 240.0);
    assert!((g.idle_share() - 50.0 / 240.0).abs() < 1e-12);
    assert_eq!((a.generated_tokens, a.processed_tokens), (4, 8));
    assert!((a.output_tok_s() - 4.0 / 240e-6).abs() < 1e-6);
    // Per-step op time never exceeds the step.
    assert!(a.steps.iter().all(|s| s.op_us <= s.dur));
}

#[test]
fn critical_path_is_the_slowest_first_token() {
    let a = Analysis::of(&hand_trace());
    let c = a.critical.as_ref().unwrap();
    assert_eq!(c.req, 1);
    assert_eq!(c.queue_us, 60.0);
    assert_eq!(c.prefill, vec![(1, 2, 3, 50.0)]);
    assert_eq!(c.ttft_us, 110.0);
    assert_eq!(c.between_steps_us(), 0.0);
    assert_eq!((c.decode_steps, c.mean_decode_step_us), (1, 40.0));
    assert_eq!(a.median_ttft_us, Some(100.0));
}

#[test]
fn malformed_reqs_and_missing_shape_degrade_gracefully() {
    assert_eq!(
        parse_reqs("3:0:5:1,bad,4:x:1:0,7:2:1:0"),
        vec![
            ChunkRef {
                req: 3,
                start_pos: 0,
                num_tokens: 5,
                sampled: true
            },
            ChunkRef {
                req: 7,
                start_pos: 2,
                num_tokens: 1,
                sampled: false
            }
        ]
    );
    let mut t = hand_trace();
    t.metadata.clear();
    let a = Analysis::of(&t);
    assert!(
        a.ops
            .iter()
            .all(|o| o.flops.is_none() && o.gflops().is_none())
    );
    let empty = Analysis::of(&Trace::default());
    assert!(empty.steps.is_empty() && empty.critical.is_none());
    assert_eq!(empty.gaps.outside_share(), 0.0);
}
