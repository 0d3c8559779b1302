//! Pure: the plot as hand-written SVG. Two panels, latency and throughput against
//! message size, both axes logarithmic; one line per data path (bypass, default,
//! Unix-socket floor) and placement (solid cross-CPU, dashed same-CPU), through the
//! medians, with a bar from min to max at each point.

use std::fmt::Write as _;

use crate::{
    model::{Path, Results, Test},
    report::{cell, size_label},
};

const PANEL_W: f64 = 520.0;
const PANEL_H: f64 = 400.0;
const MARGIN_L: f64 = 70.0;
const MARGIN_R: f64 = 20.0;
const MARGIN_T: f64 = 40.0;
const MARGIN_B: f64 = 50.0;
const LEGEND_H: f64 = 110.0;

fn color(path: Path) -> &'static str {
    match path {
        Path::Bypass => "#1f77b4",
        Path::Default => "#d62728",
        Path::Minimal => "#2ca02c",
        Path::Floor => "#555555",
    }
}

fn dash(placement_index: usize) -> &'static str {
    match placement_index {
        0 => "",
        1 => "6,4",
        _ => "2,3",
    }
}

/// XML-escapes text.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A logarithmic axis mapping values in `[lo, hi]` onto pixels `[p0, p1]`.
#[derive(Clone, Copy, Debug)]
struct LogAxis {
    lo: f64,
    hi: f64,
    p0: f64,
    p1: f64,
}

impl LogAxis {
    fn map(&self, v: f64) -> f64 {
        let t = (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        self.p0 + t * (self.p1 - self.p0)
    }
}

/// Decade bounds enclosing all of `values` (positive ones).
fn decades(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi <= 0.0 {
        return None;
    }
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    Some((lo, hi))
}

fn lat_label(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{} µs", ns / 1e3)
    } else {
        format!("{ns} ns")
    }
}

fn bw_label(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{} GB/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{} MB/s", bps / 1e6)
    } else if bps >= 1e3 {
        format!("{} kB/s", bps / 1e3)
    } else {
        format!("{bps} B/s")
    }
}

