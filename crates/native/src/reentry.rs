//! Whether this thread is inside a stream's event (the worker's engine
//! locked): Envoy may call back into the module from a callback the event
//! makes (a local reply ends the stream at once), and such a call must not
//! take the lock again.

/// Whether this thread is inside a stream's event (the engine locked), and
/// which streams Envoy ended meanwhile.
pub struct Running;

thread_local! {
    static RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static ENDED: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Running {
    pub fn enter() -> Running {
        RUNNING.with(|r| r.set(true));
        Running
    }

    pub fn now() -> bool {
        RUNNING.with(|r| r.get())
    }

    /// The streams (module pointers) Envoy ended while the event ran
    /// (taken once).
    pub fn ended_meanwhile() -> Vec<usize> {
        ENDED.with(|e| {
            e.try_borrow_mut()
                .map(|mut v| std::mem::take(&mut *v))
                .unwrap_or_default()
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(false));
    }
}

/// Called by Envoy's stream-complete hook for `stream` (its module
/// pointer): `true` if it came inside an event of this thread (then it
/// runs when that event is over).
pub fn completes_later(stream: usize) -> bool {
    let inside = Running::now();
    if inside {
        let _ = ENDED.with(|e| e.try_borrow_mut().map(|mut v| v.push(stream)));
    }
    inside
}
