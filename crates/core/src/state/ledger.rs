//! What each loop spent: per loop key (the fingerprint its hits are
//! counted under, or for a tool-loop policy the conversation), the tokens
//! and micro-dollars its requests' responses reported and its newest
//! response's usage. Kept in the same compare-and-swap backend as the
//! fingerprint table (Envoy shared data: one figure per process, whichever
//! worker served each response), in buckets of its own, so it is bounded:
//! [`BUCKETS`] buckets of [`PER_BUCKET`] entries (about 280 KB at most).
//!
//! A key not added to for [`IDLE_MS`] starts again from zero: a loop is a
//! run of requests, and the same question asked tomorrow is another one.
//! When a bucket is full, its entry added to longest ago makes room.

use crate::response::usage::Usage;
use crate::state::store::{BucketBackend, CasWrite, MAX_CAS_ATTEMPTS};
use std::ops::Range;

/// The ledger's buckets in the backend (after any fingerprint table's: the
/// table has at most 2^20 buckets).
pub const BUCKETS: Range<u32> = 0xF000_0000..0xF000_0400;
/// Entries per bucket.
pub const PER_BUCKET: usize = 4;
/// A key idle this long starts again.
pub const IDLE_MS: u64 = 15 * 60 * 1000;

const ENTRY: usize = 8 * 8 + 4;

/// A loop's spending so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    /// Responses that reported usage.
    pub responses: u32,
    pub input: u64,
    pub output: u64,
    /// Micro-dollars (0 for an unpriced model).
    pub microusd: u64,
    /// The newest response's usage (what the next request would likely
    /// spend).
    pub last_input: u64,
    pub last_output: u64,
    /// What the newest response cost, in micro-dollars.
    pub last_microusd: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    key: u64,
    at_ms: u64,
    spend: Spend,
}

fn decode(bytes: &[u8]) -> Vec<Entry> {
    let u64_at = |c: &[u8], i: usize| {
        let mut b = [0u8; 8];
        if let Some(s) = c.get(i..i + 8) {
            b.copy_from_slice(s);
        }
        u64::from_le_bytes(b)
    };
    bytes
        .chunks_exact(ENTRY)
        .take(PER_BUCKET)
        .map(|c| {
            let mut r = [0u8; 4];
            if let Some(s) = c.get(64..68) {
                r.copy_from_slice(s);
            }
            Entry {
                key: u64_at(c, 0),
                at_ms: u64_at(c, 8),
                spend: Spend {
                    input: u64_at(c, 16),
                    output: u64_at(c, 24),
                    microusd: u64_at(c, 32),
                    last_input: u64_at(c, 40),
                    last_output: u64_at(c, 48),
                    last_microusd: u64_at(c, 56),
                    responses: u32::from_le_bytes(r),
                },
            }
        })
        .collect()
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY);
    for e in entries {
        for v in [
            e.key,
            e.at_ms,
            e.spend.input,
            e.spend.output,
            e.spend.microusd,
            e.spend.last_input,
            e.spend.last_output,
            e.spend.last_microusd,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&e.spend.responses.to_le_bytes());
    }
    out
}

fn bucket(key: u64) -> u32 {
    let n = u64::from(BUCKETS.end - BUCKETS.start);
    // The key is a digest's first bytes: any bits spread evenly.
    BUCKETS.start + u32::try_from(key.rotate_right(20) % n).unwrap_or(0)
}

/// What an add came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Added, after this many lost races.
    Done { cas_retries: u32 },
    /// The backend failed, or every attempt lost its race: not added.
    Failed,
}