fn panel(o: &mut String, r: &Results, test: Test, x0: f64, title: &str, label: fn(f64) -> String) {
    let paths = [Path::Bypass, Path::Default, Path::Minimal, Path::Floor];
    let all = r.samples.iter().filter(|s| s.test == test).map(|s| s.value);
    let Some((lo, hi)) = decades(all) else {
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" font-size="14">{}: no data</text>"#,
            x0 + MARGIN_L,
            MARGIN_T + 20.0,
            esc(title)
        );
        return;
    };
    let sizes = &r.config.sizes;
    let (smin, smax) = (
        f64::from(*sizes.iter().min().unwrap_or(&1)),
        f64::from(*sizes.iter().max().unwrap_or(&16384)),
    );
    let xa = LogAxis {
        lo: smin,
        hi: smax.max(smin * 2.0),
        p0: x0 + MARGIN_L,
        p1: x0 + PANEL_W - MARGIN_R,
    };
    let ya = LogAxis {
        lo,
        hi,
        p0: MARGIN_T + PANEL_H - MARGIN_B,
        p1: MARGIN_T,
    };
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" font-size="15" font-weight="bold" text-anchor="middle">{}</text>"#,
        x0 + PANEL_W / 2.0,
        MARGIN_T - 15.0,
        esc(title)
    );
    // Frame, grid and tick labels.
    let _ = writeln!(
        o,
        r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#000"/>"##,
        xa.p0,
        ya.p1,
        xa.p1 - xa.p0,
        ya.p0 - ya.p1
    );
    let mut d = lo;
    while d <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let v = d * m;
            if v > hi * 1.0001 {
                break;
            }
            let y = ya.map(v);
            let stroke = if m == 1.0 { "#bbb" } else { "#eee" };
            let _ = writeln!(
                o,
                r#"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="{stroke}"/>"#,
                xa.p0, xa.p1
            );
            // Few decades: label 2x and 5x too, or a one-decade axis has two labels.
            if m == 1.0 || hi / lo <= 100.0 {
                let _ = writeln!(
                    o,
                    r#"<text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"#,
                    xa.p0 - 5.0,
                    y + 4.0,
                    esc(&label(v))
                );
            }
        }
        d *= 10.0;
    }
    for &s in sizes {
        let x = xa.map(f64::from(s));
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#eee"/>"##,
            ya.p0, ya.p1
        );
        let _ = writeln!(
            o,
            r#"<text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
            ya.p0 + 15.0,
            size_label(s)
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">message size, bytes</text>"#,
        (xa.p0 + xa.p1) / 2.0,
        ya.p0 + 35.0
    );
    // Series.
    for (pi, p) in r.config.placements.iter().enumerate() {
        for path in paths {
            let pts: Vec<(f64, f64, f64, f64)> = sizes
                .iter()
                .filter_map(|&s| {
                    let c = cell(r, &p.name, path, test, s)?;
                    let x = xa.map(f64::from(s));
                    Some((x, ya.map(c.median), ya.map(c.min), ya.map(c.max)))
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            let line: Vec<String> = pts
                .iter()
                .map(|(x, y, _, _)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2" stroke-dasharray="{}"/>"#,
                line.join(" "),
                color(path),
                dash(pi)
            );
            for (x, y, ymin, ymax) in pts {
                let _ = writeln!(
                    o,
                    r#"<line x1="{x:.1}" y1="{ymin:.1}" x2="{x:.1}" y2="{ymax:.1}" stroke="{}"/><circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#,
                    color(path),
                    color(path)
                );
            }
        }
    }
}

/// The SVG document.
pub fn svg(r: &Results) -> String {
    let width = PANEL_W * 2.0;
    let height = PANEL_H + LEGEND_H;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    panel(
        &mut o,
        r,
        Test::TcpLat,
        0.0,
        "qperf tcp_lat: one-way latency (lower is better)",
        lat_label,
    );
    panel(
        &mut o,
        r,
        Test::TcpBw,
        PANEL_W,
        "qperf tcp_bw: throughput (higher is better)",
        bw_label,
    );
    // Legend.
    let mut x = MARGIN_L;
    let mut y = MARGIN_T + PANEL_H + 10.0;
    for (pi, p) in r.config.placements.iter().enumerate() {
        for path in [Path::Bypass, Path::Default, Path::Minimal, Path::Floor] {
            if path == Path::Minimal && !r.config.minimal {
                continue;
            }
            let name = match path {
                Path::Floor => "Unix-socket floor",
                Path::Bypass => "bypass",
                Path::Default => "default (veth+bridge)",
                Path::Minimal => "minimal redirect",
            };
            let _ = writeln!(
                o,
                r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="2" stroke-dasharray="{}"/><text x="{}" y="{}" font-size="12">{}</text>"#,
                x + 30.0,
                color(path),
                dash(pi),
                x + 35.0,
                y + 4.0,
                esc(&format!("{name}, {}", p.name))
            );
            x += 300.0;
            if x + 300.0 > width {
                x = MARGIN_L;
                y += 20.0;
            }
        }
    }
    let _ = writeln!(
        o,
        r##"<text x="{MARGIN_L}" y="{}" font-size="11" fill="#444">{}</text>"##,
        height - 8.0,
        esc(&format!(
            "median of {} interleaved reps, bar = min..max; kernel {}, {} CPUs, git {}",
            r.config.reps, r.env.kernel, r.env.cpus, r.env.git_commit
        ))
    );
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_results;

    #[test]
    fn svg_has_both_panels_and_series() {
        let s = svg(&sample_results());
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert!(s.contains("tcp_lat"));
        assert!(s.contains("tcp_bw"));
        assert_eq!(s.matches("<polyline").count(), 8, "4 paths x 2 tests");
        assert!(s.contains("Unix-socket floor, cross-cpu"));
        assert!(s.contains("minimal redirect, cross-cpu"));
    }

    #[test]
    fn decade_bounds() {
        assert_eq!(decades([5.0, 120.0].into_iter()), Some((1.0, 1000.0)));
        assert_eq!(decades([10.0].into_iter()), Some((10.0, 100.0)));
        assert_eq!(decades(std::iter::empty()), None);
    }

    #[test]
    fn axis_maps_ends() {
        let a = LogAxis {
            lo: 1.0,
            hi: 100.0,
            p0: 0.0,
            p1: 200.0,
        };
        assert!((a.map(10.0) - 100.0).abs() < 1e-9);
        assert!((a.map(100.0) - 200.0).abs() < 1e-9);
    }
}
