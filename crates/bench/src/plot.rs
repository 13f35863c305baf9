//! Plots (PNG and SVG) with `plotters`, and no system font library.
//!
//! plotters is built without its default `ttf` feature (which needs fontconfig/freetype);
//! text is drawn with `ab_glyph` from fonts embedded in the binary by the
//! `epaint_default_fonts` crate (Ubuntu Light, Ubuntu Font Licence 1.0, for `sans-serif`; Hack,
//! MIT/Bitstream Vera, for `monospace`). [`register_font`] must run before any text is drawn;
//! every function here calls it, and other crates (the profiler) call it themselves.
//!
//! [`line_chart`] draws one chart to `STEM.png` and `STEM.svg`; [`sweep_plots`] draws the four
//! charts of an SLA sweep: output throughput, P95 TTFT and P95 TPOT (with the SLA as a dashed
//! line) against the swept value, and the CDF of TTFT at every point.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font as plotters_register_font};

use crate::report::{SLA_PERCENTILE, Sla};
use crate::runner::RunResult;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the embedded font could not be loaded")]
    Font,
    #[error("drawing {path}: {message}")]
    Draw { path: String, message: String },
    #[error("creating {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Registers the embedded fonts as plotters' `sans-serif` and `monospace` (idempotent).
pub fn register_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = DONE.get_or_init(|| {
        let sans = epaint_default_fonts::UBUNTU_LIGHT;
        let mono = epaint_default_fonts::HACK_REGULAR;
        plotters_register_font("sans-serif", FontStyle::Normal, sans).is_ok()
            && plotters_register_font("monospace", FontStyle::Normal, mono).is_ok()
    });
    if *ok { Ok(()) } else { Err(PlotError::Font) }
}

/// One named line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart with an optional horizontal reference line (an SLA).
#[derive(Clone, Debug, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub hline: Option<(String, f64)>,
}

fn bounds(chart: &LineChart) -> ((f64, f64), (f64, f64)) {
    let pts = chart.series.iter().flat_map(|s| s.points.iter().copied());
    let pts: Vec<(f64, f64)> = pts.filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
    let fold = |f: fn(&(f64, f64)) -> f64| {
        let lo = pts.iter().map(f).fold(f64::INFINITY, f64::min);
        let hi = pts.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) }
    };
    let (x, mut y) = (fold(|p| p.0), fold(|p| p.1));
    if let Some((_, h)) = chart.hline {
        y.1 = y.1.max(h);
    }
    let pad = |(lo, hi): (f64, f64), from_zero: bool| {
        let lo = if from_zero { lo.min(0.0) } else { lo };
        let span = (hi - lo).max(1e-9);
        (lo, hi + span * 0.08)
    };
    (pad(x, false), pad(y, true))
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, chart: &LineChart) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let ((x0, x1), (y0, y1)) = bounds(chart);
    let mut c = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = Palette99::pick(i + 3).to_rgba(); // 0 is red, kept for the SLA line
        let line = LineSeries::new(s.points.iter().copied(), color.stroke_width(2));
        c.draw_series(line)
            .map_err(e)?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        c.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(e)?;
    }
    if let Some((name, h)) = &chart.hline {
        let dashed = DashedLineSeries::new([(x0, *h), (x1, *h)], 8, 6, RED.stroke_width(2));
        c.draw_series(dashed)
            .map_err(e)?
            .label(name.as_str())
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], RED.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Draws `chart` to `STEM.png` (1024×640) and `STEM.svg`; returns both paths.
pub fn line_chart(stem: &Path, chart: &LineChart) -> Result<Vec<PathBuf>, PlotError> {
    register_font()?;
    if let Some(dir) = stem.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| PlotError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let (png, svg) = (stem.with_extension("png"), stem.with_extension("svg"));
    let err = |p: &Path| {
        let path = p.display().to_string();
        move |message| PlotError::Draw { path, message }
    };
    draw(
        BitMapBackend::new(&png, (1024, 640)).into_drawing_area(),
        chart,
    )
    .map_err(err(&png))?;
    draw(
        SVGBackend::new(&svg, (1024, 640)).into_drawing_area(),
        chart,
    )
    .map_err(err(&svg))?;
    Ok(vec![png, svg])
}

