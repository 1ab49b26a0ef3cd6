//! Where window state lives.
//!
//! The local store ([`SlotStore`]) records one hit and answers the window
//! state at once, from the bounded slot table over any [`BucketBackend`]
//! with compare-and-swap (Envoy shared data in the host, a map in tests);
//! the shared store ([`crate::state::redis`]) answers the same
//! ([`StoreAnswer`]) after a call. Callers always go: fingerprint, then
//! the store's answer, then a pure decision.

use crate::detect::fingerprint::Fingerprint;
use crate::detect::similarity::Signature;
use crate::state::near::NearProbe;
use crate::state::slot_table::{self, TableLayout};
use crate::state::window::{Forgave, Forgiveness, WindowQuery, WindowState};

/// CAS attempts before a hit is given up on (the request then passes).
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// The suffix istiod 1.30+ adds to a WasmPlugin's name (the plugin is then
/// `<ns>.<name>~istio-translated-wasmplugin`, where 1.26-1.29 named it
/// `<ns>.<name>`).
const ISTIO_TRANSLATED_SUFFIX: &str = "~istio-translated-wasmplugin";

/// The namespace a plugin's counts live under (shared-data keys, Redis
/// keys), from the name Envoy gives the plugin: reduced to
/// `[A-Za-z0-9_-]`, at most 64 characters, `default` when empty. Istio's
/// 1.30 suffix is dropped, so a WasmPlugin keeps its counts across the
/// Istio upgrade that renames it.
pub fn plugin_namespace(raw: &[u8]) -> String {
    let name = String::from_utf8_lossy(raw);
    let name = name.strip_suffix(ISTIO_TRANSLATED_SUFFIX).unwrap_or(&name);
    let keep = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let safe: String = name
        .chars()
        .map(|c| if keep(c) { c } else { '_' })
        .take(64)
        .collect();
    if safe.is_empty() {
        "default".to_string()
    } else {
        safe
    }
}

/// One hit to record: a fingerprint (or its shadow key), when, and what
/// its policy needs measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub key: Fingerprint,
    pub now_ms: u64,
    pub query: WindowQuery,
    /// A near-mode hit: `key` names the caller's record, and this is what
    /// is compared in it.
    pub near: Option<NearProbe>,
    /// Tells the hit from every other: the shared store's log member (with
    /// the engine's random seed), so a failed attempt can be taken back.
    pub id: u64,
}

impl Hit {
    /// A hit of an exact key (every mode but near).
    pub fn exact(key: Fingerprint, now_ms: u64, query: WindowQuery) -> Hit {
        Hit {
            key,
            now_ms,
            query,
            near: None,
            id: 0,
        }
    }

    /// What taking this hit back (the provider failed the attempt) needs.
    pub fn take_back(&self, max: u32) -> TakeBack {
        TakeBack {
            key: self.key,
            at: self.now_ms,
            near: self.near.map(|p| p.signature),
            id: self.id,
            forgiveness: Forgiveness {
                window_ms: self.query.window_ms,
                max,
            },
        }
    }
}

/// A hit to take back: the attempt it counted was failed by the provider
/// (a 5xx or 429 answer), so a retry of it is not a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeBack {
    pub key: Fingerprint,
    /// When the hit was recorded (the local table's time of it).
    pub at: u64,
    pub near: Option<Signature>,
    pub id: u64,
    pub forgiveness: Forgiveness,
}

/// An HTTP call the host sends through an Envoy cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreCall {
    pub cluster: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// A call's reply as the host received it: `status` is `None` when no
/// response came (timeout, reset, no healthy host).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallReply {
    pub status: Option<String>,
    pub body: Vec<u8>,
}

/// The store's answer to one hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAnswer {
    /// Recorded; here is the window state.
    Ready(StoreReceipt),
    /// The hit could not be recorded.
    Failed(StoreFailure),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreReceipt {
    pub state: WindowState,
    /// A live fingerprint was evicted to make room for this one.
    pub evicted: bool,
    /// The fingerprint took a table entry never used before.
    pub added: bool,
    /// CAS attempts that lost a race before this one won.
    pub cas_retries: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreFailure {
    /// Every CAS attempt lost a race.
    Contention,
    /// The backend refused a read or write.
    Backend,
    /// A shared store did not answer in time, could not be reached, or the
    /// host could not send the call; the reason says which.
    Unavailable(String),
    /// A shared store answered with a non-2xx status.
    Status(String),
    /// A shared store's answer is an error or unreadable.
    Reply(String),
}

impl StoreFailure {
    /// Whether the failure is a shared store's (the request then falls back
    /// as `store.on_error` says), not the local table's.
    pub fn is_remote(&self) -> bool {
        matches!(
            self,
            StoreFailure::Unavailable(_) | StoreFailure::Status(_) | StoreFailure::Reply(_)
        )
    }
}

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreFailure::Contention => f.write_str("contention"),
            StoreFailure::Backend => f.write_str("backend"),
            StoreFailure::Unavailable(why) => write!(f, "unavailable: {why}"),
            StoreFailure::Status(status) => write!(f, "webdis answered HTTP {status}"),
            StoreFailure::Reply(msg) => write!(f, "unusable answer: {msg}"),
        }
    }
}

