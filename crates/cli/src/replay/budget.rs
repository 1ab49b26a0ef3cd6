//! What replay records about a policy's spend caps (`budget`): what the
//! caps did to each request, read from the engine's effects (the budget
//! counters, whose names carry the policy and the cap; the `budget.*`
//! events, which carry the key; the `x-loopguard-budget` header), and what
//! the budget keys spent over the replay, with the policy's calls that were
//! estimated, unpriced, priced at a reported cost, or tunnels.

use super::record::{Answer, Usage};
use super::simulate::{rank, Verdict};
use loopguard_core::config::Config;
use loopguard_core::flow::Effect;
use loopguard_core::metrics::budget as budget_names;
use loopguard_core::metrics::Kind;
use serde_json::Value;
use std::collections::HashMap;

/// The header that carries a cap's refusal (on the 429) or warning (on
/// the answer) to the client.
pub const HEADER: &str = "x-loopguard-budget";

/// A request's part of a verdict under a policy with a `budget`, read from
/// what the engine counted and logged (the budget counters' names carry
/// the policy and the cap; the events carry the key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetVerdict {
    /// The cap that refused the request (the one that frees last;
    /// `loopguard_budget_rejected_total`), or in shadow mode the first
    /// that would have (`loopguard_budget_shadow_total`).
    pub rejected: Option<String>,
    /// Shadow mode: every cap the request was at (it was forwarded).
    pub shadow: Vec<String>,
    /// The caps whose warning the request carried (at or over `warn_at`,
    /// or at a cap with `action: warn`; `loopguard_budget_warned_total`).
    pub warned: Vec<String>,
    /// Keys at a cap (`budget.exceeded`) and warned (`budget.warning`), as
    /// (cap, key tag): the events are logged once per key and cap a minute,
    /// so a key shows on its first request there, not on every one.
    pub exceeded_keys: Vec<(String, String)>,
    pub warned_keys: Vec<(String, String)>,
    /// The `x-loopguard-budget` header the client got (on the 429, or the
    /// warning on the answer).
    pub header: Option<String>,
}

/// What a budget counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BudgetCount {
    Rejected,
    Warned,
    Shadow,
}

/// What a per-policy budget counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PolicyCount {
    /// Responses whose spending was estimated.
    Estimated,
    /// Calls under a dollar cap whose model no price names.
    Unpriced,
    /// Responses priced at the cost the upstream reported.
    ReportedCost,
    /// Upgrades and CONNECT tunnels, charged as one call when they open.
    Tunnels,
}

/// The budget counters of a configuration, by name: what each counts, for
/// which policy and cap.
#[derive(Debug, Default)]
pub struct BudgetNames {
    counts: HashMap<String, (BudgetCount, String)>,
    /// `loopguard.budget_spend_total.policy.P.budget.B.key.` (any key
    /// after it), with the policy and cap.
    spend: Vec<(String, String, String)>,
    /// The per-policy counters (`loopguard.budget_estimated_total.policy.P`
    /// and the like): what each counts, and the policy.
    per_policy: HashMap<String, (PolicyCount, String)>,
}

impl BudgetNames {
    pub(super) fn of(config: &Config) -> BudgetNames {
        let mut n = BudgetNames::default();
        for p in &config.policies {
            let Some(b) = &p.budget else {
                continue;
            };
            for l in &b.limits {
                for (kind, counter) in [
                    (BudgetCount::Rejected, "rejected"),
                    (BudgetCount::Warned, "warned"),
                    (BudgetCount::Shadow, "shadow"),
                ] {
                    let name = budget_names::limit_counter(counter, &p.id, &l.name);
                    n.counts.insert(name, (kind, l.name.clone()));
                }
                n.spend.push((
                    budget_names::spend(&p.id, &l.name, ""),
                    p.id.clone(),
                    l.name.clone(),
                ));
            }
            for (kind, counter) in [
                (PolicyCount::Estimated, "estimated"),
                (PolicyCount::Unpriced, "unpriced"),
                (PolicyCount::ReportedCost, "reported_cost"),
                (PolicyCount::Tunnels, "tunnels"),
            ] {
                let name = budget_names::policy_counter(counter, &p.id);
                n.per_policy.insert(name, (kind, p.id.clone()));
            }
        }
        n
    }
}

/// What every budget key of a policy's caps spent over the replay, in the
/// cap's unit (micro-dollars, tokens, calls), and per policy the responses
/// whose spending was estimated, the calls to unpriced models, those
/// priced at the cost the upstream reported, and the tunnels opened.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BudgetSpend {
    /// (policy, cap) to what was spent.
    pub spent: HashMap<(String, String), u64>,
    /// Policy to responses estimated (`loopguard_budget_estimated_total`).
    pub estimated: HashMap<String, u64>,
    /// Policy to calls whose model no price names
    /// (`loopguard_budget_unpriced_total`).
    pub unpriced: HashMap<String, u64>,
    /// Policy to responses priced at the cost the upstream reported
    /// (`loopguard_budget_reported_cost_total`).
    pub reported_cost: HashMap<String, u64>,
    /// Policy to upgrades and CONNECT tunnels opened
    /// (`loopguard_budget_tunnels_total`).
    pub tunnels: HashMap<String, u64>,
}

