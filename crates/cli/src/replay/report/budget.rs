//! What a policy's spend caps did over a replay: per cap, the requests it
//! rejected (or, in shadow mode, would have) and warned, the keys it
//! touched, when it first rejected, and what its keys spent; per policy,
//! the responses estimated, the calls to unpriced models, those priced at
//! the cost the upstream reported, and the tunnels opened.

use super::{PolicyTally, Tally, MAX_CALLERS};
use crate::replay::budget::{BudgetSpend, BudgetVerdict};
use crate::replay::record::Recorded;
use crate::replay::simulate::{Simulation, Verdict};
use loopguard_core::config::budget::{Budget, BudgetAction, Cap, Unpriced};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// Keys remembered per cap for the `keys touched` figures.
const MAX_KEYS: usize = 100_000;

/// One cap's tally.
#[derive(Debug)]
pub(super) struct CapTally {
    name: String,
    per: &'static str,
    cap: Cap,
    window_seconds: u64,
    rejected: u64,
    warned: u64,
    /// Keys warned or at the cap, and those at the cap.
    touched: BTreeSet<String>,
    at_cap: BTreeSet<String>,
    keys_overflow: bool,
    first_rejected_ms: Option<u64>,
    /// What its keys spent, in its unit.
    spent: u64,
}

/// A policy's caps.
#[derive(Debug)]
pub(super) struct BudgetTally {
    action: BudgetAction,
    /// What its dollar caps do with a model no price names (`None`: no
    /// dollar cap).
    unpriced_policy: Option<Unpriced>,
    caps: Vec<CapTally>,
    /// Responses whose spending was estimated.
    estimated: u64,
    /// Calls whose model no price names (charged, or refused, as
    /// `budget.unpriced` says).
    unpriced: u64,
    /// Responses priced at the cost the upstream reported.
    reported_cost: u64,
    /// Upgrades and CONNECT tunnels, charged as one call each as they
    /// opened.
    tunnels: u64,
}

impl BudgetTally {
    pub(super) fn new(b: &Budget) -> BudgetTally {
        BudgetTally {
            action: b.action,
            unpriced_policy: b.has_usd().then_some(b.unpriced),
            caps: b
                .limits
                .iter()
                .map(|l| CapTally {
                    name: l.name.clone(),
                    per: l.per.as_str(),
                    cap: l.cap,
                    window_seconds: l.window_ms / 1000,
                    rejected: 0,
                    warned: 0,
                    touched: BTreeSet::new(),
                    at_cap: BTreeSet::new(),
                    keys_overflow: false,
                    first_rejected_ms: None,
                    spent: 0,
                })
                .collect(),
            estimated: 0,
            unpriced: 0,
            reported_cost: 0,
            tunnels: 0,
        }
    }

    fn cap(&mut self, name: &str) -> Option<&mut CapTally> {
        self.caps.iter_mut().find(|c| c.name == name)
    }

    pub(super) fn add(&mut self, at_ms: u64, v: &BudgetVerdict) {
        if let Some(c) = v.rejected.as_deref().and_then(|n| self.cap(n)) {
            c.rejected += 1;
            c.first_rejected_ms.get_or_insert(at_ms);
        }
        for name in &v.warned {
            if let Some(c) = self.cap(name) {
                c.warned += 1;
            }
        }
        for (keys, at_cap) in [(&v.exceeded_keys, true), (&v.warned_keys, false)] {
            for (name, key) in keys {
                let Some(c) = self.cap(name) else {
                    continue;
                };
                if c.touched.len() >= MAX_KEYS {
                    c.keys_overflow = true;
                    continue;
                }
                c.touched.insert(key.clone());
                if at_cap {
                    c.at_cap.insert(key.clone());
                }
            }
        }
    }

    /// What the simulation counted of the keys' spending.
    pub(super) fn spending(&mut self, policy: &str, spend: &BudgetSpend) {
        for c in &mut self.caps {
            c.spent = spend
                .spent
                .get(&(policy.to_string(), c.name.clone()))
                .copied()
                .unwrap_or(0);
        }
        let of = |counts: &std::collections::HashMap<String, u64>| {
            counts.get(policy).copied().unwrap_or(0)
        };
        self.estimated = of(&spend.estimated);
        self.unpriced = of(&spend.unpriced);
        self.reported_cost = of(&spend.reported_cost);
        self.tunnels = of(&spend.tunnels);
    }

