//! The `--plot FILE.svg` drawing: every series as one polyline of value against size.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use super::Plot;

/// Width and height of the drawing, and the plot area's margins.
pub(super) const SVG_W: f64 = 860.0;
const SVG_H: f64 = 520.0;
pub(super) const LEFT: f64 = 90.0;
pub(super) const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
/// Series colours, in order (then repeated).
const COLOURS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Escapes text for XML content and attribute values.
fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A size as the x-axis labels show it: `512`, `4K`, `4M`.
pub(super) fn size_label(s: usize) -> String {
    if s >= 1 << 30 && s % (1 << 30) == 0 {
        format!("{}G", s >> 30)
    } else if s >= 1 << 20 && s % (1 << 20) == 0 {
        format!("{}M", s >> 20)
    } else if s >= 1 << 10 && s % (1 << 10) == 0 {
        format!("{}K", s >> 10)
    } else {
        s.to_string()
    }
}

/// A value as a tick label: short, without trailing zeros; millions and billions as
/// `15M`, `2.5G`.
pub(super) fn value_label(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    };
    let a = v.abs();
    if a == 0.0 {
        "0".to_owned()
    } else if a >= 1e9 {
        format!("{}G", trim(format!("{:.2}", v / 1e9)))
    } else if a >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.4}"))
    }
}

