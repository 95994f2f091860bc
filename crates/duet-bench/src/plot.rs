//! PNG charts (plotters, bitmap backend). Text is drawn with DejaVu Sans from
//! the `dejavu` crate through plotters' ab_glyph backend, so charts render the
//! same everywhere with no system font lookup.
//!
//! Two shapes cover the papers' figures: lines (update throughput or p95
//! latency vs number of analytics — VLS Fig. 8) and grouped bars (scan
//! duration per strategy — VLS Fig. 7; snapshot creation per method and size —
//! AnKer Table 1; YCSB throughput per workload).

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        // The bundled font is valid TrueType; failing here would be a packaging bug.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

const W: u32 = 900;
const H: u32 = 520;

fn color(i: usize) -> RGBColor {
    // Tableau 10 followed by its light variants: charts with every target and
    // strategy have up to 11 series, and a repeated colour made two unreadable.
    const PALETTE: [RGBColor; 20] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(0, 0, 0),
        RGBColor(174, 199, 232),
        RGBColor(255, 187, 120),
        RGBColor(152, 223, 138),
        RGBColor(255, 152, 150),
        RGBColor(197, 176, 213),
        RGBColor(196, 156, 148),
        RGBColor(247, 182, 210),
        RGBColor(199, 199, 199),
        RGBColor(219, 219, 141),
    ];
    PALETTE[i % PALETTE.len()]
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

/// A line per series over numeric x.
pub fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    register_font();
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x));
    let x_max = xs.fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_max * 1.05, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Grouped bars: one group per category, one bar per series (value ≤ 0 = no bar).
pub fn bars(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
    log_y: bool,
) -> Result<()> {
    register_font();
    let values = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if hi <= 0.0 { (0.1, 1.0) } else { (lo, hi) };
    let n = categories.len().max(1) as f64;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let cats = categories.to_vec();
    let x_fmt = move |x: &f64| {
        let i = x.floor();
        if (x - i - 0.5).abs() < 1e-6 && i >= 0.0 {
            cats.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let nseries = series.len().max(1) as f64;
    let width = 0.8 / nseries;
    macro_rules! draw {
        ($chart:expr, $base:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(categories.len() * 2 + 1)
                .x_label_formatter(&x_fmt)
                .y_desc(y_label)
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(err)?;
            for (si, (name, vals)) in series.iter().enumerate() {
                let c = color(si);
                chart
                    .draw_series(vals.iter().enumerate().filter(|(_, v)| **v > 0.0).map(
                        |(ci, v)| {
                            let x0 = ci as f64 + 0.1 + si as f64 * width;
                            Rectangle::new([(x0, $base), (x0 + width * 0.95, *v)], c.filled())
                        },
                    ))
                    .map_err(err)?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled())
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 14))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(err)?;
        }};
    }
    let builder = |root| {
        let mut b = ChartBuilder::on(root);
        b.caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80);
        b
    };
    if log_y {
        let base = lo / 2.0;
        let chart = builder(&root)
            .build_cartesian_2d(0.0..n, (base..hi * 3.0).log_scale())
            .map_err(err)?;
        draw!(chart, base);
    } else {
        let chart = builder(&root)
            .build_cartesian_2d(0.0..n, 0.0..hi * 1.15)
            .map_err(err)?;
        draw!(chart, 0.0);
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_render_with_text() {
        let dir = std::env::temp_dir().join(format!("duet-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let p = dir.join("lines.png");
        lines(
            &p,
            "title",
            "x",
            "y",
            &[("a".into(), vec![(0.0, 1.0), (1.0, 2.0)])],
        )
        .expect("lines");
        let b = dir.join("bars.png");
        bars(
            &b,
            "bars",
            "ms",
            &["one".into(), "two".into()],
            &[("s".into(), vec![1.0, 100.0])],
            true,
        )
        .expect("bars");
        assert!(std::fs::metadata(&p).expect("png").len() > 1000);
        assert!(std::fs::metadata(&b).expect("png").len() > 1000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
