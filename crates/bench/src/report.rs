//! Reports over several runs: the SLA sweep table and its best point, and the side-by-side
//! comparison of two servers with the ratio B/A of every figure.
//!
//! The sweep's "best" point is the one with the highest output token throughput among those
//! with no failed request whose P95 TTFT and P95 TPOT are within the SLA (a limit left out is
//! not checked). The comparison quotes, for each figure, the median over rounds on each side
//! (the machine is noisy; a lone run proves little) and their ratio.

use crate::stats::{Summary, percentile};

/// The latency limits of an SLA sweep, in ms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sla {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

/// The percentile the SLA is checked at.
pub const SLA_PERCENTILE: f64 = 95.0;

impl Sla {
    /// Whether `s` meets the SLA. `s` must carry the 95th percentile.
    pub fn met_by(&self, s: &Summary) -> bool {
        let within =
            |limit: Option<f64>, v: Option<f64>| limit.is_none_or(|l| v.is_some_and(|v| v <= l));
        s.failed == 0
            && s.completed > 0
            && within(self.ttft_ms, s.ttft.at(SLA_PERCENTILE))
            && within(self.tpot_ms, s.tpot.at(SLA_PERCENTILE))
    }
}

/// Index of the point with the highest output throughput that meets `sla`.
pub fn best_under_sla(points: &[Summary], sla: &Sla) -> Option<usize> {
    points
        .iter()
        .enumerate()
        .filter(|(_, s)| sla.met_by(s))
        .max_by(|a, b| a.1.output_throughput().total_cmp(&b.1.output_throughput()))
        .map(|(i, _)| i)
}

/// The sweep as a table, one row per point (`xs[i]` labels row `i`), and the best point.
pub fn render_sweep(x_name: &str, xs: &[f64], points: &[Summary], sla: &Sla) -> String {
    let mut s = format!(
        "{x_name:>12} {:>8} {:>10} {:>10} {:>12} {:>12} {:>6}\n",
        "req/s", "out tok/s", "tot tok/s", "P95 TTFT ms", "P95 TPOT ms", "SLA"
    );
    for (x, p) in xs.iter().zip(points) {
        s.push_str(&format!(
            "{x:>12} {:>8.2} {:>10.2} {:>10.2} {:>12.2} {:>12.2} {:>6}\n",
            p.request_throughput(),
            p.output_throughput(),
            p.total_throughput(),
            p.ttft.at(SLA_PERCENTILE).unwrap_or(f64::NAN),
            p.tpot.at(SLA_PERCENTILE).unwrap_or(f64::NAN),
            if sla.met_by(p) { "ok" } else { "miss" },
        ));
    }
    let limits = format!(
        "P95 TTFT ≤ {} ms, P95 TPOT ≤ {} ms",
        sla.ttft_ms.map_or("∞".into(), |v| v.to_string()),
        sla.tpot_ms.map_or("∞".into(), |v| v.to_string())
    );
    match best_under_sla(points, sla) {
        Some(i) => s.push_str(&format!(
            "Best under SLA ({limits}): {x_name} {} → {:.2} output tok/s\n",
            xs[i],
            points[i].output_throughput()
        )),
        None => s.push_str(&format!("No point meets the SLA ({limits})\n")),
    }
    s
}

/// Median of one figure over runs.
fn median_of(runs: &[Summary], key: &str) -> Option<f64> {
    let mut v: Vec<f64> = runs
        .iter()
        .filter_map(|s| s.figures().into_iter().find(|f| f.1 == key).map(|f| f.2))
        .collect();
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

/// `(label, key, median A, median B, B/A)` for every figure of the first run of `a`.
pub fn compare_figures(a: &[Summary], b: &[Summary]) -> Vec<(String, String, f64, f64, f64)> {
    let Some(first) = a.first() else {
        return Vec::new();
    };
    first
        .figures()
        .into_iter()
        .filter_map(|(label, key, _)| {
            let (ma, mb) = (median_of(a, &key)?, median_of(b, &key)?);
            let ratio = if ma != 0.0 { mb / ma } else { f64::NAN };
            Some((label, key, ma, mb, ratio))
        })
        .collect()
}

/// The comparison table: median of each side over its runs, and B/A.
pub fn render_compare(names: [&str; 2], a: &[Summary], b: &[Summary]) -> String {
    let mut s = format!(
        "{:=^76}\n{:<40}{:>12}{:>12}{:>12}\n",
        format!(
            " A = {}  B = {}  ({} rounds, medians) ",
            names[0],
            names[1],
            a.len()
        ),
        "",
        "A",
        "B",
        "B/A"
    );
    for (label, _, ma, mb, r) in compare_figures(a, b) {
        s.push_str(&format!("{label:<40}{ma:>12.2}{mb:>12.2}{r:>12.3}\n"));
    }
    s.push_str(&"=".repeat(76));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Distribution;
    use std::time::Duration;

    fn point(out_tokens: usize, p95_ttft: f64, p95_tpot: f64, failed: usize) -> Summary {
        let d = |v| Distribution {
            percentiles: vec![(95.0, v)],
            ..Distribution::default()
        };
        Summary {
            completed: 10,
            failed,
            output_tokens: out_tokens,
            duration: Duration::from_secs(10),
            ttft: d(p95_ttft),
            tpot: d(p95_tpot),
            ..Summary::default()
        }
    }

    #[test]
    fn best_point_is_the_fastest_within_the_sla() {
        let pts = [
            point(100, 50.0, 10.0, 0),
            point(300, 150.0, 20.0, 0),
            point(500, 900.0, 30.0, 0), // TTFT over
            point(400, 100.0, 60.0, 0), // TPOT over
            point(450, 100.0, 20.0, 1), // a failure
        ];
        let sla = Sla {
            ttft_ms: Some(200.0),
            tpot_ms: Some(50.0),
        };
        assert_eq!(best_under_sla(&pts, &sla), Some(1));
        assert_eq!(best_under_sla(&pts, &Sla::default()), Some(2));
        let strict = Sla {
            ttft_ms: Some(1.0),
            tpot_ms: None,
        };
        assert_eq!(best_under_sla(&pts, &strict), None);
        let t = render_sweep("concurrency", &[1.0, 2.0, 4.0, 8.0, 16.0], &pts, &sla);
        assert!(
            t.contains("Best under SLA") && t.contains("concurrency 2 → 30.00"),
            "{t}"
        );
        assert!(render_sweep("c", &[1.0], &pts[..1], &strict).contains("No point meets"));
    }

    #[test]
    fn comparison_uses_medians_and_ratios() {
        let a = [
            point(100, 1.0, 1.0, 0),
            point(300, 1.0, 1.0, 0),
            point(200, 1.0, 1.0, 0),
        ];
        let b = [
            point(400, 1.0, 1.0, 0),
            point(400, 1.0, 1.0, 0),
            point(900, 1.0, 1.0, 0),
        ];
        let rows = compare_figures(&a, &b);
        let out = rows.iter().find(|r| r.1 == "output_throughput").unwrap();
        assert_eq!((out.2, out.3, out.4), (20.0, 40.0, 2.0));
        assert!(render_compare(["x", "y"], &a, &b).contains("Output token throughput"));
        assert!(compare_figures(&[], &b).is_empty());
    }
}
