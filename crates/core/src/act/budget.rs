//! Spend caps: from what each of a request's budget keys has spent in its
//! window to a verdict (under the caps, warned, at a cap), and what the
//! client and the logs see of it: the `x-loopguard-budget` header, the 429
//! in the called API's error shape with code `budget_exceeded`, and the
//! `budget.warning` / `budget.exceeded` events.

use crate::act::reply::{self, Api, Code, LocalReply, Refusal, Shape};
use crate::config::budget::{Budget, BudgetAction, BudgetLimit};
use crate::config::{ladder, Mode};
use serde_json::{json, Value};

/// The fraction of a cap (in thousandths) from which a key counts as near
/// its cap in `loopguard_budget_near_cap_total` (the alert's threshold,
/// whatever `warn_at` says).
pub const NEAR_CAP_PERMILLE: u64 = 800;

/// One budget key's standing: its limit (an index in the policy's
/// `budget.limits`), what it spent in the window, and when it would be
/// back under its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub limit: usize,
    pub spent: u64,
    pub until_below_ms: u64,
    /// The key's tag (metrics' `key` label, events' `key`).
    pub tag: u64,
}

/// What a request's standings mean.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetVerdict {
    /// The caps reached (spent >= cap), the one that frees last first.
    pub exceeded: Vec<Standing>,
    /// At or over `warn_at` of their caps, under them.
    pub warned: Vec<Standing>,
    /// At or over [`NEAR_CAP_PERMILLE`] of their caps (reached ones too).
    pub near_cap: Vec<usize>,
}

impl BudgetVerdict {
    /// Whether the request is refused (enforced, `action: reject`, a cap
    /// reached).
    pub fn rejects(&self, b: &Budget, mode: Mode) -> bool {
        mode == Mode::Enforce && b.action == BudgetAction::Reject && !self.exceeded.is_empty()
    }
}

/// A budget's ladder: a warning from `warn_at` of a cap (unless 0), a
/// reached cap at all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rung {
    Warn,
    Reached,
}

fn rung(b: &Budget, spent: u64, cap: u64) -> Option<Rung> {
    let warn = (b.warn_at_permille > 0).then_some((u64::from(b.warn_at_permille), Rung::Warn));
    let rungs = warn.into_iter().chain([(1000, Rung::Reached)]);
    ladder::climb(rungs, ladder::permille(spent, cap)).map(|(_, r)| r)
}

/// Judge a request's standings against its policy's caps.
pub fn judge(b: &Budget, standings: &[Standing]) -> BudgetVerdict {
    let mut v = BudgetVerdict::default();
    for s in standings {
        let Some(limit) = b.limits.get(s.limit) else {
            continue;
        };
        let cap = limit.cap.amount();
        if ladder::permille(s.spent, cap) >= NEAR_CAP_PERMILLE && !v.near_cap.contains(&s.limit) {
            v.near_cap.push(s.limit);
        }
        match rung(b, s.spent, cap) {
            Some(Rung::Reached) => v.exceeded.push(*s),
            Some(Rung::Warn) => v.warned.push(*s),
            None => {}
        }
    }
    v.exceeded
        .sort_by_key(|s| std::cmp::Reverse(s.until_below_ms));
    v
}

/// One standing as the header shows it:
/// `<budget>; spent=<n>; cap=<n>; unit=<unit>; window=<seconds>`.
fn header_part(limit: &BudgetLimit, spent: u64) -> String {
    format!(
        "{}; spent={}; cap={}; unit={}; window={}",
        limit.name,
        limit.cap.show(spent),
        limit.cap.show(limit.cap.amount()),
        limit.cap.unit(),
        limit.window_ms / 1000
    )
}