    /// Requests rejected (or that would have been) over all caps.
    pub(super) fn rejected(&self) -> u64 {
        self.caps.iter().map(|c| c.rejected).sum()
    }

    pub(super) fn estimated(&self) -> u64 {
        self.estimated
    }

    pub(super) fn to_json(&self) -> Value {
        json!({
            "caps": self.caps.iter().map(|c| json!({
                "name": c.name,
                "per": c.per,
                "unit": c.cap.unit(),
                "cap": c.cap.show(c.cap.amount()),
                "window_seconds": c.window_seconds,
                "action": match self.action {
                    BudgetAction::Reject => "reject",
                    BudgetAction::Warn => "warn",
                },
                "rejected": c.rejected,
                "warned": c.warned,
                "keys_touched": c.touched.len(),
                "keys_at_cap": c.at_cap.len(),
                "keys_at_least": c.keys_overflow,
                "first_rejected_ms": c.first_rejected_ms,
                "spent": c.cap.show(c.spent),
            })).collect::<Vec<_>>(),
            "responses_estimated": self.estimated,
            "unpriced": self.unpriced_policy.map(Unpriced::as_str),
            "calls_unpriced": self.unpriced,
            "calls_reported_cost": self.reported_cost,
            "tunnels": self.tunnels,
        })
    }
}

impl PolicyTally {
    /// Add one request's part under the policy's caps.
    pub(super) fn add_budget(
        &mut self,
        sim: &Simulation,
        rec: &Recorded,
        id: &str,
        v: &Verdict,
        touched: bool,
    ) {
        let Some(b) = self.budget.as_mut() else {
            return;
        };
        b.add(rec.at_ms, &v.budget);
        // A request a cap refused touched its caller, loop or not.
        if v.budget.rejected.is_some() && touched && !self.callers_overflow {
            let key = sim.caller_key(rec, id);
            if self.budget_callers.len() < MAX_CALLERS && self.budget_callers.insert(key) {
                if self.callers.len() >= MAX_CALLERS {
                    self.callers_overflow = true;
                } else {
                    self.callers.insert(sim.caller(rec, id).0);
                }
            }
        }
    }
}

impl Tally {
    /// The replay is over: what the budget keys spent (throttled requests'
    /// answers are read at the end).
    pub fn finish(&mut self, sim: &Simulation) {
        let spend: &BudgetSpend = sim.budget_spend();
        for p in &mut self.policies {
            if let Some(b) = p.budget.as_mut() {
                b.spending(&p.id, spend);
            }
        }
    }

    /// What the report header says about spending replay estimated.
    pub fn budget_notes(&self, config: &str) -> Vec<String> {
        self.policies
            .iter()
            .filter_map(|p| {
                let n = p.budget.as_ref()?.estimated();
                (n > 0).then(|| format!(
                    "{config}: policy {}: {n} response{} had no usage recorded (no usage and no body, or a body cut before it): {} spending was estimated from what was recorded, as the filter estimates a response it cannot read (input about the request body's bytes / 4; output about the recorded response body's bytes / 4, and at least the request's output limit: its max_tokens or the like, 4096 for an LLM call that sets none), where Envoy read what the provider reported, so caps in tokens or dollars count other amounts than they did; record usage or response bodies (see docs/cli/traffic-formats.md)",
                    p.id,
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "its" } else { "their" },
                ))
            })
            .collect()
    }

    /// Requests the budgets rejected (or, in shadow mode, would have),
    /// over all policies; `None` when no policy has a budget.
    pub fn budget_rejected(&self) -> Option<u64> {
        let caps: Vec<u64> = self
            .policies
            .iter()
            .filter_map(|p| p.budget.as_ref().map(BudgetTally::rejected))
            .collect();
        (!caps.is_empty()).then(|| caps.iter().sum())
    }
}

/// The sweep table shows budget rejections when a swept configuration
/// has a budget.
pub(super) fn in_sweep(rows: &[Value]) -> bool {
    rows.iter().any(|r| !r["budget_rejected"].is_null())
}

