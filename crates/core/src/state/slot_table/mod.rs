//! The bounded fingerprint table: fixed buckets of a few entries each, every
//! entry holding a full 128-bit fingerprint and its sliding log.
//!
//! The table has `ceil(max_tracked_fingerprints / 4)` buckets, created when
//! the plugin starts and never more, so memory stays bounded however many
//! distinct requests arrive. A fingerprint lives in the bucket its digest
//! picks. Inside a bucket an entry is found by its full digest (two
//! fingerprints never share a count); a new fingerprint takes a free entry,
//! else an expired one, else evicts the least recently seen.
//!
//! This module is pure: it turns the old bucket bytes into the new ones. The
//! host stores them (Envoy shared data, compare-and-swap).

use crate::detect::fingerprint::Fingerprint;
use crate::detect::similarity::{Signature, SIGNATURE_BYTES};
use crate::state::bytes::Reader;
use crate::state::near::{NearEvent, NearProbe, NearRecord};
use crate::state::store::place;
use crate::state::window::{Forgave, Forgiveness, HitRecord, WindowQuery, WindowState};

/// Entries per bucket.
pub const BUCKET_ENTRIES: usize = 4;
/// Bumped whenever the bucket encoding changes: it is part of the layout
/// hash, so a new encoding never misreads old slots.
const FORMAT_VERSION: u8 = 6;

/// The shape of the table, fixed at configure time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableLayout {
    pub buckets: u32,
    /// A policy reads MCP: the call histories' region is created too
    /// ([`crate::state::mcp_sessions`]; not part of the tag).
    pub mcp: bool,
    /// Buckets of the budget keys' region, created too
    /// ([`crate::state::budget`]; not part of the tag: budget entries carry
    /// their keys).
    pub budget_buckets: u32,
}

impl TableLayout {
    pub fn new(fingerprints: u32) -> Self {
        TableLayout {
            buckets: fingerprints.max(1).div_ceil(BUCKET_ENTRIES as u32),
            mcp: false,
            budget_buckets: 0,
        }
    }

    /// Every bucket of the table a host must create before the first
    /// compare-and-swap (Envoy shared data has no delete and no TTL): the
    /// fingerprints', the loops' spending ledger's and its registry, the
    /// MCP histories' when a policy reads MCP, and the budget keys'.
    pub fn all_buckets(&self) -> impl Iterator<Item = u32> {
        use crate::state::{budget::BudgetTable, ledger, mcp_sessions};
        let mcp = if self.mcp {
            mcp_sessions::BUCKETS
        } else {
            0..0
        };
        let budget = BudgetTable {
            buckets: self.budget_buckets,
        }
        .range();
        (0..self.buckets)
            .chain(ledger::BUCKETS)
            .chain([ledger::REGISTRY])
            .chain(mcp)
            .chain(budget)
    }

    /// Entries the table can hold.
    pub fn capacity(&self) -> u64 {
        u64::from(self.buckets) * BUCKET_ENTRIES as u64
    }

    pub fn bucket_of(&self, fp: &Fingerprint) -> u32 {
        (fp.spread() % u64::from(self.buckets.max(1))) as u32
    }

    /// 8 hex characters naming this layout and encoding. Store keys carry
    /// it, so a reload with another table size starts on fresh keys instead
    /// of misreading old ones, and a reload with the same layout keeps its
    /// counts.
    pub fn tag(&self) -> String {
        let mut h = crc32fast::Hasher::new();
        h.update(b"loopguard-slot-table");
        h.update(&[FORMAT_VERSION, BUCKET_ENTRIES as u8]);
        h.update(&self.buckets.to_le_bytes());
        format!("{:08x}", h.finalize())
    }
}

/// One tracked fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub fingerprint: Fingerprint,
    /// Time of the newest hit.
    pub last_seen: u64,
    /// When the entry stops mattering: newest hit + window, or the end of
    /// its cooldown if later. An expired entry is reused before any live one
    /// is evicted.
    pub expires_at: u64,
    pub record: Record,
}

/// What an entry counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// One fingerprint's hits (exact, llm_tail, session).
    Hits(HitRecord),
    /// A caller's recent near-mode hits, by SimHash.
    Near(NearRecord),
}

impl Record {
    fn fresh(near: Option<&NearProbe>) -> Record {
        match near {
            Some(_) => Record::Near(NearRecord::default()),
            None => Record::Hits(HitRecord::default()),
        }
    }

    fn record(&mut self, now: u64, q: &WindowQuery, near: Option<&NearProbe>) -> WindowState {
        if matches!(self, Record::Near(_)) != near.is_some() {
            // A key names one kind of record; answer a mismatch afresh.
            *self = Record::fresh(near);
        }
        match (self, near) {
            (Record::Near(r), Some(p)) => r.record(now, q, *p),
            (Record::Hits(r), _) => r.record(now, q),
            (Record::Near(_), None) => WindowState::FIRST,
        }
    }

