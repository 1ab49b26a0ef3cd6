//! The tick. Envoy's dynamic-module ABI has schedulers (post an event to a
//! stream's worker thread, or to the main thread, from any thread) but no
//! timers, so one module thread is the clock: every [`TICK_MS`] it commits
//! a tick to each worker whose engine wants ticks, through the scheduler
//! of one of its streams or, while it has none, the configuration's (the
//! main thread then ticks that worker's engine). It sleeps while no
//! worker wants ticks.

use crate::abi::{self, SchedulerPtr};
use loopguard_core::host::TICK_MS;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// The event id of a tick.
pub const TICK_EVENT: u64 = 1;

/// What ticks a worker: a stream's scheduler (the tick runs on the
/// worker thread) or its configuration's (on the main thread). Envoy
/// documents commits as safe from any thread; a stream's scheduler is
/// deleted only after `stop`, which the drivers' lock orders with commits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Driver {
    Stream(SchedulerPtr),
    Main(SchedulerPtr),
}

// SAFETY: only the address crosses threads; see `Driver`.
unsafe impl Send for Driver {}

struct Clock {
    drivers: Mutex<HashMap<u64, Driver>>,
    wake: Condvar,
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let started = std::thread::Builder::new()
            .name("loopguard-tick".into())
            .spawn(run);
        if let Err(e) = started {
            abi::log(
                abi::LogLevel::Error,
                &format!("loopguard: cannot start the tick thread ({e}); throttled requests resume at the next request"),
            );
        }
        Clock {
            drivers: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
        }
    })
}

/// The clock thread (it ends only if a lock is poisoned).
fn run() -> Option<()> {
    let c = clock();
    loop {
        let mut drivers = c.drivers.lock().ok()?;
        while drivers.is_empty() {
            drivers = c.wake.wait(drivers).ok()?;
        }
        for (worker, d) in drivers.iter() {
            // SAFETY: a registered scheduler lives until it is removed
            // under this lock (see `stop`); a configuration's lives as
            // long as the configuration, whose workers unregister first.
            match *d {
                Driver::Stream(s) => unsafe { abi::scheduler_commit(s, TICK_EVENT) },
                Driver::Main(s) => unsafe { abi::config_scheduler_commit(s, *worker) },
            }
        }
        drop(drivers);
        std::thread::sleep(Duration::from_millis(TICK_MS.into()));
    }
}

/// Tick `worker` through `driver` from now on (replacing its driver). On
/// the main thread, the event id is the worker's id.
pub fn drive(worker: u64, driver: Driver) {
    let c = clock();
    if let Ok(mut d) = c.drivers.lock() {
        d.insert(worker, driver);
        c.wake.notify_one();
    }
}

/// Stop ticking `worker`. Once this returns, no commit to its driver's
/// scheduler is in flight, and it may be deleted.
pub fn stop(worker: u64) {
    if let Ok(mut d) = clock().drivers.lock() {
        d.remove(&worker);
    }
}

/// Wall-clock milliseconds (the clock the Wasm host reads too).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
