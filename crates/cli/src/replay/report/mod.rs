//! What a run found, gathered request by request in bounded memory: per
//! policy, the requests seen and touched, the actions, the tokens, and the
//! loops (who, when, how many turns, which detector).

mod budget;
mod mcp;

use super::record::Recorded;
use super::simulate::{Simulation, Verdict};
pub(super) use budget::calls_lines;
use budget::{in_sweep, render_budgets, sweep_cell, BudgetTally};
use loopguard_core::config::Similarity;
use mcp::{render_mcp, McpTally};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Loops listed per policy (more are counted, not listed).
pub const MAX_LOOPS_LISTED: usize = 1000;
/// Timeline marks kept per loop.
pub const MAX_TIMELINE: usize = 500;
/// Callers remembered per policy for the `callers touched` figure.
const MAX_CALLERS: usize = 100_000;

/// Actions that change what the client or the model gets.
pub fn touches(action: &str) -> bool {
    matches!(
        action,
        "warn" | "throttle" | "nudge" | "directive" | "reject" | "note" | "block" | "error"
    )
}

/// Actions as the text report lists them, strongest first.
const SHOWN_ACTIONS: [&str; 10] = [
    "reject",
    "error",
    "block",
    "throttle",
    "directive",
    "nudge",
    "note",
    "warn",
    "allow",
    "exempt",
];

/// Tools listed per MCP policy (more are counted under `other`).
const MAX_MCP_TOOLS: usize = 200;

/// Tokens of one request: as recorded, or estimated from the body (about 4
/// bytes a token).
fn tokens(rec: &Recorded) -> (u64, bool) {
    match rec.response.as_ref().and_then(|a| a.usage) {
        Some(u) => (u.input + u.output, false),
        None => ((rec.request.body.len() as u64).div_ceil(4), true),
    }
}

#[derive(Debug, Default)]
struct LoopTally {
    /// The caller as shown (with an MCP history's session or address).
    caller: String,
    /// The caller alone, for `callers touched`.
    who: String,
    model: Option<String>,
    /// The detectors that saw it (`near`, `tool_loop (identical)`).
    kinds: Vec<String>,
    /// The first tool-loop tier, if a tool loop is among them.
    tier: Option<String>,
    /// The MCP tools looped on, for an MCP loop.
    tools: Vec<String>,
    first_ms: u64,
    last_ms: u64,
    turns: u64,
    actions: BTreeMap<&'static str, u64>,
    tokens: u64,
    tokens_estimated: bool,
    timeline: Vec<(u64, &'static str)>,
}

#[derive(Debug, Default)]
struct PolicyTally {
    id: String,
    kind: &'static str,
    requests: u64,
    requests_touched: u64,
    actions: BTreeMap<&'static str, u64>,
    tokens_touched: u64,
    tokens_estimated: bool,
    callers: BTreeSet<String>,
    callers_overflow: bool,
    loops: HashMap<String, LoopTally>,
    /// Every key a listed loop is known by (a fingerprint, a near record, a
    /// tool loop), to the key it is listed under.
    alias: HashMap<String, String>,
    /// Loops past the listing limit, counted once each.
    unlisted: std::collections::HashSet<String>,
    loops_found: u64,
    loops_not_listed: u64,
    shadow: bool,
    /// The policy reads MCP traffic.
    mcp: Option<McpTally>,
    /// The policy's spend caps.
    budget: Option<BudgetTally>,
    /// Callers a cap rejected, by their key (each one's label is worked
    /// out once).
    budget_callers: std::collections::HashSet<u64>,
}

/// One run's tally.
#[derive(Debug, Default)]
pub struct Tally {
    pub requests: u64,
    policies: Vec<PolicyTally>,
}

impl Tally {
    pub fn new(sim: &Simulation) -> Tally {
        let policies = sim
            .config()
            .policies
            .iter()
            .map(|p| PolicyTally {
                id: p.id.clone(),
                kind: match p.detection.as_ref().map(|d| &d.similarity) {
                    _ if p.mcp.is_some() => "mcp",
                    Some(Similarity::Near { .. }) => "near",
                    _ => "fingerprint",
                },
                mcp: p.mcp.as_ref().map(|_| McpTally::default()),
                budget: p.budget.as_ref().map(BudgetTally::new),
                ..PolicyTally::default()
            })
            .collect();
        Tally {
            requests: 0,
            policies,
        }
    }