/// The empirical CDF of `values` as (value, fraction ≤ value) points.
pub fn cdf(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect()
}

/// The four charts of a sweep in `dir`: `throughput`, `ttft_p95`, `tpot_p95`, `ttft_cdf`.
pub fn sweep_plots(
    dir: &Path,
    x_name: &str,
    xs: &[f64],
    runs: &[RunResult],
    sla: &Sla,
) -> Result<Vec<PathBuf>, PlotError> {
    let line = |name: &str, f: &dyn Fn(&RunResult) -> Option<f64>| Series {
        name: name.into(),
        points: xs
            .iter()
            .zip(runs)
            .filter_map(|(&x, r)| f(r).map(|y| (x, y)))
            .collect(),
    };
    let chart = |title: &str, y: &str, series, hline| LineChart {
        title: title.into(),
        x_label: x_name.into(),
        y_label: y.into(),
        series,
        hline,
    };
    let p95 = SLA_PERCENTILE;
    let sla_line = |v: Option<f64>| v.map(|v| (format!("SLA {v} ms"), v));
    let mut out = Vec::new();
    let tput = line("output tok/s", &|r| Some(r.summary.output_throughput()));
    let title = format!("Output throughput vs {x_name}");
    out.extend(line_chart(
        &dir.join("throughput"),
        &chart(&title, "tok/s", vec![tput], None),
    )?);
    let ttft = line("P95 TTFT", &|r| r.summary.ttft.at(p95));
    let title = format!("P95 TTFT vs {x_name}");
    let c = chart(&title, "ms", vec![ttft], sla_line(sla.ttft_ms));
    out.extend(line_chart(&dir.join("ttft_p95"), &c)?);
    let tpot = line("P95 TPOT", &|r| r.summary.tpot.at(p95));
    let title = format!("P95 TPOT vs {x_name}");
    let c = chart(&title, "ms", vec![tpot], sla_line(sla.tpot_ms));
    out.extend(line_chart(&dir.join("tpot_p95"), &c)?);
    let cdfs = xs
        .iter()
        .zip(runs)
        .map(|(x, r)| {
            let ttfts: Vec<f64> = r
                .records
                .iter()
                .filter(|r| r.ok())
                .filter_map(|r| r.ttft())
                .map(|d| d.as_secs_f64() * 1e3)
                .collect();
            Series {
                name: format!("{x_name} {x}"),
                points: cdf(&ttfts),
            }
        })
        .collect();
    let c = LineChart {
        title: "TTFT CDF".into(),
        x_label: "TTFT (ms)".into(),
        y_label: "fraction of requests".into(),
        series: cdfs,
        hline: None,
    };
    out.extend(line_chart(&dir.join("ttft_cdf"), &c)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_is_sorted_and_ends_at_one() {
        assert_eq!(
            cdf(&[3.0, 1.0, f64::NAN, 2.0]),
            vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]
        );
        assert!(cdf(&[]).is_empty());
    }

    #[test]
    fn draws_png_and_svg_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let chart = LineChart {
            title: "t".into(),
            x_label: "concurrency".into(),
            y_label: "tok/s".into(),
            series: vec![Series {
                name: "a".into(),
                points: vec![(1.0, 10.0), (2.0, 18.0), (4.0, 30.0)],
            }],
            hline: Some(("SLA".into(), 25.0)),
        };
        let paths = line_chart(&dir.path().join("sub/x"), &chart).unwrap();
        let png = std::fs::read(&paths[0]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(&paths[1]).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("concurrency"),
            "{svg:.200}"
        );
        // An empty chart still draws (axes only).
        let empty = LineChart {
            series: vec![],
            hline: None,
            ..chart
        };
        assert!(line_chart(&dir.path().join("e"), &empty).is_ok());
    }
}
