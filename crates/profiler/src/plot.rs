//! The op × layer heat map as a PNG (plotters' bitmap backend, text in an embedded font —
//! no system font libraries).
//!
//! Rows are ops in the order the forward pass first ran them, columns are layers; a cell's
//! colour is its share of the hottest cell (a five-stop viridis ramp), and the row label
//! carries the op's total time.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::analysis::HeatMap;

/// Registers the embedded font as `sans-serif` once per process.
fn font() -> &'static str {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
    "sans-serif"
}

/// Viridis at `t ∈ [0, 1]` (linear between five stops).
pub fn viridis(t: f64) -> RGBColor {
    const STOPS: [(u8, u8, u8); 5] = [
        (68, 1, 84),
        (59, 82, 139),
        (33, 145, 140),
        (94, 201, 98),
        (253, 231, 37),
    ];
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let x = t * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let lerp = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    RGBColor(lerp(a.0, b.0), lerp(a.1, b.1), lerp(a.2, b.2))
}

/// Draws `heat` to `path` (PNG).
pub fn heat_map_png(heat: &HeatMap, title: &str, path: &Path) -> Result<(), String> {
    let (left, top, cell_h, bottom) = (210i32, 40i32, 26i32, 40i32);
    let n = heat.n_layers.max(1) as i32;
    let cell_w = (900 / n).clamp(8, 40);
    let width = (left + n * cell_w + 20) as u32;
    let height = (top + heat.ops.len().max(1) as i32 * cell_h + bottom) as u32;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let style = |size: i32| TextStyle::from((font(), size).into_font()).color(&BLACK);
    root.draw(&Text::new(title.to_string(), (10, 10), style(18)))
        .map_err(|e| e.to_string())?;
    let max = heat.cells.iter().flatten().copied().fold(0.0f64, f64::max);
    for (r, (op, row)) in heat.ops.iter().zip(&heat.cells).enumerate() {
        let y = top + r as i32 * cell_h;
        let total: f64 = row.iter().sum();
        let label = format!("{op} {:.1} ms", total / 1e3);
        root.draw(&Text::new(label, (6, y + 6), style(13)))
            .map_err(|e| e.to_string())?;
        for (l, v) in row.iter().enumerate() {
            let x = left + l as i32 * cell_w;
            let c = viridis(v / max.max(1e-12));
            root.draw(&Rectangle::new(
                [(x, y), (x + cell_w - 1, y + cell_h - 1)],
                c.filled(),
            ))
            .map_err(|e| e.to_string())?;
        }
    }
    let y = top + heat.ops.len() as i32 * cell_h + 6;
    let step = (n / 10).max(1);
    for l in (0..n).step_by(step as usize) {
        let x = left + l * cell_w;
        root.draw(&Text::new(l.to_string(), (x, y), style(12)))
            .map_err(|e| e.to_string())?;
    }
    root.draw(&Text::new("layer", (left, y + 16), style(12)))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viridis_ends_and_clamps() {
        assert_eq!(viridis(0.0), RGBColor(68, 1, 84));
        assert_eq!(viridis(1.0), RGBColor(253, 231, 37));
        assert_eq!(viridis(2.0), viridis(1.0));
        assert_eq!(viridis(f64::NAN), viridis(0.0));
        assert_eq!(viridis(0.5), RGBColor(33, 145, 140));
    }

    #[test]
    fn writes_a_png_with_hot_and_cold_cells() {
        let heat = HeatMap {
            ops: vec!["qkv_matmul".into(), "attention".into()],
            n_layers: 2,
            cells: vec![vec![30.0, 40.0], vec![0.0, 20.0]],
        };
        let dir = std::env::temp_dir().join(format!("tm-heat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("heat.png");
        heat_map_png(&heat, "test", &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
