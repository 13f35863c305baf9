//! [`Analysis`]: the figures of a trace taken by tokenmill — steps, op × layer heat map, top
//! ops with their work, gaps, a request's critical path and throughput.
//!
//! What it relies on (written by the engine, runner and model; see their module docs):
//! - each engine step is a complete `step` event (cat `engine`) whose `reqs` argument lists
//!   its chunks as `id:start_pos:num_tokens:sampled`;
//! - the stages `schedule`, `prepare_batch`, `forward`, `sample`, `update` and
//!   `execute_model` (args `tokens`, `logit_rows`, `attn_ctx`, `kv_read`) nest in a step on
//!   the same track;
//! - model ops are complete events of category `op`, with a `layer` argument inside layers;
//! - a request's queue wait is an async `queue` span (`b`/`e`, id = request id);
//! - a pool worker's share of a job is a complete `pool_job` event (cat `pool`) on the
//!   worker's own track.
//!
//! An event belongs to the step on its track that contains it (times in µs, with a small
//! tolerance for rounding). Events outside any step (a trace cut mid-step) are ignored.

use std::collections::{BTreeMap, HashMap};

use tokenmill_trace::{Trace, TraceEvent};

use crate::shape::{BatchShape, ModelShape, op_cost};

/// Tolerance when testing containment, µs (timestamps are rounded to ns).
const EPS_US: f64 = 0.01;
/// The stages of a step, in order.
pub const STAGES: [&str; 5] = ["schedule", "prepare_batch", "forward", "sample", "update"];

/// One chunk of a step: `num_tokens` tokens of request `req` from `start_pos`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkRef {
    pub req: u64,
    pub start_pos: usize,
    pub num_tokens: usize,
    pub sampled: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepInfo {
    pub ts: f64,
    pub dur: f64,
    pub tid: u64,
    pub chunks: Vec<ChunkRef>,
    pub batch: BatchShape,
    /// Σ op durations inside the step, µs.
    pub op_us: f64,
    /// Duration of each of [`STAGES`], µs.
    pub stage_us: [f64; STAGES.len()],
}

impl StepInfo {
    pub fn end(&self) -> f64 {
        self.ts + self.dur
    }
}

/// Time per (op, layer), µs: `cells[op][layer]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeatMap {
    pub ops: Vec<String>,
    pub n_layers: usize,
    pub cells: Vec<Vec<f64>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpStat {
    pub name: String,
    pub count: usize,
    pub total_us: f64,
    /// `None` when the op's work is unknown (no model shape, or an op the table lacks).
    pub flops: Option<f64>,
    pub bytes: Option<f64>,
}

impl OpStat {
    pub fn mean_us(&self) -> f64 {
        self.total_us / self.count.max(1) as f64
    }
    pub fn gflops(&self) -> Option<f64> {
        Some(self.flops? / (self.total_us * 1e3).max(1e-9))
    }
    pub fn gbps(&self) -> Option<f64> {
        Some(self.bytes? / (self.total_us * 1e3).max(1e-9))
    }
}

/// Where step time went besides the model's ops, and the idle time between steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GapStats {
    pub step_us: f64,
    pub op_us: f64,
    pub stage_us: [f64; STAGES.len()],
    /// Time in the forward pass outside any op (glue between ops), µs.
    pub forward_glue_us: f64,
    /// Time between consecutive steps on the engine track, µs.
    pub idle_us: f64,
    pub max_gap_us: f64,
    pub num_gaps_over_1ms: usize,
    /// From the first step's start to the last step's end, µs.
    pub wall_us: f64,
}

impl GapStats {
    /// Share of step time outside the model's ops.
    pub fn outside_share(&self) -> f64 {
        (self.step_us - self.op_us) / self.step_us.max(1e-9)
    }
    /// Share of wall time between steps.
    pub fn idle_share(&self) -> f64 {
        self.idle_us / self.wall_us.max(1e-9)
    }
}

/// Where one request's time to first token went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CriticalPath {
    pub req: u64,
    pub prompt_tokens: usize,
    pub queue_us: f64,
    /// (step index, tokens of this request, tokens in the step, step duration µs) per
    /// prefill step, the last one sampling the first token.
    pub prefill: Vec<(usize, usize, usize, f64)>,
    /// Arrival → end of the step that sampled the first token, µs.
    pub ttft_us: f64,
    pub decode_steps: usize,
    pub mean_decode_step_us: f64,
}

