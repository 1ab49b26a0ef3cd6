//! The budget counters. What each key spent is a named counter, defined
//! by the host when first counted: its `key` label values are bounded (at
//! most [`crate::metrics::MAX_CALLER_SERIES`] per budget and worker, the
//! rest counted as `other`). The others have labels from the configuration
//! only (policy ids, budget names) and are defined with it
//! ([`BudgetIds`]), so counting them costs an id, not a name.

use crate::config::Policy;
use crate::metrics::{Kind, MetricId};

/// The ids of one policy's budget counters: per policy, then per budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetIds {
    first: u32,
    limits: u32,
}

/// Per-policy counters, then per-budget ones.
const PER_POLICY: u32 = 6;
const PER_LIMIT: u32 = 4;

impl BudgetIds {
    /// Define a policy's budget counters at the end of `defs` (`None`: it
    /// has no budget).
    pub fn define(p: &Policy, defs: &mut Vec<(String, Kind)>) -> Option<BudgetIds> {
        let b = p.budget.as_ref()?;
        let first = u32::try_from(defs.len()).ok()?;
        for name in [
            estimated(&p.id),
            unrecorded(&p.id),
            evicted(&p.id),
            unpriced(&p.id),
            tunnels(&p.id),
            reported_cost(&p.id),
        ] {
            defs.push((name, Kind::Counter));
        }
        for l in &b.limits {
            for name in [
                rejected(&p.id, &l.name),
                warned(&p.id, &l.name),
                shadow(&p.id, &l.name),
                near_cap(&p.id, &l.name),
            ] {
                defs.push((name, Kind::Counter));
            }
        }
        Some(BudgetIds {
            first,
            limits: u32::try_from(b.limits.len()).ok()?,
        })
    }

    fn limit(&self, limit: usize, offset: u32) -> Option<MetricId> {
        let l = u32::try_from(limit).ok().filter(|l| *l < self.limits)?;
        Some(MetricId(self.first + PER_POLICY + l * PER_LIMIT + offset))
    }

    pub fn estimated(&self) -> MetricId {
        MetricId(self.first)
    }
    pub fn unrecorded(&self) -> MetricId {
        MetricId(self.first + 1)
    }
    pub fn evicted(&self) -> MetricId {
        MetricId(self.first + 2)
    }
    pub fn unpriced(&self) -> MetricId {
        MetricId(self.first + 3)
    }
    pub fn tunnels(&self) -> MetricId {
        MetricId(self.first + 4)
    }
    pub fn reported_cost(&self) -> MetricId {
        MetricId(self.first + 5)
    }
    pub fn rejected(&self, limit: usize) -> Option<MetricId> {
        self.limit(limit, 0)
    }
    pub fn warned(&self, limit: usize) -> Option<MetricId> {
        self.limit(limit, 1)
    }
    pub fn shadow(&self, limit: usize) -> Option<MetricId> {
        self.limit(limit, 2)
    }
    pub fn near_cap(&self, limit: usize) -> Option<MetricId> {
        self.limit(limit, 3)
    }
}

/// What a key spent, in its budget's unit (micro-dollars, tokens, calls).
pub fn spend(policy_id: &str, budget: &str, key: &str) -> String {
    format!("loopguard.budget_spend_total.policy.{policy_id}.budget.{budget}.key.{key}")
}

/// Requests refused at a cap.
pub fn rejected(policy_id: &str, budget: &str) -> String {
    format!("loopguard.budget_rejected_total.policy.{policy_id}.budget.{budget}")
}

/// Requests that carried the warning (at or over `warn_at`, or at a cap
/// with `action: warn`).
pub fn warned(policy_id: &str, budget: &str) -> String {
    format!("loopguard.budget_warned_total.policy.{policy_id}.budget.{budget}")
}

/// Rejections shadow mode did not make.
pub fn shadow(policy_id: &str, budget: &str) -> String {
    format!("loopguard.budget_shadow_total.policy.{policy_id}.budget.{budget}")
}

/// Requests whose key had spent 80% of a cap or more.
pub fn near_cap(policy_id: &str, budget: &str) -> String {
    format!("loopguard.budget_near_cap_total.policy.{policy_id}.budget.{budget}")
}

/// Responses whose spending was estimated from the bytes seen.
pub fn estimated(policy_id: &str) -> String {
    format!("loopguard.budget_estimated_total.policy.{policy_id}")
}

/// Budget spending that could not be recorded (the table or the shared
/// store failed).
pub fn unrecorded(policy_id: &str) -> String {
    format!("loopguard.budget_unrecorded_total.policy.{policy_id}")
}

/// Keys that gave their place in a full table while they still had
/// spending in their window.
pub fn evicted(policy_id: &str) -> String {
    format!("loopguard.budget_evicted_total.policy.{policy_id}")
}

/// Calls under a dollar cap whose model no price names (charged as
/// `budget.unpriced` says).
pub fn unpriced(policy_id: &str) -> String {
    format!("loopguard.budget_unpriced_total.policy.{policy_id}")
}

/// Upgrades and CONNECT tunnels under a budget: checked and counted as a
/// call when they open, but what passes through them is not read.
pub fn tunnels(policy_id: &str) -> String {
    format!("loopguard.budget_tunnels_total.policy.{policy_id}")
}

/// Responses whose cost the upstream reported (OpenRouter's `usage.cost`,
/// LiteLLM's `x-litellm-response-cost`), used instead of the price list.
pub fn reported_cost(policy_id: &str) -> String {
    format!("loopguard.budget_reported_cost_total.policy.{policy_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::metrics::Registry;
    use serde_json::json;

    #[test]
    fn every_id_names_its_budget_counter() {
        let cfg = Config::from_value(&json!({"policies": [
            {"id": "a", "spec": {"selector": {}, "tool_loops": {"enabled": true}}},
            {"id": "b", "spec": {"selector": {}, "budget": {"limits": [
                {"name": "x", "per": "caller", "window_seconds": 60, "calls": 1},
                {"name": "y", "per": "session", "window_seconds": 60, "calls": 1}]}}}]}))
        .unwrap();
        let r = Registry::new(&cfg);
        assert!(r.budget(0).is_none());
        let ids = r.budget(1).unwrap();
        let name = |id: Option<MetricId>| r.defs()[id.unwrap().0 as usize].0.clone();
        assert_eq!(name(Some(ids.estimated())), estimated("b"));
        assert_eq!(name(Some(ids.unrecorded())), unrecorded("b"));
        assert_eq!(name(Some(ids.evicted())), evicted("b"));
        assert_eq!(name(Some(ids.unpriced())), unpriced("b"));
        assert_eq!(name(Some(ids.tunnels())), tunnels("b"));
        assert_eq!(name(Some(ids.reported_cost())), reported_cost("b"));
        assert_eq!(name(ids.rejected(0)), rejected("b", "x"));
        assert_eq!(name(ids.warned(1)), warned("b", "y"));
        assert_eq!(name(ids.shadow(1)), shadow("b", "y"));
        assert_eq!(name(ids.near_cap(0)), near_cap("b", "x"));
        assert_eq!(ids.rejected(2), None);
        assert_eq!(
            r.defs().len() as u32,
            ids.first + PER_POLICY + 2 * PER_LIMIT
        );
    }
}