    fn expires_at(&self, window_ms: u64) -> u64 {
        match self {
            Record::Hits(r) => r.expires_at(window_ms),
            Record::Near(r) => r.expires_at(window_ms),
        }
    }

    fn forgive(&mut self, at: u64, near: Option<&Signature>, now: u64, f: &Forgiveness) -> Forgave {
        match (self, near) {
            (Record::Hits(r), None) => r.forgive(at, now, f),
            (Record::Near(r), Some(sig)) => r.forgive(sig, at, now, f),
            _ => Forgave::NotFound,
        }
    }
}

/// A decoded bucket.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bucket {
    pub entries: Vec<Entry>,
}

/// What recording a hit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub state: WindowState,
    /// A live fingerprint was pushed out to make room.
    pub evicted: bool,
    /// The fingerprint took an entry never used before (the table holds
    /// one more).
    pub added: bool,
    /// The new bucket bytes to store.
    pub bucket: Vec<u8>,
}

/// Record a hit of `fp` at `now` into the bucket `old` (its stored bytes;
/// empty or unreadable bytes are an empty bucket); `near` for a near-mode
/// hit (`fp` then names the caller's record).
pub fn record(
    old: &[u8],
    fp: &Fingerprint,
    now: u64,
    q: &WindowQuery,
    near: Option<&NearProbe>,
) -> Recorded {
    let mut bucket = Bucket::decode(old).unwrap_or_default();
    let (mut evicted, mut added) = (false, false);
    let found = bucket.entries.iter().position(|e| e.fingerprint == *fp);
    let idx = found.unwrap_or_else(|| {
        let fresh = Entry {
            fingerprint: *fp,
            last_seen: now,
            expires_at: now,
            record: Record::fresh(near),
        };
        // A free entry, else the first expired one, else the least
        // recently seen (a live one: evicted).
        let (i, least) = place(&mut bucket.entries, BUCKET_ENTRIES, fresh, |e| {
            let live = e.expires_at > now;
            (live, if live { e.last_seen } else { 0 })
        });
        added = least.is_none();
        evicted = least.is_some_and(|(live, _)| live);
        i
    });
    // `None` is unreachable by construction; answer as a first hit.
    let entry = bucket.entries.get_mut(idx);
    let state = entry.map_or(WindowState::FIRST, |entry| {
        let state = entry.record.record(now, q, near);
        entry.last_seen = now;
        entry.expires_at = entry.record.expires_at(q.window_ms);
        state
    });
    Recorded {
        state,
        evicted,
        added,
        bucket: bucket.encode(),
    }
}

/// Take back the hit of `fp` recorded at `at` (`near`: its signature) in
/// the bucket `old`: an attempt the provider failed. The new bucket bytes
/// when something changed.
pub fn forgive(
    old: &[u8],
    fp: &Fingerprint,
    at: u64,
    near: Option<&Signature>,
    now: u64,
    f: &Forgiveness,
) -> (Forgave, Option<Vec<u8>>) {
    let mut bucket = Bucket::decode(old).unwrap_or_default();
    let Some(entry) = bucket.entries.iter_mut().find(|e| e.fingerprint == *fp) else {
        return (Forgave::NotFound, None);
    };
    let forgave = entry.record.forgive(at, near, now, f);
    // The entry may expire sooner now; it never lives longer.
    let bytes = (forgave == Forgave::Forgiven).then(|| bucket.encode());
    (forgave, bytes)
}

// Encoding (little-endian):
//   bucket := version:u8 count:u8 entry*
//   entry  := kind:u8 fingerprint:[16] last_seen:u64 expires_at:u64
//             last_event:u64 suppressed:u32 record
//   record := (kind 0, hits) cooldown_until:u64 n:u16 age:u32*n
//                            f:u8 forgiven:u64*f
//           | (kind 1, near) n:u16 (signature:[60] age:u32)*n
//                            m:u8 (signature:[60] until:u64)*m
//                            e:u8 (signature:[60] last:u64 suppressed:u32)*e
//                            f:u8 (signature:[60] forgiven:u64)*f
// (a near record's event state is per loop: its entry-level last_event and
// suppressed are 0)
// Hit times are stored as ages in ms before `last_seen` (a window is at
// most a day, so an age fits in 32 bits), oldest first.
const ENTRY_FIXED: usize = 1 + 16 + 8 + 8 + 8 + 4;
const KIND_HITS: u8 = 0;
const KIND_NEAR: u8 = 1;

