//! One filter configuration (Envoy's `on_http_filter_config_new`, on the
//! main thread): the configuration validated as the Wasm module validates
//! it, the metrics defined, and the relay for calls that belong to no
//! stream (webhook alerts, taking back a failed attempt's hit), whose
//! answers the main thread gives to the worker's engine at once.
//!
//! Each worker thread runs its own engine over this configuration
//! (`worker.rs`), as each Wasm VM does; what they share is the slot table
//! in process memory (`memory_store.rs`).

use crate::abi::{self, ConfigPtr, SchedulerPtr};
use crate::metrics::Metrics;
use crate::timer::now_ms;
use crate::worker::Worker;
use loopguard_core::host::{plugin_namespace, CallReply, Config, Engine, InProcess, StoreCall};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The main-thread event that sends the relayed calls (any other event id
/// is a worker's id: tick that worker).
const RELAY_EVENT: u64 = 0;

pub struct FilterConfig {
    /// Unique in the process: workers find their engine by it.
    pub id: u64,
    /// The configuration's JSON, parsed again by each worker's engine.
    pub json: Vec<u8>,
    pub namespace: String,
    pub metrics: Metrics,
    pub relay: Relay,
    /// Envoy destroyed the configuration: workers drop their engines.
    pub alive: AtomicBool,
    /// The line logged when the configuration is in place.
    pub summary: String,
    /// Every worker's engine for this configuration, for the main thread.
    workers: Mutex<HashMap<u64, Weak<Worker>>>,
}

/// Calls from a worker's engine that belong to no stream. Envoy sends a
/// configuration's calls from the main thread only, so a worker leaves
/// them here and wakes the main thread.
pub struct Relay {
    config: usize,
    scheduler: usize,
    /// Calls queued, each with its worker and token.
    outbox: Mutex<Vec<(u64, u32, StoreCall)>>,
    /// The (worker, token) of each call sent, by callout id.
    in_flight: Mutex<HashMap<u64, (u64, u32)>>,
}

impl Relay {
    /// Queue a call from `worker` (its token chosen by the worker).
    pub fn send(&self, worker: u64, token: u32, call: StoreCall) {
        if let Ok(mut out) = self.outbox.lock() {
            out.push((worker, token, call));
        }
        // SAFETY: the scheduler lives as long as the configuration, which
        // outlives its streams (the only callers).
        unsafe { abi::config_scheduler_commit(self.scheduler as SchedulerPtr, RELAY_EVENT) };
    }

    /// The configuration's scheduler (the main thread's events).
    pub fn scheduler(&self) -> SchedulerPtr {
        self.scheduler as SchedulerPtr
    }

    /// On the main thread: send what the workers queued; the calls Envoy
    /// refuses, as (worker, token) with no answer.
    fn flush(&self) -> Vec<(u64, u32)> {
        let queued = self.outbox.lock().map(|mut o| std::mem::take(&mut *o));
        let mut refused = Vec::new();
        for (worker, token, call) in queued.unwrap_or_default() {
            match abi::callout(self.config as ConfigPtr, true, &call) {
                Ok(id) => {
                    if let Ok(mut f) = self.in_flight.lock() {
                        f.insert(id, (worker, token));
                    }
                }
                Err(why) => {
                    let cluster = &call.cluster;
                    let line =
                        format!("loopguard: Envoy refused a call to cluster \"{cluster}\" ({why})");
                    abi::log(abi::LogLevel::Debug, &line);
                    refused.push((worker, token));
                }
            }
        }
        refused
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // SAFETY: created in `FilterConfig::new`, deleted once, here.
        unsafe { abi::config_scheduler_delete(self.scheduler as SchedulerPtr) };
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl FilterConfig {
    /// Validate the configuration (as the Wasm module does, plus a trial
    /// engine: a webhook secret that is not set fails here) and define its
    /// metrics. `Err` names the policy and field.
    pub fn new(envoy: ConfigPtr, name: &[u8], json: &[u8]) -> Result<FilterConfig, String> {
        let config = Config::parse(json).map_err(|e| e.to_string())?;
        let namespace = plugin_namespace(name);
        // A trial engine over a throwaway table: it checks what only an
        // engine checks (a webhook secret that is not set) without joining
        // the shared table's spending ledger.
        let trial = Engine::new(
            config,
            &namespace,
            |_| Ok(InProcess::default()),
            |var| std::env::var(var).ok(),
            0,
        )?;
        let metrics = Metrics::define(envoy, trial.registry());
        let summary = trial.summary();
        let scheduler = abi::config_scheduler_new(envoy)
            .ok_or("Envoy gave no scheduler for the configuration")?;
        Ok(FilterConfig {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            json: json.to_vec(),
            namespace,
            metrics,
            relay: Relay {
                config: envoy as usize,
                scheduler: scheduler as usize,
                outbox: Mutex::new(Vec::new()),
                in_flight: Mutex::new(HashMap::new()),
            },
            alive: AtomicBool::new(true),
            summary,
            workers: Mutex::new(HashMap::new()),
        })
    }

    /// A worker's engine made for this configuration.
    pub fn adopt(&self, worker: &Arc<Worker>) {
        if let Ok(mut w) = self.workers.lock() {
            w.retain(|_, x| x.strong_count() > 0);
            w.insert(worker.id, Arc::downgrade(worker));
        }
    }

    pub fn worker_ids(&self) -> Vec<u64> {
        self.workers
            .lock()
            .map(|w| w.keys().copied().collect())
            .unwrap_or_default()
    }

    fn worker(&self, id: u64) -> Option<Arc<Worker>> {
        self.workers.lock().ok()?.get(&id)?.upgrade()
    }

    /// A main-thread event: send the relayed calls, or tick an idle worker.
    pub fn on_main(&self, event: u64) {
        let now = now_ms();
        if event == RELAY_EVENT {
            for (worker, token) in self.relay.flush() {
                if let Some(w) = self.worker(worker) {
                    w.on_main(now, |e, out| e.on_root_reply(token, None, &[], now, out));
                }
            }
        } else if let Some(w) = self.worker(event) {
            w.on_main(now, |e, out| e.on_tick(now, out));
        }
    }

    /// On the main thread: a relayed call's answer, to its worker's engine
    /// (`None`: the call or its worker is unknown or gone).
    pub fn answered(&self, callout: u64, reply: CallReply) -> Option<()> {
        let (worker, token) = self.relay.in_flight.lock().ok()?.remove(&callout)?;
        let w = self.worker(worker)?;
        let now = now_ms();
        w.on_main(now, |e, out| {
            e.on_root_reply(token, reply.status.as_deref(), &reply.body, now, out)
        });
        Some(())
    }
}
