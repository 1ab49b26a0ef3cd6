//! One configuration on one Envoy worker thread: the core's engine (as one
//! Wasm VM has one), the streams alive on the thread, and the tick.
//!
//! The engine sits behind a lock. Its worker thread takes it for each of
//! its streams' events; the main thread takes it to give the engine the
//! answer to a call relayed through it, and to tick a worker that has no
//! stream left to tick through (alerts still queued). Envoy offers a
//! module no way to run code on a worker thread without one of its
//! streams, so an idle worker's engine runs on the main thread, in turn.
//!
//! Workers are found by their thread through thread-local storage, and by
//! the main thread through their configuration's list.

use crate::abi::{self, FilterPtr, SchedulerPtr};
use crate::config::FilterConfig;
use crate::memory_store::{self, Memory};
use crate::timer;
use loopguard_core::flow::{Effects, Engine};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The engine and the effects buffer its events fill.
pub struct Locked {
    pub engine: Engine<Memory>,
    pub out: Effects,
}

// SAFETY: the engine and every `Request` it has made share reference
// counts that are not atomic (`Rc`). All of them are only touched while
// this lock is held: the engine through the lock, and a stream's request
// only inside its worker's events (which hold the lock) and dropped under
// it (`Worker::close_stream`). The lock orders every access, so moving
// the engine between the worker thread and the main thread is sound.
unsafe impl Send for Locked {}

/// A stream alive on this worker: Envoy's pointer (valid until its
/// destroy hook) and its scheduler, once it needed one (as addresses).
struct Live {
    filter: usize,
    scheduler: Option<usize>,
}

pub struct Worker {
    /// Unique in the process (the clock and the relay address it by it).
    pub id: u64,
    pub config: Arc<FilterConfig>,
    engine: Mutex<Locked>,
    streams: Mutex<HashMap<u32, Live>>,
    next_stream: AtomicU32,
    next_root_token: AtomicU32,
    /// The engine wants ticks.
    tick_armed: AtomicBool,
    /// The stream whose scheduler the clock ticks this worker through
    /// (0: none; the main thread ticks it while it is armed).
    driver: AtomicU32,
}

static NEXT_WORKER: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static WORKERS: RefCell<Vec<Arc<Worker>>> = const { RefCell::new(Vec::new()) };
}

