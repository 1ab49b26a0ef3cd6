//! `loopguard replay`'s report as one self-contained HTML page: a header
//! with the inputs, per run a table per policy and a timeline strip per
//! looping caller, and, for a sweep, a line chart of what each value found.
//!
//! The page loads nothing: one `<style>` block, inline SVG, no scripts,
//! fonts or stylesheets from anywhere. Every string taken from the report
//! (request paths, caller labels, file names: users' traffic) is
//! HTML-escaped. The report is read with `.get()` throughout: a missing or
//! null field leaves its part of the page out, never panics.

use serde_json::Value;
use std::fmt::Write as _;

/// Width of a loop's timeline strip (SVG user units).
const STRIP_W: f64 = 760.0;
/// Margin left and right of the strip, so marks at the ends stay visible.
const STRIP_PAD: f64 = 12.0;
/// Width of one mark on a timeline.
const MARK_W: f64 = 4.0;

/// Size of the sweep chart and its margins (SVG user units).
const CHART_W: f64 = 720.0;
const CHART_H: f64 = 340.0;
const CHART_LEFT: f64 = 70.0;
const CHART_RIGHT: f64 = 70.0;
const CHART_TOP: f64 = 44.0;
const CHART_BOTTOM: f64 = 72.0;

/// The actions a policy can take, in the order tables list them.
const ACTIONS: [&str; 5] = ["reject", "throttle", "warn", "nudge", "directive"];

