//! The engine behind its worker's lock, and why that may cross threads.

use crate::memory_store::Memory;
use loopguard_core::host::{Effects, Engine};

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
