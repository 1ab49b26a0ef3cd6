//! loopguard's metrics in Envoy's stats (shown as `wasmcustom.loopguard.*`).

use super::abi;
use crate::core::config::ToolStep;
use crate::core::tool_loops::Tier;

/// Metric ids, defined once per plugin instance at configure time (Envoy
/// returns the same id for the same name, so instances sharing a VM share
/// them).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub requests: Counter,
    pub matched: Counter,
    pub exempted: Counter,
    pub rejected: Counter,
    pub throttled: Counter,
    pub warned: Counter,
    pub shadow: Counter,
    pub body_skipped: Counter,
    pub llm_unparsed: Counter,
    pub store_fail_open: Counter,
    pub store_cas_retries: Counter,
    pub evicted: Counter,
    /// Throttled requests waiting, across all workers.
    pub throttle_pending: Gauge,
    /// Tool-loop detections by tier (identical, pattern) and ladder step
    /// (nudge, directive, reject).
    pub tool_loops: [[Counter; 3]; 2],
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

impl Metrics {
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
            .and_then(|row| row.get(s))
            .copied()
            .unwrap_or_default()
    }

    pub fn define() -> Metrics {
        Metrics {
            requests: Counter::define("loopguard.requests_total"),
            matched: Counter::define("loopguard.matched_total"),
            exempted: Counter::define("loopguard.exempted_total"),
            rejected: Counter::define("loopguard.rejected_total"),
            throttled: Counter::define("loopguard.throttled_total"),
            warned: Counter::define("loopguard.warned_total"),
            shadow: Counter::define("loopguard.shadow_total"),
            body_skipped: Counter::define("loopguard.body_skipped_total"),
            llm_unparsed: Counter::define("loopguard.llm_unparsed_total"),
            store_fail_open: Counter::define("loopguard.store_fail_open_total"),
            store_cas_retries: Counter::define("loopguard.store_cas_retries_total"),
            evicted: Counter::define("loopguard.fingerprints_evicted_total"),
            throttle_pending: Gauge::define("loopguard.throttle_pending"),
            tool_loops: ["identical", "pattern"].map(|tier| {
                ["nudge", "directive", "reject"].map(|step| {
                    Counter::define(&format!("loopguard.tool_loop.{tier}.{step}_total"))
                })
            }),
        }
    }
}
