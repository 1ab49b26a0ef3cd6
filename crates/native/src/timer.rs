//! The tick. Envoy's dynamic-module ABI has schedulers (post an event to a
//! stream's worker thread, from any thread) but no timers, so one module
//! thread is the clock: every [`TICK_MS`] it commits the tick event to each
//! worker's driving stream (a stream of that worker, chosen by the worker
//! while its engine wants ticks). It sleeps while no worker wants ticks.

use crate::abi::{self, SchedulerPtr};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// How often the tick runs while something waits: the precision of
/// throttle delays (as in the Wasm host).
pub const TICK_MS: u64 = 5;
/// The event id of a tick.
pub const TICK_EVENT: u64 = 1;

/// A scheduler pointer crossing to the clock thread. Envoy documents
/// commits as safe from any thread; deletion is serialised with them by
/// the drivers' lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Sched(usize);

struct Clock {
    drivers: Mutex<HashMap<u64, Sched>>,
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

fn run() {
    let c = clock();
    loop {
        let Ok(mut drivers) = c.drivers.lock() else {
            return;
        };
        while drivers.is_empty() {
            drivers = match c.wake.wait(drivers) {
                Ok(d) => d,
                Err(_) => return,
            };
        }
        for s in drivers.values() {
            // SAFETY: a registered scheduler lives until it is removed
            // under this lock (see `stop`).
            unsafe { abi::scheduler_commit(s.0 as SchedulerPtr, TICK_EVENT) };
        }
        drop(drivers);
        std::thread::sleep(Duration::from_millis(TICK_MS));
    }
}

/// Tick `worker` through `scheduler` from now on (replacing its driver).
pub fn drive(worker: u64, scheduler: SchedulerPtr) {
    let c = clock();
    if let Ok(mut d) = c.drivers.lock() {
        d.insert(worker, Sched(scheduler as usize));
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
