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
use crate::effects::{settle, At};
use crate::memory_store::{self, Memory};
use crate::timer;
use loopguard_core::host::{random_seed, Config, Effects, Engine, Step};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// (0: none; the main thread ticks it while it is armed). Its lock
    /// orders every change of driver with the clock and with closing
    /// streams (lock order: driver, then streams).
    driver: Mutex<u32>,
}

impl Drop for Worker {
    /// No tick for a worker that is gone (its configuration's scheduler may
    /// be deleted next).
    fn drop(&mut self) {
        timer::stop(self.id);
    }
}

/// The engine and the effects buffer its events fill, behind the worker's
/// lock.
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
        let engine = Engine::new(
            Config::parse(&config.json).ok()?,
            &config.namespace,
            |layout| memory_store::open(&config.namespace, layout),
            |var| std::env::var(var).ok(),
            random_seed(timer::now_ms),
        )
        .map_err(|why| abi::log(abi::LogLevel::Error, &format!("loopguard: {why}")))
        .ok()?;
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
            driver: Mutex::new(0),
        })
    }

    /// The engine, locked. A panic while it was locked (a bug) does not
    /// turn loopguard off on this worker: it is logged, and the engine goes
    /// on as the panic left it (memory-safe; the request it happened in got
    /// its 500).
    pub fn lock(&self) -> MutexGuard<'_, Locked> {
        self.engine.lock().unwrap_or_else(|poisoned| {
            abi::log(
                abi::LogLevel::Critical,
                "loopguard: the engine goes on after a panic in an earlier request",
            );
            self.engine.clear_poison();
            poisoned.into_inner()
        })
    }

    /// A new stream's id, and it counted as alive.
    pub fn open_stream(&self, filter: FilterPtr) -> u32 {
        let id = nonzero(&self.next_stream);
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

    /// Make sure a stream can be resumed and can drive the tick: its
    /// scheduler, made now (only on its worker thread, in its event).
    pub fn can_resume(&self, stream: u32) {
        if let Ok(mut streams) = self.streams.lock() {
            if let Some(live) = streams.get_mut(&stream).filter(|l| l.scheduler.is_none()) {
                live.scheduler = abi::scheduler_new(live.filter as FilterPtr).map(|s| s as usize);
            }
        }
    }

    /// The stream is gone (Envoy's destroy hook, on the worker thread):
    /// `forget` drops what the engine gave it, under the engine's lock. Its
    /// entry goes and, if it drove the tick, another stream (or the main
    /// thread) takes over, under the driver's lock; its scheduler is
    /// deleted last, when nothing can commit to it any more.
    pub fn close_stream(&self, stream: u32, forget: impl FnOnce()) {
        let engine = self.lock();
        forget();
        drop(engine);
        let gone = {
            let Ok(mut driver) = self.driver.lock() else {
                return;
            };
            let gone = self.streams.lock().ok().and_then(|mut s| s.remove(&stream));
            if *driver == stream {
                timer::stop(self.id);
                *driver = 0;
                if self.tick_armed.load(Ordering::Acquire) {
                    self.find_driver(&mut driver, None);
                }
            }
            gone
        };
        if let Some(s) = gone.and_then(|l| l.scheduler) {
            // SAFETY: out of the streams (resumes commit under their lock)
            // and not the clock's driver (stopped under the drivers' lock):
            // nothing commits to it any more; deleted once.
            unsafe { abi::scheduler_delete(s as SchedulerPtr) };
        }
    }

    /// The engine wants ticks: the clock ticks this worker through
    /// `current` (the stream at hand, on the worker thread) or another
    /// live stream, else through the main thread.
    pub fn arm_tick(&self, current: Option<u32>) {
        self.tick_armed.store(true, Ordering::Release);
        if let Ok(mut driver) = self.driver.lock() {
            if *driver == 0 {
                self.find_driver(&mut driver, current);
            }
        }
    }

    pub fn stop_tick(&self) {
        self.tick_armed.store(false, Ordering::Release);
        if let Ok(mut driver) = self.driver.lock() {
            *driver = 0;
            timer::stop(self.id);
        }
    }

    pub fn ticking(&self) -> bool {
        self.tick_armed.load(Ordering::Acquire)
    }

    /// Whether the tick is wanted but no stream of the worker drives it
    /// (the main thread does): a stream of the worker's own takes over.
    pub fn needs_driver(&self) -> bool {
        self.tick_armed.load(Ordering::Acquire) && self.driver.lock().is_ok_and(|d| *d == 0)
    }

    /// Choose what ticks this worker (the driver's lock held): `prefer`
    /// (the stream at hand, whose scheduler may be made now), else a live
    /// stream that has a scheduler, else the main thread.
    fn find_driver(&self, driver: &mut u32, prefer: Option<u32>) {
        if let Some(stream) = prefer {
            self.can_resume(stream);
        }
        let found = self.streams.lock().ok().and_then(|m| {
            prefer
                .and_then(|p| m.get(&p).and_then(|l| l.scheduler).map(|s| (p, s)))
                .or_else(|| m.iter().find_map(|(id, l)| l.scheduler.map(|s| (*id, s))))
        });
        match found {
            Some((stream, s)) => {
                *driver = stream;
                timer::drive(self.id, timer::Driver::Stream(s as SchedulerPtr));
            }
            None => {
                *driver = 0;
                if self.config.alive.load(Ordering::Acquire) {
                    timer::drive(self.id, timer::Driver::Main(self.config.relay.scheduler()));
                }
            }
        }
    }

    /// Resume a paused stream of this worker: through its own scheduler, so
    /// that it continues in an event of its own, never inside another
    /// stream's hook (or on the main thread). Committed under the streams'
    /// lock, so its scheduler cannot be deleted meanwhile.
    pub fn resume(&self, stream: u32) {
        if let Ok(streams) = self.streams.lock() {
            if let Some(s) = streams.get(&stream).and_then(|l| l.scheduler) {
                // SAFETY: a live stream's scheduler (deleted only after its
                // entry is removed, under this lock).
                unsafe { abi::scheduler_commit(s as SchedulerPtr, crate::stream::RESUME_EVENT) };
            }
        }
    }

    /// On the main thread: run `event` on this worker's engine and carry
    /// out what it asks (no stream's effects come from these events).
    pub fn on_main(&self, now: u64, event: impl FnOnce(&mut Engine<Memory>, &mut Effects)) {
        let mut guard = self.lock();
        let l = &mut *guard;
        event(&mut l.engine, &mut l.out);
        let _ = settle(self, l, At::default(), now, None, Step::Continue);
        l.out.clear();
    }

    /// A token for a call relayed through the main thread.
    pub fn root_token(&self) -> u32 {
        nonzero(&self.next_root_token)
    }
}

/// The next number of `counter`, never 0 (skipped when it wraps).
fn nonzero(counter: &AtomicU32) -> u32 {
    match counter.fetch_add(1, Ordering::Relaxed) {
        0 => counter.fetch_add(1, Ordering::Relaxed),
        n => n,
    }
}
