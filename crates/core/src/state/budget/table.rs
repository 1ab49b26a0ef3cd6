//! The budget table: every budget key's slices in a fixed region of
//! buckets of the shared table (Envoy shared data, or process memory for
//! the native host), read and written with compare-and-swap, so every
//! worker of the process adds to and reads the same spending, exactly.
//! The keys of one caller, session or conversation (its group: a
//! request's caps under one of them) share a bucket, so a request costs one
//! read per group and its response one compare-and-swap per group.
//! Memory is bounded by the configuration: a bucket holds [`PER_BUCKET`]
//! keys; a full bucket gives the key idle longest (or one whose spending
//! has all left its window) to a new one, counted.

use super::slices::Slices;
use crate::state::store::{BucketBackend, CasWrite, MAX_CAS_ATTEMPTS};
use std::ops::Range;

/// Keys per bucket.
pub const PER_BUCKET: usize = 4;
/// The first bucket of the region (after the fingerprint table's, at
/// most 2^20, and before the MCP histories' and the ledger's).
const BASE: u32 = 0xD000_0000;
/// The encoding's version (the first byte of a bucket).
const VERSION: u8 = 1;

/// One key's spending.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: u64,
    slice_ms: u64,
    /// When it was last added to (the least recent is evicted first).
    last_ms: u64,
    slices: Slices,
}

const HEAD: usize = 8 * 3 + 1;
const SLICE: usize = 16;

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(i..i + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// The entries of a bucket where they are: each one's byte range, key and
/// when it was last added to (nothing else is decoded).
fn spans(bytes: &[u8]) -> Vec<(std::ops::Range<usize>, u64, u64)> {
    let mut out = Vec::with_capacity(PER_BUCKET);
    if bytes.first() != Some(&VERSION) {
        return out;
    }
    let mut i = 1;
    while i + HEAD <= bytes.len() {
        let n = usize::from(bytes.get(i + 24).copied().unwrap_or(0));
        let end = i + HEAD + n * SLICE;
        if end > bytes.len() {
            break;
        }
        out.push((i..end, u64_at(bytes, i), u64_at(bytes, i + 16)));
        i = end;
    }
    out
}

/// The entry at `range`.
fn entry_at(bytes: &[u8], range: std::ops::Range<usize>) -> Entry {
    let b = bytes.get(range).unwrap_or_default();
    let n = usize::from(b.get(24).copied().unwrap_or(0));
    let spent = (0..n)
        .map(|j| {
            let at = HEAD + j * SLICE;
            (u64_at(b, at), u64_at(b, at + 8))
        })
        .collect();
    Entry {
        key: u64_at(b, 0),
        slice_ms: u64_at(b, 8).max(1),
        last_ms: u64_at(b, 16),
        slices: Slices { spent },
    }
}

fn encode_into(b: &mut Vec<u8>, e: &Entry) {
    b.extend_from_slice(&e.key.to_le_bytes());
    b.extend_from_slice(&e.slice_ms.to_le_bytes());
    b.extend_from_slice(&e.last_ms.to_le_bytes());
    let n = e.slices.spent.len().min(usize::from(u8::MAX));
    b.push(u8::try_from(n).unwrap_or(u8::MAX));
    for (i, amount) in e.slices.spent.iter().take(n) {
        b.extend_from_slice(&i.to_le_bytes());
        b.extend_from_slice(&amount.to_le_bytes());
    }
}

/// What an add did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Done {
        cas_retries: u32,
        /// Keys with spending in their window that gave their place.
        evicted: u32,
    },
    /// The backend failed or the bucket stayed contended.
    Failed,
}

/// One key's part of an add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Add {
    pub key: u64,
    pub slice_ms: u64,
    pub amount: u64,
}

/// The region of buckets for `keys` budget keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetTable {
    pub buckets: u32,
}

impl BudgetTable {
    /// A table for `keys` keys (0: none).
    pub fn for_keys(keys: u64) -> BudgetTable {
        let buckets = keys.div_ceil(PER_BUCKET as u64).min(1 << 24);
        BudgetTable {
            buckets: u32::try_from(buckets).unwrap_or(0),
        }
    }

    /// The buckets of the region (created with the table).
    pub fn range(&self) -> Range<u32> {
        BASE..BASE + self.buckets
    }

    /// The bucket of a caller's, session's or conversation's keys (its
    /// `group`): one read and one write for all of them.
    fn bucket(&self, group: u64) -> u32 {
        BASE + (group.rotate_left(17) % u64::from(self.buckets.max(1))) as u32
    }

    /// The spending of `keys` of one group, in order (empty when unknown;
    /// `None`: the backend failed).
    pub fn read<B: BucketBackend>(
        &self,
        backend: &mut B,
        group: u64,
        keys: &[u64],
    ) -> Option<Vec<Slices>> {
        if self.buckets == 0 {
            return Some(vec![Slices::default(); keys.len()]);
        }
        let (bytes, _) = backend.read(self.bucket(group))?;
        let spans = spans(&bytes);
        Some(
            keys.iter()
                .map(|k| {
                    spans
                        .iter()
                        .find(|(_, key, _)| key == k)
                        .map(|(r, _, _)| entry_at(&bytes, r.clone()).slices)
                        .unwrap_or_default()
                })
                .collect(),
        )
    }