/// Add a response's usage (and its cost) to loop `key`'s spending.
pub fn add<B: BucketBackend>(
    backend: &mut B,
    key: u64,
    usage: &Usage,
    microusd: u64,
    now_ms: u64,
) -> Added {
    let b = bucket(key);
    for attempt in 0..MAX_CAS_ATTEMPTS {
        let Some((old, version)) = backend.read(b) else {
            return Added::Failed;
        };
        let mut entries = decode(&old);
        let i = match entries.iter().position(|e| e.key == key) {
            Some(i) => i,
            None if entries.len() < PER_BUCKET => {
                entries.push(Entry {
                    key,
                    at_ms: now_ms,
                    spend: Spend::default(),
                });
                entries.len() - 1
            }
            None => {
                let oldest = entries
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, e)| e.at_ms)
                    .map_or(0, |(i, _)| i);
                if let Some(e) = entries.get_mut(oldest) {
                    *e = Entry {
                        key,
                        at_ms: now_ms,
                        spend: Spend::default(),
                    };
                }
                oldest
            }
        };
        if let Some(e) = entries.get_mut(i) {
            if now_ms.saturating_sub(e.at_ms) > IDLE_MS {
                e.spend = Spend::default();
            }
            e.at_ms = e.at_ms.max(now_ms);
            let s = &mut e.spend;
            s.responses = s.responses.saturating_add(1);
            s.input = s.input.saturating_add(usage.input);
            s.output = s.output.saturating_add(usage.output);
            s.microusd = s.microusd.saturating_add(microusd);
            s.last_input = usage.input;
            s.last_output = usage.output;
            s.last_microusd = microusd;
        }
        match backend.write(b, &encode(&entries), version) {
            CasWrite::Written => {
                return Added::Done {
                    cas_retries: attempt,
                }
            }
            CasWrite::Conflict => continue,
            CasWrite::Failed => return Added::Failed,
        }
    }
    Added::Failed
}

