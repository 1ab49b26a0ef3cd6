//! The root context: configuration, the tick, and the answers to alerts.
//! Each Envoy worker has its own VM and root context; the fingerprint table
//! in shared data is what they have in common.

use crate::abi;
use crate::effects::WasmHost;
use crate::http::Stream;
use crate::metrics::Metrics;
use crate::shared_store::{self, SharedData};
use loopguard_core::host::{
    plugin_namespace, random_seed, Config, Effects, Engine, Request, Step, TICK_MS,
};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// One configured plugin instance: the core's engine and what the host
/// needs to carry out its effects. Held by the root context and shared
/// (by `Rc`) with its streams, never in globals, so two plugin instances
/// in one VM never see each other's state.
pub struct Plugin {
    pub engine: RefCell<Engine<SharedData>>,
    pub metrics: Metrics,
    /// Store calls and alerts are sent on its behalf.
    pub root_id: u32,
    /// Envoy restarts the timer on every period change, so the tick is
    /// armed once, not on every event.
    tick_armed: Cell<bool>,
    /// The engine's effects buffer, reused by every event.
    scratch: RefCell<Effects>,
}

impl Plugin {
    pub fn arm_tick(&self) {
        if !self.tick_armed.get() && abi::set_tick_period_ms(TICK_MS).is_ok() {
            self.tick_armed.set(true);
        }
    }

    pub fn disarm_tick(&self) {
        let _ = abi::set_tick_period_ms(0);
        self.tick_armed.set(false);
    }

    /// Run `event` on the engine in the context `home` and carry out its
    /// effects through the core's driver (`request`: the stream's, if
    /// any): what the request does next.
    pub fn run(
        &self,
        home: u32,
        mut request: Option<&mut Request>,
        event: impl FnOnce(&mut Engine<SharedData>, Option<&mut Request>, &mut Effects) -> Step,
    ) -> Step {
        // The reused buffer (re-entered: a new one), given back empty.
        let mut out = self
            .scratch
            .try_borrow_mut()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        // Effects kept until the engine is no longer borrowed (a local
        // reply, a resumed stream) are rare: their buffer starts empty.
        let mut host = WasmHost::new(self, home);
        let step = match self.engine.try_borrow_mut() {
            Ok(mut engine) => {
                let step = event(&mut engine, request.as_deref_mut(), &mut out);
                engine.drive(&mut host, request, &mut out, step)
            }
            Err(_) => Step::Continue,
        };
        let replied = host.finish();
        out.clear();
        if let Ok(mut s) = self.scratch.try_borrow_mut() {
            *s = out;
        }
        if replied {
            step
        } else {
            Step::Continue
        }
    }
}

pub struct Root {
    pub id: u32,
    /// Set once configured.
    pub plugin: Option<Rc<Plugin>>,
}

impl Context for Root {
    /// The answer to a call sent from the root context (an alert, a
    /// take-back); a stream's store calls are answered to the stream.
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(plugin) = &self.plugin else {
            return;
        };
        let reply = abi::http_call_reply(num_headers, body_size);
        let now = abi::now_ms();
        plugin.run(plugin.root_id, None, |engine, _, out| {
            engine.on_root_reply(token, reply.status.as_deref(), &reply.body, now, out);
            Step::Continue
        });
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
            Ok(mut plugin) => {
                log::info!("{}", plugin.engine.get_mut().summary());
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
        let _ = abi::set_effective_context(self.id);
        let now = abi::now_ms();
        plugin.run(plugin.root_id, None, |engine, _, out| {
            engine.on_tick(now, out);
            Step::Continue
        });
        let _ = abi::set_effective_context(self.id);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream::new(context_id, self.plugin.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn configure(size: usize, root_id: u32) -> Result<Plugin, String> {
    let bytes = abi::buffer(abi::BUFFER_PLUGIN_CONFIGURATION, size)
        .map_err(|e| format!("cannot read the plugin configuration (host status {})", e.0))?;
    let config = Config::parse(&bytes).map_err(|e| e.to_string())?;
    let raw_name = abi::property(&["plugin_name"]).unwrap_or_default();
    let namespace = plugin_namespace(&raw_name);
    let engine = Engine::new(
        config,
        &namespace,
        |layout| shared_store::open(&namespace, layout),
        |var| std::env::var(var).ok(),
        random_seed(abi::now_ms),
    )?;
    let metrics = Metrics::define(engine.registry());
    Ok(Plugin {
        engine: RefCell::new(engine),
        metrics,
        root_id,
        tick_armed: Cell::new(false),
        scratch: RefCell::new(Effects::with_capacity(16)),
    })
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
