//! MCP call histories: per caller (or session), the newest calls and what
//! each got, in a fixed region of the shared table (Envoy shared data has
//! no delete: the region is a fixed set of buckets, each holding a few
//! histories). Every worker reads and writes them with compare-and-swap,
//! so a session whose calls land on different workers is one history.
//!
//! The region is bounded fairly: a history's bucket is chosen by a keyed
//! mix of its key (the region's seed, random per Envoy process), so a
//! client cannot aim its sessions at another caller's bucket; and a new
//! history in a full bucket takes the place of the one with least to
//! lose: one idle past its window, else one of its own caller's, else the
//! one least far into a loop (fewest repeated calls), idle longest.

use crate::detect::mcp::Entry;
use crate::detect::similarity::mix;
use crate::state::bytes::Reader;
use crate::state::store::{cas, place, BucketBackend, StoreFailure};
use std::ops::Range;

/// Buckets in the region.
pub const REGION: u32 = 1024;
/// The first bucket (after the fingerprint table's, at most 2^20, and
/// before the ledger's).
const BASE: u32 = 0xE000_0000;
/// The bucket holding the region's seed (after the histories').
const SEED: u32 = BASE + REGION;
/// The region: created with the table when a policy reads MCP.
pub const BUCKETS: Range<u32> = BASE..SEED + 1;
/// Histories per bucket.
pub const PER_BUCKET: usize = 4;
/// Calls a history keeps (enough for a cycle of three calls, five
/// rounds).
pub const MAX_ENTRIES: usize = 16;
/// The encoding's version (the first byte of a bucket).
const VERSION: u8 = 3;
const ENTRY: usize = 8 * 3 + 1;
const HEAD: usize = 8 * 4 + 1;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct History {
    key: u64,
    /// Whose history it is (the caller, and its address when nothing else
    /// tells it apart).
    owner: u64,
    last_ms: u64,
    /// When the newest call the server answered was added (loopguard's
    /// own answers aside).
    last_real_ms: u64,
    entries: Vec<Entry>,
}

impl History {
    /// How far into a loop the history is: its calls that repeat an
    /// earlier call.
    fn stake(&self) -> usize {
        let mut calls: Vec<u64> = self.entries.iter().map(|e| e.call).collect();
        calls.sort_unstable();
        calls.dedup();
        self.entries.len() - calls.len()
    }
}

/// A history's place: its key, its owner, and its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryId {
    pub key: u64,
    pub owner: u64,
    bucket: u32,
}

impl HistoryId {
    /// The history `key` of `owner`, in the region seeded with `seed`
    /// ([`region_seed`]).
    pub fn new(key: u64, owner: u64, seed: u64) -> HistoryId {
        HistoryId {
            key,
            owner,
            // splitmix64's finaliser: every bit of the key and the seed
            // moves the bucket.
            bucket: BASE + (mix(key ^ seed) % u64::from(REGION)) as u32,
        }
    }
}

/// The region's seed, shared by every worker of the process: the one a
/// worker stored first, else `fresh` (random), stored now. `0` when the
/// backend cannot be read (bucket choice is then unkeyed, still bounded).
pub fn region_seed<B: BucketBackend>(backend: &mut B, fresh: u64) -> u64 {
    let seed = cas(backend, SEED, None, |bytes| match Reader(bytes).u64() {
        Some(seed) => (seed, None),
        None => (fresh, Some(fresh.to_le_bytes().to_vec())),
    });
    seed.map_or(0, |(seed, _)| seed)
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

/// What an append did besides adding the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Appended {
    /// A live history (not idle past its window) was given up to make
    /// room for this one.
    pub evicted: bool,
}

/// The history `id` (oldest first; empty when there is none, or it has
/// been idle for `idle_ms`).
pub fn read<B: BucketBackend>(
    backend: &mut B,
    id: HistoryId,
    now: u64,
    idle_ms: u64,
) -> Result<Recent, StoreFailure> {
    let (bytes, version) = backend.read(id.bucket).ok_or(StoreFailure::Backend)?;
    let mut histories = decode(&bytes).into_iter();
    let h = histories.find(|h| h.key == id.key && !idle(h, now, idle_ms));
    let h = h.unwrap_or_default();
    Ok(Recent {
        entries: h.entries,
        last_real_ms: h.last_real_ms,
        snapshot: Some((bytes, version)),
    })
}