/// Loop `key`'s spending so far (`None`: nothing recorded, or idle for
/// longer than [`IDLE_MS`], or the backend failed).
pub fn read<B: BucketBackend>(backend: &mut B, key: u64, now_ms: u64) -> Option<Spend> {
    let (bytes, _) = backend.read(bucket(key))?;
    decode(&bytes)
        .into_iter()
        .find(|e| e.key == key && now_ms.saturating_sub(e.at_ms) <= IDLE_MS)
        .map(|e| e.spend)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::InProcess;
    use proptest::prelude::*;

    fn u(input: u64, output: u64) -> Usage {
        Usage {
            input,
            output,
            ..Usage::default()
        }
    }

    #[test]
    fn adds_up_per_key_and_keeps_the_newest_usage() {
        let mut b = InProcess::default();
        assert_eq!(read(&mut b, 7, 0), None);
        assert_eq!(
            add(&mut b, 7, &u(100, 20), 5, 1_000),
            Added::Done { cas_retries: 0 }
        );
        add(&mut b, 7, &u(120, 30), 6, 2_000);
        add(&mut b, 8, &u(1, 1), 0, 2_000);
        assert_eq!(
            read(&mut b, 7, 2_500),
            Some(Spend {
                responses: 2,
                input: 220,
                output: 50,
                microusd: 11,
                last_input: 120,
                last_output: 30,
                last_microusd: 6,
            })
        );
        assert_eq!(read(&mut b, 8, 2_500).map(|s| s.input), Some(1));
    }

    #[test]
    fn an_idle_key_starts_again() {
        let mut b = InProcess::default();
        add(&mut b, 7, &u(100, 20), 0, 1_000);
        assert_eq!(read(&mut b, 7, 1_000 + IDLE_MS + 1), None);
        add(&mut b, 7, &u(5, 5), 0, 1_000 + IDLE_MS + 1);
        assert_eq!(
            read(&mut b, 7, 1_000 + IDLE_MS + 1).map(|s| s.input),
            Some(5)
        );
    }

    #[test]
    fn a_full_bucket_replaces_its_stalest_entry() {
        let mut b = InProcess::default();
        // Keys in the same bucket: the bucket comes from bits 20.. of the
        // key.
        let n = u64::from(BUCKETS.end - BUCKETS.start);
        let keys: Vec<u64> = (0..=PER_BUCKET as u64).map(|i| (i * n) << 20).collect();
        assert!(keys.iter().all(|k| bucket(*k) == bucket(keys[0])));
        for (t, k) in keys.iter().take(PER_BUCKET).enumerate() {
            add(&mut b, *k, &u(1, 1), 0, 10 + t as u64);
        }
        add(&mut b, keys[PER_BUCKET], &u(9, 9), 0, 100);
        assert_eq!(read(&mut b, keys[0], 100), None);
        assert_eq!(read(&mut b, keys[1], 100).map(|s| s.input), Some(1));
        assert_eq!(
            read(&mut b, keys[PER_BUCKET], 100).map(|s| s.input),
            Some(9)
        );
        let (bytes, _) = b.read(bucket(keys[0])).unwrap();
        assert_eq!(bytes.len(), PER_BUCKET * ENTRY);
    }

    /// A backend whose first writes lose their race (another worker wrote).
    struct Racy {
        inner: InProcess,
        losses: u32,
    }
    impl BucketBackend for Racy {
        fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
            self.inner.read(bucket)
        }
        fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
            if self.losses > 0 {
                self.losses -= 1;
                // The other worker's add lands first.
                let (old, v) = self.inner.read(bucket).unwrap();
                let mut e = decode(&old);
                if let Some(first) = e.first_mut() {
                    first.spend.input += 1000;
                }
                self.inner.write(bucket, &encode(&e), v);
                return CasWrite::Conflict;
            }
            self.inner.write(bucket, bytes, version)
        }
    }

    #[test]
    fn a_lost_race_is_retried_and_no_add_is_lost() {
        let mut b = Racy {
            inner: InProcess::default(),
            losses: 0,
        };
        add(&mut b, 7, &u(10, 0), 0, 1);
        b.losses = 2;
        assert_eq!(
            add(&mut b, 7, &u(10, 0), 0, 2),
            Added::Done { cas_retries: 2 }
        );
        assert_eq!(read(&mut b, 7, 2).map(|s| s.input), Some(2020));
        b.losses = MAX_CAS_ATTEMPTS;
        assert_eq!(add(&mut b, 7, &u(10, 0), 0, 3), Added::Failed);
    }

    proptest! {
        #[test]
        fn totals_are_the_sums_of_what_was_added(
            adds in proptest::collection::vec((0u64..64, 0u64..10_000, 0u64..10_000), 1..200)
        ) {
            let mut b = InProcess::default();
            let mut want = std::collections::HashMap::<u64, (u64, u64, u32)>::new();
            // Keys like digests' bits (spread), or crowded into few buckets
            // (small numbers share bucket 0), so eviction is exercised too.
            let keys: Vec<u64> = adds
                .iter()
                .map(|(k, _, _)| if k % 2 == 0 { k.wrapping_mul(0x9E37_79B9_7F4A_7C15) } else { *k })
                .collect();
            let mut per_bucket = std::collections::HashMap::<u32, Vec<u64>>::new();
            for (key, (_, i, o)) in keys.iter().zip(&adds) {
                add(&mut b, *key, &u(*i, *o), 0, 1);
                let w = want.entry(*key).or_default();
                *w = (w.0 + i, w.1 + o, w.2 + 1);
                let held = per_bucket.entry(bucket(*key)).or_default();
                if !held.contains(key) {
                    held.push(*key);
                }
            }
            for (key, (i, o, n)) in want {
                // A bucket that never had more keys than entries evicted
                // none: its totals are exact.
                if per_bucket[&bucket(key)].len() <= PER_BUCKET {
                    let s = read(&mut b, key, 1);
                    prop_assert_eq!(s.map(|s| (s.input, s.output, s.responses)), Some((i, o, n)));
                }
            }
            // Memory is bounded whatever is added.
            for k in BUCKETS {
                let (bytes, _) = b.read(k).unwrap();
                prop_assert!(bytes.len() <= PER_BUCKET * ENTRY);
            }
        }
    }
}