impl BudgetVerdict {
    /// The budget header among a local reply's headers, if it carries one.
    pub(super) fn reply_headers(&mut self, headers: &[(&'static str, String)]) {
        if let Some((_, h)) = headers.iter().find(|(k, _)| *k == HEADER) {
            self.header = Some(h.clone());
        }
    }

    /// A logged event: `budget.exceeded` and `budget.warning` name a key
    /// at or warned by a cap.
    pub(super) fn event(&mut self, name: &str, event: &Value) {
        if matches!(name, "budget.exceeded" | "budget.warning") {
            let field = |k: &str| event.get(k).and_then(Value::as_str);
            if let (Some(cap), Some(key)) = (field("budget"), field("key")) {
                let pair = (cap.to_string(), key.to_string());
                if name == "budget.exceeded" {
                    self.exceeded_keys.push(pair);
                } else {
                    self.warned_keys.push(pair);
                }
            }
        }
    }
}

impl BudgetNames {
    /// Read `e` into the verdict if it counts a budget counter; `false`
    /// when it does not.
    pub(super) fn read(&self, e: &Effect, defs: &[(String, Kind)], v: &mut Verdict) -> bool {
        let Some((kind, cap)) = counted(e, defs).and_then(|(name, _)| self.counts.get(name)) else {
            return false;
        };
        let b = &mut v.budget;
        match kind {
            BudgetCount::Rejected => b.rejected = Some(cap.clone()),
            BudgetCount::Warned => b.warned.push(cap.clone()),
            BudgetCount::Shadow => {
                // The cap that frees last comes first, as the one an
                // enforced policy's 429 names; the action is what
                // would have been done, as for a loop in shadow mode.
                b.rejected.get_or_insert_with(|| cap.clone());
                b.shadow.push(cap.clone());
                v.shadow = true;
                if rank("reject") > rank(v.action) {
                    v.action = "reject";
                }
            }
        }
        true
    }
}

/// A recording that kept the usage and not the body (JSON Lines'
/// `response.usage`): the body Envoy read reported it, so the response
/// path reads it from one that says the same (not under an MCP policy).
pub(super) fn with_reported_usage(answer: Option<&Answer>, mcp: bool) -> Option<Answer> {
    match answer {
        Some(a) if !mcp && a.body.is_none() => a.usage.as_ref().map(|u| Answer {
            content_type: Some("application/json".to_string()),
            body: Some(usage_body(u)),
            body_cut: false,
            ..a.clone()
        }),
        _ => None,
    }
}

/// A counter's name and what is added to it: a named counter's, or a
/// defined one's (by its id).
fn counted<'a>(e: &'a Effect, defs: &'a [(String, Kind)]) -> Option<(&'a str, i64)> {
    match e {
        Effect::CountNamed(name, by) => Some((name.as_str(), *by)),
        Effect::Count(id, by) => defs.get(id.0 as usize).map(|(n, _)| (n.as_str(), *by)),
        _ => None,
    }
}

/// Add what `out` says budget keys spent (and the per-policy counts:
/// responses estimated, unpriced calls, reported costs, tunnels).
pub(super) fn account(
    out: &[Effect],
    defs: &[(String, Kind)],
    n: &BudgetNames,
    spend: &mut BudgetSpend,
) {
    for e in out {
        let Some((name, by)) = counted(e, defs) else {
            continue;
        };
        let by = u64::try_from(by).unwrap_or(0);
        if let Some((_, policy, cap)) = n
            .spend
            .iter()
            .find(|(prefix, ..)| name.starts_with(prefix.as_str()))
        {
            *spend
                .spent
                .entry((policy.clone(), cap.clone()))
                .or_default() += by;
        } else if let Some((kind, policy)) = n.per_policy.get(name) {
            let counts = match kind {
                PolicyCount::Estimated => &mut spend.estimated,
                PolicyCount::Unpriced => &mut spend.unpriced,
                PolicyCount::ReportedCost => &mut spend.reported_cost,
                PolicyCount::Tunnels => &mut spend.tunnels,
            };
            *counts.entry(policy.clone()).or_default() += by;
        }
    }
}

/// A JSON response body whose `usage` the filter's reader reads as `u`:
/// Anthropic's form, which carries every count (cache reads and writes
/// outside `input_tokens`), or OpenAI's when the counts do not add up to
/// it; a cost the upstream reported as OpenRouter's `usage.cost`, in
/// dollars.
pub(super) fn usage_body(u: &Usage) -> Vec<u8> {
    let cached = u.cached_input.saturating_add(u.cache_write);
    let mut usage = if cached <= u.input {
        serde_json::json!({
            "input_tokens": u.input - cached,
            "cache_read_input_tokens": u.cached_input,
            "cache_creation_input_tokens": u.cache_write,
            "output_tokens": u.output,
            "output_tokens_details": {"reasoning_tokens": u.reasoning},
        })
    } else {
        serde_json::json!({
            "prompt_tokens": u.input,
            "completion_tokens": u.output,
            "prompt_tokens_details": {"cached_tokens": u.cached_input},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning},
        })
    };
    if let (Some(cost), Some(o)) = (u.cost_microusd, usage.as_object_mut()) {
        // Micro-dollars are whole: the dollars read back to the same.
        #[allow(clippy::cast_precision_loss)]
        o.insert("cost".to_string(), serde_json::json!(cost as f64 / 1e6));
    }
    serde_json::json!({ "usage": usage })
        .to_string()
        .into_bytes()
}
