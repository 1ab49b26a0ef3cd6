//! The sweep's section: an SVG line chart of what each swept value found, then its rows.

use super::format::{count, opt_count};
use super::{array, field, show, uint};
use serde_json::Value;
use std::fmt::Write as _;

/// Size of the sweep chart and its margins (SVG user units).
const CHART_W: f64 = 720.0;
const CHART_H: f64 = 340.0;
const CHART_LEFT: f64 = 70.0;
const CHART_RIGHT: f64 = 70.0;
const CHART_TOP: f64 = 44.0;
const CHART_BOTTOM: f64 = 72.0;

pub(super) fn sweep(out: &mut String, report: &Value) {
    let Some(sweep) = field(report, "sweep") else {
        return;
    };
    out.push_str("<section class=\"sweep\">\n<h2>Sweep");
    if let Some(path) = field(sweep, "path") {
        let _ = write!(out, " of <code>{}</code>", show(path));
    }
    out.push_str("</h2>\n");
    let rows = array(sweep, "rows");
    if rows.is_empty() {
        out.push_str("<p class=\"empty\">The sweep has no rows.</p>\n</section>\n");
        return;
    }
    sweep_chart(out, sweep, rows);

    // Budget rejections, when a swept configuration has a budget.
    let budgets = rows.iter().any(|r| field(r, "budget_rejected").is_some());
    let _ = writeln!(
        out,
        "<table>\n<thead><tr><th class=\"left\">Value</th><th>Loops found</th>\
         <th>Requests touched</th><th>Callers touched</th>{}</tr></thead>\n<tbody>",
        if budgets {
            "<th>Budget rejections</th>"
        } else {
            ""
        }
    );
    for row in rows {
        let value = row.get("value").map(show).unwrap_or_default();
        let budget = if budgets {
            format!("<td>{}</td>", opt_count(uint(row, "budget_rejected")))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "<tr><td class=\"left\"><code>{value}</code></td><td>{}</td><td>{}</td><td>{}</td>{budget}</tr>",
            opt_count(uint(row, "loops_found")),
            opt_count(uint(row, "requests_touched")),
            opt_count(uint(row, "callers_touched"))
        );
    }
    out.push_str("</tbody>\n</table>\n</section>\n");
}

