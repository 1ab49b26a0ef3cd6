use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

fn fp(n: u8) -> Fingerprint {
    Fingerprint([n; 16])
}

fn sig(n: u64) -> Signature {
    Signature {
        anchor: n as u32,
        payload: (n >> 3) as u32,
        bins: [n, !n, n << 3, 0, 1, n],
    }
}

fn q(window_ms: u64, trip_at: u32) -> WindowQuery {
    WindowQuery {
        window_ms,
        capacity: trip_at,
        trip_at,
        cooldown_ms: 0,
        detect_at: trip_at,
        event_every_ms: window_ms,
    }
}

#[test]
fn layout_rounds_up_and_tags_differ() {
    assert_eq!(TableLayout::new(1).buckets, 1);
    assert_eq!(TableLayout::new(4).buckets, 1);
    assert_eq!(TableLayout::new(5).buckets, 2);
    assert_eq!(TableLayout::new(65_536).buckets, 16_384);
    assert_eq!(TableLayout::new(65_536).capacity(), 65_536);
    assert_ne!(TableLayout::new(8).tag(), TableLayout::new(12).tag());
    assert_eq!(TableLayout::new(8).tag(), TableLayout::new(8).tag());
    assert_eq!(TableLayout::new(8).tag().len(), 8);
}

#[test]
fn encode_decode_round_trip() {
    let b = Bucket {
        entries: vec![
            Entry {
                fingerprint: fp(1),
                last_seen: 5_000,
                expires_at: 65_000,
                record: Record::Hits(HitRecord {
                    hits: vec![1_000, 4_000, 5_000],
                    cooldown_until: 9_000,
                    last_event: 4_000,
                    suppressed: 7,
                    forgiven: vec![4_500],
                }),
            },
            Entry {
                fingerprint: fp(2),
                last_seen: 6_000,
                expires_at: 66_000,
                record: Record::Near(NearRecord {
                    hits: vec![(sig(u64::MAX), 2_000), (sig(7), 6_000)],
                    cooldowns: vec![(sig(7), 36_000)],
                    events: vec![NearEvent {
                        signature: sig(7),
                        last: 6_000,
                        suppressed: 2,
                    }],
                    forgiven: vec![(sig(7), 3_000), (sig(9), 5_500)],
                }),
            },
        ],
    };
    assert_eq!(Bucket::decode(&b.encode()), Some(b));
    assert_eq!(Bucket::decode(&[]), Some(Bucket::default()));
    assert_eq!(Bucket::decode(&[9, 0]), None);
    assert_eq!(Bucket::decode(&[FORMAT_VERSION, 1, 0]), None);
    let mut trailing = Bucket::default().encode();
    trailing.push(0);
    assert_eq!(Bucket::decode(&trailing), None);
}

#[test]
fn unreadable_bucket_is_treated_as_empty() {
    let r = record(&[0xff, 0xff, 0xff], &fp(1), 100, &q(1_000, 2), None);
    assert_eq!(r.state.count, 1);
    assert!(!r.evicted);
    assert_eq!(Bucket::decode(&r.bucket).unwrap().entries.len(), 1);
}

#[test]
fn expired_entries_are_reused_before_live_ones_are_evicted() {
    let mut bytes = Vec::new();
    for i in 0..4u8 {
        bytes = record(&bytes, &fp(i), 1_000 + u64::from(i), &q(1_000, 3), None).bucket;
    }
    // fp(0) expired at 2000; at 2000 a new fingerprint reuses it.
    let r = record(&bytes, &fp(9), 2_000, &q(1_000, 3), None);
    assert!(!r.evicted);
    let b = Bucket::decode(&r.bucket).unwrap();
    assert!(b.entries.iter().any(|e| e.fingerprint == fp(9)));
    assert!(!b.entries.iter().any(|e| e.fingerprint == fp(0)));
    // All live now: the least recently seen (fp(1)) is evicted.
    let r = record(&r.bucket, &fp(10), 2_000, &q(60_000, 3), None);
    assert!(r.evicted);
    let b = Bucket::decode(&r.bucket).unwrap();
    assert!(!b.entries.iter().any(|e| e.fingerprint == fp(1)));
    assert_eq!(b.entries.len(), BUCKET_ENTRIES);
}

#[test]
fn an_entry_in_cooldown_outlives_its_window() {
    let q = WindowQuery {
        window_ms: 1_000,
        capacity: 2,
        trip_at: 2,
        cooldown_ms: 30_000,
        detect_at: 2,
        event_every_ms: 30_000,
    };
    let mut bytes = record(&[], &fp(1), 0, &q, None).bucket;
    bytes = record(&bytes, &fp(1), 10, &q, None).bucket;
    for i in 2..5u8 {
        bytes = record(&bytes, &fp(i), 20, &q, None).bucket;
    }
    // At 5 s fp(1)'s hits are out of the window but its cooldown runs:
    // the expired fp(2..4) entries are reused first.
    for i in 5..8u8 {
        let r = record(&bytes, &fp(i), 5_000, &q, None);
        assert!(!r.evicted);
        bytes = r.bucket;
    }
    let r = record(&bytes, &fp(1), 5_000, &q, None);
    assert_eq!(r.state.cooldown_remaining_ms, 25_010);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Against a per-fingerprint reference log: a fingerprint's count
    /// never exceeds its true count (no two fingerprints share one), and
    /// equals it whenever the fingerprint was never evicted.
    #[test]
    fn counts_never_mix(
        events in prop::collection::vec((0u8..12, 0u64..300), 1..200),
        buckets in 1u32..4,
    ) {
        let layout = TableLayout {
            buckets,
            mcp: false,
            budget_buckets: 0,
        };
        let query = q(2_000, 6);
        let mut table: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut truth: HashMap<u8, Vec<u64>> = HashMap::new();
        let mut evicted_ever: std::collections::HashSet<u8> = Default::default();
        let mut now = 0u64;
        for (id, gap) in events {
            now += gap;
            let f = Fingerprint([id, id.wrapping_mul(37), 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, id]);
            let b = layout.bucket_of(&f);
            let before = Bucket::decode(table.get(&b).map(Vec::as_slice).unwrap_or(&[])).unwrap();
            let present: Vec<Fingerprint> = before.entries.iter().map(|e| e.fingerprint).collect();
            let r = record(table.get(&b).map(Vec::as_slice).unwrap_or(&[]), &f, now, &query, None);
            let after = Bucket::decode(&r.bucket).unwrap();
            for lost in present.iter().filter(|p| !after.entries.iter().any(|e| e.fingerprint == **p)) {
                evicted_ever.insert(lost.0[0]);
            }
            table.insert(b, r.bucket);
            let log = truth.entry(id).or_default();
            log.push(now);
            let true_count = log.iter().filter(|&&t| now - t < query.window_ms).count() as u32;
            prop_assert!(r.state.count <= true_count.min(query.capacity));
            if !evicted_ever.contains(&id) {
                prop_assert_eq!(r.state.count, true_count.min(query.capacity));
            }
            prop_assert!(after.entries.len() <= BUCKET_ENTRIES);
        }
    }
}
