//! loopguard's metrics: their names (with labels) and dense ids.
//!
//! Envoy shows them under `wasmcustom.` with their labels written into the
//! name (`loopguard.rejected_total.policy.llm-policy`); the
//! `stats_config.stats_tags` of the example configs turn those into real
//! labels, so `/stats/prometheus` shows
//! `loopguard_rejected_total{policy="llm-policy"}`. Label values are
//! bounded: policy ids, actions, modes, tiers, steps, reasons, results;
//! never fingerprints, paths or users.
//!
//! The registry is built once per configuration; the host defines every
//! name with Envoy at configure time and keeps the ids in a table indexed
//! by [`MetricId`], so a request's metrics cost no string work.

pub mod budget;
pub mod mcp;
pub mod named;

use crate::config::{Action, Config, OnStoreError, ToolStep};
use crate::detect::tool_loops::Tier;
use crate::state::window::Forgave;

/// How a metric behaves in Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    /// Process-wide: every worker adds and removes its own part.
    Gauge,
    Histogram,
}

/// A metric of this configuration: an index into [`Registry::defs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricId(pub u32);

/// What a shadow-mode policy would have done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WouldBe {
    Warn,
    Throttle,
    Reject,
    Nudge,
    Directive,
}

impl From<Action> for WouldBe {
    fn from(a: Action) -> WouldBe {
        match a {
            Action::Warn => WouldBe::Warn,
            Action::Throttle => WouldBe::Throttle,
            Action::Reject => WouldBe::Reject,
        }
    }
}

impl From<ToolStep> for WouldBe {
    fn from(s: ToolStep) -> WouldBe {
        match s {
            ToolStep::Nudge => WouldBe::Nudge,
            ToolStep::Directive => WouldBe::Directive,
            ToolStep::Reject => WouldBe::Reject,
        }
    }
}

/// Why a body was not fingerprinted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    TooLarge,
    Unreadable,
    Unparsed,
    /// Nested deeper than the scanner reads.
    TooDeep,
    /// More conversation items, object keys or tool calls than the scanner
    /// reads.
    TooMany,
}

/// The result of a call to the shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    Ok,
    Unavailable,
    Status,
    Reply,
    /// A Redis Cluster node did not have the script yet (`NOSCRIPT`,
    /// after a failover or a restart): the call was sent again in full.
    NoScript,
}

impl CallResult {
    /// A call's result from its failure (`None`: it succeeded).
    pub fn of(failure: Option<&crate::state::store::StoreFailure>) -> CallResult {
        use crate::state::store::StoreFailure;
        match failure {
            None => CallResult::Ok,
            Some(StoreFailure::Status(_)) => CallResult::Status,
            Some(StoreFailure::Reply(_)) => CallResult::Reply,
            Some(_) => CallResult::Unavailable,
        }
    }
}

/// The result of a webhook alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookResult {
    Sent,
    Failed,
    Dropped,
}

const SKIP_REASONS: [&str; 5] = [
    "too_large",
    "unreadable",
    "unparsed",
    "too_deep",
    "too_many",
];
const WOULD_BE: [&str; 5] = ["warn", "throttle", "reject", "nudge", "directive"];
const TIERS: [&str; 5] = ["identical", "pattern", "cycle", "answer", "turn"];
const STEPS: [&str; 3] = ["nudge", "directive", "reject"];
const CALL_RESULTS: [&str; 5] = ["ok", "unavailable", "status", "reply", "noscript"];
const FALLBACKS: [&str; 2] = ["local", "allow"];
const WEBHOOK_RESULTS: [&str; 3] = ["sent", "failed", "dropped"];

/// What became of an attempt the provider failed (its hit taken back or
/// not), as a label.
const FAILED_ATTEMPT_RESULTS: [&str; 4] = ["forgiven", "counted", "gone", "unrecorded"];

/// Token types, in the OpenTelemetry GenAI vocabulary
/// (`gen_ai.token.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Input,
    Output,
}

