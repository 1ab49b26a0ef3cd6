//! The root context: configuration, the per-plugin state every stream
//! shares, and the tick that releases throttled requests. Each Envoy worker
//! has its own VM and root context; the slot table in shared data is what
//! they have in common.

use crate::abi;
use crate::http::Stream;
use crate::metrics::Metrics;
use crate::shared_store::{self, SharedData};
use loopguard_core::config::{Config, Webhook};
use loopguard_core::delay_queue::DelayQueue;
use loopguard_core::events::{self, Alert};
use loopguard_core::hold::HeaderHold;
use loopguard_core::llm::CallCache;
use loopguard_core::slot_table::TableLayout;
use loopguard_core::store::SlotStore;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

/// How often the tick runs while a throttled request waits: the precision
/// of throttle delays.
pub const THROTTLE_TICK_MS: u32 = 5;
/// Distinct unknown route-policy ids remembered (each is logged once).
const MAX_UNKNOWN_ROUTE_POLICIES: usize = 64;
/// Alerts waiting to be sent, per worker; more are dropped and counted.
pub const MAX_QUEUED_ALERTS: usize = 256;
/// Alerts dispatched per tick.
const ALERTS_PER_TICK: usize = 32;
/// Webhook failures are logged at most this often.
const WEBHOOK_FAIL_LOG_INTERVAL_MS: u64 = 10_000;

/// Everything one configured plugin instance needs on the request path.
/// Held by the root context and shared (by `Rc`) with its streams, never in
/// globals, so two plugin instances in one VM never see each other's state.
pub struct Plugin {
    pub config: Config,
    pub store: RefCell<SlotStore<SharedData>>,
    pub metrics: Metrics,
    /// Throttled streams of this worker, released by the tick.
    pub throttled: RefCell<DelayQueue>,
    /// Requests whose headers wait for their body's verdict, and whether
    /// Envoy supports that (`hold_request_headers`).
    hold: RefCell<HeaderHold>,
    /// Tool calls of conversation items this worker has parsed before.
    pub call_cache: RefCell<CallCache>,
    /// Last time a fail-open warning was logged (rate limit).
    pub last_fail_open_log_ms: Cell<u64>,
    /// The root context's id: shared-store calls are made on its behalf.
    pub root_id: u32,
    /// The plugin's name: it keeps deployments apart in the table keys and
    /// in Redis.
    pub name: String,
    /// Last time a Redis store error was logged (rate limit).
    pub last_store_error_log_ms: Cell<u64>,
    /// Makes each Redis hit's log member unique: a random seed per plugin
    /// instance and a counter.
    nonce_seed: u64,
    nonce_counter: Cell<u64>,
    unknown_route_policies: RefCell<Vec<String>>,
    /// The webhook and its HMAC secret (read from the VM environment).
    webhook: Option<(Webhook, Option<Vec<u8>>)>,
    /// Alerts waiting for the tick to send them.
    alerts: RefCell<VecDeque<Alert>>,
    last_webhook_fail_log_ms: Cell<u64>,
    /// The tick is running. Envoy restarts the timer on every period
    /// change, so it is armed once, not on every event (a stream of events
    /// closer than the period would otherwise keep the tick from ever
    /// running).
    tick_armed: Cell<bool>,
}

impl Plugin {
    /// Make sure the tick runs (throttles, alerts, held requests wait).
    fn arm_tick(&self) {
        if !self.tick_armed.get() && abi::set_tick_period_ms(THROTTLE_TICK_MS).is_ok() {
            self.tick_armed.set(true);
        }
    }

    fn disarm_tick(&self) {
        let _ = abi::set_tick_period_ms(0);
        self.tick_armed.set(false);
    }

    /// Hold a stream until `due_ms` and make sure the tick runs.
    pub fn hold(&self, stream: u32, due_ms: u64) {
        let mut q = self.throttled.borrow_mut();
        let before = q.len();
        q.push(stream, due_ms);
        self.metrics
            .throttle_pending
            .add(q.len() as i64 - before as i64);
        self.arm_tick();
    }

    /// A value unique to this hit among every Envoy sharing the store.
    pub fn next_nonce(&self) -> String {
        let n = self.nonce_counter.get().wrapping_add(1);
        self.nonce_counter.set(n);
        format!("{:x}-{n:x}", self.nonce_seed)
    }

