//! `tokenmill-profiler`: reads a trace taken by tokenmill (`tokenmill-trace`'s Chrome Trace
//! Event JSON) and tells where the time went.
//!
//! - [`analysis`]: steps and their stages, the op × layer heat map, top ops with their FLOPs
//!   and bytes ([`shape`]), gaps inside and between steps, a request's critical path;
//! - [`roofline`]: this machine's compute and memory ceilings, measured;
//! - [`report`]: the verdict (overhead- vs memory- vs compute-bound) and the text report;
//! - [`plot`]: the heat map as a PNG.
//!
//! [`report_trace`] runs them all for `tokenmill profile report`.

pub mod analysis;
pub mod plot;
pub mod report;
pub mod roofline;
pub mod shape;

use std::path::{Path, PathBuf};

pub use analysis::Analysis;
pub use report::{Bound, Verdict};
pub use roofline::Roofline;
pub use shape::ModelShape;
use tokenmill_trace::Trace;

#[derive(Debug, thiserror::Error)]
pub enum ProfilerError {
    #[error(transparent)]
    Trace(#[from] tokenmill_trace::TraceError),
    #[error("{path}: {msg}")]
    Output { path: String, msg: String },
    #[error("the trace has no engine steps (was the profile session empty?)")]
    NoSteps,
}

/// What [`report_trace`] produced.
pub struct ReportOutput {
    pub text: String,
    pub verdict: Verdict,
    pub heat_map_png: Option<PathBuf>,
}

/// Reads `trace_path`, analyses it against the roofline `roof` gives (called only once the
/// trace proved readable), writes the heat map PNG into `out_dir` (when given) and returns
/// the text report.
pub fn report_trace(
    trace_path: &Path,
    out_dir: Option<&Path>,
    roof: impl FnOnce() -> Roofline,
) -> Result<ReportOutput, ProfilerError> {
    let trace = Trace::read_file(trace_path)?;
    let a = Analysis::of(&trace);
    if a.steps.is_empty() {
        return Err(ProfilerError::NoSteps);
    }
    let roof = &roof();
    let mut text = report::render(&a, roof, 12);
    let mut heat_map_png = None;
    if let Some(dir) = out_dir {
        let out = |msg: String| ProfilerError::Output {
            path: dir.display().to_string(),
            msg,
        };
        std::fs::create_dir_all(dir).map_err(|e| out(e.to_string()))?;
        let png = dir.join("heatmap.png");
        let title = format!("time per op and layer — {}", trace_path.display());
        plot::heat_map_png(&a.heat, &title, &png).map_err(out)?;
        text.push_str(&format!("\nheat map: {}\n", png.display()));
        heat_map_png = Some(png);
    }
    Ok(ReportOutput {
        text,
        verdict: Verdict::of(&a, roof),
        heat_map_png,
    })
}
