//! One configuration on one Envoy worker thread: the core's engine (as one
//! Wasm VM has one), the streams alive on the thread, and the tick.
//!
//! Engines live in thread-local storage, found by their configuration's
//! id; an engine whose configuration Envoy destroyed is dropped the next
//! time its thread looks for one.

use crate::abi::{self, FilterPtr, SchedulerPtr};
use crate::config::FilterConfig;
use crate::memory_store::{self, Memory};
use crate::timer;
use loopguard_core::flow::{Effects, Engine};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A stream alive on this worker: Envoy's pointer (valid until its
/// destroy hook) and its scheduler, once it needed one.
pub struct Live {
    pub filter: FilterPtr,
    pub scheduler: Option<SchedulerPtr>,
}

pub struct Worker {
    /// Unique in the process (the clock and the relay address it by it).
    pub id: u64,
    pub config: Arc<FilterConfig>,
    pub engine: RefCell<Engine<Memory>>,
    scratch: RefCell<Effects>,
    pub streams: RefCell<HashMap<u32, Live>>,
    next_stream: Cell<u32>,
    next_root_token: Cell<u32>,
    /// The engine wants ticks.
    tick_armed: Cell<bool>,
    /// The stream whose scheduler the clock commits ticks to.
    driver: Cell<Option<u32>>,
}

static NEXT_WORKER: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static WORKERS: RefCell<Vec<Rc<Worker>>> = const { RefCell::new(Vec::new()) };
}

/// This thread's engine for `config`, made the first time.
pub fn for_config(config: &Arc<FilterConfig>) -> Option<Rc<Worker>> {
    WORKERS.with(|w| {
        let mut workers = w.try_borrow_mut().ok()?;
        if let Some(found) = workers.iter().find(|x| x.config.id == config.id) {
            return Some(found.clone());
        }
        // Engines of configurations Envoy has destroyed go now.
        workers.retain(|x| x.config.alive.load(Ordering::Acquire));
        let worker = Rc::new(Worker::new(config.clone())?);
        workers.push(worker.clone());
        Some(worker)
    })
}

impl Worker {
    fn new(config: Arc<FilterConfig>) -> Option<Worker> {
        let parsed = loopguard_core::config::Config::parse(&config.json).ok()?;
        let namespace = config.namespace.clone();
        let engine = Engine::new(
            parsed,
            &namespace,
            |layout| memory_store::open(&namespace, layout),
            |var| std::env::var(var).ok(),
            random_seed(),
        );
        let engine = match engine {
            Ok(e) => e,
            Err(why) => {
                abi::log(abi::LogLevel::Error, &format!("loopguard: {why}"));
                return None;
            }
        };
        Some(Worker {
            id: NEXT_WORKER.fetch_add(1, Ordering::Relaxed),
            config,
            engine: RefCell::new(engine),
            scratch: RefCell::new(Effects::with_capacity(16)),
            streams: RefCell::new(HashMap::new()),
            next_stream: Cell::new(1),
            next_root_token: Cell::new(1),
            tick_armed: Cell::new(false),
            driver: Cell::new(None),
        })
    }

    /// A new stream's id, and it counted as alive.
    pub fn open_stream(&self, filter: FilterPtr) -> u32 {
        let id = self.next_stream.get();
        self.next_stream.set(id.wrapping_add(1).max(1));
        if let Ok(mut s) = self.streams.try_borrow_mut() {
            s.insert(
                id,
                Live {
                    filter,
                    scheduler: None,
                },
            );
        }
        id
    }

    /// The stream's scheduler, made the first time.
    pub fn scheduler_of(&self, stream: u32) -> Option<SchedulerPtr> {
        let mut streams = self.streams.try_borrow_mut().ok()?;
        let live = streams.get_mut(&stream)?;
        if live.scheduler.is_none() {
            live.scheduler = abi::scheduler_new(live.filter);
        }
        live.scheduler
    }

    /// The stream is gone (Envoy's destroy hook): its scheduler is deleted;
    /// if it drove the tick, another stream of this worker takes over.
    pub fn close_stream(&self, stream: u32) {
        let gone = self
            .streams
            .try_borrow_mut()
            .ok()
            .and_then(|mut s| s.remove(&stream));
        if self.driver.get() == Some(stream) {
            timer::stop(self.id);
            self.driver.set(None);
            if self.tick_armed.get() {
                self.find_driver(None);
            }
        }
        if let Some(s) = gone.and_then(|l| l.scheduler) {
            // SAFETY: removed from the clock (above) before deletion, and
            // deleted once: the stream's entry is gone.
            unsafe { abi::scheduler_delete(s) };
        }
    }

    /// The engine wants ticks: the clock ticks this worker through
    /// `current` (the stream at hand) or another live stream.
    pub fn arm_tick(&self, current: Option<u32>) {
        self.tick_armed.set(true);
        if self.driver.get().is_none() {
            self.find_driver(current);
        }
    }

    pub fn stop_tick(&self) {
        self.tick_armed.set(false);
        if self.driver.take().is_some() {
            timer::stop(self.id);
        }
    }

    /// Whether the tick is wanted but no stream drives it (all ended):
    /// the next stream takes over.
    pub fn needs_driver(&self) -> bool {
        self.tick_armed.get() && self.driver.get().is_none()
    }

    fn find_driver(&self, prefer: Option<u32>) {
        let candidates: Vec<u32> = match self.streams.try_borrow() {
            Ok(s) => prefer.into_iter().chain(s.keys().copied()).collect(),
            Err(_) => return,
        };
        for stream in candidates {
            if let Some(s) = self.scheduler_of(stream) {
                self.driver.set(Some(stream));
                timer::drive(self.id, s);
                return;
            }
        }
    }

    /// Resume a paused stream of this worker: through its own scheduler, so
    /// that it continues in an event of its own, never inside another
    /// stream's hook.
    pub fn resume(&self, stream: u32) {
        if let Some(s) = self.scheduler_of(stream) {
            // SAFETY: the scheduler belongs to a live stream of this thread.
            unsafe { abi::scheduler_commit(s, crate::stream::RESUME_EVENT) };
        }
    }

    /// A token for a call relayed through the main thread.
    pub fn root_token(&self) -> u32 {
        let t = self.next_root_token.get();
        self.next_root_token.set(t.wrapping_add(1).max(1));
        t
    }

    /// The effects buffer (empty), to give back with [`Worker::put_back`].
    pub fn take_scratch(&self) -> Effects {
        self.scratch
            .try_borrow_mut()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }

    pub fn put_back(&self, mut effects: Effects) {
        effects.clear();
        if let Ok(mut s) = self.scratch.try_borrow_mut() {
            *s = effects;
        }
    }

    /// The relayed calls' answers that arrived for this worker, given to
    /// the engine.
    pub fn collect_answers(&self, now: u64, out: &mut Effects) {
        let answers = self.config.relay.take(self.id);
        if answers.is_empty() {
            return;
        }
        if let Ok(mut engine) = self.engine.try_borrow_mut() {
            for a in answers {
                engine.on_root_reply(a.token, a.status.as_deref(), &a.body, now, out);
            }
        }
    }
}

/// 64 random bits (the standard library's hash keys come from the OS).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_ms());
    h.finish()
}

/// Wall-clock milliseconds (the clock the Wasm host reads too).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
