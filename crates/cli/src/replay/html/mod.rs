//! `loopguard replay`'s report as one self-contained HTML page: a header
//! with the inputs, per run a table per policy and a timeline strip per
//! looping caller, and, for a sweep, a line chart of what each value found.
//!
//! The page loads nothing: one `<style>` block, inline SVG, no scripts,
//! fonts or stylesheets from anywhere. Every string taken from the report
//! (request paths, caller labels, file names: users' traffic) is
//! HTML-escaped. The report is read with `.get()` throughout: a missing or
//! null field leaves its part of the page out, never panics.
//!
//! The parts: `timeline` (a loop's block and its SVG strip), `chart` (the
//! sweep's section and line chart), `format` (dates, durations, counts).

mod chart;
mod format;
#[cfg(test)]
mod tests;
mod timeline;

use chart::sweep;
use format::{count, duration, opt_count, tokens_text, utc};
use serde_json::Value;
use std::fmt::Write as _;
use timeline::{action_class, legend, loop_block};

/// The actions a policy can take, in the order tables list them.
const ACTIONS: [&str; 5] = ["reject", "throttle", "warn", "nudge", "directive"];

/// MCP policies' actions, listed after those when a policy has any.
const MCP_ACTIONS: [&str; 3] = ["note", "block", "error"];

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
.mark-note,.sw-note{fill:#26a69a;background:#26a69a}
.mark-block,.sw-block{fill:#ad1457;background:#ad1457}
.mark-error,.sw-error{fill:#6a1b9a;background:#6a1b9a}
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
    if field(policy, "mcp").is_some() {
        columns.extend(MCP_ACTIONS);
    }
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
    if let Some(b) = field(policy, "budgets") {
        budget_table(out, b, flag(policy, "shadow"));
    }

    let loops = array(policy, "loops");
    let not_listed = uint(policy, "loops_not_listed").unwrap_or(0);
    if loops.is_empty() && not_listed == 0 {
        out.push_str("<p class=\"muted\">No loops found.</p>\n");
        return;
    }
    if let Some(mcp) = field(policy, "mcp") {
        mcp_facts(out, mcp);
    }
    if !loops.is_empty() {
        legend(out, field(policy, "mcp").is_some());
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

/// A policy's spend caps: per cap, its figure, what it rejected (or in
/// shadow mode would have) and warned, the keys it touched, when it first
/// rejected and what its keys spent.
fn budget_table(out: &mut String, b: &Value, shadow: bool) {
    let caps = array(b, "caps");
    if caps.is_empty() {
        return;
    }
    let amount = |c: &Value, key: &str| {
        let shown = c.get(key).map(show).unwrap_or_default();
        match c.get("unit").and_then(Value::as_str) {
            Some("usd") => format!("${shown}"),
            Some(unit) => format!("{shown} {}", esc(unit)),
            None => shown,
        }
    };
    let _ = writeln!(
        out,
        "<table class=\"budgets\">\n<thead><tr><th class=\"left\">Budget</th><th class=\"left\">Cap</th>\
         <th>{}</th><th>Warned</th><th>Keys touched</th><th>Keys at the cap</th>\
         <th class=\"left\">First rejected</th><th>Spent</th></tr></thead>\n<tbody>",
        if shadow { "Would have rejected" } else { "Rejected" }
    );
    for c in caps {
        let name = c.get("name").map(show).unwrap_or_default();
        let per = c.get("per").map(show).unwrap_or_default();
        let window = uint(c, "window_seconds").map(count).unwrap_or_default();
        let action = c.get("action").map(show).unwrap_or_default();
        let first = uint(c, "first_rejected_ms").map_or_else(|| "—".to_string(), utc);
        let _ = writeln!(
            out,
            "<tr><td class=\"left\"><code>{name}</code></td><td class=\"left\">{} per {per} in {window} s ({action})</td>\
             <td>{}</td><td>{}</td><td>{}{}</td><td>{}</td><td class=\"left\">{first}</td><td>{}</td></tr>",
            amount(c, "cap"),
            opt_count(uint(c, "rejected")),
            opt_count(uint(c, "warned")),
            if flag(c, "keys_at_least") { "at least " } else { "" },
            opt_count(uint(c, "keys_touched")),
            opt_count(uint(c, "keys_at_cap")),
            amount(c, "spent"),
        );
    }
    out.push_str("</tbody>\n</table>\n");
    if let Some(n) = uint(b, "responses_estimated").filter(|n| *n > 0) {
        let _ = writeln!(
            out,
            "<p class=\"muted\">Spending estimated for {} {} (no usage recorded, or cut before it).</p>",
            count(n),
            if n == 1 { "response" } else { "responses" }
        );
    }
    for line in super::report::calls_lines(b, shadow) {
        // "budget: 3 calls ...": the table above says whose.
        let line = line.strip_prefix("budget: ").unwrap_or(&line);
        let _ = writeln!(out, "<p class=\"muted\">{}.</p>", esc(line));
    }
}

/// An MCP policy's facts: calls judged, notes added, loops by tool, what
/// passed unjudged and results replay could not read.
fn mcp_facts(out: &mut String, mcp: &Value) {
    let listed = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, n)| Some(format!("{} {}", esc(k), count(as_uint(n)?))))
                    .collect()
            })
            .unwrap_or_default()
    };
    out.push_str("<dl class=\"facts\">\n");
    let _ = writeln!(
        out,
        "<dt>MCP calls judged</dt><dd>{}</dd>",
        opt_count(uint(mcp, "calls_judged"))
    );
    let _ = writeln!(
        out,
        "<dt>Notes added</dt><dd>{}</dd>",
        opt_count(uint(mcp, "notes_added"))
    );
    if let Some(tools) = mcp.get("loops_by_tool").and_then(Value::as_object) {
        for (tool, steps) in tools {
            let _ = writeln!(
                out,
                "<dt>Tool <code>{}</code></dt><dd>{}</dd>",
                esc(tool),
                listed(Some(steps)).join(", ")
            );
        }
    }
    for (key, label) in [
        ("unjudged", "Passed unjudged"),
        ("results_missing", "Results not read"),
    ] {
        let parts = listed(mcp.get(key));
        if !parts.is_empty() {
            let _ = writeln!(out, "<dt>{label}</dt><dd>{}</dd>", parts.join(", "));
        }
    }
    out.push_str("</dl>\n");
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