    /// Add one request's verdict.
    pub fn add(&mut self, sim: &Simulation, rec: &Recorded, v: &Verdict) {
        self.requests += 1;
        let Some(id) = v.policy.as_deref() else {
            return;
        };
        let Some(p) = self.policies.iter_mut().find(|p| p.id == id) else {
            return;
        };
        p.requests += 1;
        *p.actions.entry(v.action).or_default() += 1;
        p.shadow |= v.shadow;
        let touched = touches(v.action);
        let (n, estimated) = tokens(rec);
        if let Some(m) = p.mcp.as_mut() {
            m.add(v);
        }
        p.add_budget(sim, rec, id, v, touched);
        if touched {
            p.requests_touched += 1;
            p.tokens_touched += n;
            p.tokens_estimated |= estimated;
        }
        // Which loop the request belongs to: a fingerprint (or near record)
        // that raised an event, or the tool loop it is judged part of.
        let mut keys: Vec<(String, &'static str, Option<String>)> = Vec::new();
        for e in &v.events {
            match e.get("event").and_then(Value::as_str) {
                Some("loop.detected") => {
                    if let Some(fp) = e.get("fingerprint").and_then(Value::as_str) {
                        keys.push((format!("fp {fp}"), p.kind, None));
                    }
                }
                Some("loop.tool.detected") => {}
                _ => {}
            }
        }
        if keys.is_empty() {
            if let Some(fp) = &v.fingerprint {
                let key = format!("fp {fp}");
                if p.loops.contains_key(&key) {
                    keys.push((key, p.kind, None));
                }
            }
        }
        let mut caller: Option<(String, Option<String>)> = None;
        let mut who: Option<u64> = None;
        if let Some(t) = &v.tool_loop {
            let who = *who.get_or_insert_with(|| sim.caller_key(rec, id));
            // `tier;tool=NAME;level=N`: one loop whatever level it reaches.
            let tier = t.split(';').next().unwrap_or(t).trim().to_string();
            let what: Vec<&str> = t.split(';').filter(|f| !f.starts_with("level=")).collect();
            keys.push((
                format!("tool {who:016x} {}", what.join(";")),
                "tool_loop",
                Some(tier),
            ));
        }
        let mut tool = None;
        // An MCP history is the caller's session (when the policy keys by
        // session; and its address, when nothing else tells the caller):
        // one agent stuck, and one loop in the report.
        let history = match &p.mcp {
            Some(_) => sim.mcp_history(rec, id),
            None => Default::default(),
        };
        let session = history.shown().unwrap_or_default();
        if let (Some(tier), Some(name)) = (v.mcp.field("tier"), v.mcp.field("tool")) {
            let who = *who.get_or_insert_with(|| sim.caller_key(rec, id));
            // One loop per history, tier and tool, whatever count and step
            // it reaches.
            keys.push((
                format!("mcp {who:016x} {session} {tier};{name}"),
                "mcp",
                Some(tier.to_string()),
            ));
            tool = Some(name.to_string());
        }
        // A caller stuck is one loop, whichever detectors see it and when:
        // every key a request has leads to its caller's loop.
        if !keys.is_empty() {
            let who = *who.get_or_insert_with(|| sim.caller_key(rec, id));
            keys.push((format!("caller {who:016x} {session}"), p.kind, None));
        }
        // One request, one loop: a request two detectors see (near mode and
        // a tool loop of the same conversation) joins the loop it is
        // already part of, which then shows both.
        let Some((first, ..)) = keys.first() else {
            return;
        };
        let existing = keys.iter().find_map(|(k, ..)| p.alias.get(k).cloned());
        let canonical = match existing {
            Some(c) => c,
            None => {
                if p.loops.len() >= MAX_LOOPS_LISTED {
                    // Counted (once per loop, in bounded memory), not listed.
                    if p.unlisted.len() < MAX_CALLERS && p.unlisted.insert(first.clone()) {
                        p.loops_found += 1;
                        p.loops_not_listed += 1;
                    }
                    return;
                }
                p.loops_found += 1;
                let (who, model) = caller.get_or_insert_with(|| sim.caller(rec, id)).clone();
                let join = |a: &str, b: Option<String>| match b {
                    Some(b) if a.is_empty() => b,
                    Some(b) => format!("{a}; {b}"),
                    None => a.to_string(),
                };
                let shown = join(&who, history.shown());
                // Callers known by nothing else are told apart by address.
                let who = join(&who, history.address.clone());
                p.loops.insert(
                    first.clone(),
                    LoopTally {
                        caller: shown,
                        who,
                        model,
                        first_ms: rec.at_ms,
                        ..LoopTally::default()
                    },
                );
                first.clone()
            }
        };
        let Some(l) = p.loops.get_mut(&canonical) else {
            return;
        };
        if let Some(t) = tool.filter(|t| !l.tools.contains(t)) {
            l.tools.push(t);
        }
        for (key, kind, tier) in keys {
            if key.starts_with("caller ") {
                if key != canonical {
                    p.alias.insert(key, canonical.clone());
                }
                continue;
            }
            let shown = match &tier {
                Some(t) => format!("{kind} ({t})"),
                None => kind.to_string(),
            };
            if !l.kinds.contains(&shown) {
                l.kinds.push(shown);
            }
            if l.tier.is_none() {
                l.tier = tier;
            }
            if key != canonical {
                p.alias.insert(key, canonical.clone());
            }
        }
        p.alias.insert(canonical.clone(), canonical);
        l.last_ms = rec.at_ms;
        l.turns += 1;
        *l.actions.entry(v.action).or_default() += 1;
        l.tokens += n;
        l.tokens_estimated |= estimated;
        if l.timeline.len() < MAX_TIMELINE {
            l.timeline.push((rec.at_ms, v.action));
        }
        if touched && !p.callers_overflow {
            if p.callers.len() >= MAX_CALLERS {
                p.callers_overflow = true;
            } else {
                p.callers.insert(l.who.clone());
            }
        }
    }

    /// What the report header says about MCP results replay could not
    /// read as Envoy did.
    pub fn mcp_notes(&self, config: &str) -> Vec<String> {
        let mut notes = Vec::new();
        let plural = |n: u64| if n == 1 { "" } else { "s" };
        for p in &self.policies {
            let Some(m) = &p.mcp else {
                continue;
            };
            for (why, n) in &m.results_missing {
                let said = match *why {
                    "not_recorded" => "no recorded result (no response body, or neither a body nor a content type)",
                    "incomplete" => "a recorded body that ends before the result does (cut by the recorder or at 1 MiB)",
                    _ => "loopguard's own answer recorded instead of the server's (the recording was made in front of loopguard, and this configuration forwards the call)",
                };
                notes.push(format!(
                    "{config}: policy {}: {n} forwarded MCP call{} had {said}: replay leaves {} out of the history, where Envoy added what the server answered, so loops through {} can be missed; record response bodies (see docs/cli/traffic-formats.md)",
                    p.id,
                    plural(*n),
                    if *n == 1 { "it" } else { "them" },
                    if *n == 1 { "it" } else { "them" },
                ));
            }
            if m.own_notes_removed > 0 {
                notes.push(format!(
                    "{config}: policy {}: {} recorded MCP result{} carried loopguard's own note (recorded in front of loopguard): replay took it out and read the server's result",
                    p.id,
                    m.own_notes_removed,
                    plural(m.own_notes_removed)
                ));
            }
        }
        notes
    }

    /// The figures a sweep row shows: loops found, requests and callers
    /// touched (over all policies).
    pub fn totals(&self) -> (u64, u64, u64) {
        self.policies.iter().fold((0, 0, 0), |(l, r, c), p| {
            (
                l + p.loops_found,
                r + p.requests_touched,
                c + p.callers.len() as u64,
            )
        })
    }

    /// The run as JSON (`--json`; the text and HTML forms are drawn from
    /// it).
    pub fn to_json(&self) -> Value {
        let policies: Vec<Value> = self
            .policies
            .iter()
            .map(|p| {
                let mut loops: Vec<&LoopTally> = p.loops.values().collect();
                loops.sort_by(|a, b| (a.first_ms, &a.caller).cmp(&(b.first_ms, &b.caller)));
                json!({
                    "id": p.id,
                    "shadow": p.shadow,
                    "requests": p.requests,
                    "loops_found": p.loops_found,
                    "callers_touched": p.callers.len(),
                    "callers_touched_at_least": p.callers_overflow,
                    "requests_touched": p.requests_touched,
                    "actions": p.actions,
                    "tokens": {"touched": p.tokens_touched, "estimated": p.tokens_estimated},
                    "loops": loops.iter().map(|l| json!({
                        "caller": l.caller,
                        "model": l.model,
                        "kind": l.kinds.join(" + "),
                        "tier": l.tier,
                        "tool": (!l.tools.is_empty()).then(|| l.tools.join(", ")),
                        "first_ms": l.first_ms,
                        "last_ms": l.last_ms,
                        "turns": l.turns,
                        "actions": l.actions,
                        "tokens": l.tokens,
                        "tokens_estimated": l.tokens_estimated,
                        "timeline": l.timeline.iter().map(|(at, a)| json!({"at_ms": at, "action": a})).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                    "loops_not_listed": p.loops_not_listed,
                    "budgets": p.budget.as_ref().map(BudgetTally::to_json),
                    "mcp": p.mcp.as_ref().map(|m| json!({
                        "calls_judged": m.calls,
                        "notes_added": m.notes_added,
                        "loops_by_tool": m.tools,
                        "unjudged": m.unjudged,
                        "results_missing": m.results_missing,
                        "own_notes_removed": m.own_notes_removed,
                    })),
                })
            })
            .collect();
        json!({"requests": self.requests, "policies": policies})
    }
}

/// The report as text.
pub fn render(report: &Value) -> String {
    let mut s = String::new();
    let inputs = &report["inputs"];
    let files: Vec<&str> = inputs["files"]
        .as_array()
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    s.push_str(&format!(
        "replayed {} request{} from {} ({} skipped)",
        inputs["read"],
        if inputs["read"] == 1 { "" } else { "s" },
        files.join(", "),
        inputs["skipped"]
    ));
    if let (Some(a), Some(b)) = (inputs["first_ms"].as_u64(), inputs["last_ms"].as_u64()) {
        s.push_str(&format!(
            ", {} to {}",
            loopguard_core::act::events::rfc3339(a),
            loopguard_core::act::events::rfc3339(b)
        ));
    }
    s.push('\n');
    for e in inputs["skipped_entries"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "  skipped {}: {}\n",
            e["place"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or("")
        ));
    }
    if inputs["skipped_not_listed"].as_u64().unwrap_or(0) > 0 {
        s.push_str(&format!(
            "  ... and {} more skipped entries\n",
            inputs["skipped_not_listed"]
        ));
    }
    for n in report["notes"].as_array().into_iter().flatten() {
        s.push_str(&format!("note: {}\n", n.as_str().unwrap_or("")));
    }
    if let Some(sweep) = report.get("sweep").filter(|v| !v.is_null()) {
        s.push_str(&format!(
            "\nsweep of {}\n",
            sweep["path"].as_str().unwrap_or("")
        ));
        let rows = sweep["rows"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let budgets = in_sweep(rows);
        s.push_str(&format!(
            "  {:<28} {:>12} {:>18} {:>17}{}\n",
            "config / value",
            "loops found",
            "requests touched",
            "callers touched",
            sweep_cell(budgets, None)
        ));
        for r in rows {
            s.push_str(&format!(
                "  {:<28} {:>12} {:>18} {:>17}{}\n",
                format!(
                    "{} = {}",
                    short(r["config"].as_str().unwrap_or("")),
                    r["value"]
                ),
                r["loops_found"].to_string(),
                r["requests_touched"].to_string(),
                r["callers_touched"].to_string(),
                sweep_cell(budgets, Some(r))
            ));
        }
    }
    for run in report["runs"].as_array().into_iter().flatten() {
        s.push_str(&format!("\n{}", run["config"].as_str().unwrap_or("")));
        if let Some(set) = run.get("setting").filter(|v| !v.is_null()) {
            s.push_str(&format!(
                " with {} = {}",
                set["path"].as_str().unwrap_or(""),
                set["value"]
            ));
        }
        s.push('\n');
        for p in run["policies"].as_array().into_iter().flatten() {
            render_policy(&mut s, p);
        }
    }
    s
}

fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn render_policy(s: &mut String, p: &Value) {
    let shadow = if p["shadow"] == true {
        " (shadow mode: actions were only logged)"
    } else {
        ""
    };
    s.push_str(&format!(
        "  policy {}{shadow}: {} requests, {} loop{} found, {} request{} touched, {} caller{} touched\n",
        p["id"].as_str().unwrap_or(""),
        p["requests"],
        p["loops_found"],
        if p["loops_found"] == 1 { "" } else { "s" },
        p["requests_touched"],
        if p["requests_touched"] == 1 { "" } else { "s" },
        p["callers_touched"],
        if p["callers_touched"] == 1 { "" } else { "s" },
    ));
    let actions: Vec<String> = p["actions"]
        .as_object()
        .map(|m| {
            SHOWN_ACTIONS
                .iter()
                .filter_map(|a| m.get(*a).map(|n| format!("{a} {n}")))
                .collect()
        })
        .unwrap_or_default();
    if !actions.is_empty() {
        s.push_str(&format!("    actions: {}\n", actions.join(", ")));
    }
    // MCP calls carry no tokens: an MCP policy's lines leave them out.
    let mcp = p.get("mcp").filter(|m| m.is_object());
    if let Some(m) = mcp {
        render_mcp(s, m);
    } else {
        let t = &p["tokens"];
        s.push_str(&format!(
            "    tokens in touched requests: {}{}\n",
            t["touched"],
            if t["estimated"] == true {
                " (estimated from body sizes where no usage was recorded)"
            } else {
                ""
            }
        ));
    }
    if let Some(b) = p.get("budgets").filter(|b| b.is_object()) {
        render_budgets(s, b, p["shadow"] == true);
    }
    for l in p["loops"].as_array().into_iter().flatten() {
        let kind = l["kind"].as_str().unwrap_or("");
        let actions: Vec<String> = l["actions"]
            .as_object()
            .map(|m| m.iter().map(|(a, n)| format!("{a} {n}")).collect())
            .unwrap_or_default();
        let span = format!(
            "{} turn{} from {} to {}: {}",
            l["turns"],
            if l["turns"] == 1 { "" } else { "s" },
            l["first_ms"]
                .as_u64()
                .map(loopguard_core::act::events::rfc3339)
                .unwrap_or_default(),
            l["last_ms"]
                .as_u64()
                .map(loopguard_core::act::events::rfc3339)
                .unwrap_or_default(),
            actions.join(", "),
        );
        let caller = l["caller"].as_str().unwrap_or("");
        if mcp.is_some() {
            let tool = l["tool"]
                .as_str()
                .map(|t| format!(" on tool {t}"))
                .unwrap_or_default();
            s.push_str(&format!("    loop: {caller}: {kind}{tool}, {span}\n"));
            continue;
        }
        s.push_str(&format!(
            "    loop: {caller} model {}: {kind}, {span}; {} tokens{}\n",
            l["model"].as_str().unwrap_or("-"),
            l["tokens"],
            if l["tokens_estimated"] == true {
                " (estimate)"
            } else {
                ""
            }
        ));
    }
    if p["loops_not_listed"].as_u64().unwrap_or(0) > 0 {
        s.push_str(&format!(
            "    ... and {} more loops not listed\n",
            p["loops_not_listed"]
        ));
    }
}
