//! loopguard's metrics in Envoy's stats.
//!
//! Envoy shows them under `wasmcustom.` with their labels written into the
//! name (`loopguard.rejected_total.policy.llm-policy`); the
//! `stats_config.stats_tags` of the example configs turn those into real
//! labels, so `/stats/prometheus` shows
//! `loopguard_rejected_total{policy="llm-policy"}`. Label values are
//! bounded: policy ids, actions, modes, tiers, steps, reasons, results;
//! never fingerprints, paths or users.

use crate::abi;
use loopguard_core::config::{Config, OnStoreError, ToolStep};
use loopguard_core::redis::RedisError;
use loopguard_core::tool_loops::Tier;
use loopguard_core::window::WindowState;

/// Every metric, defined once per plugin instance at configure time (Envoy
/// returns the same id for the same name, so instances sharing a VM share
/// them).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub requests: Counter,
    pub evicted: Counter,
    pub store_cas_retries: Counter,
    pub store_fail_open: Counter,
    pub skipped_too_large: Counter,
    pub skipped_unreadable: Counter,
    pub skipped_unparsed: Counter,
    pub webhook_sent: Counter,
    pub webhook_failed: Counter,
    pub webhook_dropped: Counter,
    /// Held requests released because Envoy delivered no body
    /// (`hold_request_headers` without `allow_on_headers_stop_iteration`).
    pub hold_released: Counter,
    /// Redis store calls by result: ok, unavailable, status, reply.
    pub store_calls: [Counter; 4],
    /// Requests the Redis store failed, by fallback: local, allow.
    pub store_fallbacks: [Counter; 2],
    /// Entries in use in the fingerprint table (process-wide).
    pub tracked: Gauge,
    /// Throttled requests waiting, across all workers.
    pub throttle_pending: Gauge,
    /// Per policy, in configuration order.
    pub policies: Vec<PolicyMetrics>,
}

#[derive(Debug, Clone, Default)]
pub struct PolicyMetrics {
    pub matched: Counter,
    pub exempted: Counter,
    /// Loops detected (reported detections), by mode: enforce, shadow.
    pub detected: [Counter; 2],
    pub rejected: Counter,
    pub throttled: Counter,
    pub warned: Counter,
    /// Shadow would-be actions: warn, throttle, reject, nudge, directive.
    pub shadow: [Counter; 5],
    /// Tool-loop detections by tier (identical, pattern) and step (nudge,
    /// directive, reject).
    pub tool_loops: [[Counter; 3]; 2],
    pub throttle_delay_ms: Histogram,
}

/// What a shadow-mode policy would have done.
#[derive(Debug, Clone, Copy)]
pub enum WouldBe {
    Warn,
    Throttle,
    Reject,
    Nudge,
    Directive,
}

/// One counter; a failed definition leaves it inert rather than failing the
/// filter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counter(Option<u32>);

impl Counter {
    fn define(name: &str) -> Counter {
        Counter(abi::define_counter(name).ok())
    }

    pub fn add(self, n: u64) {
        if let (Some(id), Ok(n)) = (self.0, i64::try_from(n)) {
            if n > 0 {
                let _ = abi::increment(id, n);
            }
        }
    }