fn idle(h: &History, now: u64, idle_ms: u64) -> bool {
    now.saturating_sub(h.last_ms) >= idle_ms
}

/// [`append_after`] with no snapshot (tests).
#[cfg(test)]
pub fn append<B: BucketBackend>(
    backend: &mut B,
    id: HistoryId,
    entry: Entry,
    now: u64,
    idle_ms: u64,
) -> Result<Appended, StoreFailure> {
    append_after(backend, id, entry, now, idle_ms, None)
}

/// What a history has to lose when a new one needs its place in a full
/// bucket, least first: one idle past its window, else the newcomer's
/// owner's, else the one with least at stake; idle longest among equals.
/// First: whether it is live.
fn rank(h: &History, owner: u64, now: u64, idle_ms: u64) -> (bool, bool, usize, u64) {
    let live = !idle(h, now, idle_ms);
    (live, live && h.owner != owner, h.stake(), h.last_ms)
}

/// Add a call to the history `id` (the oldest call beyond
/// [`MAX_ENTRIES`] goes), trying first over `snapshot` (the bucket as
/// [`read`] saw it). A call whose result could not be read starts no
/// history of its own (it is never a repeat, and a stream of them must not
/// push other callers' histories out).
pub fn append_after<B: BucketBackend>(
    backend: &mut B,
    id: HistoryId,
    entry: Entry,
    now: u64,
    idle_ms: u64,
    snapshot: Option<(Vec<u8>, u32)>,
) -> Result<Appended, StoreFailure> {
    let appended = cas(backend, id.bucket, snapshot, |bytes| {
        let mut histories = decode(bytes);
        let mut done = Appended::default();
        let found = histories.iter().position(|h| h.key == id.key);
        if found.is_none() && entry.unread {
            return (done, None);
        }
        let fresh = History {
            key: id.key,
            owner: id.owner,
            last_ms: now,
            ..History::default()
        };
        let i = found.unwrap_or_else(|| {
            let (i, least) = place(&mut histories, PER_BUCKET, fresh, |h| {
                rank(h, id.owner, now, idle_ms)
            });
            done.evicted = least.is_some_and(|r| r.0);
            i
        });
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
        (done, Some(encode(&histories)))
    });
    appended.map(|(done, _)| done)
}

// bucket  := version:u8 count:u8 history*
// history := key:u64 owner:u64 last_ms:u64 last_real_ms:u64 n:u8 entry*n
// entry   := call:u64 result:u64 content:u64 flags:u8
//            (flags: 1 failed, 2 unread, 4 answered)
fn encode(histories: &[History]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + histories.len() * (HEAD + MAX_ENTRIES * ENTRY));
    out.extend_from_slice(&[VERSION, histories.len() as u8]);
    for h in histories {
        for n in [h.key, h.owner, h.last_ms, h.last_real_ms] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.push(h.entries.len() as u8);
        for e in &h.entries {
            out.extend_from_slice(&e.call.to_le_bytes());
            out.extend_from_slice(&e.result.to_le_bytes());
            out.extend_from_slice(&e.content.to_le_bytes());
            out.push(flags(e));
        }
    }
    out
}

/// The histories of a bucket; bytes that cannot be read (another version,
/// cut short) are an empty bucket.
fn decode(bytes: &[u8]) -> Vec<History> {
    let mut r = Reader(bytes);
    let count = r.u8().filter(|&v| v == VERSION).and_then(|_| r.u8());
    let count = count.map_or(0, |n| n.min(PER_BUCKET as u8));
    let histories = r.list(count.into(), |r| {
        let (key, owner, last_ms, last_real_ms) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let n = usize::from(r.u8()?).min(MAX_ENTRIES);
        let entries = r.list(n, |r| Some(entry(r.u64()?, r.u64()?, r.u64()?, r.u8()?)))?;
        Some(History {
            key,
            owner,
            last_ms,
            last_real_ms,
            entries,
        })
    });
    histories.unwrap_or_default()
}

