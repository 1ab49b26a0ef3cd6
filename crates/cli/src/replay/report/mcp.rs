//! What an MCP policy saw over a replay: calls judged, notes added, loops
//! by tool and step, what passed unjudged, results replay could not read.

use super::MAX_MCP_TOOLS;
use crate::replay::simulate::Verdict;
use serde_json::Value;
use std::collections::BTreeMap;

/// What an MCP policy saw.
#[derive(Debug, Default)]
pub(super) struct McpTally {
    /// `tools/call` requests judged.
    pub(super) calls: u64,
    /// Requests and results passed unjudged, by reason.
    pub(super) unjudged: BTreeMap<String, u64>,
    /// Loops acted on, by tool and step.
    pub(super) tools: BTreeMap<String, BTreeMap<String, u64>>,
    /// Notes inserted into real results.
    pub(super) notes_added: u64,
    /// Forwarded calls whose result replay could not read as Envoy did,
    /// by why.
    pub(super) results_missing: BTreeMap<&'static str, u64>,
    /// Recorded results that carried loopguard's own note.
    pub(super) own_notes_removed: u64,
}

/// An MCP policy's line: calls judged, notes, loops by tool, what passed
/// unjudged.
pub(super) fn render_mcp(s: &mut String, m: &Value) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let mut parts = vec![format!(
        "{} tools/call judged, {} note{} added",
        n(&m["calls_judged"]),
        n(&m["notes_added"]),
        if n(&m["notes_added"]) == 1 { "" } else { "s" }
    )];
    let listed = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|o| o.iter().map(|(k, c)| format!("{k} {c}")).collect())
            .unwrap_or_default()
    };
    for (tool, steps) in m["loops_by_tool"].as_object().into_iter().flatten() {
        parts.push(format!("tool {tool}: {}", listed(steps).join(", ")));
    }
    let unjudged = listed(&m["unjudged"]);
    if !unjudged.is_empty() {
        parts.push(format!("unjudged: {}", unjudged.join(", ")));
    }
    let missing = listed(&m["results_missing"]);
    if !missing.is_empty() {
        parts.push(format!("results not read: {}", missing.join(", ")));
    }
    s.push_str(&format!("    mcp: {}\n", parts.join("; ")));
}

impl McpTally {
    pub(super) fn add(&mut self, v: &Verdict) {
        let m = &v.mcp;
        self.calls += u64::from(m.judged);
        self.notes_added += u64::from(m.note_added);
        self.own_notes_removed += u64::from(m.own_note_removed);
        if let Some(why) = &m.unjudged {
            *self.unjudged.entry(why.clone()).or_default() += 1;
        }
        if let Some(why) = m.result_missing {
            *self.results_missing.entry(why).or_default() += 1;
        }
        // A loop's step as the client got it: a note only when one was
        // inserted (a note planned for a result that changed is none).
        let step = match (m.field("step"), m.field("tool")) {
            (Some("note"), Some(_)) if !m.note_added && !v.shadow => None,
            (Some(step), Some(tool)) => Some((step, tool)),
            _ => None,
        };
        if let Some((step, tool)) = step {
            let tool = if self.tools.len() < MAX_MCP_TOOLS || self.tools.contains_key(tool) {
                tool
            } else {
                "other"
            };
            *self
                .tools
                .entry(tool.to_string())
                .or_default()
                .entry(step.to_string())
                .or_default() += 1;
        }
    }
}