    /// Queue a webhook alert for an event (if a webhook is configured). The
    /// tick sends it: a finished stream cannot wait for the call's answer.
    pub fn queue_alert(&self, event: &Value) {
        let Some((_, secret)) = &self.webhook else {
            return;
        };
        let Ok(mut q) = self.alerts.try_borrow_mut() else {
            return;
        };
        if q.len() >= MAX_QUEUED_ALERTS {
            self.metrics.webhook_dropped.inc();
            return;
        }
        q.push_back(events::alert(event, abi::now_ms(), secret.as_deref()));
        self.arm_tick();
    }

    /// Send queued alerts (a few per tick).
    fn send_alerts(&self) {
        let Some((webhook, _)) = &self.webhook else {
            return;
        };
        for _ in 0..ALERTS_PER_TICK {
            let Some(alert) = self.alerts.borrow_mut().pop_front() else {
                return;
            };
            let headers = events::alert_headers(webhook, &alert);
            let sent = proxy_wasm::hostcalls::dispatch_http_call(
                &webhook.cluster,
                headers,
                Some(alert.body.as_bytes()),
                vec![],
                Duration::from_millis(webhook.timeout_ms),
            );
            if let Err(status) = sent {
                self.webhook_failed(&format!(
                    "cannot call cluster \"{}\" ({status:?})",
                    webhook.cluster
                ));
            }
        }
    }

    fn webhook_failed(&self, why: &str) {
        self.metrics.webhook_failed.inc();
        let now = abi::now_ms();
        if now.saturating_sub(self.last_webhook_fail_log_ms.get()) >= WEBHOOK_FAIL_LOG_INTERVAL_MS {
            self.last_webhook_fail_log_ms.set(now);
            log::warn!("webhook alert failed: {why}");
        }
    }

    /// Whether requests with a body are held in the headers phase.
    pub fn holds_headers(&self) -> bool {
        self.hold
            .try_borrow_mut()
            .is_ok_and(|mut h| h.holds(abi::now_ms()))
    }

    /// A request was held in the headers phase: watch it until Envoy is
    /// known to deliver bodies of held requests.
    pub fn watch_held(&self, stream: u32) {
        let watch = match self.hold.try_borrow_mut() {
            Ok(mut h) => h.held(stream, abi::now_ms()),
            Err(_) => false,
        };
        if watch {
            self.arm_tick();
        }
    }

    /// A held request's first body callback; true if its headers are
    /// still held.
    pub fn body_arrived(&self, stream: u32) -> bool {
        self.hold
            .try_borrow_mut()
            .is_ok_and(|mut h| h.body_arrived(stream))
    }

    pub fn forget_held(&self, stream: u32) {
        if let Ok(mut h) = self.hold.try_borrow_mut() {
            h.forget(stream);
        }
    }

    /// Release held requests that got no body in time (Envoy does not
    /// deliver bodies of held requests: `allow_on_headers_stop_iteration`
    /// is not set) and stop holding.
    fn release_unheld(&self, now: u64) {
        let released = match self.hold.try_borrow_mut() {
            Ok(mut h) => h.due(now),
            Err(_) => return,
        };
        if released.turned_off {
            log::error!(
                "hold_request_headers is set, but Envoy delivered no body to {} requests held in the headers phase within {} ms each: set allow_on_headers_stop_iteration: true in the Wasm filter's config (Envoy 1.35+), or remove hold_request_headers and place the buffer filter after loopguard. For the next {} s requests are judged after their headers went upstream; then holding is tried again.",
                loopguard_core::hold::MISSES_TO_STOP,
                loopguard_core::hold::HOLD_PROBE_MS,
                loopguard_core::hold::REPROBE_MS / 1000
            );
        }
        for stream in released.streams {
            self.metrics.hold_released.inc();
            if abi::set_effective_context(stream).is_ok() {
                let _ = abi::resume_request();
            }
        }
    }

    /// Forget a stream whose client left while it was held.
    pub fn release(&self, stream: u32) {
        if let Ok(mut q) = self.throttled.try_borrow_mut() {
            if q.remove(stream) {
                self.metrics.throttle_pending.add(-1);
            }
        }
    }

    /// Log an unknown route policy id the first time it is seen.
    pub fn note_unknown_route_policy(&self, id: &str) {
        let mut seen = self.unknown_route_policies.borrow_mut();
        if seen.iter().any(|s| s == id) || seen.len() >= MAX_UNKNOWN_ROUTE_POLICIES {
            return;
        }
        seen.push(id.to_string());
        log::warn!(
            "route metadata names policy \"{id}\", which this configuration does not have; its requests pass unchecked"
        );
    }
}