const STYLE: &str = "\
body{font-family:system-ui,-apple-system,\"Segoe UI\",Roboto,sans-serif;color:#222;background:#fff;\
max-width:62rem;margin:1.5rem auto;padding:0 1rem;line-height:1.45}
h1{font-size:1.6rem;margin:0 0 .5rem}
h2{font-size:1.3rem;margin:2rem 0 .4rem;padding-top:.6rem;border-top:2px solid #ddd}
h3{font-size:1.1rem;margin:1.4rem 0 .4rem}
h4{font-size:1rem;margin:1rem 0 .2rem;font-weight:600;overflow-wrap:anywhere}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em;\
background:#f4f4f4;padding:0 .2em;border-radius:3px;overflow-wrap:anywhere}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;margin:.5rem 0}
dl.facts dt{font-weight:600}
dl.facts dd{margin:0}
ul.files,ul.skipped{margin:0;padding-left:1.2rem}
ul.notes{background:#fff8e1;border-left:4px solid #ffbf00;padding:.5rem .5rem .5rem 1.8rem}
details{margin:.5rem 0}
summary{cursor:pointer}
table{border-collapse:collapse;margin:.4rem 0 .8rem}
th,td{border:1px solid #ccc;padding:.25rem .6rem;text-align:right}
th{background:#f4f4f4;font-weight:600}
th.left,td.left{text-align:left}
.muted,.empty{color:#666}
.empty{font-style:italic}
.loop{margin:.6rem 0 1.2rem;padding:.2rem .8rem .6rem;border:1px solid #e4e4e4;border-radius:4px}
.loop p{margin:.2rem 0 .4rem}
.legend{margin:.3rem 0;font-size:.9rem}
.key{margin-right:1rem;white-space:nowrap}
.swatch{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;margin-right:.3rem;vertical-align:-.05rem}
svg{max-width:100%;height:auto;display:block}
svg text{font-family:system-ui,-apple-system,\"Segoe UI\",Roboto,sans-serif;font-size:12px;fill:#333}
.strip{fill:#f6f6f6;stroke:#ccc}
.mark-allow,.sw-allow{fill:#9e9e9e;background:#9e9e9e}
.mark-warn,.sw-warn{fill:#ffbf00;background:#ffbf00}
.mark-throttle,.sw-throttle{fill:#f57c00;background:#f57c00}
.mark-nudge,.sw-nudge{fill:#1e88e5;background:#1e88e5}
.mark-directive,.sw-directive{fill:#0d47a1;background:#0d47a1}
.mark-reject,.sw-reject{fill:#d32f2f;background:#d32f2f}
.mark-other,.sw-other{fill:#6d4c41;background:#6d4c41}
.axis{stroke:#555;stroke-width:1}
.grid{stroke:#e4e4e4;stroke-width:1}
.line-loops{fill:none;stroke:#c62828;stroke-width:2}
.line-touched{fill:none;stroke:#1565c0;stroke-width:2;stroke-dasharray:6 4}
.pt-loops{fill:#c62828}
.pt-touched{fill:#1565c0}
text.val-loops,text.tick-loops{fill:#c62828}
text.val-touched,text.tick-touched{fill:#1565c0}
text.val{font-size:11px;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
";

/// The report as a self-contained HTML page.
pub fn render(report: &Value) -> String {
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(out, "<title>{}</title>", page_title(report));
    let _ = writeln!(out, "<style>\n{STYLE}</style>\n</head>\n<body>");
    if is_empty(report) {
        out.push_str("<h1>loopguard replay</h1>\n");
        out.push_str("<p class=\"empty\">Nothing to show: the report is empty.</p>\n");
    } else {
        header(&mut out, report);
        sweep(&mut out, report);
        runs(&mut out, report);
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// The page's title (escaped): the command and the first traffic file.
fn page_title(report: &Value) -> String {
    let files = array(report.get("inputs").unwrap_or(&Value::Null), "files");
    match files.split_first() {
        None => "loopguard replay".to_string(),
        Some((first, [])) => format!("loopguard replay: {}", show(first)),
        Some((first, rest)) => {
            format!("loopguard replay: {} and {} more", show(first), rest.len())
        }
    }
}

/// Whether the report holds nothing to show (`null`, `{}`, only nulls and
/// empty lists).
fn is_empty(report: &Value) -> bool {
    let Some(obj) = report.as_object() else {
        return true;
    };
    let has = |key: &str| {
        obj.get(key).is_some_and(|v| match v {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        })
    };
    !(has("inputs") || has("runs") || has("sweep") || has("notes"))
}

// ---------------------------------------------------------------------------
// Header

fn header(out: &mut String, report: &Value) {
    let inputs = report.get("inputs").unwrap_or(&Value::Null);
    out.push_str("<header>\n<h1>loopguard replay</h1>\n<dl class=\"facts\">\n");

    let files = array(inputs, "files");
    if !files.is_empty() {
        let label = if files.len() == 1 { "File" } else { "Files" };
        let _ = write!(out, "<dt>{label}</dt><dd><ul class=\"files\">");
        for file in files {
            let _ = write!(out, "<li><code>{}</code></li>", show(file));
        }
        out.push_str("</ul></dd>\n");
    }

    let span = match (uint(inputs, "first_ms"), uint(inputs, "last_ms")) {
        (Some(first), Some(last)) => Some(format!(
            "{} to {} ({})",
            utc(first),
            utc(last),
            duration(last.saturating_sub(first))
        )),
        (Some(first), None) => Some(format!("from {}", utc(first))),
        (None, Some(last)) => Some(format!("until {}", utc(last))),
        (None, None) => None,
    };
    if let Some(span) = span {
        let _ = writeln!(out, "<dt>Time span</dt><dd>{span}</dd>");
    }

    if let Some(read) = uint(inputs, "read") {
        let _ = writeln!(out, "<dt>Requests read</dt><dd>{}</dd>", count(read));
    }
    let skipped_entries = array(inputs, "skipped_entries");
    let skipped = uint(inputs, "skipped").or_else(|| {
        (!skipped_entries.is_empty()).then(|| u64::try_from(skipped_entries.len()).unwrap_or(0))
    });
    if let Some(skipped) = skipped {
        let _ = writeln!(out, "<dt>Entries skipped</dt><dd>{}</dd>", count(skipped));
    }
    out.push_str("</dl>\n");

    let notes = array(report, "notes");
    if !notes.is_empty() {
        out.push_str("<ul class=\"notes\">\n");
        for note in notes {
            let _ = writeln!(out, "<li>{}</li>", show(note));
        }
        out.push_str("</ul>\n");
    }

    if !skipped_entries.is_empty() {
        let listed = skipped_entries.len();
        let _ = write!(
            out,
            "<details>\n<summary>{} skipped {}",
            count(u64::try_from(listed).unwrap_or(0)),
            if listed == 1 { "entry" } else { "entries" }
        );
        let unlisted = uint(inputs, "skipped_not_listed").unwrap_or(0);
        let total = skipped.unwrap_or(0).max(
            u64::try_from(listed)
                .unwrap_or(u64::MAX)
                .saturating_add(unlisted),
        );
        if u64::try_from(listed).is_ok_and(|l| l < total) {
            let _ = write!(out, " listed (of {})", count(total));
        }
        out.push_str("</summary>\n<ul class=\"skipped\">\n");
        for entry in skipped_entries {
            let place = entry.get("place").map(show).unwrap_or_default();
            let reason = entry.get("reason").map(show).unwrap_or_default();
            let _ = writeln!(out, "<li><code>{place}</code>: {reason}</li>");
        }
        out.push_str("</ul>\n</details>\n");
    }
    out.push_str("</header>\n");
}

// ---------------------------------------------------------------------------
// Runs, policies, loops

fn runs(out: &mut String, report: &Value) {
    let runs = array(report, "runs");
    if runs.is_empty() {
        out.push_str("<p class=\"empty\">Nothing to show: the report has no runs.</p>\n");
        return;
    }
    for (i, run) in runs.iter().enumerate() {
        run_section(out, i.saturating_add(1), run);
    }
}

fn run_section(out: &mut String, number: usize, run: &Value) {
    out.push_str("<section class=\"run\">\n");
    let _ = write!(out, "<h2>Run {number}");
    if let Some(config) = field(run, "config") {
        let _ = write!(out, ": <code>{}</code>", show(config));
    }
    out.push_str("</h2>\n");
    if let Some(setting) = field(run, "setting") {
        let path = setting.get("path").map(show).unwrap_or_default();
        let value = setting.get("value").map(show).unwrap_or_default();
        let _ = writeln!(
            out,
            "<p>With <code>{path}</code> set to <code>{value}</code>.</p>"
        );
    }
    if let Some(requests) = uint(run, "requests") {
        let _ = writeln!(out, "<p>{} requests replayed.</p>", count(requests));
    }
    let policies = array(run, "policies");
    if policies.is_empty() {
        out.push_str("<p class=\"empty\">No policy saw a request in this run.</p>\n");
    }
    for policy in policies {
        policy_section(out, policy);
    }
    out.push_str("</section>\n");
}

fn policy_section(out: &mut String, policy: &Value) {
    match field(policy, "id") {
        Some(id) => {
            let _ = writeln!(out, "<h3>Policy <code>{}</code></h3>", show(id));
        }
        None => out.push_str("<h3>Policy (no id)</h3>\n"),
    }
    if flag(policy, "shadow") {
        out.push_str("<p class=\"muted\">Shadow mode: the filter only logs these actions.</p>\n");
    }

    // The actions: the known ones in order, then any others the report has.
    let actions = policy.get("actions").and_then(Value::as_object);
    let mut columns: Vec<&str> = ACTIONS.to_vec();
    if let Some(actions) = actions {
        for key in actions.keys() {
            if !columns.contains(&key.as_str()) {
                columns.push(key.as_str());
            }
        }
    }

    out.push_str("<table>\n<thead>\n<tr>");
    for head in [
        "Requests",
        "Loops found",
        "Callers touched",
        "Requests touched",
    ] {
        let _ = write!(out, "<th rowspan=\"2\">{head}</th>");
    }
    let _ = write!(
        out,
        "<th colspan=\"{}\">Requests by action</th><th rowspan=\"2\">Tokens touched</th></tr>\n<tr>",
        columns.len()
    );
    for action in &columns {
        let _ = write!(
            out,
            "<th><span class=\"swatch sw-{}\"></span>{}</th>",
            action_class(action),
            esc(action)
        );
    }
    out.push_str("</tr>\n</thead>\n<tbody>\n<tr>");
    for key in [
        "requests",
        "loops_found",
        "callers_touched",
        "requests_touched",
    ] {
        // Past its limit the report stops telling callers apart.
        let at_least = key == "callers_touched" && flag(policy, "callers_touched_at_least");
        let _ = write!(
            out,
            "<td>{}{}</td>",
            if at_least { "at least " } else { "" },
            opt_count(uint(policy, key))
        );
    }
    for action in &columns {
        let cell = match actions {
            Some(actions) => count(actions.get(*action).and_then(as_uint).unwrap_or(0)),
            None => "—".to_string(),
        };
        let _ = write!(out, "<td>{cell}</td>");
    }
    let tokens = policy.get("tokens").unwrap_or(&Value::Null);
    let _ = write!(
        out,
        "<td>{}</td>",
        tokens_text(uint(tokens, "touched"), flag(tokens, "estimated"))
    );
    out.push_str("</tr>\n</tbody>\n</table>\n");

    let loops = array(policy, "loops");
    let not_listed = uint(policy, "loops_not_listed").unwrap_or(0);
    if loops.is_empty() && not_listed == 0 {
        out.push_str("<p class=\"muted\">No loops found.</p>\n");
        return;
    }
    if !loops.is_empty() {
        legend(out);
    }
    for lp in loops {
        loop_block(out, lp);
    }
    if not_listed > 0 {
        let _ = writeln!(
            out,
            "<p class=\"muted\">{} more {} not listed.</p>",
            count(not_listed),
            if not_listed == 1 { "loop" } else { "loops" }
        );
    }
}

/// The colours of a timeline's marks.
fn legend(out: &mut String) {
    out.push_str("<p class=\"legend\">Timeline marks, one per request: ");
    for action in ["allow", "warn", "throttle", "nudge", "directive", "reject"] {
        let _ = write!(
            out,
            "<span class=\"key\"><span class=\"swatch sw-{action}\"></span>{action}</span>"
        );
    }
    out.push_str("</p>\n");
}

fn loop_block(out: &mut String, lp: &Value) {
    out.push_str("<div class=\"loop\">\n");
    let caller = match field(lp, "caller") {
        Some(caller) => format!("<code>{}</code>", show(caller)),
        None => "<span class=\"muted\">(unknown caller)</span>".to_string(),
    };
    let _ = writeln!(out, "<h4>Caller {caller}</h4>");

    let mut facts: Vec<String> = Vec::new();
    match field(lp, "model") {
        Some(model) => facts.push(format!("model <code>{}</code>", show(model))),
        None => facts.push("no model".to_string()),
    }
    match (field(lp, "kind"), field(lp, "tier")) {
        (Some(kind), Some(tier)) => {
            facts.push(format!("kind {} (tier {})", show(kind), show(tier)));
        }
        (Some(kind), None) => facts.push(format!("kind {}", show(kind))),
        (None, Some(tier)) => facts.push(format!("tier {}", show(tier))),
        (None, None) => {}
    }
    if let Some(turns) = uint(lp, "turns") {
        facts.push(format!(
            "{} {}",
            count(turns),
            if turns == 1 { "turn" } else { "turns" }
        ));
    }
    match (uint(lp, "first_ms"), uint(lp, "last_ms")) {
        (Some(first), Some(last)) if first == last => facts.push(format!("at {}", utc(first))),
        (Some(first), Some(last)) => facts.push(format!(
            "{} to {} ({})",
            utc(first),
            utc(last),
            duration(last.saturating_sub(first))
        )),
        (Some(first), None) => facts.push(format!("from {}", utc(first))),
        (None, Some(last)) => facts.push(format!("until {}", utc(last))),
        (None, None) => {}
    }
    if let Some(tokens) = uint(lp, "tokens") {
        let estimate = if flag(lp, "tokens_estimated") {
            " (estimate)"
        } else {
            ""
        };
        facts.push(format!("{} tokens{estimate}", count(tokens)));
    }
    if let Some(actions) = lp.get("actions").and_then(Value::as_object) {
        let parts: Vec<String> = actions
            .iter()
            .filter_map(|(k, v)| Some(format!("{} {}", esc(k), count(as_uint(v)?))))
            .collect();
        if !parts.is_empty() {
            facts.push(format!("actions: {}", parts.join(", ")));
        }
    }
    let _ = writeln!(out, "<p>{}</p>", facts.join(" · "));
    timeline_svg(out, lp);
    out.push_str("</div>\n");
}

/// The loop's requests on a strip across its time span, one mark each.
fn timeline_svg(out: &mut String, lp: &Value) {
    let timeline = array(lp, "timeline");
    let mut marks: Vec<(u64, &str)> = timeline
        .iter()
        .filter_map(|e| {
            let at = uint(e, "at_ms")?;
            Some((at, e.get("action").and_then(Value::as_str).unwrap_or("")))
        })
        .collect();
    let unplaced = timeline.len().saturating_sub(marks.len());

    // The span: the loop's own, widened to every mark.
    let lo = marks.iter().map(|m| m.0).chain(uint(lp, "first_ms")).min();
    let hi = marks.iter().map(|m| m.0).chain(uint(lp, "last_ms")).max();

    let height = 50.0;
    let _ = writeln!(
        out,
        "<svg class=\"timeline\" width=\"{STRIP_W}\" height=\"{height}\" \
         viewBox=\"0 0 {STRIP_W} {height}\" role=\"img\" aria-label=\"timeline of the loop's requests\">"
    );
    let _ = writeln!(
        out,
        "<rect class=\"strip\" x=\"0.5\" y=\"4.5\" width=\"{}\" height=\"26\" rx=\"3\"/>",
        STRIP_W - 1.0
    );
    let (x0, x1) = (STRIP_PAD, STRIP_W - STRIP_PAD);
    let place = |at: u64| -> f64 {
        match (lo, hi) {
            (Some(lo), Some(hi)) if hi > lo => {
                x0 + (at.saturating_sub(lo) as f64) / ((hi - lo) as f64) * (x1 - x0)
            }
            // A loop of one instant: its marks in the middle of the strip.
            _ => (x0 + x1) / 2.0,
        }
    };
    // The strongest actions last, so they are drawn on top.
    marks.sort_by_key(|&(at, action)| (severity(action), at));
    for (at, action) in &marks {
        let x = place(*at) - MARK_W / 2.0;
        let label = if action.is_empty() {
            "(no action)"
        } else {
            action
        };
        let _ = writeln!(
            out,
            "<rect class=\"mark mark-{}\" x=\"{x:.1}\" y=\"7\" width=\"{MARK_W}\" height=\"21\">\
             <title>{} {}</title></rect>",
            action_class(action),
            utc_ms(*at),
            esc(label)
        );
    }
    match (lo, hi) {
        (Some(lo), Some(hi)) if hi > lo => {
            let _ = writeln!(
                out,
                "<text x=\"{x0}\" y=\"45\">{}</text>\
                 <text x=\"{}\" y=\"45\" text-anchor=\"middle\">{}</text>\
                 <text x=\"{x1}\" y=\"45\" text-anchor=\"end\">{}</text>",
                clock(lo),
                STRIP_W / 2.0,
                duration(hi - lo),
                clock(hi)
            );
        }
        (Some(at), _) | (None, Some(at)) => {
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"45\" text-anchor=\"middle\">{}</text>",
                STRIP_W / 2.0,
                clock(at)
            );
        }
        (None, None) => {
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"22\" text-anchor=\"middle\">no timeline in the report</text>",
                STRIP_W / 2.0
            );
        }
    }
    out.push_str("</svg>\n");
    if unplaced > 0 {
        let _ = writeln!(
            out,
            "<p class=\"muted\">{unplaced} timeline {} without a time, not drawn.</p>",
            if unplaced == 1 { "entry" } else { "entries" }
        );
    }
}

/// The fixed class suffix for an action (never the report's own string).
fn action_class(action: &str) -> &'static str {
    match action {
        "allow" => "allow",
        "warn" => "warn",
        "throttle" => "throttle",
        "nudge" => "nudge",
        "directive" => "directive",
        "reject" => "reject",
        _ => "other",
    }
}

/// Drawing order: the stronger the action, the later (on top).
fn severity(action: &str) -> u8 {
    match action {
        "allow" => 0,
        "nudge" => 2,
        "directive" => 3,
        "warn" => 4,
        "throttle" => 5,
        "reject" => 6,
        _ => 1,
    }
}

// ---------------------------------------------------------------------------
// Sweep

fn sweep(out: &mut String, report: &Value) {
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

    out.push_str(
        "<table>\n<thead><tr><th class=\"left\">Value</th><th>Loops found</th>\
         <th>Requests touched</th><th>Callers touched</th></tr></thead>\n<tbody>\n",
    );
    for row in rows {
        let value = row.get("value").map(show).unwrap_or_default();
        let _ = writeln!(
            out,
            "<tr><td class=\"left\"><code>{value}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
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
fn nice_max(max: u64) -> u64 {
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

// ---------------------------------------------------------------------------
// Reading the report

/// `v[key]` unless it is absent or null.
fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

/// `v[key]` as a list; empty when absent or not a list.
fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// `v[key]` as a non-negative whole number.
fn uint(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(as_uint)
}

fn as_uint(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f.round() as u64)
    })
}

/// `v[key]` is `true`.
fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

// ---------------------------------------------------------------------------
// Text

/// HTML-escaped text; control characters other than tab and newline (not
/// allowed in HTML) become U+FFFD.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' => out.push(c),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Any JSON value as escaped text: strings as they are, null as a dash,
/// anything else as compact JSON.
fn show(v: &Value) -> String {
    match v {
        Value::Null => "—".to_string(),
        Value::String(s) => esc(s),
        Value::Number(n) => esc(&n.to_string()),
        other => esc(&other.to_string()),
    }
}

/// A count with thousands separators: 45,678.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    let len = digits.len();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (len - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn opt_count(n: Option<u64>) -> String {
    n.map(count).unwrap_or_else(|| "—".to_string())
}

fn tokens_text(tokens: Option<u64>, estimated: bool) -> String {
    match (tokens, estimated) {
        (Some(t), true) => format!("{} (estimate)", count(t)),
        (Some(t), false) => count(t),
        (None, _) => "—".to_string(),
    }
}

/// Days since 1970-01-01 as (year, month, day), proleptic Gregorian.
fn civil(days: i64) -> (i64, u64, u64) {
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u64::try_from(month).unwrap_or(0),
        u64::try_from(day).unwrap_or(0),
    )
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(ms: u64) -> String {
    let secs = ms / 1_000;
    let (y, m, d) = civil(i64::try_from(secs / 86_400).unwrap_or(0));
    format!("{y:04}-{m:02}-{d:02} {} UTC", clock(ms))
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm UTC`.
fn utc_ms(ms: u64) -> String {
    let secs = ms / 1_000;
    let (y, m, d) = civil(i64::try_from(secs / 86_400).unwrap_or(0));
    let sod = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03} UTC",
        sod / 3_600,
        sod / 60 % 60,
        sod % 60,
        ms % 1_000
    )
}

/// The time of day of `ms`, `HH:MM:SS` (UTC).
fn clock(ms: u64) -> String {
    let sod = ms / 1_000 % 86_400;
    format!("{:02}:{:02}:{:02}", sod / 3_600, sod / 60 % 60, sod % 60)
}

/// A length of time, roughly: `850 ms`, `12.5 s`, `3 min 5 s`, `2 h 10 min`.
fn duration(ms: u64) -> String {
    let secs = ms / 1_000;
    if ms < 1_000 {
        format!("{ms} ms")
    } else if secs < 60 {
        format!("{}.{} s", secs, ms % 1_000 / 100)
    } else if secs < 3_600 {
        format!("{} min {} s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{} h {} min", secs / 3_600, secs / 60 % 60)
    } else {
        format!("{} d {} h", secs / 86_400, secs / 3_600 % 24)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DANGEROUS: &str = "<script>alert(\"x\")</script> & 'co'";

    fn sample() -> Value {
        json!({
            "inputs": {
                "files": ["traffic.jsonl", "more <b>traffic</b>.json"],
                "read": 1234,
                "skipped": 5,
                "skipped_not_listed": 3,
                "skipped_entries": [
                    {"place": "traffic.jsonl:17", "reason": "not JSON: <oops>"},
                    {"place": "traffic.jsonl:18"}
                ],
                "first_ms": 1_764_000_000_000u64,
                "last_ms": 1_764_003_600_000u64
            },
            "notes": ["the configuration uses the Redis store: replay counts as one replica would"],
            "runs": [
                {
                    "config": "examples/recommended/envoy.yaml",
                    "setting": {"path": "policies.agents.loop_detection.threshold_identical_requests", "value": 3},
                    "requests": 1234,
                    "policies": [
                        {
                            "id": "agents", "requests": 1200, "loops_found": 2,
                            "callers_touched": 2, "requests_touched": 17,
                            "actions": {"reject": 5, "throttle": 0, "warn": 2, "nudge": 7, "directive": 3},
                            "tokens": {"touched": 45678, "estimated": true},
                            "loops": [
                                {
                                    "caller": DANGEROUS, "model": "gpt-4o",
                                    "kind": "fingerprint", "tier": "identical",
                                    "first_ms": 1_764_000_100_000u64, "last_ms": 1_764_000_160_000u64,
                                    "turns": 6, "actions": {"reject": 2, "warn": 1},
                                    "tokens": 12345, "tokens_estimated": true,
                                    "timeline": [
                                        {"at_ms": 1_764_000_100_000u64, "action": "allow"},
                                        {"at_ms": 1_764_000_110_000u64, "action": "allow"},
                                        {"at_ms": 1_764_000_120_000u64, "action": "warn"},
                                        {"at_ms": 1_764_000_130_000u64, "action": "nudge"},
                                        {"at_ms": 1_764_000_150_000u64, "action": "reject"},
                                        {"at_ms": 1_764_000_160_000u64, "action": "reject"}
                                    ]
                                },
                                {
                                    "caller": "source 10.0.0.7",
                                    "model": null, "kind": "tool_loop",
                                    "first_ms": 1_764_000_200_000u64, "last_ms": 1_764_000_200_000u64,
                                    "turns": 1,
                                    "timeline": [{"at_ms": 1_764_000_200_000u64, "action": "throttle"}]
                                }
                            ],
                            "loops_not_listed": 0
                        },
                        {"id": "quiet", "shadow": true, "callers_touched": 5000, "callers_touched_at_least": true}
                    ]
                },
                {
                    "config": "examples/recommended/envoy.yaml",
                    "setting": {"path": "policies.agents.loop_detection.threshold_identical_requests", "value": 4},
                    "requests": 1234,
                    "policies": [
                        {
                            "id": "agents", "loops_found": 1, "requests_touched": 4,
                            "loops": [
                                {"caller": "header x-agent=a&b", "kind": "near",
                                 "timeline": [
                                     {"at_ms": 1_764_000_300_000u64, "action": "directive"},
                                     {"at_ms": 1_764_000_301_000u64, "action": "mystery"},
                                     {"at_ms": 1_764_000_302_000u64}
                                 ]}
                            ],
                            "loops_not_listed": 3
                        }
                    ]
                }
            ],
            "sweep": {
                "path": "policies.agents.loop_detection.threshold_identical_requests",
                "rows": [
                    {"value": 3, "loops_found": 9, "requests_touched": 40, "callers_touched": 5},
                    {"value": 4, "loops_found": 4, "requests_touched": 17, "callers_touched": 2},
                    {"value": 5, "loops_found": 1, "requests_touched": null}
                ]
            }
        })
    }

    /// The callers and timeline lengths of every loop, in page order.
    fn loops_of(report: &Value) -> Vec<(String, usize)> {
        let mut loops = Vec::new();
        for run in report["runs"].as_array().unwrap() {
            for policy in run["policies"].as_array().unwrap() {
                for lp in policy["loops"].as_array().into_iter().flatten() {
                    loops.push((
                        lp["caller"].as_str().unwrap().to_string(),
                        lp["timeline"].as_array().unwrap().len(),
                    ));
                }
            }
        }
        loops
    }

    fn assert_self_contained(html: &str) {
        assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
        assert!(html.contains("<meta charset=\"utf-8\">"));
        assert!(html.contains("<title>"));
        assert_eq!(html.matches("<style>").count(), 1);
        let lower = html.to_lowercase();
        for banned in [
            "<script",
            "<link",
            "@import",
            "url(",
            "href=\"http",
            "src=\"http",
            "src=",
        ] {
            assert!(!lower.contains(banned), "page contains {banned:?}");
        }
        for tag in ["html", "svg", "table", "details", "section", "div", "ul"] {
            assert_eq!(
                html.matches(&format!("<{tag}")).count(),
                html.matches(&format!("</{tag}>")).count(),
                "unbalanced <{tag}>"
            );
        }
        assert!(html.trim_end().ends_with("</html>"));
    }

    #[test]
    fn renders_a_self_contained_page() {
        let report = sample();
        let html = render(&report);
        assert_self_contained(&html);
        assert!(html.contains("<title>loopguard replay: traffic.jsonl and 1 more</title>"));
    }

    #[test]
    fn escapes_strings_from_the_report() {
        let html = render(&sample());
        assert!(!html.contains(DANGEROUS));
        assert!(!html.contains("<script>"));
        assert!(
            html.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;co&#39;")
        );
        assert!(html.contains("more &lt;b&gt;traffic&lt;/b&gt;.json"));
        assert!(!html.contains("<b>"));
        assert!(html.contains("not JSON: &lt;oops&gt;"));
        assert!(html.contains("header x-agent=a&amp;b"));
        assert!(!html.contains("x-agent=a&b"));
        // An unknown action gets the fixed "other" class, never its own name.
        assert!(html.contains("mark mark-other"));
        assert!(!html.contains("mark-mystery"));
    }

    #[test]
    fn one_timeline_per_loop_with_one_mark_per_entry() {
        let report = sample();
        let html = render(&report);
        let loops = loops_of(&report);
        assert_eq!(loops.len(), 3);
        // One SVG per loop, plus the sweep's chart.
        assert_eq!(html.matches("<svg").count(), loops.len() + 1);
        let timelines: Vec<&str> = html
            .split("<svg")
            .skip(1)
            .filter(|s| s.starts_with(" class=\"timeline\""))
            .map(|s| s.split("</svg>").next().unwrap())
            .collect();
        assert_eq!(timelines.len(), loops.len());
        for ((caller, len), svg) in loops.iter().zip(&timelines) {
            assert!(html.contains(&esc(caller)), "caller {caller} missing");
            assert_eq!(svg.matches("class=\"mark ").count(), *len, "{caller}");
        }
        // The legend is not drawn with marks.
        assert_eq!(html.matches("class=\"mark ").count(), 6 + 1 + 3);
        assert!(html.contains("class=\"mark mark-reject\""));
        assert!(html.contains("class=\"mark mark-throttle\""));
        assert!(html.contains("class=\"legend\""));
        // A loop of one instant still has its mark, in the strip's middle.
        let single = timelines[1];
        assert!(single.contains(&format!("x=\"{:.1}\"", STRIP_W / 2.0 - MARK_W / 2.0)));
    }

    #[test]
    fn shows_the_header_tables_and_loop_facts() {
        let html = render(&sample());
        assert!(html.contains("2025-11-24 16:00:00 UTC to 2025-11-24 17:00:00 UTC (1 h 0 min)"));
        assert!(html.contains("<dd>1,234</dd>"));
        assert!(html.contains("<details>"));
        assert!(html.contains("2 skipped entries listed (of 5)"));
        assert!(html.contains("Shadow mode"));
        assert!(html.contains("<td>at least 5,000</td>"));
        assert!(html.contains("traffic.jsonl:17"));
        assert!(html.contains("Redis store"));
        assert!(html.contains("45,678 (estimate)"));
        assert!(html.contains("12,345 tokens (estimate)"));
        assert!(html.contains("model <code>gpt-4o</code>"));
        assert!(html.contains("kind fingerprint (tier identical)"));
        assert!(html.contains("6 turns"));
        assert!(html.contains("no model"));
        assert!(html.contains("3 more loops not listed"));
        assert!(html.contains("No loops found."));
        assert!(html.contains("<code>policies.agents.loop_detection.threshold_identical_requests</code> set to <code>4</code>"));
        assert!(html.contains("(no action)</title>"));
    }

    #[test]
    fn draws_the_sweep() {
        let html = render(&sample());
        let chart = html
            .split("<svg class=\"chart\"")
            .nth(1)
            .and_then(|s| s.split("</svg>").next())
            .unwrap();
        // Both series, a point and a value label per known value.
        assert_eq!(chart.matches("class=\"pt pt-loops\"").count(), 3);
        assert_eq!(chart.matches("class=\"pt pt-touched\"").count(), 2);
        assert!(chart.contains("class=\"line-loops\""));
        assert!(chart.contains("class=\"line-touched\""));
        assert!(chart.contains(">loops found<"));
        assert!(chart.contains(">requests touched<"));
        assert!(chart.contains(">40</text>"));
        assert!(chart.contains(">9</text>"));
        assert!(chart.contains("threshold_identical_requests</text>"));
        // And the rows as a table after it.
        let after = html.split("<svg class=\"chart\"").nth(1).unwrap();
        assert!(after.contains("<th class=\"left\">Value</th>"));
        assert_eq!(after.matches("<tr><td class=\"left\"><code>").count(), 3);
    }

    #[test]
    fn an_empty_report_says_so() {
        for report in [
            json!({}),
            Value::Null,
            json!([]),
            json!({"runs": [], "sweep": null}),
        ] {
            let html = render(&report);
            assert_self_contained(&html);
            assert!(html.contains("Nothing to show"), "{html}");
            assert!(!html.contains("<svg"));
        }
    }

    #[test]
    fn odd_shapes_do_not_panic() {
        let odd = json!({
            "inputs": {"files": "not a list", "read": -3, "first_ms": "soon", "skipped_entries": [7, null]},
            "notes": [null, 3, {"a": "<b>"}],
            "runs": [null, 5, {"policies": [null, {"actions": [], "loops": [null, {"timeline": [null, {"at_ms": 1.5}]}]}]}],
            "sweep": {"rows": [{"value": "a"}, {"value": {"x": 1}, "loops_found": 2}, 7]}
        });
        let html = render(&odd);
        assert_self_contained(&html);
        assert!(html.contains("{&quot;a&quot;:&quot;&lt;b&gt;&quot;}"));
        assert!(html.contains("1 timeline entry without a time, not drawn."));
        let sweep_only = json!({"sweep": {"path": "p", "rows": [{"value": 2, "loops_found": 0, "requests_touched": 0}]}});
        let html = render(&sweep_only);
        assert_self_contained(&html);
        assert!(html.contains("the report has no runs"));
        assert_eq!(html.matches("<svg").count(), 1);
    }

    #[test]
    fn formats_times_and_counts() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_764_000_000_000), "2025-11-24 16:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_ms(1_764_000_000_123), "2025-11-24 16:00:00.123 UTC");
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(12_500), "12.5 s");
        assert_eq!(duration(185_000), "3 min 5 s");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(45_678), "45,678");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(nice_max(0), 2);
        assert_eq!(nice_max(3), 4);
        assert_eq!(nice_max(9), 10);
        assert_eq!(nice_max(40), 40);
        assert_eq!(nice_max(41), 60);
        assert_eq!(nice_max(1_234), 2_000);
        assert!(nice_max(u64::MAX) >= u64::MAX - 1);
        assert_eq!(esc("a\u{0}b"), "a\u{FFFD}b");
    }
}