/// Per policy: the ids before the token metrics (the six counters, detected,
/// shadow, tool loops, failed attempts, harness retries).
const PER_POLICY_FIXED: u32 = 6 + 2 + 5 + 3 * TIERS.len() as u32 + 4 + 1;

/// Every metric of a configuration.
#[derive(Debug, Clone)]
pub struct Registry {
    defs: Vec<(String, Kind)>,
    policies: u32,
    /// Priced models (the token metrics' `model` label has one more
    /// value: `other`).
    models: u32,
    /// Ids per policy.
    per_policy: u32,
    /// Per policy, `mcp_calls_total` (policies with `mcp` only: defined
    /// after every other metric, counted on every call, so a dense id
    /// rather than a name).
    mcp_calls: Vec<Option<MetricId>>,
    /// Per policy, its budgets' counters (policies with a budget only:
    /// defined after every other metric).
    budgets: Vec<Option<budget::BudgetIds>>,
}

/// The caller label values one policy gives their own series, per worker;
/// further callers are counted as `other`.
pub const MAX_CALLER_SERIES: usize = 50;

// Layout of the global ids.
impl MetricId {
    pub const REQUESTS: MetricId = MetricId(0);
    pub const EVICTED: MetricId = MetricId(1);
    pub const CAS_RETRIES: MetricId = MetricId(2);
    pub const FAIL_OPEN: MetricId = MetricId(3);
    pub const HOLD_RELEASED: MetricId = MetricId(4);
    pub const TABLE_ENTRIES: MetricId = MetricId(5);
    pub const THROTTLE_PENDING: MetricId = MetricId(6);
    /// A response's spending could not be added to the loops' ledger.
    pub const LEDGER_FAILED: MetricId = MetricId(WEBHOOK + 3);
}
const SKIPPED: u32 = 7; // 5
const CALLS: u32 = SKIPPED + 5; // 5
const FALLBACK: u32 = CALLS + 5; // 2
const WEBHOOK: u32 = FALLBACK + 2; // 3
const GLOBALS: u32 = MetricId::LEDGER_FAILED.0 + 1;

impl Registry {
    pub fn new(config: &Config) -> Registry {
        let c = |name: &str| (format!("loopguard.{name}"), Kind::Counter);
        let mut defs = vec![
            c("requests_total"),
            c("fingerprints_evicted_total"),
            c("store_cas_retries_total"),
            c("store_fail_open_total"),
            c("hold_released_total"),
            ("loopguard.table_entries_used".to_string(), Kind::Gauge),
            ("loopguard.throttle_pending".to_string(), Kind::Gauge),
        ];
        let labelled: [(&str, &[&str]); 4] = [
            ("bodies_skipped_total.reason", &SKIP_REASONS),
            ("store_calls_total.result", &CALL_RESULTS),
            ("store_fallback_total.action", &FALLBACKS),
            ("webhook_total.result", &WEBHOOK_RESULTS),
        ];
        for (name, labels) in labelled {
            defs.extend(labels.iter().map(|l| c(&format!("{name}.{l}"))));
        }
        defs.push(c("spend_ledger_failed_total"));
        for p in &config.policies {
            let id = &p.id;
            let pc = |name: &str, tags: &str| {
                (format!("loopguard.{name}.policy.{id}{tags}"), Kind::Counter)
            };
            for name in ["matched", "exempted", "rejected", "throttled", "warned"] {
                defs.push(pc(&format!("{name}_total"), ""));
            }
            let delay = format!("loopguard.throttle_delay_ms.policy.{id}");
            defs.push((delay, Kind::Histogram));
            for m in ["enforce", "shadow"] {
                defs.push(pc("detected_total", &format!(".mode.{m}")));
            }
            for a in WOULD_BE {
                defs.push(pc("shadow_total", &format!(".action.{a}")));
            }
            for t in TIERS {
                for s in STEPS {
                    let tags = format!(".tier.{t}.step.{s}");
                    defs.push(pc("tool_loop_detected_total", &tags));
                }
            }
            for r in FAILED_ATTEMPT_RESULTS {
                defs.push(pc("failed_attempts_total", &format!(".result.{r}")));
            }
            defs.push(pc("harness_retries_total", ""));
            // Token metrics, model last (a model name may hold dots; the
            // `model` tag takes the rest of the name).
            let labels = config.prices.models.iter().map(|m| m.label.as_str());
            let models: Vec<&str> = labels.chain(["other"]).collect();
            let priced = models.len() - 1;
            for t in ["input", "output"] {
                for l in ["false", "true"] {
                    for m in &models {
                        let tags = format!(".token_type.{t}.loop.{l}.model.{m}");
                        defs.push(pc("tokens_total", &tags));
                    }
                }
            }
            defs.push(pc("responses_without_usage_total", ""));
            defs.push(pc("degenerate_output_total", ""));
            for t in ["input", "output"] {
                for m in &models {
                    let tags = format!(".token_type.{t}.model.{m}");
                    defs.push(pc("tokens_avoided_total", &tags));
                }
            }
            for l in ["false", "true"] {
                for m in models.iter().take(priced) {
                    defs.push(pc("cost_microusd_total", &format!(".loop.{l}.model.{m}")));
                }
            }
            for m in models.iter().take(priced) {
                defs.push(pc("cost_avoided_microusd_total", &format!(".model.{m}")));
            }
        }
        let mcp_calls = config
            .policies
            .iter()
            .map(|p| {
                p.mcp.as_ref()?;
                let id = MetricId(u32::try_from(defs.len()).ok()?);
                defs.push((mcp::calls(&p.id), Kind::Counter));
                Some(id)
            })
            .collect();
        let budgets = config
            .policies
            .iter()
            .map(|p| budget::BudgetIds::define(p, &mut defs))
            .collect();
        let models = u32::try_from(config.prices.models.len()).unwrap_or(0);
        Registry {
            defs,
            policies: u32::try_from(config.policies.len()).unwrap_or(0),
            models,
            per_policy: Self::per_policy(models),
            mcp_calls,
            budgets,
        }
    }

