//! MCP call histories: per caller (or session), the newest calls and what
//! each got, in a fixed region of the shared table (Envoy shared data has
//! no delete: the region is a fixed set of buckets, each holding a few
//! histories; a full bucket gives the history idle longest to a new one).
//! Every worker reads and writes them with compare-and-swap, so a session
//! whose calls land on different workers is one history.

use crate::detect::mcp::Entry;
use crate::state::store::{BucketBackend, CasWrite, MAX_CAS_ATTEMPTS};
use std::ops::Range;

/// Buckets in the region.
pub const REGION: u32 = 1024;
/// The first bucket (after the fingerprint table's, at most 2^20, and
/// before the ledger's).
const BASE: u32 = 0xE000_0000;
/// The region: created with the table when a policy reads MCP.
pub const BUCKETS: Range<u32> = BASE..BASE + REGION;
/// Histories per bucket.
pub const PER_BUCKET: usize = 4;
/// Histories the region holds.
pub const CAPACITY: usize = REGION as usize * PER_BUCKET;
/// Calls a history keeps (enough for a cycle of three calls, five
/// rounds).
pub const MAX_ENTRIES: usize = 16;
/// The encoding's version (the first byte of a bucket).
const VERSION: u8 = 2;
const ENTRY: usize = 8 * 3 + 1;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct History {
    key: u64,
    last_ms: u64,
    /// When the newest call the server answered was added (loopguard's
    /// own answers aside).
    last_real_ms: u64,
    entries: Vec<Entry>,
}

/// A history as read: its calls, oldest first, and when the newest call the
/// server answered was added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recent {
    pub entries: Vec<Entry>,
    pub last_real_ms: u64,
    /// The bucket as read, and its version: the first try of an append
    /// that follows writes over it without reading it again (a write
    /// since then fails the compare-and-swap, and the append reads anew).
    pub snapshot: Option<(Vec<u8>, u32)>,
}

fn bucket(key: u64) -> u32 {
    BASE + (key % u64::from(REGION)) as u32
}

/// Why the store could not be used (the call passes; counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    Backend,
    /// Other workers kept writing the bucket.
    Contention,
}

/// The history of `key` (oldest first; empty when there is none, or it
/// has been idle for `idle_ms`).
pub fn read<B: BucketBackend>(
    backend: &mut B,
    key: u64,
    now: u64,
    idle_ms: u64,
) -> Result<Recent, Failed> {
    let (bytes, version) = backend.read(bucket(key)).ok_or(Failed::Backend)?;
    let mut recent = decode(&bytes)
        .into_iter()
        .find(|h| h.key == key && !idle(h, now, idle_ms))
        .map(|h| Recent {
            entries: h.entries,
            last_real_ms: h.last_real_ms,
            snapshot: None,
        })
        .unwrap_or_default();
    recent.snapshot = Some((bytes, version));
    Ok(recent)
}

fn idle(h: &History, now: u64, idle_ms: u64) -> bool {
    now.saturating_sub(h.last_ms) >= idle_ms
}

/// Add a call to the history of `key` (the oldest call beyond
/// [`MAX_ENTRIES`] goes). A call whose result could not be read starts no
/// history of its own (it is never a repeat, and a stream of them must not
/// push other callers' histories out).
pub fn append<B: BucketBackend>(
    backend: &mut B,
    key: u64,
    entry: Entry,
    now: u64,
    idle_ms: u64,
) -> Result<(), Failed> {
    append_after(backend, key, entry, now, idle_ms, None)
}