    pub fn inc(self) {
        self.add(1);
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Gauge(Option<u32>);

impl Gauge {
    fn define(name: &str) -> Gauge {
        Gauge(abi::define_gauge(name).ok())
    }

    /// Gauges are process-wide while each worker keeps its own part, so
    /// they move by deltas rather than being set.
    pub fn add(self, delta: i64) {
        if let Some(id) = self.0 {
            if delta != 0 {
                let _ = abi::increment(id, delta);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Histogram(Option<u32>);

impl Histogram {
    fn define(name: &str) -> Histogram {
        Histogram(abi::define_histogram(name).ok())
    }

    pub fn record(self, value: u64) {
        if let Some(id) = self.0 {
            let _ = abi::record(id, value);
        }
    }
}

const TIERS: [&str; 2] = ["identical", "pattern"];
const STEPS: [&str; 3] = ["nudge", "directive", "reject"];
const WOULD_BE: [&str; 5] = ["warn", "throttle", "reject", "nudge", "directive"];

impl Metrics {
    pub fn define(config: &Config) -> Metrics {
        let c = |name: &str| Counter::define(&format!("loopguard.{name}"));
        Metrics {
            requests: c("requests_total"),
            evicted: c("fingerprints_evicted_total"),
            store_cas_retries: c("store_cas_retries_total"),
            store_fail_open: c("store_fail_open_total"),
            skipped_too_large: c("bodies_skipped_total.reason.too_large"),
            skipped_unreadable: c("bodies_skipped_total.reason.unreadable"),
            skipped_unparsed: c("bodies_skipped_total.reason.unparsed"),
            webhook_sent: c("webhook_total.result.sent"),
            webhook_failed: c("webhook_total.result.failed"),
            webhook_dropped: c("webhook_total.result.dropped"),
            hold_released: c("hold_released_total"),
            store_calls: ["ok", "unavailable", "status", "reply"]
                .map(|r| c(&format!("store_calls_total.result.{r}"))),
            store_fallbacks: ["local", "allow"]
                .map(|a| c(&format!("store_fallback_total.action.{a}"))),
            tracked: Gauge::define("loopguard.tracked_fingerprints"),
            throttle_pending: Gauge::define("loopguard.throttle_pending"),
            policies: config
                .policies
                .iter()
                .map(|p| PolicyMetrics::define(&p.id))
                .collect(),
        }
    }

    /// The Redis store call counter for a result.
    pub fn redis_call(&self, result: &Result<WindowState, RedisError>) -> Counter {
        match result {
            Ok(_) => self.store_calls[0],
            Err(error) => self.redis_error(error),
        }
    }

    /// The counter of a failed store call (a call Envoy refused to
    /// dispatch included).
    pub fn redis_error(&self, error: &RedisError) -> Counter {
        pick(
            &self.store_calls,
            match error {
                RedisError::Unavailable(_) => 1,
                RedisError::Status(_) => 2,
                RedisError::Reply(_) => 3,
            },
        )
    }

    pub fn store_fallback(&self, on_error: OnStoreError) -> Counter {
        pick(
            &self.store_fallbacks,
            match on_error {
                OnStoreError::Local => 0,
                OnStoreError::Allow => 1,
            },
        )
    }

    /// The metrics of the policy at `index` (inert ones if out of range).
    pub fn policy(&self, index: usize) -> PolicyMetrics {
        self.policies.get(index).cloned().unwrap_or_default()
    }
}

impl PolicyMetrics {
    fn define(id: &str) -> PolicyMetrics {
        let c = |name: &str, tags: &str| {
            Counter::define(&format!("loopguard.{name}.policy.{id}{tags}"))
        };
        PolicyMetrics {
            matched: c("matched_total", ""),
            exempted: c("exempted_total", ""),
            detected: ["enforce", "shadow"].map(|m| c("detected_total", &format!(".mode.{m}"))),
            rejected: c("rejected_total", ""),
            throttled: c("throttled_total", ""),
            warned: c("warned_total", ""),
            shadow: WOULD_BE.map(|a| c("shadow_total", &format!(".action.{a}"))),
            tool_loops: TIERS.map(|t| {
                STEPS.map(|s| c("tool_loop_detected_total", &format!(".tier.{t}.step.{s}")))
            }),
            throttle_delay_ms: Histogram::define(&format!(
                "loopguard.throttle_delay_ms.policy.{id}"
            )),
        }
    }

    pub fn detected(&self, shadow: bool) -> Counter {
        pick(&self.detected, usize::from(shadow))
    }

    pub fn shadow(&self, would: WouldBe) -> Counter {
        pick(&self.shadow, would as usize)
    }

    pub fn tool_loop(&self, tier: Tier, step: ToolStep) -> Counter {
        let t = match tier {
            Tier::Identical => 0,
            Tier::Pattern => 1,
        };
        let s = match step {
            ToolStep::Nudge => 0,
            ToolStep::Directive => 1,
            ToolStep::Reject => 2,
        };
        self.tool_loops
            .get(t)
            .map(|row| pick(row, s))
            .unwrap_or_default()
    }
}

/// The metric at `i` of a fixed table (an inert one if out of range).
fn pick<M: Copy + Default>(table: &[M], i: usize) -> M {
    table.get(i).copied().unwrap_or_default()
}
