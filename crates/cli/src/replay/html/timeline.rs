//! A looping caller's block on the page: its facts and its SVG timeline strip.

use super::format::{clock, count, duration, utc, utc_ms};
use super::{array, as_uint, esc, field, flag, show, uint};
use serde_json::Value;
use std::fmt::Write as _;

/// Width of a loop's timeline strip (SVG user units).
pub(super) const STRIP_W: f64 = 760.0;
/// Margin left and right of the strip, so marks at the ends stay visible.
const STRIP_PAD: f64 = 12.0;
/// Width of one mark on a timeline.
pub(super) const MARK_W: f64 = 4.0;

/// The colours of a timeline's marks.
/// (`mcp`: with an MCP policy's note, block and error).
pub(super) fn legend(out: &mut String, mcp: bool) {
    out.push_str("<p class=\"legend\">Timeline marks, one per request: ");
    let mut actions = vec!["allow", "warn", "throttle", "nudge", "directive", "reject"];
    if mcp {
        actions.extend(["note", "block", "error"]);
    }
    for action in actions {
        let _ = write!(
            out,
            "<span class=\"key\"><span class=\"swatch sw-{action}\"></span>{action}</span>"
        );
    }
    out.push_str("</p>\n");
}

pub(super) fn loop_block(out: &mut String, lp: &Value) {
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
    if let Some(tool) = field(lp, "tool") {
        facts.push(format!("tool <code>{}</code>", show(tool)));
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
pub(super) fn action_class(action: &str) -> &'static str {
    match action {
        "allow" => "allow",
        "warn" => "warn",
        "throttle" => "throttle",
        "nudge" => "nudge",
        "directive" => "directive",
        "reject" => "reject",
        "note" => "note",
        "block" => "block",
        "error" => "error",
        _ => "other",
    }
}

/// Drawing order: the stronger the action, the later (on top).
fn severity(action: &str) -> u8 {
    match action {
        "allow" => 0,
        "note" => 2,
        "nudge" => 2,
        "directive" => 3,
        "warn" => 4,
        "throttle" => 5,
        "block" => 6,
        "error" => 6,
        "reject" => 6,
        _ => 1,
    }
}