/// This thread's engine for `config`, made the first time.
pub fn for_config(config: &Arc<FilterConfig>) -> Option<Arc<Worker>> {
    WORKERS.with(|w| {
        let mut workers = w.try_borrow_mut().ok()?;
        if let Some(found) = workers.iter().find(|x| x.config.id == config.id) {
            return Some(found.clone());
        }
        // Engines of configurations Envoy has destroyed go now.
        workers.retain(|x| x.config.alive.load(Ordering::Acquire));
        let worker = Arc::new(Worker::new(config.clone())?);
        config.adopt(&worker);
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
            engine: Mutex::new(Locked {
                engine,
                out: Effects::with_capacity(16),
            }),
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU32::new(1),
            next_root_token: AtomicU32::new(1),
            tick_armed: AtomicBool::new(false),
            driver: AtomicU32::new(0),
        })
    }

    /// The engine, locked (`None` if a panic left it unusable).
    pub fn lock(&self) -> Option<MutexGuard<'_, Locked>> {
        self.engine.lock().ok()
    }

    /// A new stream's id, and it counted as alive.
    pub fn open_stream(&self, filter: FilterPtr) -> u32 {
        let mut id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut s) = self.streams.lock() {
            s.insert(
                id,
                Live {
                    filter: filter as usize,
                    scheduler: None,
                },
            );
        }
        id
    }

    /// The stream's scheduler, made the first time (on its worker thread).
    pub fn scheduler_of(&self, stream: u32) -> Option<SchedulerPtr> {
        let mut streams = self.streams.lock().ok()?;
        let live = streams.get_mut(&stream)?;
        if live.scheduler.is_none() {
            live.scheduler = abi::scheduler_new(live.filter as FilterPtr).map(|s| s as usize);
        }
        live.scheduler.map(|s| s as SchedulerPtr)
    }

    /// The stream is gone (Envoy's destroy hook, on the worker thread):
    /// `forget` drops what the engine gave it, under the lock; its
    /// scheduler is deleted; if it drove the tick, another stream of this
    /// worker (or the main thread) takes over.
    pub fn close_stream(&self, stream: u32, forget: impl FnOnce()) {
        if let Some(_guard) = self.lock() {
            forget();
        }
        let gone = self.streams.lock().ok().and_then(|mut s| s.remove(&stream));
        if self.driver.load(Ordering::Acquire) == stream {
            timer::stop(self.id);
            self.driver.store(0, Ordering::Release);
            if self.tick_armed.load(Ordering::Acquire) {
                self.find_driver(None);
            }
        }
        if let Some(s) = gone.and_then(|l| l.scheduler) {
            // SAFETY: removed from the clock (above) before deletion, and
            // deleted once: the stream's entry is gone.
            unsafe { abi::scheduler_delete(s as SchedulerPtr) };
        }
    }

    /// The engine wants ticks: the clock ticks this worker through
    /// `current` (the stream at hand, on the worker thread) or another
    /// live stream, else through the main thread.
    pub fn arm_tick(&self, current: Option<u32>) {
        self.tick_armed.store(true, Ordering::Release);
        if self.driver.load(Ordering::Acquire) == 0 {
            self.find_driver(current);
        }
    }

    pub fn stop_tick(&self) {
        self.tick_armed.store(false, Ordering::Release);
        self.driver.store(0, Ordering::Release);
        timer::stop(self.id);
    }

    /// Whether the engine wants ticks.
    pub fn ticking(&self) -> bool {
        self.tick_armed.load(Ordering::Acquire)
    }

    /// Whether the tick is wanted but only the main thread drives it: a
    /// stream of the worker's own takes over.
    pub fn needs_driver(&self) -> bool {
        self.tick_armed.load(Ordering::Acquire) && self.driver.load(Ordering::Acquire) == 0
    }

    fn find_driver(&self, prefer: Option<u32>) {
        let on_worker = prefer.is_some();
        let candidates: Vec<u32> = match self.streams.lock() {
            // Schedulers are made on the worker thread only.
            Ok(s) if on_worker => prefer.into_iter().chain(s.keys().copied()).collect(),
            Ok(s) => s
                .iter()
                .filter(|(_, l)| l.scheduler.is_some())
                .map(|(id, _)| *id)
                .collect(),
            Err(_) => Vec::new(),
        };
        for stream in candidates {
            let s = if on_worker {
                self.scheduler_of(stream)
            } else {
                self.streams
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&stream).and_then(|l| l.scheduler))
                    .map(|s| s as SchedulerPtr)
            };
            if let Some(s) = s {
                self.driver.store(stream, Ordering::Release);
                timer::drive(self.id, timer::Driver::Stream(s));
                return;
            }
        }
        timer::drive(self.id, timer::Driver::Main(self.config.relay.scheduler()));
    }

    /// Resume a paused stream of this worker: through its own scheduler, so
    /// that it continues in an event of its own, never inside another
    /// stream's hook (or on the main thread).
    pub fn resume(&self, stream: u32, on_worker: bool) {
        let s = if on_worker {
            self.scheduler_of(stream)
        } else {
            self.streams
                .lock()
                .ok()
                .and_then(|m| m.get(&stream).and_then(|l| l.scheduler))
                .map(|s| s as SchedulerPtr)
        };
        if let Some(s) = s {
            // SAFETY: the scheduler belongs to a live stream (its entry is
            // removed before it is deleted, on the worker thread, which
            // commits nothing then).
            unsafe { abi::scheduler_commit(s, crate::stream::RESUME_EVENT) };
        }
    }

    /// On the main thread: run `event` on this worker's engine and carry
    /// out what it asks (no stream's effects come from these events).
    pub fn on_main(&self, now: u64, event: impl FnOnce(&mut Engine<Memory>, &mut Effects)) {
        let Some(mut guard) = self.lock() else {
            return;
        };
        let l = &mut *guard;
        event(&mut l.engine, &mut l.out);
        crate::effects::settle(
            self,
            l,
            crate::effects::At::MAIN,
            now,
            None,
            loopguard_core::flow::Step::Continue,
        );
        l.out.clear();
    }

    /// Make sure a stream that pauses can be resumed from anywhere (its
    /// scheduler is made now, on its worker thread).
    pub fn can_resume(&self, stream: u32) {
        let _ = self.scheduler_of(stream);
    }

    /// A token for a call relayed through the main thread.
    pub fn root_token(&self) -> u32 {
        let t = self.next_root_token.fetch_add(1, Ordering::Relaxed);
        if t == 0 {
            self.next_root_token.fetch_add(1, Ordering::Relaxed)
        } else {
            t
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