impl Bucket {
    pub fn decode(bytes: &[u8]) -> Option<Bucket> {
        if bytes.is_empty() {
            return Some(Bucket::default());
        }
        let mut r = Reader(bytes);
        r.u8().filter(|&v| v == FORMAT_VERSION)?;
        let n = Some(usize::from(r.u8()?)).filter(|&n| n <= BUCKET_ENTRIES)?;
        let entries = r.list(n, |r| {
            let kind = r.u8()?;
            let fingerprint = Fingerprint(r.take(16)?.try_into().ok()?);
            let last_seen = r.u64()?;
            let expires_at = r.u64()?;
            let last_event = r.u64()?;
            let suppressed = r.u32()?;
            let at = |age: u32| last_seen.saturating_sub(u64::from(age));
            // Fields are read in the order the encoding lists them.
            let record = match kind {
                KIND_HITS => {
                    let cooldown_until = r.u64()?;
                    let n = r.u16()?.into();
                    Record::Hits(HitRecord {
                        hits: r.list(n, |r| Some(at(r.u32()?)))?,
                        cooldown_until,
                        last_event,
                        suppressed,
                        forgiven: r.short(Reader::u64)?,
                    })
                }
                KIND_NEAR => {
                    let n = r.u16()?.into();
                    Record::Near(NearRecord {
                        hits: r.list(n, |r| Some((r.signature()?, at(r.u32()?))))?,
                        cooldowns: r.short(Reader::stamped)?,
                        events: r.short(|r| {
                            Some(NearEvent {
                                signature: r.signature()?,
                                last: r.u64()?,
                                suppressed: r.u32()?,
                            })
                        })?,
                        forgiven: r.short(Reader::stamped)?,
                    })
                }
                _ => return None,
            };
            Some(Entry {
                fingerprint,
                last_seen,
                expires_at,
                record,
            })
        })?;
        r.0.is_empty().then_some(Bucket { entries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let size = 2 + self
            .entries
            .iter()
            .map(|e| {
                ENTRY_FIXED
                    + match &e.record {
                        Record::Hits(r) => 8 + 2 + 4 * r.hits.len() + 1 + 8 * r.forgiven.len(),
                        Record::Near(r) => {
                            2 + (SIGNATURE_BYTES + 4) * r.hits.len()
                                + 1
                                + (SIGNATURE_BYTES + 8) * r.cooldowns.len()
                                + 1
                                + (SIGNATURE_BYTES + 12) * r.events.len()
                                + 1
                                + (SIGNATURE_BYTES + 8) * r.forgiven.len()
                        }
                    }
            })
            .sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&[FORMAT_VERSION, self.entries.len() as u8]);
        for e in &self.entries {
            let (kind, last_event, suppressed) = match &e.record {
                Record::Hits(r) => (KIND_HITS, r.last_event, r.suppressed),
                Record::Near(_) => (KIND_NEAR, 0, 0),
            };
            out.push(kind);
            out.extend_from_slice(&e.fingerprint.0);
            out.extend_from_slice(&e.last_seen.to_le_bytes());
            out.extend_from_slice(&e.expires_at.to_le_bytes());
            out.extend_from_slice(&last_event.to_le_bytes());
            out.extend_from_slice(&suppressed.to_le_bytes());
            let age = |t: u64| e.last_seen.saturating_sub(t).min(u64::from(u32::MAX)) as u32;
            match &e.record {
                Record::Hits(r) => {
                    out.extend_from_slice(&r.cooldown_until.to_le_bytes());
                    let n = r.hits.len().min(usize::from(u16::MAX));
                    out.extend_from_slice(&(n as u16).to_le_bytes());
                    for &t in r.hits.iter().skip(r.hits.len() - n) {
                        out.extend_from_slice(&age(t).to_le_bytes());
                    }
                    put_list(&mut out, &r.forgiven, |out, t| {
                        out.extend_from_slice(&t.to_le_bytes());
                    });
                }
                Record::Near(r) => {
                    let n = r.hits.len().min(usize::from(u16::MAX));
                    out.extend_from_slice(&(n as u16).to_le_bytes());
                    for (h, t) in r.hits.iter().skip(r.hits.len() - n) {
                        out.extend_from_slice(&h.to_bytes());
                        out.extend_from_slice(&age(*t).to_le_bytes());
                    }
                    put_list(&mut out, &r.cooldowns, put_stamped);
                    put_list(&mut out, &r.events, |out, ev| {
                        out.extend_from_slice(&ev.signature.to_bytes());
                        out.extend_from_slice(&ev.last.to_le_bytes());
                        out.extend_from_slice(&ev.suppressed.to_le_bytes());
                    });
                    put_list(&mut out, &r.forgiven, put_stamped);
                }
            }
        }
        out
    }
}

/// A short list: `n:u8` and its first `n` items (at most 255).
fn put_list<T>(out: &mut Vec<u8>, items: &[T], put: impl Fn(&mut Vec<u8>, &T)) {
    let n = items.len().min(usize::from(u8::MAX));
    out.push(n as u8);
    for item in items.iter().take(n) {
        put(out, item);
    }
}

/// `signature:[60] time:u64`.
fn put_stamped(out: &mut Vec<u8>, (h, t): &(Signature, u64)) {
    out.extend_from_slice(&h.to_bytes());
    out.extend_from_slice(&t.to_le_bytes());
}

#[cfg(test)]
mod tests;