/// A "nice" step (1, 2 or 5 times a power of ten) near `range / 5`.
pub(super) fn nice_step(range: f64) -> f64 {
    let raw = (range / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

impl Plot {
    /// The plot as a self-contained SVG document.
    pub(crate) fn svg(&self) -> String {
        let usable = |v: f64| v.is_finite() && (!self.log_y || v > 0.0);
        let points: Vec<(usize, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(_, v)| usable(v))
            .collect();

        // x: log2 of the size; size 0 sits one step left of the smallest positive size.
        let lo_pos = points
            .iter()
            .filter(|p| p.0 > 0)
            .map(|p| (p.0 as f64).log2().floor())
            .fold(f64::INFINITY, f64::min);
        let lo_pos = if lo_pos.is_finite() { lo_pos } else { 0.0 };
        let zero_pos = lo_pos - 1.0;
        let xpos = |s: usize| {
            if s == 0 {
                zero_pos
            } else {
                (s as f64).log2()
            }
        };
        let (mut x0, mut x1) = points
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
                (a.0.min(xpos(p.0)), a.1.max(xpos(p.0)))
            });
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 - x0 < 1.0 {
            x0 -= 0.5;
            x1 += 0.5;
        }

        // y: linear from 0 (or the minimum if negative), or log10.
        let (vmin, vmax) = points
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
                (a.0.min(p.1), a.1.max(p.1))
            });
        let (vmin, vmax) = if vmin.is_finite() {
            (vmin, vmax)
        } else if self.log_y {
            (1.0, 10.0)
        } else {
            (0.0, 1.0)
        };
        let (y0, y1, yticks): (f64, f64, Vec<f64>) = if self.log_y {
            let a = vmin.log10().floor();
            let mut b = vmax.log10().ceil();
            if b <= a {
                b = a + 1.0;
            }
            let mut ticks = Vec::new();
            let mults: &[f64] = if b - a <= 2.0 {
                &[1.0, 2.0, 5.0]
            } else {
                &[1.0]
            };
            let mut e = a;
            while e <= b {
                for m in mults {
                    let t = m * 10f64.powf(e);
                    if t.log10() <= b + 1e-9 {
                        ticks.push(t);
                    }
                }
                e += 1.0;
            }
            (a, b, ticks)
        } else {
            let lo = vmin.min(0.0);
            let hi = if vmax > lo { vmax } else { lo + 1.0 };
            let step = nice_step(hi - lo);
            let lo = (lo / step).floor() * step;
            let hi = (hi / step).ceil() * step;
            let n = ((hi - lo) / step).round() as usize;
            let ticks = (0..=n).map(|i| lo + i as f64 * step).collect();
            (lo, hi, ticks)
        };
        let yval = |v: f64| if self.log_y { v.log10() } else { v };

        let pw = SVG_W - LEFT - RIGHT;
        let ph = SVG_H - TOP - BOTTOM;
        let px = |pos: f64| LEFT + (pos - x0) / (x1 - x0) * pw;
        let py = |v: f64| TOP + ph - (yval(v) - y0) / (y1 - y0) * ph;

        let mut o = String::new();
        let _ = writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_W}" height="{SVG_H}" viewBox="0 0 {SVG_W} {SVG_H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(o, "<title>{}</title>", xml_escape(&self.title));
        let _ = writeln!(
            o,
            r#"<rect x="0" y="0" width="{SVG_W}" height="{SVG_H}" fill="white"/>"#
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="28" text-anchor="middle" font-size="16">{}</text>"#,
            LEFT + pw / 2.0,
            xml_escape(&self.title)
        );

        // Grid, ticks and labels.
        let _ = writeln!(o, r##"<g class="x-axis" stroke="#000">"##);
        let first = x0.ceil() as i64;
        let last = x1.floor() as i64;
        let count = (last - first + 1).max(1);
        let every = ((count + 11) / 12).max(1);
        for k in first..=last {
            let pos = k as f64;
            let x = px(pos);
            let _ = writeln!(
                o,
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}"/>"#,
                TOP + ph,
                TOP + ph + 5.0
            );
            let label = if (pos - zero_pos).abs() < 1e-9 && points.iter().any(|p| p.0 == 0) {
                Some("0".to_owned())
            } else if (0..63).contains(&k) && (last - k) % every == 0 {
                Some(size_label(1usize << k))
            } else {
                None
            };
            if let Some(l) = label {
                let _ = writeln!(
                    o,
                    r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle" stroke="none">{}</text>"#,
                    TOP + ph + 20.0,
                    xml_escape(&l)
                );
            }
        }
        let _ = writeln!(o, "</g>");
        let _ = writeln!(o, r##"<g class="y-axis" stroke="#000">"##);
        for &t in &yticks {
            let y = py(t);
            let _ = writeln!(
                o,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
                LEFT + pw
            );
            let _ = writeln!(
                o,
                r#"<line x1="{:.1}" y1="{y:.1}" x2="{LEFT}" y2="{y:.1}"/>"#,
                LEFT - 5.0
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" stroke="none">{}</text>"#,
                LEFT - 8.0,
                y + 4.0,
                xml_escape(&value_label(t))
            );
        }
        let _ = writeln!(o, "</g>");
        let _ = writeln!(
            o,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#000"/>"##
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">Message size (bytes, log2 scale)</text>"#,
            LEFT + pw / 2.0,
            SVG_H - 20.0
        );
        let scale = if self.log_y { ", log scale" } else { "" };
        let _ = writeln!(
            o,
            r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">{}{scale}</text>"#,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            xml_escape(&self.y_label)
        );

        // One polyline (with point markers) and a legend entry per series.
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut pts: Vec<(usize, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|&(_, v)| usable(v))
                .collect();
            pts.sort_by_key(|p| p.0);
            let _ = writeln!(o, r#"<g class="series" fill="{colour}" stroke="{colour}">"#);
            let coords: Vec<String> = pts
                .iter()
                .map(|&(sz, v)| format!("{:.1},{:.1}", px(xpos(sz)), py(v)))
                .collect();
            let _ = writeln!(
                o,
                r#"<polyline fill="none" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
                coords.join(" "),
                xml_escape(&s.label)
            );
            for &(sz, v) in &pts {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3"><title>{}: {sz} B, {}</title></circle>"#,
                    px(xpos(sz)),
                    py(v),
                    xml_escape(&s.label),
                    value_label(v)
                );
            }
            let ly = TOP + 10.0 + 20.0 * i as f64;
            let lx = LEFT + pw + 15.0;
            let _ = writeln!(
                o,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke-width="2"/>"#,
                lx + 25.0
            );
            let _ = writeln!(
                o,
                r##"<text x="{:.1}" y="{:.1}" stroke="none" fill="#000">{}</text>"##,
                lx + 32.0,
                ly + 4.0,
                xml_escape(&s.label)
            );
            let _ = writeln!(o, "</g>");
        }
        let _ = writeln!(o, "</svg>");
        o
    }

    /// Writes [`svg`](Plot::svg) to `path`.
    pub(crate) fn write(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.svg()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot write the plot {}: {e}", path.display()),
            )
        })
    }
}