/// [`append`], trying first over `snapshot` (the bucket as [`read`] saw
/// it).
pub fn append_after<B: BucketBackend>(
    backend: &mut B,
    key: u64,
    entry: Entry,
    now: u64,
    idle_ms: u64,
    mut snapshot: Option<(Vec<u8>, u32)>,
) -> Result<(), Failed> {
    let b = bucket(key);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, version) = match snapshot.take() {
            Some(s) => s,
            None => backend.read(b).ok_or(Failed::Backend)?,
        };
        let mut histories = decode(&bytes);
        let i = match histories.iter().position(|h| h.key == key) {
            Some(i) => i,
            None if entry.unread => return Ok(()),
            None => {
                let fresh = History {
                    key,
                    last_ms: now,
                    last_real_ms: 0,
                    entries: Vec::new(),
                };
                if histories.len() < PER_BUCKET {
                    histories.push(fresh);
                    histories.len() - 1
                } else {
                    let oldest = histories
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, h)| h.last_ms)
                        .map_or(0, |(i, _)| i);
                    if let Some(slot) = histories.get_mut(oldest) {
                        *slot = fresh;
                    }
                    oldest
                }
            }
        };
        if let Some(h) = histories.get_mut(i) {
            if idle(h, now, idle_ms) {
                h.entries.clear();
            }
            h.entries.push(entry);
            let extra = h.entries.len().saturating_sub(MAX_ENTRIES);
            h.entries.drain(..extra);
            h.last_ms = h.last_ms.max(now);
            if !entry.answered {
                h.last_real_ms = h.last_real_ms.max(now);
            }
        }
        match backend.write(b, &encode(&histories), version) {
            CasWrite::Written => return Ok(()),
            CasWrite::Conflict => continue,
            CasWrite::Failed => return Err(Failed::Backend),
        }
    }
    Err(Failed::Contention)
}

// bucket  := version:u8 count:u8 history*
// history := key:u64 last_ms:u64 last_real_ms:u64 n:u8 entry*n
// entry   := call:u64 result:u64 content:u64 flags:u8
//            (flags: 1 failed, 2 unread, 4 answered)
fn encode(histories: &[History]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + histories.len() * (25 + MAX_ENTRIES * ENTRY));
    out.push(VERSION);
    out.push(histories.len() as u8);
    for h in histories {
        out.extend_from_slice(&h.key.to_le_bytes());
        out.extend_from_slice(&h.last_ms.to_le_bytes());
        out.extend_from_slice(&h.last_real_ms.to_le_bytes());
        out.push(h.entries.len() as u8);
        for e in &h.entries {
            out.extend_from_slice(&e.call.to_le_bytes());
            out.extend_from_slice(&e.result.to_le_bytes());
            out.extend_from_slice(&e.content.to_le_bytes());
            out.push(u8::from(e.failed) | u8::from(e.unread) << 1 | u8::from(e.answered) << 2);
        }
    }
    out
}

/// The histories of a bucket; bytes that cannot be read (another version,
/// cut short) are an empty bucket.
fn decode(bytes: &[u8]) -> Vec<History> {
    decode_checked(bytes).unwrap_or_default()
}

