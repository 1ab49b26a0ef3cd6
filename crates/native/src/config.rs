//! One filter configuration (Envoy's `on_http_filter_config_new`, on the
//! main thread): the configuration validated as the Wasm module validates
//! it, the metrics defined, and the relay for calls that belong to no
//! stream (webhook alerts, taking back a failed attempt's hit).
//!
//! Each worker thread runs its own engine over this configuration
//! (`worker.rs`), as each Wasm VM does; what they share is the slot table
//! in process memory (`memory_store.rs`).

use crate::abi::{self, ConfigPtr, SchedulerPtr};
use crate::memory_store;
use crate::metrics::Metrics;
use loopguard_core::config::Config;
use loopguard_core::flow::Engine;
use loopguard_core::state::store::{plugin_namespace, StoreCall};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The event id the relay's scheduler carries.
const RELAY_EVENT: u64 = 1;

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
}

/// Calls from a worker's engine that belong to no stream. Envoy sends a
/// configuration's calls from the main thread only, so a worker leaves
/// them here and wakes the main thread; the answers wait for the worker's
/// next event.
pub struct Relay {
    config: usize,
    scheduler: usize,
    outbox: Mutex<Vec<Outgoing>>,
    in_flight: Mutex<HashMap<u64, (u64, u32)>>,
    inbox: Mutex<HashMap<u64, Vec<RootReply>>>,
    /// Answers waiting in the inbox (read without the lock).
    waiting: AtomicUsize,
}

struct Outgoing {
    worker: u64,
    token: u32,
    call: StoreCall,
}

/// The answer to a relayed call (`status` `None`: none came).
pub struct RootReply {
    pub token: u32,
    pub status: Option<String>,
    pub body: Vec<u8>,
}

impl Relay {
    /// Queue a call from `worker` (its token chosen by the worker).
    pub fn send(&self, worker: u64, token: u32, call: StoreCall) {
        if let Ok(mut out) = self.outbox.lock() {
            out.push(Outgoing {
                worker,
                token,
                call,
            });
        }
        // SAFETY: the scheduler lives as long as the configuration, which
        // outlives its streams (the only callers).
        unsafe { abi::config_scheduler_commit(self.scheduler as SchedulerPtr, RELAY_EVENT) };
    }

    /// On the main thread: send what the workers queued.
    pub fn flush(&self) {
        let queued = match self.outbox.lock() {
            Ok(mut out) => std::mem::take(&mut *out),
            Err(_) => return,
        };
        for o in queued {
            let headers: Vec<(&str, &str)> = o
                .call
                .headers
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect();
            let sent = abi::config_callout(
                self.config as ConfigPtr,
                &abi::Callout {
                    cluster: &o.call.cluster,
                    headers: &headers,
                    body: &o.call.body,
                    timeout_ms: o.call.timeout_ms,
                },
            );
            match sent {
                Ok(id) => {
                    if let Ok(mut f) = self.in_flight.lock() {
                        f.insert(id, (o.worker, o.token));
                    }
                }
                Err(why) => {
                    abi::log(
                        abi::LogLevel::Debug,
                        &format!(
                            "loopguard: Envoy refused a call to cluster \"{}\" ({why})",
                            o.call.cluster
                        ),
                    );
                    self.answer(
                        o.worker,
                        RootReply {
                            token: o.token,
                            status: None,
                            body: Vec::new(),
                        },
                    )
                }
            }
        }
    }

    /// On the main thread: a relayed call's answer.
    pub fn answered(&self, callout: u64, status: Option<String>, body: Vec<u8>) {
        let Some((worker, token)) = self
            .in_flight
            .lock()
            .ok()
            .and_then(|mut f| f.remove(&callout))
        else {
            return;
        };
        self.answer(
            worker,
            RootReply {
                token,
                status,
                body,
            },
        );
    }

    fn answer(&self, worker: u64, reply: RootReply) {
        if let Ok(mut inbox) = self.inbox.lock() {
            inbox.entry(worker).or_default().push(reply);
            self.waiting.fetch_add(1, Ordering::Release);
        }
    }

    /// The answers waiting for `worker` (cheap when there are none).
    pub fn take(&self, worker: u64) -> Vec<RootReply> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let Ok(mut inbox) = self.inbox.lock() else {
            return Vec::new();
        };
        let mine = inbox.remove(&worker).unwrap_or_default();
        self.waiting.fetch_sub(mine.len(), Ordering::Release);
        mine
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
        let trial = Engine::new(
            config,
            &namespace,
            |layout| memory_store::open(&namespace, layout),
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
                inbox: Mutex::new(HashMap::new()),
                waiting: AtomicUsize::new(0),
            },
            alive: AtomicBool::new(true),
            summary,
        })
    }
}
