//! loopguard's metrics in Envoy's stats: every metric of the configuration
//! (names and kinds from the core's registry) defined once at configure
//! time; the core's effects name them by id. A few counters are named
//! by the core as they first count (a looping caller's series, bounded per
//! policy by the core): defined then, and their ids kept by name.

use crate::abi;
use loopguard_core::host::{Kind, MetricId, Registry};

/// Envoy's id for each of the registry's metrics (`None`: Envoy refused to
/// define it; the metric is then inert rather than failing the filter).
pub struct Metrics {
    ids: Vec<Option<u32>>,
    named: std::cell::RefCell<std::collections::HashMap<String, Option<u32>>>,
}

impl Metrics {
    /// Define every metric (Envoy returns the same id for the same name, so
    /// instances sharing a VM share them).
    pub fn define(registry: &Registry) -> Metrics {
        let ids = registry
            .defs()
            .iter()
            .map(|(name, kind)| abi::define_metric(*kind, name).ok())
            .collect();
        Metrics {
            ids,
            named: Default::default(),
        }
    }

    /// Add to the counter `name`, defining it the first time.
    pub fn count_named(&self, name: String, n: i64) {
        let Ok(mut named) = self.named.try_borrow_mut() else {
            return;
        };
        let id = *named
            .entry(name)
            .or_insert_with_key(|name| abi::define_metric(Kind::Counter, name).ok());
        if let Some(id) = id {
            let _ = abi::increment(id, n);
        }
    }

    fn id(&self, m: MetricId) -> Option<u32> {
        self.ids.get(m.0 as usize).copied().flatten()
    }

    /// Add to a counter or gauge.
    pub fn count(&self, m: MetricId, n: i64) {
        if let Some(id) = self.id(m).filter(|_| n != 0) {
            let _ = abi::increment(id, n);
        }
    }

    /// Record a histogram value.
    pub fn record(&self, m: MetricId, value: u64) {
        if let Some(id) = self.id(m) {
            let _ = abi::record(id, value);
        }
    }
}