impl CriticalPath {
    /// Time inside the prefill steps.
    pub fn prefill_steps_us(&self) -> f64 {
        self.prefill.iter().map(|p| p.3).sum()
    }
    /// Running but between its prefill steps (other steps, idle).
    pub fn between_steps_us(&self) -> f64 {
        (self.ttft_us - self.queue_us - self.prefill_steps_us()).max(0.0)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Analysis {
    pub steps: Vec<StepInfo>,
    pub heat: HeatMap,
    /// Sorted by total time, largest first.
    pub ops: Vec<OpStat>,
    pub gaps: GapStats,
    /// The request with the longest TTFT among those whose queue wait is in the trace.
    pub critical: Option<CriticalPath>,
    pub median_ttft_us: Option<f64>,
    pub generated_tokens: usize,
    pub processed_tokens: usize,
    pub shape: Option<ModelShape>,
    /// The compute pool's workers, by track name.
    pub workers: Vec<WorkerUse>,
}

/// How busy one pool worker was while the steps' forward passes ran.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerUse {
    pub track: String,
    /// Jobs it took part in, within the steps.
    pub jobs: usize,
    /// Time on those jobs, µs.
    pub busy_us: f64,
    /// The forward passes' total time, µs (the time the worker could have been busy).
    pub forward_us: f64,
}

impl WorkerUse {
    /// Busy share of the forward time (0 to 1; the rest it spun or slept between jobs).
    pub fn utilisation(&self) -> f64 {
        self.busy_us / self.forward_us.max(1e-9)
    }
}

impl Analysis {
    /// Generated tokens per second over the steps' wall time.
    pub fn output_tok_s(&self) -> f64 {
        self.generated_tokens as f64 / (self.gaps.wall_us / 1e6).max(1e-12)
    }