fn decode_checked(bytes: &[u8]) -> Option<Vec<History>> {
    let (&version, rest) = bytes.split_first()?;
    if version != VERSION {
        return None;
    }
    let (&count, mut rest) = rest.split_first()?;
    let mut out = Vec::with_capacity(usize::from(count).min(PER_BUCKET));
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    for _ in 0..count.min(PER_BUCKET as u8) {
        let key = u64_at(rest, 0)?;
        let last_ms = u64_at(rest, 8)?;
        let last_real_ms = u64_at(rest, 16)?;
        let n = usize::from(*rest.get(24)?).min(MAX_ENTRIES);
        rest = rest.get(25..)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let flags = *rest.get(24)?;
            entries.push(Entry {
                call: u64_at(rest, 0)?,
                result: u64_at(rest, 8)?,
                content: u64_at(rest, 16)?,
                failed: flags & 1 != 0,
                unread: flags & 2 != 0,
                answered: flags & 4 != 0,
            });
            rest = rest.get(ENTRY..)?;
        }
        out.push(History {
            key,
            last_ms,
            last_real_ms,
            entries,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::InProcess;
    use proptest::prelude::*;

    fn e(call: u64, result: u64) -> Entry {
        Entry {
            call,
            result,
            content: result ^ 1,
            ..Entry::default()
        }
    }

    #[test]
    fn a_history_keeps_its_newest_calls_and_starts_again_when_idle() {
        let mut b = InProcess::default();
        for i in 0..20 {
            append(&mut b, 7, e(i, i), 1_000 + i, 60_000).unwrap();
        }
        let h = read(&mut b, 7, 2_000, 60_000).unwrap().entries;
        assert_eq!(h.len(), MAX_ENTRIES);
        assert_eq!(h.first().map(|e| e.call), Some(4));
        assert_eq!(h.last(), Some(&e(19, 19)));
        assert!(read(&mut b, 7, 1_019 + 60_000, 60_000)
            .unwrap()
            .entries
            .is_empty());
        append(&mut b, 7, e(99, 1), 1_019 + 60_000, 60_000).unwrap();
        assert_eq!(
            read(&mut b, 7, 1_019 + 60_000, 60_000).unwrap().entries,
            vec![e(99, 1)]
        );
        assert!(read(&mut b, 8, 2_000, 60_000).unwrap().entries.is_empty());
    }

    #[test]
    fn unread_calls_start_no_history_and_answers_are_not_real_results() {
        let mut b = InProcess::default();
        let unread = Entry {
            unread: true,
            ..e(1, 0)
        };
        append(&mut b, 9, unread, 10, 1_000).unwrap();
        let none = read(&mut b, 9, 10, 1_000).unwrap();
        assert!(none.entries.is_empty() && none.last_real_ms == 0);
        append(&mut b, 9, e(1, 1), 20, 1_000).unwrap();
        append(&mut b, 9, unread, 30, 1_000).unwrap();
        let answered = Entry {
            answered: true,
            ..e(1, 1)
        };
        append(&mut b, 9, answered, 40, 1_000).unwrap();
        let r = read(&mut b, 9, 40, 1_000).unwrap();
        assert_eq!(r.entries, vec![e(1, 1), unread, answered]);
        assert_eq!(r.last_real_ms, 30);
    }

    #[test]
    fn flags_round_trip() {
        let mut b = InProcess::default();
        let odd = Entry {
            failed: true,
            unread: false,
            answered: true,
            ..e(1, 2)
        };
        append(&mut b, 3, odd, 5, 1_000).unwrap();
        assert_eq!(read(&mut b, 3, 6, 1_000).unwrap().entries, vec![odd]);
    }

    #[test]
    fn a_full_bucket_gives_the_longest_idle_history_away() {
        let mut b = InProcess::default();
        // Keys in one bucket.
        let keys: Vec<u64> = (0..=PER_BUCKET as u64)
            .map(|i| 5 + i * u64::from(REGION))
            .collect();
        for (t, &k) in keys.iter().enumerate() {
            append(&mut b, k, e(k, 1), 100 + t as u64, 1_000_000).unwrap();
        }
        assert!(read(&mut b, keys[0], 200, 1_000_000)
            .unwrap()
            .entries
            .is_empty());
        for &k in &keys[1..] {
            assert_eq!(
                read(&mut b, k, 200, 1_000_000).unwrap().entries,
                vec![e(k, 1)]
            );
        }
    }

    #[test]
    fn unreadable_bytes_are_an_empty_bucket() {
        assert!(decode(&[]).is_empty());
        assert!(decode(&[VERSION + 1, 1, 2, 3]).is_empty());
        assert!(decode(&[VERSION, 1, 2, 3]).is_empty());
        let mut b = InProcess::default();
        b.write(bucket(3), &[VERSION, 9, 9], 0);
        append(&mut b, 3, e(1, 1), 5, 1_000).unwrap();
        assert_eq!(read(&mut b, 3, 5, 1_000).unwrap().entries, vec![e(1, 1)]);
    }

    proptest! {
        /// Against a brute-force model: per key, the newest calls since it
        /// was last idle (up to MAX_ENTRIES), while its bucket keeps it.
        #[test]
        fn histories_match_a_model(ops in proptest::collection::vec((0u64..3, 0u64..5, 0u64..50), 1..80)) {
            let idle_ms = 100;
            let mut b = InProcess::default();
            let mut model: std::collections::HashMap<u64, (u64, Vec<Entry>)> = Default::default();
            let mut now = 0;
            for (key, call, dt) in ops {
                now += dt;
                let entry = e(call, call * 10);
                append(&mut b, key, entry, now, idle_ms).unwrap();
                let m = model.entry(key).or_insert((now, Vec::new()));
                if now - m.0 >= idle_ms { m.1.clear(); }
                m.1.push(entry);
                if m.1.len() > MAX_ENTRIES { m.1.remove(0); }
                m.0 = now;
                for (k, (last, entries)) in &model {
                    let got = read(&mut b, *k, now, idle_ms).unwrap().entries;
                    let want = if now - last >= idle_ms { Vec::new() } else { entries.clone() };
                    prop_assert_eq!(got, want);
                }
            }
        }
    }
}
