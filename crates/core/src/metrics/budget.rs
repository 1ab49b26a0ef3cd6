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

/// A policy's own counters, in id order ([`policy_counter`]):
/// - `estimated`: responses whose spending was estimated from the bytes
///   seen;
/// - `unrecorded`: budget spending that could not be recorded (the table or
///   the shared store failed);
/// - `evicted`: keys that gave their place in a full table while they
///   still had spending in their window;
/// - `unpriced`: calls under a dollar cap whose model no price names
///   (charged as `budget.unpriced` says);
/// - `tunnels`: upgrades and CONNECT tunnels under a budget: checked and
///   counted as a call when they open, but what passes through them is not
///   read;
/// - `reported_cost`: responses whose cost the upstream reported
///   (OpenRouter's `usage.cost`, LiteLLM's `x-litellm-response-cost`),
///   used instead of the price list.
pub const POLICY_COUNTERS: [&str; 6] = [
    "estimated",
    "unrecorded",
    "evicted",
    "unpriced",
    "tunnels",
    "reported_cost",
];

/// Each budget's counters, in id order ([`limit_counter`]):
/// - `rejected`: requests refused at a cap;
/// - `warned`: requests that carried the warning (at or over `warn_at`, or
///   at a cap with `action: warn`);
/// - `shadow`: rejections shadow mode did not make;
/// - `near_cap`: requests whose key had spent 80% of a cap or more.
pub const LIMIT_COUNTERS: [&str; 4] = ["rejected", "warned", "shadow", "near_cap"];

const PER_POLICY: u32 = POLICY_COUNTERS.len() as u32;
const PER_LIMIT: u32 = LIMIT_COUNTERS.len() as u32;

impl BudgetIds {
    /// Define a policy's budget counters at the end of `defs` (`None`: it
    /// has no budget).
    pub fn define(p: &Policy, defs: &mut Vec<(String, Kind)>) -> Option<BudgetIds> {
        let b = p.budget.as_ref()?;
        let first = u32::try_from(defs.len()).ok()?;
        for name in POLICY_COUNTERS {
            defs.push((policy_counter(name, &p.id), Kind::Counter));
        }
        for l in &b.limits {
            for name in LIMIT_COUNTERS {
                defs.push((limit_counter(name, &p.id, &l.name), Kind::Counter));
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

/// A policy's counter `name` (one of [`POLICY_COUNTERS`]).
pub fn policy_counter(name: &str, policy_id: &str) -> String {
    format!("loopguard.budget_{name}_total.policy.{policy_id}")
}

/// A budget's counter `name` (one of [`LIMIT_COUNTERS`]).
pub fn limit_counter(name: &str, policy_id: &str, budget: &str) -> String {
    format!("loopguard.budget_{name}_total.policy.{policy_id}.budget.{budget}")
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
        let own = [
            ids.estimated(),
            ids.unrecorded(),
            ids.evicted(),
            ids.unpriced(),
            ids.tunnels(),
            ids.reported_cost(),
        ];
        for (id, counter) in own.into_iter().zip(POLICY_COUNTERS) {
            let expected = format!("loopguard.budget_{counter}_total.policy.b");
            assert_eq!(name(Some(id)), expected);
        }
        for (l, budget) in [(0, "x"), (1, "y")] {
            let per = [
                ids.rejected(l),
                ids.warned(l),
                ids.shadow(l),
                ids.near_cap(l),
            ];
            for (id, counter) in per.into_iter().zip(LIMIT_COUNTERS) {
                let expected = format!("loopguard.budget_{counter}_total.policy.b.budget.{budget}");
                assert_eq!(name(id), expected);
            }
        }
        let policy_counters = ["estimated", "unrecorded", "evicted", "unpriced", "tunnels"];
        assert_eq!(POLICY_COUNTERS[..5], policy_counters);
        assert_eq!(POLICY_COUNTERS[5], "reported_cost");
        assert_eq!(LIMIT_COUNTERS, ["rejected", "warned", "shadow", "near_cap"]);
        assert_eq!(ids.rejected(2), None);
        assert_eq!(
            r.defs().len() as u32,
            ids.first + PER_POLICY + 2 * PER_LIMIT
        );
    }
}