/// An entry's flags: 1 failed, 2 unread, 4 answered.
pub(crate) fn flags(e: &Entry) -> u8 {
    u8::from(e.failed) | u8::from(e.unread) << 1 | u8::from(e.answered) << 2
}

/// An entry from its digests and its [`flags`].
pub(crate) fn entry(call: u64, result: u64, content: u64, flags: u8) -> Entry {
    Entry {
        call,
        result,
        content,
        failed: flags & 1 != 0,
        unread: flags & 2 != 0,
        answered: flags & 4 != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::InProcess;
    use proptest::prelude::*;

    fn id(k: u64) -> HistoryId {
        HistoryId::new(k, k, 0)
    }

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
            append(&mut b, id(7), e(i, i), 1_000 + i, 60_000).unwrap();
        }
        let h = read(&mut b, id(7), 2_000, 60_000).unwrap().entries;
        assert_eq!(h.len(), MAX_ENTRIES);
        assert_eq!(h.first().map(|e| e.call), Some(4));
        assert_eq!(h.last(), Some(&e(19, 19)));
        assert!(read(&mut b, id(7), 1_019 + 60_000, 60_000)
            .unwrap()
            .entries
            .is_empty());
        append(&mut b, id(7), e(99, 1), 1_019 + 60_000, 60_000).unwrap();
        assert_eq!(
            read(&mut b, id(7), 1_019 + 60_000, 60_000).unwrap().entries,
            vec![e(99, 1)]
        );
        assert!(read(&mut b, id(8), 2_000, 60_000)
            .unwrap()
            .entries
            .is_empty());
    }

    #[test]
    fn unread_calls_start_no_history_and_answers_are_not_real_results() {
        let mut b = InProcess::default();
        let unread = Entry {
            unread: true,
            ..e(1, 0)
        };
        append(&mut b, id(9), unread, 10, 1_000).unwrap();
        let none = read(&mut b, id(9), 10, 1_000).unwrap();
        assert!(none.entries.is_empty() && none.last_real_ms == 0);
        append(&mut b, id(9), e(1, 1), 20, 1_000).unwrap();
        append(&mut b, id(9), unread, 30, 1_000).unwrap();
        let answered = Entry {
            answered: true,
            ..e(1, 1)
        };
        append(&mut b, id(9), answered, 40, 1_000).unwrap();
        let r = read(&mut b, id(9), 40, 1_000).unwrap();
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
        append(&mut b, id(3), odd, 5, 1_000).unwrap();
        assert_eq!(read(&mut b, id(3), 6, 1_000).unwrap().entries, vec![odd]);
    }

    /// `n` keys whose histories share one bucket (under `seed`).
    fn one_bucket(n: usize, seed: u64) -> Vec<u64> {
        let target = HistoryId::new(1, 0, seed).bucket;
        (1..)
            .filter(|&k| HistoryId::new(k, 0, seed).bucket == target)
            .take(n)
            .collect()
    }

    #[test]
    fn a_full_bucket_gives_the_longest_idle_history_away_first() {
        let mut b = InProcess::default();
        let keys = one_bucket(PER_BUCKET + 1, 0);
        for (t, &k) in keys.iter().enumerate() {
            let got = append(&mut b, id(k), e(k, 1), 100 + t as u64, 1_000_000).unwrap();
            assert_eq!(got.evicted, t == PER_BUCKET, "a live history is counted");
        }
        assert!(read(&mut b, id(keys[0]), 200, 1_000_000)
            .unwrap()
            .entries
            .is_empty());
        for &k in &keys[1..] {
            assert_eq!(
                read(&mut b, id(k), 200, 1_000_000).unwrap().entries,
                vec![e(k, 1)]
            );
        }
        // One idle past its window goes before any live one, uncounted.
        let late = one_bucket(PER_BUCKET + 2, 0)[PER_BUCKET + 1];
        append(&mut b, id(keys[1]), e(9, 9), 5_000_000, 1_000_000).unwrap();
        append(&mut b, id(keys[2]), e(9, 9), 5_000_000, 1_000_000).unwrap();
        append(&mut b, id(keys[3]), e(9, 9), 5_000_000, 1_000_000).unwrap();
        let got = append(&mut b, id(late), e(1, 1), 5_000_000, 1_000_000).unwrap();
        assert!(!got.evicted);
        assert!(
            read(&mut b, id(keys[1]), 5_000_000, 1_000_000)
                .unwrap()
                .entries
                .len()
                == 1
        );
    }

    #[test]
    fn a_caller_opening_sessions_pushes_out_its_own_histories_not_a_loop_of_another() {
        let mut b = InProcess::default();
        let keys = one_bucket(64, 0);
        let (victim, rest) = keys.split_first().unwrap();
        let victim = HistoryId::new(*victim, 1, 0);
        // The victim is two calls into a loop.
        append(&mut b, victim, e(5, 5), 10, 1_000_000).unwrap();
        append(&mut b, victim, e(5, 5), 11, 1_000_000).unwrap();
        // Another caller opens sessions, all in the victim's bucket (as if
        // it had found the seed), newer than the victim's calls.
        let mut evicted = 0;
        for (t, &k) in rest.iter().enumerate() {
            let got = append(
                &mut b,
                HistoryId::new(k, 2, 0),
                e(k, 1),
                20 + t as u64,
                1_000_000,
            );
            evicted += usize::from(got.unwrap().evicted);
        }
        assert_eq!(
            evicted,
            rest.len() - (PER_BUCKET - 1),
            "every push-out counted"
        );
        assert_eq!(
            read(&mut b, victim, 500, 1_000_000).unwrap().entries,
            vec![e(5, 5); 2]
        );
        // A third caller's new history takes the place of the one with
        // least at stake, idle longest: the flooder's oldest, not the loop.
        let third = HistoryId::new(keys[0] ^ 0xffff, 3, 0);
        let third = HistoryId {
            bucket: victim.bucket,
            ..third
        };
        append(&mut b, third, e(1, 1), 600, 1_000_000).unwrap();
        assert_eq!(
            read(&mut b, victim, 600, 1_000_000).unwrap().entries.len(),
            2
        );
        assert_eq!(
            read(&mut b, third, 600, 1_000_000).unwrap().entries.len(),
            1
        );
    }

    #[test]
    fn the_seed_moves_buckets_and_is_shared_by_every_worker() {
        let mut b = InProcess::default();
        let seed = region_seed(&mut b, 42);
        assert_eq!(seed, 42);
        assert_eq!(region_seed(&mut b, 7), 42, "the first stored wins");
        let moved = (1..200u64)
            .filter(|&k| HistoryId::new(k, 0, 0).bucket != HistoryId::new(k, 0, 42).bucket)
            .count();
        assert!(moved > 190, "{moved}");
        assert!(BUCKETS.contains(&HistoryId::new(u64::MAX, 0, u64::MAX).bucket));
    }

    #[test]
    fn unreadable_bytes_are_an_empty_bucket() {
        assert!(decode(&[]).is_empty());
        assert!(decode(&[VERSION + 1, 1, 2, 3]).is_empty());
        assert!(decode(&[VERSION, 1, 2, 3]).is_empty());
        let mut b = InProcess::default();
        b.write(id(3).bucket, &[VERSION, 9, 9], 0);
        append(&mut b, id(3), e(1, 1), 5, 1_000).unwrap();
        assert_eq!(
            read(&mut b, id(3), 5, 1_000).unwrap().entries,
            vec![e(1, 1)]
        );
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
                append(&mut b, id(key), entry, now, idle_ms).unwrap();
                let m = model.entry(key).or_insert((now, Vec::new()));
                if now - m.0 >= idle_ms { m.1.clear(); }
                m.1.push(entry);
                if m.1.len() > MAX_ENTRIES { m.1.remove(0); }
                m.0 = now;
                for (k, (last, entries)) in &model {
                    let got = read(&mut b, id(*k), now, idle_ms).unwrap().entries;
                    let want = if now - last >= idle_ms { Vec::new() } else { entries.clone() };
                    prop_assert_eq!(got, want);
                }
            }
        }
    }
}