/// The sweep table's budget column (`shown`: see [`in_sweep`]): its
/// heading, or a row's rejections.
pub(super) fn sweep_cell(shown: bool, row: Option<&Value>) -> String {
    match row {
        _ if !shown => String::new(),
        None => format!(" {:>19}", "budget rejections"),
        Some(r) => format!(" {:>19}", r["budget_rejected"].as_u64().unwrap_or(0)),
    }
}

/// An amount in a cap's unit as the text shows it: `$5.00`, `1200 tokens`,
/// `30 calls`.
fn amount(unit: &str, shown: &str) -> String {
    match unit {
        "usd" => format!("${shown}"),
        other => format!("{shown} {other}"),
    }
}

/// A policy's caps, one line each, as text.
pub(super) fn render_budgets(s: &mut String, b: &Value, shadow: bool) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let plural = |k: u64, one: &str, many: &str| {
        if k == 1 {
            one.to_string()
        } else {
            many.to_string()
        }
    };
    for c in b["caps"].as_array().into_iter().flatten() {
        let unit = c["unit"].as_str().unwrap_or("");
        let rejected = n(&c["rejected"]);
        let mut rejections = format!(
            "{rejected} {} {}",
            plural(rejected, "request", "requests"),
            if shadow {
                "would have been rejected"
            } else {
                "rejected"
            }
        );
        if let Some(first) = c["first_rejected_ms"].as_u64() {
            rejections.push_str(&format!(
                " (the first at {})",
                loopguard_core::act::events::rfc3339(first)
            ));
        }
        let touched = n(&c["keys_touched"]);
        s.push_str(&format!(
            "    budget {}: {} per {} in {} s ({}): {rejections}, {} warned; {}{touched} {} touched, {} at the cap; {} spent\n",
            c["name"].as_str().unwrap_or(""),
            amount(unit, c["cap"].as_str().unwrap_or("")),
            c["per"].as_str().unwrap_or(""),
            c["window_seconds"],
            c["action"].as_str().unwrap_or(""),
            n(&c["warned"]),
            if c["keys_at_least"] == true { "at least " } else { "" },
            plural(touched, "key", "keys"),
            n(&c["keys_at_cap"]),
            amount(unit, c["spent"].as_str().unwrap_or("")),
        ));
    }
    let estimated = n(&b["responses_estimated"]);
    if estimated > 0 {
        s.push_str(&format!(
            "    budget spending estimated for {estimated} {} (no usage recorded, or cut before it)\n",
            plural(estimated, "response", "responses")
        ));
    }
    for line in calls_lines(b, shadow) {
        s.push_str(&format!("    {line}\n"));
    }
}

/// What a policy's budget counted beside its caps, one sentence each
/// (none when it is 0): calls to unpriced models, responses priced at the
/// cost the upstream reported, tunnels opened (`shadow`: the policy is in
/// shadow mode). The text and the page say the same.
pub(in crate::replay) fn calls_lines(b: &Value, shadow: bool) -> Vec<String> {
    let n = |k: &str| b[k].as_u64().unwrap_or(0);
    let calls = |k: u64| if k == 1 { "call" } else { "calls" };
    let mut lines = Vec::new();
    let unpriced = n("calls_unpriced");
    if unpriced > 0 {
        let what = match b["unpriced"].as_str() {
            Some("reject") if shadow => "would have been refused; charged as max",
            Some("reject") => "refused",
            Some("ignore") => "charged no dollars",
            _ => "charged at the highest price of their provider",
        };
        lines.push(format!(
            "budget: {unpriced} {} to a model no price names (unpriced: {}: {what})",
            calls(unpriced),
            b["unpriced"].as_str().unwrap_or("max"),
        ));
    }
    let reported = n("calls_reported_cost");
    if reported > 0 {
        lines.push(format!(
            "budget: {reported} {} priced at the cost the upstream reported",
            calls(reported)
        ));
    }
    let tunnels = n("tunnels");
    if tunnels > 0 {
        lines.push(format!(
            "budget: {tunnels} {} opened, each charged as one call (what passed through is not read)",
            if tunnels == 1 { "tunnel" } else { "tunnels" }
        ));
    }
    lines
}