/// Loops found (left axis) and requests touched (right axis) against the
/// swept value: spaced by value when every value is a number, evenly in
/// the report's order otherwise.
fn sweep_chart(out: &mut String, sweep: &Value, rows: &[Value]) {
    let (left, right, top) = (CHART_LEFT, CHART_W - CHART_RIGHT, CHART_TOP);
    let bottom = CHART_H - CHART_BOTTOM;
    let plot_w = right - left;
    // Points stay clear of the axes, so their value labels do too: x runs
    // from x0 to x1, and 0 sits above the bottom axis at `base`.
    let (x0, x1) = (left + 30.0, right - 30.0);
    let (base, peak) = (bottom - 24.0, top + 6.0);

    let numbers: Option<Vec<f64>> = rows
        .iter()
        .map(|r| r.get("value").and_then(Value::as_f64))
        .collect();
    let n = rows.len();
    let xs: Vec<f64> = match numbers {
        Some(values) => {
            let min = values.iter().copied().fold(f64::INFINITY, f64::min);
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            values
                .iter()
                .map(|v| {
                    if max > min {
                        x0 + (v - min) / (max - min) * (x1 - x0)
                    } else {
                        (x0 + x1) / 2.0
                    }
                })
                .collect()
        }
        None => (0..n)
            .map(|i| {
                if n > 1 {
                    x0 + (i as f64) / ((n - 1) as f64) * (x1 - x0)
                } else {
                    (x0 + x1) / 2.0
                }
            })
            .collect(),
    };

    let loops: Vec<Option<u64>> = rows.iter().map(|r| uint(r, "loops_found")).collect();
    let touched: Vec<Option<u64>> = rows.iter().map(|r| uint(r, "requests_touched")).collect();
    let max_loops = nice_max(loops.iter().flatten().copied().max().unwrap_or(0));
    let max_touched = nice_max(touched.iter().flatten().copied().max().unwrap_or(0));
    let y_of = |v: u64, max: u64| base - (v as f64) / (max as f64) * (base - peak);

    let path = field(sweep, "path")
        .map(show)
        .unwrap_or_else(|| "swept value".to_string());
    let _ = writeln!(
        out,
        "<svg class=\"chart\" width=\"{CHART_W}\" height=\"{CHART_H}\" \
         viewBox=\"0 0 {CHART_W} {CHART_H}\" role=\"img\" \
         aria-label=\"loops found and requests touched for each swept value\">"
    );

    // Grid, axes and tick labels: loops found on the left, requests
    // touched on the right.
    for step in 0..=2u64 {
        let y = base - (step as f64) / 2.0 * (base - peak);
        let _ = writeln!(
            out,
            "<line class=\"grid\" x1=\"{left}\" y1=\"{y:.1}\" x2=\"{right}\" y2=\"{y:.1}\"/>"
        );
        let _ = writeln!(
            out,
            "<text class=\"tick-loops\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <text class=\"tick-touched\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            left - 8.0,
            y + 4.0,
            count(max_loops / 2 * step),
            right + 8.0,
            y + 4.0,
            count(max_touched / 2 * step)
        );
    }
    let _ = writeln!(
        out,
        "<line class=\"axis\" x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{bottom}\"/>\
         <line class=\"axis\" x1=\"{right}\" y1=\"{top}\" x2=\"{right}\" y2=\"{bottom}\"/>\
         <line class=\"axis\" x1=\"{left}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\"/>"
    );

    // The swept values under the axis (every k-th when there are many).
    let every = n.div_ceil(12).max(1);
    for (i, (row, x)) in rows.iter().zip(&xs).enumerate() {
        let _ = writeln!(
            out,
            "<line class=\"axis\" x1=\"{x:.1}\" y1=\"{bottom}\" x2=\"{x:.1}\" y2=\"{:.1}\"/>",
            bottom + 4.0
        );
        if i.is_multiple_of(every) {
            let _ = writeln!(
                out,
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                bottom + 18.0,
                row.get("value").map(show).unwrap_or_default()
            );
        }
    }

    // Axis titles.
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{path}</text>",
        left + plot_w / 2.0,
        CHART_H - 14.0
    );
    let mid_y = (top + bottom) / 2.0;
    let _ = writeln!(
        out,
        "<text class=\"tick-loops\" x=\"18\" y=\"{mid_y:.1}\" text-anchor=\"middle\" \
         transform=\"rotate(-90 18 {mid_y:.1})\">loops found</text>"
    );
    let rx = CHART_W - 14.0;
    let _ = writeln!(
        out,
        "<text class=\"tick-touched\" x=\"{rx:.1}\" y=\"{mid_y:.1}\" text-anchor=\"middle\" \
         transform=\"rotate(90 {rx:.1} {mid_y:.1})\">requests touched</text>"
    );

    // Legend.
    let _ = writeln!(
        out,
        "<line class=\"line-loops\" x1=\"{left}\" y1=\"16\" x2=\"{:.1}\" y2=\"16\"/>\
         <text x=\"{:.1}\" y=\"20\">loops found (left axis)</text>\
         <line class=\"line-touched\" x1=\"{:.1}\" y1=\"16\" x2=\"{:.1}\" y2=\"16\"/>\
         <text x=\"{:.1}\" y=\"20\">requests touched (right axis)</text>",
        left + 24.0,
        left + 30.0,
        left + 200.0,
        left + 224.0,
        left + 230.0
    );

    series(
        out,
        &xs,
        &loops,
        "loops",
        "loops found",
        (-6.0, -8.0, "end"),
        |v| y_of(v, max_loops),
    );
    series(
        out,
        &xs,
        &touched,
        "touched",
        "requests touched",
        (6.0, 16.0, "start"),
        |v| y_of(v, max_touched),
    );
    out.push_str("</svg>\n");
}

/// One series of the sweep chart: its line, points and their values
/// (`label`: the values' offset from their point and text anchor).
fn series(
    out: &mut String,
    xs: &[f64],
    values: &[Option<u64>],
    class: &str,
    name: &str,
    label: (f64, f64, &str),
    y_of: impl Fn(u64) -> f64,
) {
    let mut points: Vec<(f64, u64)> = xs
        .iter()
        .zip(values)
        .filter_map(|(x, v)| Some((*x, (*v)?)))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    if points.len() > 1 {
        let coords: Vec<String> = points
            .iter()
            .map(|(x, v)| format!("{x:.1},{:.1}", y_of(*v)))
            .collect();
        let _ = writeln!(
            out,
            "<polyline class=\"line-{class}\" points=\"{}\"/>",
            coords.join(" ")
        );
    }
    for (x, v) in &points {
        let y = y_of(*v);
        let _ = writeln!(
            out,
            "<circle class=\"pt pt-{class}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\"><title>{name}: {}</title></circle>\
             <text class=\"val val-{class}\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{}\">{}</text>",
            count(*v),
            x + label.0,
            y + label.1,
            label.2,
            count(*v)
        );
    }
}

/// An even, round axis maximum at or above `max` (so its half is whole).
pub(super) fn nice_max(max: u64) -> u64 {
    if max <= 2 {
        return 2;
    }
    let mut magnitude: u64 = 1;
    while magnitude.saturating_mul(10) <= max && magnitude < u64::MAX / 10 {
        magnitude = magnitude.saturating_mul(10);
    }
    [1u64, 2, 4, 6, 8, 10]
        .iter()
        .map(|k| magnitude.saturating_mul(*k))
        .find(|candidate| *candidate >= max && candidate.is_multiple_of(2))
        .unwrap_or(max.saturating_add(1) & !1)
}