/// The `x-loopguard-budget` header of a verdict (the caps reached, then
/// those warned of), if any.
pub fn header(b: &Budget, v: &BudgetVerdict) -> Option<String> {
    let parts: Vec<String> = v
        .exceeded
        .iter()
        .chain(&v.warned)
        .filter_map(|s| Some(header_part(b.limits.get(s.limit)?, s.spent)))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// How a cap reads in a message: `$5.00`, `2000000 tokens`, `200 calls`.
fn amount(limit: &BudgetLimit, n: u64) -> String {
    match limit.cap {
        crate::config::budget::Cap::MicroUsd(_) => format!("${}", limit.cap.show(n)),
        crate::config::budget::Cap::Tokens(..) => format!("{n} tokens"),
        crate::config::budget::Cap::Calls(_) => format!("{n} calls"),
    }
}

/// The 429 for a reached cap, in the called API's error shape (`code`
/// `budget_exceeded`; `x-should-retry: false`, so the OpenAI and Anthropic
/// SDKs raise it without retrying), with `Retry-After` for when enough of
/// the spending has left the window.
pub fn rejection(policy_id: &str, b: &Budget, s: &Standing, api: Api) -> Option<LocalReply> {
    let limit = b.limits.get(s.limit)?;
    let retry_after_ms = s.until_below_ms.max(1);
    let retry_after = reply::retry_after_seconds(retry_after_ms);
    let message = format!(
        "Budget \"{}\" exceeded: spent {} of {} per {} in the last {} seconds. Retry after {} seconds.",
        limit.name,
        amount(limit, s.spent),
        amount(limit, limit.cap.amount()),
        limit.per.as_str(),
        limit.window_ms / 1000,
        retry_after
    );
    let details = json!({
        "policy": policy_id,
        "budget": limit.name,
        "per": limit.per.as_str(),
        "spent": limit.cap.show(s.spent),
        "cap": limit.cap.show(limit.cap.amount()),
        "unit": limit.cap.unit(),
        "window_seconds": limit.window_ms / 1000,
        "retry_after_seconds": retry_after,
    });
    let refusal = Refusal {
        policy_id,
        status: 429,
        message,
        details,
        retry_after_ms: Some(retry_after_ms),
        header: Some(("x-loopguard-budget", header_part(limit, s.spent))),
    };
    let shape = Shape::Api(api, Code::BudgetExceeded);
    Some(reply::refuse(shape, refusal))
}

/// A `budget.warning` or `budget.exceeded` event for one standing.
pub fn event(
    name: &str,
    policy_id: &str,
    mode: Mode,
    b: &Budget,
    s: &Standing,
    action: &str,
) -> Option<Value> {
    let limit = b.limits.get(s.limit)?;
    Some(json!({
        "event": name,
        "policy": policy_id,
        "mode": mode.as_str(),
        "budget": limit.name,
        "per": limit.per.as_str(),
        "key": crate::act::events::caller_tag(s.tag),
        "spent": limit.cap.show(s.spent),
        "cap": limit.cap.show(limit.cap.amount()),
        "unit": limit.cap.unit(),
        "window_seconds": limit.window_ms / 1000,
        "action": action,
    }))
}

/// A `budget.unpriced` event: a call under a dollar cap whose model no
/// price names, and what it was charged as.
pub fn unpriced_event(
    policy_id: &str,
    mode: Mode,
    b: &Budget,
    model: &str,
    charged_as: &str,
    caller: u64,
) -> Value {
    json!({
        "event": "budget.unpriced",
        "policy": policy_id,
        "mode": mode.as_str(),
        "model": model,
        "unpriced": b.unpriced.as_str(),
        "charged_as": charged_as,
        "key": crate::act::events::caller_tag(caller),
    })
}

/// The `x-loopguard-budget` part naming an unpriced model and what it is
/// charged as.
pub fn unpriced_header(model: &str, charged_as: &str) -> String {
    format!("unpriced; model={model}; charged_as={charged_as}")
}

/// The refusal of a call whose model no price names, under a dollar cap
/// with `unpriced: reject`: a `403` in the called API's error shape
/// (`code` `model_unpriced`; the SDKs raise it without retrying).
pub fn unpriced_rejection(policy_id: &str, model: &str, api: Api) -> LocalReply {
    let message = format!(
        "Model \"{model}\" has no price under policy \"{policy_id}\", whose spend caps refuse unpriced models (budget.unpriced: reject). Use a priced model, or ask the gateway's operators to add its price."
    );
    let details = json!({"policy": policy_id, "model": model, "unpriced": "reject"});
    let refusal = Refusal {
        policy_id,
        status: 403,
        message,
        details,
        retry_after_ms: None,
        header: Some((
            "x-loopguard-budget",
            unpriced_header(model, "refused (reject)"),
        )),
    };
    reply::refuse(Shape::Api(api, Code::ModelUnpriced), refusal)
}

/// The log line of a rejection shadow mode did not make.
pub fn shadow_line(policy_id: &str, b: &Budget, s: &Standing) -> Option<String> {
    let limit = b.limits.get(s.limit)?;
    let fields = [
        ("budget", limit.name.to_string()),
        ("per", limit.per.as_str().to_string()),
        ("spent", limit.cap.show(s.spent)),
        ("cap", limit.cap.show(limit.cap.amount())),
        ("unit", limit.cap.unit().to_string()),
    ];
    let guard = Some("budget");
    Some(super::shadow::line("reject", guard, policy_id, &fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn budget(extra: Value) -> Budget {
        let mut b = json!({"limits": [
            {"name": "hour", "per": "session", "window_seconds": 3600, "usd": 5},
            {"name": "calls", "per": "caller", "window_seconds": 60, "calls": 10}
        ]});
        if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        let cfg = Config::from_value(&json!({"policies": [
            {"id": "p", "spec": {"selector": {}, "budget": b}}]}))
        .unwrap();
        cfg.policies[0].budget.clone().unwrap()
    }

    fn standing(limit: usize, spent: u64, until: u64) -> Standing {
        Standing {
            limit,
            spent,
            until_below_ms: until,
            tag: 0xabc_def0_1234_5678,
        }
    }

    #[test]
    fn under_warned_and_reached() {
        let b = budget(json!({}));
        let v = judge(&b, &[standing(0, 3_999_999, 0), standing(1, 7, 0)]);
        assert_eq!(v, BudgetVerdict::default());
        let v = judge(&b, &[standing(0, 4_000_000, 0), standing(1, 7, 0)]);
        assert_eq!(v.warned.len(), 1);
        assert_eq!(v.near_cap, vec![0]);
        assert!(!v.rejects(&b, Mode::Enforce));
        let v = judge(&b, &[standing(0, 5_000_000, 100), standing(1, 10, 9_000)]);
        assert_eq!(v.exceeded.len(), 2);
        // The cap that frees last answers.
        assert_eq!(v.exceeded[0].limit, 1);
        assert!(v.rejects(&b, Mode::Enforce));
        assert!(!v.rejects(&b, Mode::Shadow));
        assert!(!v.rejects(&budget(json!({"action": "warn"})), Mode::Enforce));
    }

    #[test]
    fn warn_at_zero_never_warns() {
        let b = budget(json!({"warn_at": 0}));
        let v = judge(&b, &[standing(0, 4_900_000, 0)]);
        assert!(v.warned.is_empty());
        assert_eq!(v.near_cap, vec![0]);
    }

    #[test]
    fn the_429_names_the_budget_the_spend_and_when_to_retry() {
        let b = budget(json!({}));
        let r = rejection("p", &b, &standing(0, 5_021_300, 1_259_001), Api::OpenAi).unwrap();
        assert_eq!(r.status, 429);
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["error"]["code"], "budget_exceeded");
        assert_eq!(body["error"]["type"], "budget_exceeded");
        assert_eq!(
            body["error"]["message"],
            "Budget \"hour\" exceeded: spent $5.02 of $5.00 per session in the last 3600 seconds. Retry after 1260 seconds."
        );
        let h = |n: &str| {
            r.headers
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(h("retry-after"), Some("1260"));
        assert_eq!(h("x-should-retry"), Some("false"));
        assert_eq!(
            h("x-loopguard-budget"),
            Some("hour; spent=5.02; cap=5.00; unit=usd; window=3600")
        );
        let a = rejection("p", &b, &standing(1, 12, 0), Api::Anthropic).unwrap();
        let body: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["loopguard"]["code"], "budget_exceeded");
        assert_eq!(body["loopguard"]["budget"], "calls");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spent 12 calls of 10 calls per caller"));
    }

    #[test]
    fn the_header_lists_reached_caps_then_warnings() {
        let b = budget(json!({}));
        let v = judge(&b, &[standing(0, 4_500_000, 0), standing(1, 10, 5)]);
        assert_eq!(
            header(&b, &v).unwrap(),
            "calls; spent=10; cap=10; unit=calls; window=60, hour; spent=4.50; cap=5.00; unit=usd; window=3600"
        );
    }
}