/// Outcome of a conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasWrite {
    Written,
    /// Someone else wrote the bucket since it was read.
    Conflict,
    Failed,
}

/// Bucket storage with compare-and-swap: the only thing a host must provide
/// for the local store.
pub trait BucketBackend {
    /// The bucket's bytes and version (`None` on a backend error).
    fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)>;
    /// Write if the bucket is still at `version`.
    fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite;
    /// Write a bucket that only this worker writes, whatever its version
    /// (`false`: the backend failed). A backend that can write without a
    /// version check (Envoy shared data) saves the read.
    fn publish(&mut self, bucket: u32, bytes: &[u8]) -> bool {
        cas(self, bucket, None, |_| ((), Some(bytes))).is_ok()
    }
}

/// Update `bucket` with compare-and-swap: `update` turns its bytes into
/// what to answer and the bytes to write (`None`: nothing to write, answer
/// at once); a lost race reads and updates again, up to
/// [`MAX_CAS_ATTEMPTS`] times. The first attempt starts from `first` (the
/// bucket and its version as read before) when given. The answer and the
/// races lost before it; `Backend` when a read or write failed,
/// `Contention` when every attempt lost its race.
pub fn cas<B: BucketBackend + ?Sized, T, W: AsRef<[u8]>>(
    backend: &mut B,
    bucket: u32,
    mut first: Option<(Vec<u8>, u32)>,
    mut update: impl FnMut(&[u8]) -> (T, Option<W>),
) -> Result<(T, u32), StoreFailure> {
    for attempt in 0..MAX_CAS_ATTEMPTS {
        let read = first.take().or_else(|| backend.read(bucket));
        let (old, version) = read.ok_or(StoreFailure::Backend)?;
        let (answer, new) = update(&old);
        let Some(new) = new else {
            return Ok((answer, attempt));
        };
        match backend.write(bucket, new.as_ref(), version) {
            CasWrite::Written => return Ok((answer, attempt)),
            CasWrite::Conflict => continue,
            CasWrite::Failed => return Err(StoreFailure::Backend),
        }
    }
    Err(StoreFailure::Contention)
}

/// Put `fresh` in a list of at most `max`: at its end while there is room,
/// else in the place of the least by `rank` (the first of equals), whose
/// rank comes back too. Where it went.
pub fn place<T, K: Ord>(
    list: &mut Vec<T>,
    max: usize,
    fresh: T,
    rank: impl Fn(&T) -> K,
) -> (usize, Option<K>) {
    if list.len() < max {
        list.push(fresh);
        return (list.len() - 1, None);
    }
    let least = list.iter().map(rank).zip(0..).min();
    let i = least.as_ref().map_or(0, |l| l.1);
    if let Some(slot) = list.get_mut(i) {
        *slot = fresh;
    }
    (i, least.map(|l| l.0))
}

/// The fingerprint table in the process's own memory, for a host that
/// runs the engine natively on one thread (`loopguard replay`, examples):
/// at most one entry per bucket of the table's layout, so its size is
/// bounded by the configuration, not by the traffic.
#[derive(Debug, Default, Clone)]
pub struct InProcess {
    buckets: std::collections::HashMap<u32, (Vec<u8>, u32)>,
}

impl BucketBackend for InProcess {
    fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
        Some(self.buckets.get(&bucket).cloned().unwrap_or_default())
    }
    fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
        let slot = self.buckets.entry(bucket).or_default();
        if slot.1 != version {
            return CasWrite::Conflict;
        }
        slot.0.clear();
        slot.0.extend_from_slice(bytes);
        slot.1 = slot.1.wrapping_add(1);
        CasWrite::Written
    }
}

/// The local store: the slot table over a CAS backend.
pub struct SlotStore<B> {
    pub layout: TableLayout,
    pub backend: B,
}

impl<B: BucketBackend> SlotStore<B> {
    /// Record a hit in the table, retrying lost races.
    pub fn record(&mut self, hit: &Hit) -> StoreAnswer {
        let bucket = self.layout.bucket_of(&hit.key);
        // The CAS loop written out, not `cas` with a closure: every
        // request's hit comes here, and the record need not travel back.
        for cas_retries in 0..MAX_CAS_ATTEMPTS {
            let Some((old, version)) = self.backend.read(bucket) else {
                return StoreAnswer::Failed(StoreFailure::Backend);
            };
            let rec = slot_table::record(&old, &hit.key, hit.now_ms, &hit.query, hit.near.as_ref());
            match self.backend.write(bucket, &rec.bucket, version) {
                CasWrite::Written => {
                    return StoreAnswer::Ready(StoreReceipt {
                        state: rec.state,
                        evicted: rec.evicted,
                        added: rec.added,
                        cas_retries,
                    });
                }
                CasWrite::Conflict => {}
                CasWrite::Failed => return StoreAnswer::Failed(StoreFailure::Backend),
            }
        }
        StoreAnswer::Failed(StoreFailure::Contention)
    }

