//! loopguard's metrics in Envoy's stats, under the same names as the Wasm
//! module's. Envoy lets a dynamic module define metrics only while its
//! configuration loads, so everything is defined then: the registry's
//! metrics by name, and the families the engine names counters in as it
//! first counts them (a looping caller's series, the MCP counters) as
//! labelled counters, whose stat names are the family's name followed by
//! `.label.value` pairs: the same names the Wasm module writes.

use crate::abi::{self, ConfigPtr};
use loopguard_core::host::{named, Kind, MetricId, Registry};
use std::collections::HashMap;

pub struct Metrics {
    /// Envoy's `filter_config_envoy_ptr` (an address: Envoy's stats are
    /// safe to change from any thread).
    config: usize,
    ids: Vec<Option<(usize, Kind)>>,
    /// The registry's metrics by name, for a named count that is one.
    by_name: HashMap<String, usize>,
    /// Envoy's id of each named family ([`named::FAMILIES`]).
    families: Vec<Option<usize>>,
}

impl Metrics {
    /// Define every metric (in the configuration hook). A metric Envoy
    /// refuses is inert rather than failing the configuration.
    pub fn define(config: ConfigPtr, registry: &Registry) -> Metrics {
        let mut by_name = HashMap::new();
        let ids = registry
            .defs()
            .iter()
            .enumerate()
            .map(|(i, (name, k))| {
                by_name.insert(name.clone(), i);
                abi::define_metric(config, *k, name, &[]).map(|id| (id, *k))
            })
            .collect();
        let families = named::FAMILIES
            .iter()
            .map(|f| abi::define_metric(config, Kind::Counter, f.name, f.labels))
            .collect();
        Metrics {
            config: config as usize,
            ids,
            by_name,
            families,
        }
    }

    fn ptr(&self) -> ConfigPtr {
        self.config as ConfigPtr
    }

    /// Add to a counter or gauge (a gauge may go down).
    pub fn count(&self, m: MetricId, n: i64) {
        let Some(Some((id, k))) = self.ids.get(m.0 as usize).filter(|_| n != 0) else {
            return;
        };
        abi::metric(self.ptr(), *k, *id, &[], n < 0, n.unsigned_abs());
    }

    /// Record a histogram value.
    pub fn record(&self, m: MetricId, value: u64) {
        if let Some(Some((id, k))) = self.ids.get(m.0 as usize) {
            abi::metric(self.ptr(), *k, *id, &[], false, value);
        }
    }

    /// Add to the counter the engine named: one of the registry's, or a
    /// family's with the name's label values. A name of neither is not
    /// counted (the engine only makes the ones the families list).
    pub fn count_named(&self, name: &str, n: i64) {
        if let Some(&i) = self.by_name.get(name) {
            return self.count(MetricId(i as u32), n);
        }
        let Some((family, values)) = named::split(name) else {
            return;
        };
        if let Some(Some(id)) = self.families.get(family) {
            abi::metric(
                self.ptr(),
                Kind::Counter,
                *id,
                &values,
                false,
                n.unsigned_abs(),
            );
        }
    }
}
