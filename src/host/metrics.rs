//! loopguard's counters in Envoy's stats (shown as `wasmcustom.loopguard.*`).

use super::abi;

/// Counter ids, defined once per plugin instance at configure time (Envoy
/// returns the same id for the same name, so instances sharing a VM share
/// counters).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub requests: Counter,
    pub matched: Counter,
    pub rejected: Counter,
    pub body_skipped: Counter,
    pub store_fail_open: Counter,
    pub store_cas_retries: Counter,
    pub evicted: Counter,
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

impl Metrics {
    pub fn define() -> Metrics {
        Metrics {
            requests: Counter::define("loopguard.requests_total"),
            matched: Counter::define("loopguard.matched_total"),
            rejected: Counter::define("loopguard.rejected_total"),
            body_skipped: Counter::define("loopguard.body_skipped_total"),
            store_fail_open: Counter::define("loopguard.store_fail_open_total"),
            store_cas_retries: Counter::define("loopguard.store_cas_retries_total"),
            evicted: Counter::define("loopguard.fingerprints_evicted_total"),
        }
    }
}