    /// Add what one response spent, dated `at`, to keys of one group, at
    /// `now`.
    pub fn add<B: BucketBackend>(
        &self,
        backend: &mut B,
        group: u64,
        adds: &[Add],
        at: u64,
        now: u64,
    ) -> Added {
        if self.buckets == 0 {
            return Added::Failed;
        }
        let bucket = self.bucket(group);
        for attempt in 0..MAX_CAS_ATTEMPTS {
            let Some((bytes, version)) = backend.read(bucket) else {
                return Added::Failed;
            };
            let mut spans = spans(&bytes);
            let mut out = Vec::with_capacity(bytes.len() + adds.len() * (HEAD + SLICE));
            out.push(VERSION);
            // Each key added to, written anew; the others as they are, but
            // the least recent make room for new keys.
            let mut fresh = Vec::with_capacity(adds.len());
            for a in adds {
                let mut e = match spans.iter().position(|(_, k, _)| *k == a.key) {
                    Some(i) => entry_at(&bytes, spans.remove(i).0),
                    None => Entry {
                        key: a.key,
                        slice_ms: a.slice_ms,
                        last_ms: now,
                        slices: Slices::default(),
                    },
                };
                e.slice_ms = a.slice_ms.max(1);
                e.last_ms = now;
                e.slices.add(at, a.amount, now, e.slice_ms);
                fresh.push(e);
            }
            let mut evicted = 0;
            while spans.len() + fresh.len() > PER_BUCKET && !spans.is_empty() {
                // An entry with nothing left in its window first, else the
                // one idle longest.
                let victim = spans
                    .iter()
                    .enumerate()
                    .map(|(i, (r, _, last))| {
                        let mut e = entry_at(&bytes, r.clone());
                        e.slices.prune(now, e.slice_ms);
                        (i, !e.slices.spent.is_empty(), *last)
                    })
                    .min_by_key(|(_, live, last)| (*live, *last));
                let Some((i, live, _)) = victim else {
                    break;
                };
                evicted += u32::from(live);
                spans.remove(i);
            }
            for (r, _, _) in &spans {
                out.extend_from_slice(bytes.get(r.clone()).unwrap_or_default());
            }
            for e in fresh.iter().take(PER_BUCKET) {
                encode_into(&mut out, e);
            }
            match backend.write(bucket, &out, version) {
                CasWrite::Written => {
                    return Added::Done {
                        cas_retries: attempt,
                        evicted,
                    }
                }
                CasWrite::Conflict => continue,
                CasWrite::Failed => return Added::Failed,
            }
        }
        Added::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::InProcess;

    #[test]
    fn spending_adds_up_per_key() {
        let t = BudgetTable::for_keys(64);
        let mut b = InProcess::default();
        let add = |key, amount| Add {
            key,
            slice_ms: 1000,
            amount,
        };
        for i in 0..10 {
            assert!(matches!(
                t.add(&mut b, 1, &[add(7, 3), add(8, 1)], i * 100, i * 100),
                Added::Done { .. }
            ));
        }
        let got = t.read(&mut b, 1, &[7, 8, 9]).unwrap();
        let totals: Vec<u64> = got.iter().map(|s| s.total(1000, 1000)).collect();
        assert_eq!(totals, vec![30, 10, 0]);
        // Another group's bucket (or the same bucket) holds its own keys.
        t.add(&mut b, 2, &[add(70, 5)], 0, 0);
        assert_eq!(t.read(&mut b, 1, &[7]).unwrap()[0].total(1000, 1000), 30);
        assert_eq!(t.read(&mut b, 2, &[70]).unwrap()[0].total(1000, 1000), 5);
    }

    #[test]
    fn a_full_bucket_gives_the_idle_key_away() {
        // One bucket: four keys fit, the fifth evicts the least recent.
        let t = BudgetTable::for_keys(4);
        let mut b = InProcess::default();
        let add = |key| Add {
            key,
            slice_ms: 1000,
            amount: 1,
        };
        for k in 0..4u64 {
            t.add(&mut b, k, &[add(k)], k, k);
        }
        let added = t.add(&mut b, 99, &[add(99)], 10, 10);
        assert_eq!(
            added,
            Added::Done {
                cas_retries: 0,
                evicted: 1
            }
        );
        let read = |b: &mut InProcess, k| t.read(b, k, &[k]).unwrap()[0].total(10, 1000);
        assert_eq!(read(&mut b, 0), 0);
        assert_eq!(read(&mut b, 3), 1);
        assert_eq!(read(&mut b, 99), 1);
        // A key whose spending left the window goes first, unevicted.
        let later = 100_000;
        t.add(&mut b, 3, &[add(3)], later, later);
        let added = t.add(&mut b, 100, &[add(100)], later, later);
        assert_eq!(
            added,
            Added::Done {
                cas_retries: 0,
                evicted: 0
            }
        );
        assert_eq!(t.read(&mut b, 3, &[3]).unwrap()[0].total(later, 1000), 1);
    }

    #[test]
    fn concurrent_adders_lose_nothing() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone)]
        struct Shared(Arc<Mutex<InProcess>>);
        impl BucketBackend for Shared {
            fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
                self.0.lock().ok()?.read(bucket)
            }
            fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
                match self.0.lock() {
                    Ok(mut b) => b.write(bucket, bytes, version),
                    Err(_) => CasWrite::Failed,
                }
            }
        }
        let t = BudgetTable::for_keys(64);
        let shared = Shared(Arc::new(Mutex::new(InProcess::default())));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let mut b = shared.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let a = Add {
                            key: 42,
                            slice_ms: 60_000,
                            amount: 2,
                        };
                        // Contended past its attempts, an add fails (and
                        // is counted by the caller); it never half-lands.
                        while t.add(&mut b, 7, &[a], 1, 1) == Added::Failed {}
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let mut b = shared.clone();
        assert_eq!(
            t.read(&mut b, 7, &[42]).unwrap()[0].total(1, 60_000),
            4 * 500 * 2
        );
    }
}