    /// Take a hit back (the provider failed its attempt), retrying lost
    /// races. `Err` when the table could not be updated.
    pub fn take_back(&mut self, t: &TakeBack, now: u64) -> Result<Forgave, StoreFailure> {
        let bucket = self.layout.bucket_of(&t.key);
        let (near, f) = (t.near.as_ref(), &t.forgiveness);
        cas(&mut self.backend, bucket, None, |old| {
            slot_table::forgive(old, &t.key, t.at, near, now, f)
        })
        .map(|(forgave, _)| forgave)
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    #[test]
    fn plugin_namespaces() {
        assert_eq!(plugin_namespace(b"loopguard"), "loopguard");
        assert_eq!(plugin_namespace(b""), "default");
        assert_eq!(plugin_namespace("a.b/c \u{e9}".as_bytes()), "a_b_c__");
        assert_eq!(plugin_namespace(&[b'x'; 100]).len(), 64);
        // Istio 1.29 and 1.30 name the same WasmPlugin differently; its
        // counts stay in one namespace.
        assert_eq!(
            plugin_namespace(b"istio-system.loopguard-gateway~istio-translated-wasmplugin"),
            plugin_namespace(b"istio-system.loopguard-gateway")
        );
        assert_eq!(
            plugin_namespace(b"istio-system.loopguard-gateway"),
            "istio-system_loopguard-gateway"
        );
    }
    use std::collections::HashMap;

    /// An in-memory CAS backend that can be told to lose races.
    #[derive(Default)]
    pub struct MemoryBackend {
        pub buckets: HashMap<u32, (Vec<u8>, u32)>,
        /// The next N writes conflict (as if another worker won).
        pub conflicts_ahead: u32,
        pub fail_reads: bool,
    }

    impl BucketBackend for MemoryBackend {
        fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
            if self.fail_reads {
                return None;
            }
            Some(
                self.buckets
                    .get(&bucket)
                    .cloned()
                    .unwrap_or((Vec::new(), 0)),
            )
        }
        fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
            let cur = self.buckets.get(&bucket).map_or(0, |b| b.1);
            if self.conflicts_ahead > 0 {
                self.conflicts_ahead -= 1;
                // Another writer bumps the version.
                let old = self
                    .buckets
                    .get(&bucket)
                    .map(|b| b.0.clone())
                    .unwrap_or_default();
                self.buckets.insert(bucket, (old, cur + 1));
                return CasWrite::Conflict;
            }
            if cur != version {
                return CasWrite::Conflict;
            }
            self.buckets.insert(bucket, (bytes.to_vec(), cur + 1));
            CasWrite::Written
        }
    }

    fn q() -> WindowQuery {
        WindowQuery {
            window_ms: 1_000,
            capacity: 3,
            trip_at: 3,
            cooldown_ms: 0,
            detect_at: 3,
            event_every_ms: 1_000,
        }
    }

    #[test]
    fn retries_lost_races_then_records_once() {
        let mut s = SlotStore {
            layout: TableLayout::new(16),
            backend: MemoryBackend {
                conflicts_ahead: 3,
                ..Default::default()
            },
        };
        let f = Fingerprint([7; 16]);
        match s.record(&Hit::exact(f, 100, q())) {
            StoreAnswer::Ready(r) => {
                assert_eq!(r.state.count, 1);
                assert_eq!(r.cas_retries, 3);
            }
            other => panic!("{other:?}"),
        }
        match s.record(&Hit::exact(f, 200, q())) {
            StoreAnswer::Ready(r) => assert_eq!(r.state.count, 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn endless_contention_and_backend_errors_fail_open() {
        let mut s = SlotStore {
            layout: TableLayout::new(16),
            backend: MemoryBackend {
                conflicts_ahead: u32::MAX,
                ..Default::default()
            },
        };
        assert_eq!(
            s.record(&Hit::exact(Fingerprint([1; 16]), 1, q())),
            StoreAnswer::Failed(StoreFailure::Contention)
        );
        let mut s = SlotStore {
            layout: TableLayout::new(16),
            backend: MemoryBackend {
                fail_reads: true,
                ..Default::default()
            },
        };
        assert_eq!(
            s.record(&Hit::exact(Fingerprint([1; 16]), 1, q())),
            StoreAnswer::Failed(StoreFailure::Backend)
        );
    }
}