    /// Ids per policy with `models` priced models.
    fn per_policy(models: u32) -> u32 {
        let labels = models + 1;
        PER_POLICY_FIXED + 4 * labels + 2 + 2 * labels + 3 * models
    }

    /// Every metric's full name and kind, in id order.
    pub fn defs(&self) -> &[(String, Kind)] {
        &self.defs
    }

    fn at(&self, policy: usize, offset: u32) -> Option<MetricId> {
        let p = u32::try_from(policy).ok().filter(|p| *p < self.policies)?;
        Some(MetricId(GLOBALS + p * self.per_policy + offset))
    }

    // The labelled metrics below are defined in their enum's order (a
    // test holds each variant to its label).
    pub fn skipped(&self, reason: SkipReason) -> MetricId {
        MetricId(SKIPPED + reason as u32)
    }
    pub fn store_call(&self, result: CallResult) -> MetricId {
        MetricId(CALLS + result as u32)
    }
    pub fn fallback(&self, on_error: OnStoreError) -> MetricId {
        MetricId(FALLBACK + on_error as u32)
    }
    pub fn webhook(&self, result: WebhookResult) -> MetricId {
        MetricId(WEBHOOK + result as u32)
    }
    /// `tools/call` requests an MCP policy judged.
    pub fn mcp_calls(&self, policy: usize) -> Option<MetricId> {
        self.mcp_calls.get(policy).copied().flatten()
    }
    /// A policy's budget counters (`None`: it has no budget).
    pub fn budget(&self, policy: usize) -> Option<budget::BudgetIds> {
        self.budgets.get(policy).copied().flatten()
    }
    pub fn matched(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, 0)
    }
    pub fn exempted(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, 1)
    }
    /// A harness asked the model again with the same correction
    /// ([`crate::request::llm::Request::reasked`]).
    pub fn harness_retries(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, PER_POLICY_FIXED - 1)
    }
    pub fn rejected(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, 2)
    }
    pub fn throttled(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, 3)
    }
    pub fn warned(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, 4)
    }
    pub fn throttle_delay(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, 5)
    }
    pub fn detected(&self, policy: usize, shadow: bool) -> Option<MetricId> {
        self.at(policy, 6 + u32::from(shadow))
    }
    pub fn shadow(&self, policy: usize, would: WouldBe) -> Option<MetricId> {
        self.at(policy, 8 + would as u32)
    }
    pub fn tool_loop(&self, policy: usize, tier: Tier, step: ToolStep) -> Option<MetricId> {
        let t = match tier {
            Tier::Identical | Tier::Failing => 0,
            Tier::Pattern => 1,
            Tier::Cycle => 2,
            Tier::Answer => 3,
            Tier::Turn => 4,
        };
        self.at(policy, 13 + t * 3 + step as u32)
    }
    /// An attempt the provider failed (5xx, 429): `None` when its hit
    /// could not be taken back because the store failed.
    pub fn failed_attempt(&self, policy: usize, forgave: Option<Forgave>) -> Option<MetricId> {
        let i = forgave.map_or(3, |f| f as u32);
        self.at(policy, 13 + 3 * TIERS.len() as u32 + i)
    }
    /// The `model` label's index of a priced model (`None`: `other`).
    fn priced(&self, model: Option<usize>) -> Option<u32> {
        model
            .and_then(|m| u32::try_from(m).ok())
            .filter(|m| *m < self.models)
    }

    /// The `model` label's index (`other`: the last).
    fn model(&self, model: Option<usize>) -> u32 {
        self.priced(model).unwrap_or(self.models)
    }

    /// Tokens a response reported, by type, whether its request was part
    /// of a detected loop, and its model (`None`: unpriced, `other`).
    pub fn tokens(
        &self,
        policy: usize,
        t: TokenType,
        in_loop: bool,
        model: Option<usize>,
    ) -> Option<MetricId> {
        let labels = self.models + 1;
        let i = 2 * t as u32 + u32::from(in_loop);
        self.at(policy, PER_POLICY_FIXED + i * labels + self.model(model))
    }
    /// A response that reported no usage (or could not be read).
    pub fn without_usage(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, PER_POLICY_FIXED + 4 * (self.models + 1))
    }
    /// A streamed response found repeating itself.
    pub fn degenerate_output(&self, policy: usize) -> Option<MetricId> {
        self.at(policy, PER_POLICY_FIXED + 4 * (self.models + 1) + 1)
    }
    /// Tokens a rejected request would have spent (an estimate: the loop's
    /// last observed usage).
    pub fn tokens_avoided(
        &self,
        policy: usize,
        t: TokenType,
        model: Option<usize>,
    ) -> Option<MetricId> {
        let labels = self.models + 1;
        let i = PER_POLICY_FIXED + 4 * labels + 2 + t as u32 * labels;
        self.at(policy, i + self.model(model))
    }
    /// What a priced model's tokens cost, in micro-dollars (`None` for an
    /// unpriced model).
    pub fn cost(&self, policy: usize, in_loop: bool, model: Option<usize>) -> Option<MetricId> {
        let m = self.priced(model)?;
        self.at(policy, self.costs() + u32::from(in_loop) * self.models + m)
    }
    /// What rejected requests would have cost (an estimate), for a priced
    /// model.
    pub fn cost_avoided(&self, policy: usize, model: Option<usize>) -> Option<MetricId> {
        let m = self.priced(model)?;
        self.at(policy, self.costs() + 2 * self.models + m)
    }

    /// The offset of a policy's first cost metric.
    fn costs(&self) -> u32 {
        PER_POLICY_FIXED + 6 * (self.models + 1) + 2
    }
}

/// The name of the counter of a caller's requests that were part of a
/// detected loop (`caller`: a caller tag, or `other`): defined by the host
/// when first counted, so only callers that loop get a series.
pub fn caller_loop_requests(policy_id: &str, caller: &str) -> String {
    format!("loopguard.caller_loop_requests_total.policy.{policy_id}.caller.{caller}")
}

#[cfg(test)]
mod tests;
