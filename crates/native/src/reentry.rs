//! Whether this thread is inside a stream's event (the worker's engine
//! locked): Envoy may call back into the module from a callback the event
//! makes (a local reply ends the stream at once), and such a call must not
//! take the lock again.

/// Whether this thread is inside a stream's event (the engine locked), and
/// whether Envoy ended that stream meanwhile.
pub struct Running;

thread_local! {
    static RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static ENDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Running {
    pub fn enter() -> Running {
        RUNNING.with(|r| r.set(true));
        ENDED.with(|e| e.set(false));
        Running
    }

    pub fn now() -> bool {
        RUNNING.with(|r| r.get())
    }

    /// The stream ended while its event ran (taken once).
    pub fn ended_meanwhile() -> bool {
        ENDED.with(|e| e.replace(false))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(false));
    }
}

/// Called by Envoy's stream-complete hook: `true` if it came inside the
/// stream's own event (then it runs when that event is over).
pub fn completes_later() -> bool {
    RUNNING.with(|r| {
        if r.get() {
            ENDED.with(|e| e.set(true));
        }
        r.get()
    })
}
