//! The root context: configuration and the per-plugin state every stream
//! shares. Each Envoy worker has its own VM and root context; the slot table
//! in shared data is what they have in common.

use super::abi;
use super::http::Stream;
use super::metrics::Metrics;
use super::shared_store::{self, SharedData};
use crate::core::config::Config;
use crate::core::slot_table::TableLayout;
use crate::core::store::SlotStore;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Everything one configured plugin instance needs on the request path.
/// Held by the root context and shared (by `Rc`) with its streams, never in
/// globals, so two plugin instances in one VM never see each other's state.
pub struct Plugin {
    pub config: Config,
    pub store: RefCell<SlotStore<SharedData>>,
    pub metrics: Metrics,
    /// Last time a fail-open warning was logged (rate limit).
    pub last_fail_open_log_ms: Cell<u64>,
}

#[derive(Default)]
pub struct Root {
    plugin: Option<Rc<Plugin>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        sync_log_level();
        match configure(plugin_configuration_size) {
            Ok(plugin) => {
                let cfg = &plugin.config;
                log::info!(
                    "configured {} polic{} ({}), tracking up to {} fingerprints",
                    cfg.policies.len(),
                    if cfg.policies.len() == 1 { "y" } else { "ies" },
                    cfg.policies
                        .iter()
                        .map(|p| p.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    plugin.store.borrow().layout.capacity(),
                );
                self.plugin = Some(Rc::new(plugin));
                true
            }
            Err(message) => {
                log::error!("invalid configuration: {message}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream::new(self.plugin.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn configure(size: usize) -> Result<Plugin, String> {
    let bytes = abi::plugin_configuration(size)
        .map_err(|e| format!("cannot read the plugin configuration (host status {})", e.0))?;
    let config = Config::parse(&bytes).map_err(|e| e.to_string())?;
    let name = plugin_name();
    let layout = TableLayout::new(config.max_tracked_fingerprints);
    let store = shared_store::open(&name, layout)?;
    Ok(Plugin {
        config,
        store: RefCell::new(store),
        metrics: Metrics::define(),
        last_fail_open_log_ms: Cell::new(0),
    })
}

/// The plugin's name from Envoy, reduced to a safe key component.
fn plugin_name() -> String {
    let raw = abi::property(&["plugin_name"])
        .ok()
        .flatten()
        .unwrap_or_default();
    let name: String = String::from_utf8_lossy(&raw)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "default".to_string()
    } else {
        name
    }
}

/// Follow Envoy's wasm log level, so messages Envoy would drop are not even
/// formatted.
fn sync_log_level() {
    let level = match abi::host_log_level() {
        Some(0) => LogLevel::Trace,
        Some(1) => LogLevel::Debug,
        Some(2) | None => LogLevel::Info,
        Some(3) => LogLevel::Warn,
        Some(4) => LogLevel::Error,
        Some(_) => LogLevel::Critical,
    };
    proxy_wasm::set_log_level(level);
}