    pub fn of(trace: &Trace) -> Analysis {
        let shape = trace
            .metadata
            .get("model_shape")
            .and_then(|v| serde_json::from_value::<ModelShape>(v.clone()).ok());
        let mut steps = collect_steps(trace);
        let mut per_op = OpTotals::new();
        let mut order: Vec<String> = Vec::new();
        for e in trace.events.iter().filter(|e| e.ph == "X") {
            let Some(si) = containing_step(&steps, e) else {
                continue;
            };
            let s = &mut steps[si];
            if e.cat == "op" {
                s.op_us += e.dur.unwrap_or(0.0);
                let layer = e.arg_i64("layer").map(|l| l as u32);
                if !order.contains(&e.name) {
                    order.push(e.name.clone());
                }
                let chunks: Vec<(usize, usize)> = s
                    .chunks
                    .iter()
                    .map(|c| (c.start_pos, c.num_tokens))
                    .collect();
                let cost = shape
                    .as_ref()
                    .and_then(|m| op_cost(m, &e.name, &s.batch, &chunks));
                let slot =
                    per_op
                        .entry((e.name.clone(), layer))
                        .or_insert((0, 0.0, Some(0.0), Some(0.0)));
                slot.0 += 1;
                slot.1 += e.dur.unwrap_or(0.0);
                slot.2 = slot.2.zip(cost).map(|(a, c)| a + c.flops);
                slot.3 = slot.3.zip(cost).map(|(a, c)| a + c.bytes);
            } else if let Some(k) = STAGES.iter().position(|n| *n == e.name) {
                s.stage_us[k] += e.dur.unwrap_or(0.0);
            }
        }
        let heat = heat_map(&per_op, &order);
        let ops = op_stats(&per_op);
        let gaps = gap_stats(&steps);
        let (critical, median_ttft_us) = critical_path(trace, &steps);
        let generated_tokens = steps
            .iter()
            .flat_map(|s| &s.chunks)
            .filter(|c| c.sampled)
            .count();
        let processed_tokens = steps.iter().map(|s| s.batch.tokens as usize).sum();
        let workers = worker_use(trace, &steps);
        Analysis {
            steps,
            heat,
            ops,
            gaps,
            critical,
            median_ttft_us,
            generated_tokens,
            processed_tokens,
            shape,
            workers,
        }
    }
}

/// Each pool worker's `pool_job` time inside the steps' wall time, against the forward
/// passes' total.
fn worker_use(trace: &Trace, steps: &[StepInfo]) -> Vec<WorkerUse> {
    let (Some(first), Some(last)) = (
        steps.first(),
        steps.iter().map(|s| s.ts + s.dur).reduce(f64::max),
    ) else {
        return Vec::new();
    };
    let forward_us: f64 = steps.iter().map(|s| s.stage_us[2]).sum();
    let names = trace.thread_names();
    let mut by_tid: BTreeMap<u64, (usize, f64)> = BTreeMap::new();
    for e in trace.complete_named("pool_job") {
        if e.ts + EPS_US >= first.ts && e.ts <= last + EPS_US {
            let slot = by_tid.entry(e.tid).or_default();
            slot.0 += 1;
            slot.1 += e.dur.unwrap_or(0.0);
        }
    }
    by_tid
        .into_iter()
        .map(|(tid, (jobs, busy_us))| WorkerUse {
            track: names
                .get(&tid)
                .cloned()
                .unwrap_or_else(|| format!("tid {tid}")),
            jobs,
            busy_us,
            forward_us,
        })
        .collect()
}

/// `id:start:n:sampled,…` → chunks (malformed entries are skipped).
pub fn parse_reqs(s: &str) -> Vec<ChunkRef> {
    s.split(',')
        .filter_map(|c| {
            let mut it = c.split(':').map(str::parse::<u64>);
            let (req, start, n, sampled) = (it.next()?, it.next()?, it.next()?, it.next()?);
            Some(ChunkRef {
                req: req.ok()?,
                start_pos: start.ok()? as usize,
                num_tokens: n.ok()? as usize,
                sampled: sampled.ok()? != 0,
            })
        })
        .collect()
}

fn collect_steps(trace: &Trace) -> Vec<StepInfo> {
    let mut steps: Vec<StepInfo> = trace
        .complete_named("step")
        .map(|e| StepInfo {
            ts: e.ts,
            dur: e.dur.unwrap_or(0.0),
            tid: e.tid,
            chunks: e.arg_str("reqs").map(parse_reqs).unwrap_or_default(),
            ..StepInfo::default()
        })
        .collect();
    steps.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    for e in trace.complete_named("execute_model") {
        if let Some(si) = containing_step(&steps, e) {
            let f = |k: &str| e.arg_f64(k).unwrap_or(0.0);
            steps[si].batch = BatchShape {
                tokens: f("tokens"),
                logit_rows: f("logit_rows"),
                attn_ctx: f("attn_ctx"),
                kv_read: f("kv_read"),
            };
        }
    }
    steps
}

/// Index of the step on `e`'s track that contains `e` (steps sorted by start; steps on one
/// track never overlap, so the latest one starting before `e` on its track is the only
/// candidate).
fn containing_step(steps: &[StepInfo], e: &TraceEvent) -> Option<usize> {
    if e.name == "step" {
        return None;
    }
    let n = steps.partition_point(|s| s.ts <= e.ts + EPS_US);
    let i = (0..n).rev().find(|&i| steps[i].tid == e.tid)?;
    (e.end() <= steps[i].end() + EPS_US).then_some(i)
}

/// (op name, layer) → (calls, µs, FLOPs, bytes); the work is `None` once any call's is unknown.
type OpTotals = BTreeMap<(String, Option<u32>), (usize, f64, Option<f64>, Option<f64>)>;

fn heat_map(per_op: &OpTotals, order: &[String]) -> HeatMap {
    let n_layers = per_op
        .keys()
        .filter_map(|k| k.1)
        .max()
        .map_or(0, |l| l as usize + 1);
    let ops: Vec<String> = order
        .iter()
        .filter(|o| per_op.keys().any(|k| &k.0 == *o && k.1.is_some()))
        .cloned()
        .collect();
    let cells = ops
        .iter()
        .map(|o| {
            (0..n_layers)
                .map(|l| {
                    per_op
                        .get(&(o.clone(), Some(l as u32)))
                        .map_or(0.0, |v| v.1)
                })
                .collect()
        })
        .collect();
    HeatMap {
        ops,
        n_layers,
        cells,
    }
}

fn op_stats(per_op: &OpTotals) -> Vec<OpStat> {
    let mut by_name: BTreeMap<&str, OpStat> = BTreeMap::new();
    for ((name, _), (count, total, flops, bytes)) in per_op {
        let s = by_name.entry(name).or_insert_with(|| OpStat {
            name: name.clone(),
            flops: Some(0.0),
            bytes: Some(0.0),
            ..OpStat::default()
        });
        s.count += count;
        s.total_us += total;
        s.flops = s.flops.zip(*flops).map(|(a, b)| a + b);
        s.bytes = s.bytes.zip(*bytes).map(|(a, b)| a + b);
    }
    let mut v: Vec<OpStat> = by_name.into_values().collect();
    v.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    v
}

fn gap_stats(steps: &[StepInfo]) -> GapStats {
    let mut g = GapStats::default();
    for s in steps {
        g.step_us += s.dur;
        g.op_us += s.op_us;
        for (a, b) in g.stage_us.iter_mut().zip(s.stage_us) {
            *a += b;
        }
    }
    let forward = STAGES.iter().position(|n| *n == "forward").unwrap_or(0);
    g.forward_glue_us = (g.stage_us[forward] - g.op_us).max(0.0);
    for w in steps.windows(2) {
        let gap = (w[1].ts - w[0].end()).max(0.0);
        g.idle_us += gap;
        g.max_gap_us = g.max_gap_us.max(gap);
        g.num_gaps_over_1ms += usize::from(gap > 1000.0);
    }
    if let (Some(a), Some(b)) = (steps.first(), steps.last()) {
        g.wall_us = b.end() - a.ts;
    }
    g
}

/// The critical path of the request with the longest TTFT, and the median TTFT.
fn critical_path(trace: &Trace, steps: &[StepInfo]) -> (Option<CriticalPath>, Option<f64>) {
    let mut queue: HashMap<u64, (f64, Option<f64>, usize)> = HashMap::new();
    for e in trace.events.iter().filter(|e| e.name == "queue") {
        let Some(id) = e.id_u64() else { continue };
        match e.ph.as_str() {
            "b" => {
                let n = e.arg_i64("prompt_tokens").unwrap_or(0) as usize;
                queue.insert(id, (e.ts, None, n));
            }
            "e" => {
                if let Some(q) = queue.get_mut(&id) {
                    q.1 = Some(e.ts);
                }
            }
            _ => {}
        }
    }
    let mut paths: Vec<CriticalPath> = queue
        .iter()
        .filter_map(|(&id, &(arrive, first, n))| path_of(id, arrive, first?, n, steps))
        .collect();
    if paths.is_empty() {
        return (None, None);
    }
    paths.sort_by(|a, b| a.ttft_us.total_cmp(&b.ttft_us).then(a.req.cmp(&b.req)));
    let median = paths[(paths.len() - 1) / 2].ttft_us;
    (paths.pop(), Some(median))
}

fn path_of(
    req: u64,
    arrive: f64,
    first: f64,
    prompt_tokens: usize,
    steps: &[StepInfo],
) -> Option<CriticalPath> {
    let mut p = CriticalPath {
        req,
        prompt_tokens,
        queue_us: first - arrive,
        ..CriticalPath::default()
    };
    let mut decode_us = 0.0;
    let mut first_token = false;
    for (i, s) in steps.iter().enumerate() {
        let Some(c) = s.chunks.iter().find(|c| c.req == req) else {
            continue;
        };
        if first_token {
            p.decode_steps += 1;
            decode_us += s.dur;
            continue;
        }
        let step_tokens = s.chunks.iter().map(|c| c.num_tokens).sum();
        p.prefill.push((i, c.num_tokens, step_tokens, s.dur));
        if c.sampled {
            first_token = true;
            p.ttft_us = s.end() - arrive;
        }
    }
    p.mean_decode_step_us = decode_us / p.decode_steps.max(1) as f64;
    first_token.then_some(p)
}

#[cfg(test)]
#[path = "analysis_tests.rs"]
pub(crate) mod tests;