pub struct Root {
    id: u32,
    plugin: Option<Rc<Plugin>>,
}

impl Root {
    pub fn new(id: u32) -> Root {
        Root { id, plugin: None }
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        num_headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        let Some(plugin) = &self.plugin else {
            return;
        };
        if num_headers == 0 {
            plugin.webhook_failed("no response (timeout, reset or no healthy host)");
            return;
        }
        let status = abi::http_call_response_header(":status")
            .ok()
            .flatten()
            .and_then(|v| String::from_utf8(v).ok())
            .unwrap_or_default();
        if status.starts_with('2') {
            plugin.metrics.webhook_sent.inc();
        } else {
            plugin.webhook_failed(&format!("receiver answered {status}"));
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        sync_log_level();
        #[cfg(feature = "fault-injection")]
        if crate::faults::configure_fails() {
            log::error!("injected configuration failure");
            return false;
        }
        match configure(plugin_configuration_size, self.id) {
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

    fn on_tick(&mut self) {
        let Some(plugin) = &self.plugin else {
            let _ = abi::set_tick_period_ms(0);
            return;
        };
        // The period is 5 ms; a tick that finds nothing left to do stops it.
        // Alerts first, from the root context itself.
        let _ = abi::set_effective_context(self.id);
        plugin.send_alerts();
        plugin.release_unheld(abi::now_ms());
        let _ = abi::set_effective_context(self.id);
        let due = match plugin.throttled.try_borrow_mut() {
            Ok(mut q) => q.take_due(abi::now_ms()),
            Err(_) => return,
        };
        plugin.metrics.throttle_pending.add(-(due.len() as i64));
        for stream in due {
            // A stream whose client left is gone: nothing to resume.
            if abi::set_effective_context(stream).is_ok() {
                if let Err(e) = abi::resume_request() {
                    log::debug!(
                        "throttled stream {stream} could not resume (host status {})",
                        e.0
                    );
                }
            }
        }
        let _ = abi::set_effective_context(self.id);
        if plugin.throttled.borrow().is_empty()
            && plugin.alerts.borrow().is_empty()
            && !plugin.hold.borrow().watching()
        {
            plugin.disarm_tick();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream::new(context_id, self.plugin.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn configure(size: usize, root_id: u32) -> Result<Plugin, String> {
    let bytes = abi::plugin_configuration(size)
        .map_err(|e| format!("cannot read the plugin configuration (host status {})", e.0))?;
    let config = Config::parse(&bytes).map_err(|e| e.to_string())?;
    let name = plugin_name();
    let webhook = match &config.webhook {
        None => None,
        Some(w) => {
            let secret = match &w.hmac_secret_env {
                None => None,
                Some(var) => match std::env::var(var) {
                    Ok(v) if !v.is_empty() => Some(v.into_bytes()),
                    _ => {
                        return Err(format!(
                            "alerts.webhook.hmac_secret_env names {var}, which is not set in the VM environment (add it to vm_config.environment_variables.host_env_keys)"
                        ))
                    }
                },
            };
            Some((w.clone(), secret))
        }
    };
    let layout = TableLayout::new(config.max_tracked_fingerprints);
    let store = shared_store::open(&name, layout)?;
    let metrics = Metrics::define(&config);
    let hold = RefCell::new(HeaderHold::new(config.hold_request_headers));
    Ok(Plugin {
        config,
        store: RefCell::new(store),
        metrics,
        throttled: RefCell::new(DelayQueue::default()),
        hold,
        call_cache: RefCell::new(CallCache::default()),
        last_fail_open_log_ms: Cell::new(0),
        root_id,
        name,
        last_store_error_log_ms: Cell::new(0),
        nonce_seed: random_seed(),
        nonce_counter: Cell::new(0),
        unknown_route_policies: RefCell::new(Vec::new()),
        webhook,
        alerts: RefCell::new(VecDeque::new()),
        last_webhook_fail_log_ms: Cell::new(0),
        tick_armed: Cell::new(false),
    })
}

/// 64 random bits from the VM (WASI's random source, through the standard
/// library's hash keys).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(abi::now_ms());
    h.finish()
}

/// The plugin's name from Envoy, as the namespace of its counts.
fn plugin_name() -> String {
    let raw = abi::property(&["plugin_name"])
        .ok()
        .flatten()
        .unwrap_or_default();
    loopguard_core::store::plugin_namespace(&raw)
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
