use super::*;
use crate::state::store::InProcess;
use proptest::prelude::*;

/// The shared region, as one worker without a region of its own uses it.
fn add(b: &mut impl BucketBackend, key: u64, t: &(u64, u64), microusd: u64, now: u64) -> Added {
    Ledger::default().add(b, key, t.0, t.1, microusd, now)
}

fn read(b: &mut impl BucketBackend, key: u64, now: u64) -> Option<Spend> {
    Ledger::default().own(b, key, now)
}

fn u(input: u64, output: u64) -> (u64, u64) {
    (input, output)
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
    let n = u64::from(REGION);
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
    let (bytes, _) = b.read(BUCKETS.start + bucket(keys[0])).unwrap();
    assert_eq!(bytes.len(), 1 + PER_BUCKET * ENTRY);
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
            prop_assert!(bytes.len() <= 1 + PER_BUCKET * ENTRY);
        }
    }
}

/// A backend that writes without a version check where asked to (as
/// Envoy's shared data does), counting its reads.
#[derive(Default)]
struct Counting {
    inner: InProcess,
    reads: u32,
}
impl BucketBackend for Counting {
    fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
        self.reads += 1;
        self.inner.read(bucket)
    }
    fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
        self.inner.write(bucket, bytes, version)
    }
    fn publish(&mut self, bucket: u32, bytes: &[u8]) -> bool {
        let v = self.inner.read(bucket).map_or(0, |(_, v)| v);
        self.inner.write(bucket, bytes, v) == CasWrite::Written
    }
}

#[test]
fn workers_publish_their_own_parts_and_a_reading_merges_them() {
    let mut b = Counting::default();
    let mut one = Ledger::join(&mut b);
    let mut two = Ledger::join(&mut b);
    assert_eq!((one.slot(), two.slot()), (Some(0), Some(1)));
    b.reads = 0;
    assert_eq!(
        one.add(&mut b, 7, 100, 10, 50, 1_000),
        Added::Done { cas_retries: 0 }
    );
    assert_eq!(b.reads, 0, "a worker's add reads nothing");
    two.add(&mut b, 7, 200, 20, 70, 2_000);
    one.add(&mut b, 7, 300, 30, 90, 1_500);
    two.add(&mut b, 8, 1, 1, 0, 2_000);
    let want = Spend {
        responses: 3,
        input: 600,
        output: 60,
        microusd: 210,
        // The newest response (two's, at 2000).
        last_input: 200,
        last_output: 20,
        last_microusd: 70,
    };
    assert_eq!(one.spend(&mut b, 7, 2_500), Some(want));
    assert_eq!(two.spend(&mut b, 7, 2_500), Some(want));
    // A worker that came later (or a VM that restarted) reads the same.
    let three = Ledger::join(&mut b);
    assert_eq!(three.spend(&mut b, 7, 2_500), Some(want));
    assert_eq!(three.spend(&mut b, 9, 2_500), None);
}

#[test]
fn workers_beyond_the_regions_add_to_the_shared_one() {
    let mut b = InProcess::default();
    let mut first = Ledger::join(&mut b);
    for _ in 1..MAX_WORKERS {
        assert!(Ledger::join(&mut b).slot().is_some());
    }
    let mut late = Ledger::join(&mut b);
    assert_eq!(late.slot(), None);
    late.add(&mut b, 7, 5, 5, 1, 10);
    first.add(&mut b, 7, 10, 10, 2, 20);
    let s = first.spend(&mut b, 7, 30).unwrap();
    assert_eq!(
        (s.responses, s.input, s.microusd, s.last_input),
        (2, 15, 3, 10)
    );
    assert_eq!(late.spend(&mut b, 7, 30), Some(s));
}

#[test]
fn a_repeating_key_outlives_keys_seen_once() {
    let mut b = InProcess::default();
    let n = u64::from(REGION);
    let key = |i: u64| (i * n) << 20;
    // The loop's key, repeated, is the stalest in its bucket...
    add(&mut b, key(0), &u(10, 1), 0, 1);
    add(&mut b, key(0), &u(10, 1), 0, 2);
    // ...and a stream of one-off keys passes through the same bucket.
    for i in 1..100 {
        add(&mut b, key(i), &u(1, 1), 0, 10 + i);
    }
    assert_eq!(read(&mut b, key(0), 200).map(|s| s.responses), Some(2));
}

#[test]
fn a_bucket_of_another_encoding_reads_as_empty() {
    let mut b = InProcess::default();
    add(&mut b, 7, &u(10, 1), 0, 1);
    let at = BUCKETS.start + bucket(7);
    let (mut bytes, v) = b.read(at).unwrap();
    bytes[0] = VERSION + 1;
    b.write(at, &bytes, v);
    assert_eq!(read(&mut b, 7, 2), None);
    add(&mut b, 7, &u(5, 1), 0, 3);
    assert_eq!(read(&mut b, 7, 4).map(|s| s.input), Some(5));
}

/// A backend whose registry is reset by a late creator right after the
/// first join (the startup race of two workers creating it).
struct Reset {
    inner: InProcess,
    resets: u32,
}
impl BucketBackend for Reset {
    fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
        self.inner.read(bucket)
    }
    fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
        let w = self.inner.write(bucket, bytes, version);
        if bucket == REGISTRY && self.resets > 0 {
            self.resets -= 1;
            let (_, v) = self.inner.read(REGISTRY).unwrap();
            self.inner.write(REGISTRY, &[], v);
        }
        w
    }
}

#[test]
fn a_join_undone_by_a_late_creator_joins_again() {
    let mut b = Reset {
        inner: InProcess::default(),
        resets: 1,
    };
    let first = Ledger::join(&mut b);
    let second = Ledger::join(&mut b);
    assert_eq!(first.slot(), Some(0));
    assert_eq!(second.slot(), Some(1));
}
