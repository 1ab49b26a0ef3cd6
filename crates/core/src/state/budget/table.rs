//! The budget table: every budget key's slices in a fixed region of
//! buckets of the shared table (Envoy shared data, or process memory for
//! the native host), read and written with compare-and-swap, so every
//! worker of the process adds to and reads the same spending, exactly.
//! The keys of one caller, session or conversation (its group: a
//! request's caps under one of them, at most
//! [`crate::config::budget::MAX_LIMITS`]) share a bucket, so a request
//! costs one read per group and its response one compare-and-swap per
//! group.
//!
//! Memory is bounded by the configuration: a bucket holds [`PER_BUCKET`]
//! keys (twice the largest group, so a whole group always fits beside
//! others), and the table has `max_tracked_keys / PER_BUCKET` buckets. A
//! bucket that would hold more gives up the keys with least to lose
//! ([`Stake`]): first those with nothing left in their window (not
//! counted), then the lowest fraction of their cap spent, then the one
//! idle longest; a key being added competes like the others (and is the
//! one dropped if it has the least to lose). So a key at its cap, idle
//! because its requests are rejected, outlasts any number of fresh keys
//! spending a little.
//!
//! Each entry starts with its key and its length, so a read or an add
//! finds its keys without reading the others' numbers: a read decodes
//! only the entries it wants, an add only the ones it adds to (the others
//! are copied as they are), and the others are weighed against each other
//! only when the bucket would hold too many (until then, an entry whose
//! spending all left its window stays, and reads as nothing spent).

use super::slices::{Slices, SLICES};
use crate::state::bytes::Reader;
use crate::state::store::{cas, BucketBackend};
use std::cmp::Ordering;
use std::ops::Range;

/// Keys per bucket: twice [`crate::config::budget::MAX_LIMITS`].
pub const PER_BUCKET: usize = 2 * crate::config::budget::MAX_LIMITS;
/// The first bucket of the region (after the fingerprint table's, at
/// most 2^20, and before the MCP histories' at 0xE000_0000 and the
/// ledger's at 0xF000_0000): at most [`MAX_BUCKETS`] buckets.
const BASE: u32 = 0xD000_0000;
/// The most buckets of the region (it ends at 0xD100_0000).
const MAX_BUCKETS: u64 = 1 << 24;
/// The encoding's version (the first byte of a bucket); a bucket of
/// another version reads as empty. 2: entries carry their cap, numbers
/// are varints, slices are numbered from the entry's oldest. 3: each
/// entry starts with its key and the length of the rest, fixed-width.
const VERSION: u8 = 3;
/// The most bytes of a varint (a `u64`).
const VARINT: usize = 10;
/// An entry's head: its key (8 bytes) and the length of the rest (2).
const HEAD: usize = 8 + 2;
/// The most bytes of one entry: its head, cap, slice length, last add and
/// slice count, the oldest slice, and each slice's offset and amount (a
/// slice of small amounts takes 2 to 4 bytes).
pub const MAX_ENTRY_BYTES: usize = HEAD + 3 * VARINT + 1 + VARINT + SLICES as usize * 2 * VARINT;

/// One key's spending.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: u64,
    /// The key's cap when it was last added to (0: none known).
    cap: u64,
    slice_ms: u64,
    /// When it was last added to.
    last_ms: u64,
    slices: Slices,
}

impl Entry {
    fn new(a: &Add, now: u64) -> Entry {
        Entry {
            key: a.key,
            cap: a.cap,
            slice_ms: a.slice_ms.max(1),
            last_ms: now,
            slices: Slices::default(),
        }
    }

    /// Add the parts of `adds` for this key (dated `at`, at `now`); what
    /// left its window is dropped. Whether anything is left in it.
    fn apply(&mut self, adds: &[Add], at: u64, now: u64) -> bool {
        for a in adds.iter().filter(|a| a.key == self.key) {
            self.cap = a.cap;
            self.slice_ms = a.slice_ms.max(1);
            self.last_ms = now;
            self.slices.add(at, a.amount, now, self.slice_ms);
        }
        self.slices.prune(now, self.slice_ms);
        self.live(now)
    }

    fn live(&self, now: u64) -> bool {
        self.slices.total(now, self.slice_ms) > 0
    }
}

/// Where one entry of a bucket is: its key and its bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    key: u64,
    start: usize,
    end: usize,
}

/// The entries of a bucket where they are, found by their heads alone (a
/// truncated tail, entries past [`PER_BUCKET`], or a bucket of another
/// version, hold none).
#[derive(Default)]
struct Spans {
    at: [Span; PER_BUCKET],
    len: usize,
}

impl Spans {
    fn of(bytes: &[u8]) -> Spans {
        let mut s = Spans::default();
        if bytes.first() != Some(&VERSION) {
            return s;
        }
        let mut i = 1;
        for slot in &mut s.at {
            let mut r = Reader(bytes.get(i..).unwrap_or_default());
            let (Some(key), Some(n)) = (r.u64(), r.u16().map(usize::from)) else {
                break;
            };
            let end = i + HEAD + n;
            if end > bytes.len() || HEAD + n > MAX_ENTRY_BYTES {
                break;
            }
            *slot = Span { key, start: i, end };
            s.len += 1;
            i = end;
        }
        s
    }

    fn all(&self) -> &[Span] {
        self.at.get(..self.len).unwrap_or_default()
    }

    fn find(&self, key: u64) -> Option<Span> {
        self.all().iter().find(|s| s.key == key).copied()
    }
}

/// The entry at `s` (`None`: malformed).
fn entry_at(bytes: &[u8], s: Span) -> Option<Entry> {
    let mut c = Reader(bytes.get(s.start + HEAD..s.end)?);
    let cap = c.varint()?;
    let slice_ms = c.varint()?.max(1);
    let last_ms = c.varint()?;
    let n = c.u8()?;
    if u64::from(n) > SLICES {
        return None;
    }
    // Each slice: its offset from the oldest (`base`), and its amount.
    let base = if n > 0 { c.varint()? } else { 0 };
    let slice = |c: &mut Reader| Some((base.checked_add(c.varint()?)?, c.varint()?));
    let mut spent = c.list(n.into(), slice)?;
    // Room for the slice an add usually pushes.
    spent.reserve(1);
    c.0.is_empty().then_some(Entry {
        key: s.key,
        cap,
        slice_ms,
        last_ms,
        slices: Slices { spent },
    })
}

/// The entries of a bucket wanted by `want`, in order (a malformed one is
/// left out).
fn decode(bytes: &[u8], want: impl Fn(u64) -> bool) -> Vec<Entry> {
    let spans = Spans::of(bytes);
    spans
        .all()
        .iter()
        .filter(|s| want(s.key))
        .filter_map(|s| entry_at(bytes, *s))
        .collect()
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(u8::try_from(v & 0x7f).unwrap_or(0) | 0x80);
        v >>= 7;
    }
    out.push(u8::try_from(v).unwrap_or(0));
}

fn encode_into(out: &mut Vec<u8>, e: &Entry) {
    out.extend_from_slice(&e.key.to_le_bytes());
    let len_at = out.len();
    out.extend_from_slice(&[0, 0]);
    put_varint(out, e.cap);
    put_varint(out, e.slice_ms);
    put_varint(out, e.last_ms);
    // At most SLICES, the newest (as `Slices::add` keeps them).
    let mut spent = std::borrow::Cow::Borrowed(&e.slices.spent);
    if spent.len() > SLICES as usize {
        let s = spent.to_mut();
        s.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
        s.truncate(SLICES as usize);
    }
    out.push(u8::try_from(spent.len()).unwrap_or(0));
    if let Some(base) = spent.iter().map(|s| s.0).min() {
        put_varint(out, base);
        for &(slice, amount) in spent.iter() {
            put_varint(out, slice - base);
            put_varint(out, amount);
        }
    }
    let len = u16::try_from(out.len() - len_at - 2).unwrap_or(u16::MAX);
    if let Some(at) = out.get_mut(len_at..len_at + 2) {
        at.copy_from_slice(&len.to_le_bytes());
    }
}

/// What a key would lose with its place: its spending in the window as a
/// fraction of its cap, and when it was last added to. Ordered from least
/// to most to lose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stake {
    /// Anything left in its window.
    live: bool,
    /// Spent of its cap, at most the cap (`spent / cap`; 0 of 1 when no
    /// cap is known).
    spent: u64,
    cap: u64,
    last_ms: u64,
}

impl Stake {
    fn of(e: &Entry, now: u64) -> Stake {
        let total = e.slices.total(now, e.slice_ms);
        Stake {
            live: total > 0,
            spent: if e.cap == 0 { 0 } else { total.min(e.cap) },
            cap: e.cap.max(1),
            last_ms: e.last_ms,
        }
    }
}

impl Ord for Stake {
    fn cmp(&self, o: &Stake) -> Ordering {
        let a = u128::from(self.spent) * u128::from(o.cap);
        let b = u128::from(o.spent) * u128::from(self.cap);
        self.live
            .cmp(&o.live)
            .then(a.cmp(&b))
            .then(self.last_ms.cmp(&o.last_ms))
    }
}

impl PartialOrd for Stake {
    fn partial_cmp(&self, o: &Stake) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// What an add did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Done {
        cas_retries: u32,
        /// Keys with spending in their window that lost their place (ones
        /// in the bucket, or ones being added that had the least to lose).
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
    /// The key's cap (in the unit of `amount`): what its place is worth.
    pub cap: u64,
}

/// The region of buckets for `keys` budget keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetTable {
    pub buckets: u32,
}

impl BudgetTable {
    /// A table for `keys` keys (0: none): `keys / PER_BUCKET` buckets.
    pub fn for_keys(keys: u64) -> BudgetTable {
        let buckets = keys.div_ceil(PER_BUCKET as u64).min(MAX_BUCKETS);
        BudgetTable {
            buckets: u32::try_from(buckets).unwrap_or(0),
        }
    }

    /// The buckets of the region (created with the table).
    pub fn range(&self) -> Range<u32> {
        BASE..BASE + self.buckets
    }

    /// The bucket of a caller's, session's or conversation's keys (its
    /// `group`): one read and one write for all of them. The group is
    /// mixed first: its hash (FNV of an identity or a session id) varies
    /// little in any few bits between names that differ only at their end
    /// (`key-1`, `key-2`), which would crowd a few buckets.
    fn bucket(&self, group: u64) -> u32 {
        BASE + (mix(group) % u64::from(self.buckets.max(1))) as u32
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
        let spans = Spans::of(&bytes);
        let entry = |k: u64| spans.find(k).and_then(|s| entry_at(&bytes, s));
        let slices = |k: &u64| entry(*k).map(|e| e.slices).unwrap_or_default();
        Some(keys.iter().map(slices).collect())
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
        let update = |b: &[u8]| added(b, adds, at, now);
        match cas(backend, self.bucket(group), None, update) {
            Ok((evicted, cas_retries)) => Added::Done {
                cas_retries,
                evicted,
            },
            Err(_) => Added::Failed,
        }
    }
}

/// A bijection of `u64` whose every bit depends on every bit of `x` (the
/// finalizer of MurmurHash3).
fn mix(x: u64) -> u64 {
    let mut x = x ^ (x >> 33);
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// How many keys with spending in their window lost their place, and a
/// bucket's bytes with `adds` added (dated `at`, at `now`). Only the entries
/// added to are decoded while the bucket has room for the keys being
/// added; the others are copied as they are.
fn added(bytes: &[u8], adds: &[Add], at: u64, now: u64) -> (u32, Option<Vec<u8>>) {
    let spans = Spans::of(bytes);
    // The keys being added that the bucket does not hold yet.
    let fresh = || firsts(adds).filter(|a| spans.find(a.key).is_none());
    let n = fresh().count();
    if spans.len + n > PER_BUCKET {
        return crowded(bytes, adds, at, now);
    }
    let mut out = Vec::with_capacity(bytes.len() + 1 + n * 32);
    out.push(VERSION);
    for s in spans.all() {
        if let Some(a) = adds.iter().find(|a| a.key == s.key) {
            // A malformed entry starts again.
            let mut e = entry_at(bytes, *s).unwrap_or_else(|| Entry::new(a, now));
            // With nothing left in its window it goes (nothing is lost).
            if e.apply(adds, at, now) {
                encode_into(&mut out, &e);
            }
        } else {
            out.extend_from_slice(bytes.get(s.start..s.end).unwrap_or_default());
        }
    }
    for a in fresh() {
        let mut e = Entry::new(a, now);
        if e.apply(adds, at, now) {
            encode_into(&mut out, &e);
        }
    }
    (0, Some(out))
}

/// The adds whose key no earlier one names (a key named twice counts
/// once).
fn firsts(adds: &[Add]) -> impl Iterator<Item = &Add> {
    let earlier = |i: usize| adds.get(..i).unwrap_or_default();
    (0..)
        .zip(adds)
        .filter(move |(i, a)| !earlier(*i).iter().any(|b| b.key == a.key))
        .map(|(_, a)| a)
}

/// [`added`] for a bucket that would hold too many: every entry decoded,
/// those with nothing left in their window dropped, then the ones with
/// least to lose.
fn crowded(bytes: &[u8], adds: &[Add], at: u64, now: u64) -> (u32, Option<Vec<u8>>) {
    let mut entries = decode(bytes, |_| true);
    for e in &mut entries {
        e.apply(adds, at, now);
    }
    for a in firsts(adds) {
        if !entries.iter().any(|e| e.key == a.key) {
            let mut e = Entry::new(a, now);
            e.apply(adds, at, now);
            entries.push(e);
        }
    }
    // What left every window is dropped (nothing is lost with it).
    entries.retain(|e| e.live(now));
    // Then, while too many, the one with least to lose (the first of
    // equals: a key already there before one being added).
    let mut stakes: Vec<Stake> = entries.iter().map(|e| Stake::of(e, now)).collect();
    let mut evicted = 0;
    while entries.len() > PER_BUCKET {
        let Some((_, i)) = stakes.iter().zip(0usize..).min() else {
            break;
        };
        entries.remove(i);
        stakes.remove(i);
        evicted += 1;
    }
    let mut out = Vec::with_capacity(bytes.len() + adds.len() * 32);
    out.push(VERSION);
    for e in &entries {
        encode_into(&mut out, e);
    }
    (evicted, Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::budget::slice_ms;
    use crate::state::store::{CasWrite, InProcess};
    use proptest::prelude::*;

    /// The most bytes of a bucket.
    const MAX_BUCKET_BYTES: usize = 1 + PER_BUCKET * MAX_ENTRY_BYTES;

    fn add(key: u64, amount: u64, cap: u64) -> Add {
        Add {
            key,
            slice_ms: 1000,
            amount,
            cap,
        }
    }

    /// The inverse of `mix`.
    fn unmix(x: u64) -> u64 {
        // The inverse of an odd number modulo 2^64, by Newton's iteration.
        let inverse = |c: u64| {
            let mut i = c;
            for _ in 0..6 {
                i = i.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(i)));
            }
            i
        };
        let mut x = x ^ (x >> 33);
        x = x.wrapping_mul(inverse(0xc4ce_b9fe_1a85_ec53));
        x ^= x >> 33;
        x = x.wrapping_mul(inverse(0xff51_afd7_ed55_8ccd));
        x ^ (x >> 33)
    }

    /// The `k`th group landing in the bucket of `group`.
    fn beside(t: &BudgetTable, group: u64, k: u64) -> u64 {
        let b = u64::from(t.bucket(group) - BASE);
        unmix(b + k * u64::from(t.buckets))
    }

    #[test]
    fn groups_named_alike_spread_over_the_buckets() {
        for x in [
            0,
            1,
            2,
            0x8000_0000_0000_0000,
            u64::MAX,
            0x1234_5678_9abc_def0,
        ] {
            assert_eq!(unmix(mix(x)), x);
        }
        // 500 callers whose keys differ in their last digits (FNV, as the
        // filter hashes an identity): about 2 groups a bucket, none with
        // more than a few.
        let t = BudgetTable::for_keys(8192);
        let mut per = std::collections::HashMap::<u32, u32>::new();
        for i in 0..500 {
            let caller = crate::act::events::caller_hash("p", format!("sk-key-{i}").as_bytes());
            *per.entry(t.bucket(caller)).or_default() += 1;
        }
        assert!(per.len() > 250, "{} buckets", per.len());
        assert!(per.values().all(|n| *n <= 8), "{per:?}");
    }

    fn total(t: &BudgetTable, b: &mut InProcess, group: u64, key: u64, now: u64) -> u64 {
        t.read(b, group, &[key]).unwrap()[0].total(now, 1000)
    }

    /// The keys a bucket holds.
    fn keys_in(t: &BudgetTable, b: &mut InProcess, group: u64) -> Vec<u64> {
        let (bytes, _) = b.read(t.bucket(group)).unwrap();
        decode(&bytes, |_| true).iter().map(|e| e.key).collect()
    }

    #[test]
    fn spending_adds_up_per_key() {
        let t = BudgetTable::for_keys(64);
        let mut b = InProcess::default();
        for i in 0..10 {
            assert!(matches!(
                t.add(
                    &mut b,
                    1,
                    &[add(7, 3, 100), add(8, 1, 100)],
                    i * 100,
                    i * 100
                ),
                Added::Done { .. }
            ));
        }
        let got = t.read(&mut b, 1, &[7, 8, 9]).unwrap();
        let totals: Vec<u64> = got.iter().map(|s| s.total(1000, 1000)).collect();
        assert_eq!(totals, vec![30, 10, 0]);
        // Another group's bucket (or the same bucket) holds its own keys.
        t.add(&mut b, 2, &[add(70, 5, 100)], 0, 0);
        assert_eq!(total(&t, &mut b, 1, 7, 1000), 30);
        assert_eq!(total(&t, &mut b, 2, 70, 1000), 5);
    }

    #[test]
    fn the_table_is_sized_in_buckets_of_sixteen() {
        assert_eq!(PER_BUCKET, 16);
        assert_eq!(BudgetTable::for_keys(0).buckets, 0);
        assert_eq!(BudgetTable::for_keys(64).buckets, 4);
        assert_eq!(BudgetTable::for_keys(8192).buckets, 512);
        assert_eq!(BudgetTable::for_keys(8193).buckets, 513);
        // The region stays below the MCP histories' (0xE000_0000).
        let most = BudgetTable::for_keys(u64::MAX).range();
        assert_eq!(most, 0xD000_0000..0xD100_0000);
    }

    #[test]
    fn two_groups_of_eight_share_a_bucket_whole() {
        // One bucket.
        let t = BudgetTable::for_keys(16);
        let mut b = InProcess::default();
        let first: Vec<Add> = (1..=8).map(|k| add(k, k, 100)).collect();
        let second: Vec<Add> = (101..=108).map(|k| add(k, k, 1000)).collect();
        let done = Added::Done {
            cas_retries: 0,
            evicted: 0,
        };
        assert_eq!(t.add(&mut b, 1, &first, 10, 10), done);
        let read = |b: &mut InProcess, group, keys: &[u64]| -> Vec<u64> {
            t.read(b, group, keys)
                .unwrap()
                .iter()
                .map(|s| s.total(10, 1000))
                .collect()
        };
        assert_eq!(
            read(&mut b, 1, &[1, 2, 3, 4, 5, 6, 7, 8]),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(t.add(&mut b, 2, &second, 10, 10), done);
        assert_eq!(
            read(&mut b, 1, &[1, 2, 3, 4, 5, 6, 7, 8]),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(
            read(&mut b, 2, &[101, 102, 103, 104, 105, 106, 107, 108]),
            [101, 102, 103, 104, 105, 106, 107, 108]
        );
        // Both again: each key adds up, none is lost.
        assert_eq!(t.add(&mut b, 1, &first, 10, 10), done);
        assert_eq!(t.add(&mut b, 2, &second, 10, 10), done);
        assert_eq!(read(&mut b, 1, &[1, 8]), [2, 16]);
        assert_eq!(read(&mut b, 2, &[101, 108]), [202, 216]);
        // A seventeenth key: the one with least to lose (key 1, 2 of 100
        // spent) gives way.
        assert_eq!(
            t.add(&mut b, 3, &[add(200, 50, 100)], 10, 10),
            Added::Done {
                cas_retries: 0,
                evicted: 1
            }
        );
        assert_eq!(read(&mut b, 1, &[1, 2]), [0, 4]);
        assert_eq!(read(&mut b, 2, &[101, 102]), [202, 204]);
        assert_eq!(read(&mut b, 3, &[200]), [50]);
    }

    #[test]
    fn least_to_lose_goes_first() {
        let t = BudgetTable::for_keys(16);
        let mut b = InProcess::default();
        // Sixteen keys, each 10 of 100 spent at time k.
        for k in 0..16u64 {
            t.add(&mut b, k, &[add(k, 10, 100)], k, k);
        }
        let evicted = |a| match a {
            Added::Done { evicted, .. } => evicted,
            Added::Failed => u32::MAX,
        };
        // Key 3 spends its cap, key 0 near it, later.
        t.add(&mut b, 3, &[add(3, 90, 100)], 20, 20);
        t.add(&mut b, 0, &[add(0, 80, 100)], 21, 21);
        // Equal fractions: the one idle longest goes (1, then 2).
        assert_eq!(evicted(t.add(&mut b, 50, &[add(50, 10, 100)], 30, 30)), 1);
        assert_eq!(total(&t, &mut b, 1, 1, 30), 0);
        assert_eq!(evicted(t.add(&mut b, 51, &[add(51, 10, 100)], 31, 31)), 1);
        assert_eq!(total(&t, &mut b, 2, 2, 31), 0);
        // The lowest fraction goes before one idle longer: key 60 spends
        // 1 of 1000 and is the one dropped, though it is the newest.
        assert_eq!(evicted(t.add(&mut b, 60, &[add(60, 1, 1000)], 40, 40)), 1);
        assert_eq!(total(&t, &mut b, 60, 60, 40), 0);
        // A key being added with a higher fraction takes the place of the
        // lowest (keys 4.. have 10 of 100; key 61 spends 20 of 100).
        assert_eq!(evicted(t.add(&mut b, 61, &[add(61, 20, 100)], 41, 41)), 1);
        assert_eq!(total(&t, &mut b, 61, 61, 41), 20);
        assert_eq!(total(&t, &mut b, 4, 4, 41), 0);
        // The capped and near-cap keys stay.
        assert_eq!(total(&t, &mut b, 3, 3, 41), 100);
        assert_eq!(total(&t, &mut b, 0, 0, 41), 90);
        // Spending that left its window makes room first, uncounted: at
        // 59.5 s the slices of second 0 have left, so key 3 and key 0 are
        // alive only through their later slices... all keys spent within
        // seconds 0..=0, so at 60 s every one but the new is empty.
        assert_eq!(
            t.add(&mut b, 70, &[add(70, 1, 1_000_000)], 60_000, 60_000),
            Added::Done {
                cas_retries: 0,
                evicted: 0
            }
        );
        assert_eq!(keys_in(&t, &mut b, 70), [70]);
    }

    #[test]
    fn a_capped_key_outlasts_a_flood_of_fresh_sessions() {
        let t = BudgetTable::for_keys(16 * 64);
        let mut b = InProcess::default();
        let g = 0x1234_5678;
        // At its cap (its requests are now rejected: it adds nothing more),
        // one near it, and three keys that spent little, all early.
        t.add(&mut b, g, &[add(1, 100, 100)], 0, 0);
        t.add(&mut b, beside(&t, g, 1), &[add(2, 95, 100)], 0, 0);
        for k in 0..3 {
            t.add(&mut b, beside(&t, g, 2 + k), &[add(10 + k, 1, 100)], 0, 0);
        }
        let mut evicted = 0;
        for i in 0..10_000u64 {
            let now = 1 + i;
            let session = beside(&t, g, 100 + i);
            assert_eq!(t.bucket(session), t.bucket(g));
            match t.add(&mut b, session, &[add(1000 + i, 1 + i % 5, 100)], now, now) {
                Added::Done { evicted: e, .. } => evicted += e,
                Added::Failed => panic!("failed"),
            }
        }
        let now = 20_000;
        assert_eq!(total(&t, &mut b, g, 1, now), 100);
        assert_eq!(total(&t, &mut b, g, 2, now), 95);
        for k in 0..3 {
            assert_eq!(total(&t, &mut b, g, 10 + k, now), 0);
        }
        let kept = keys_in(&t, &mut b, g);
        assert_eq!(kept.len(), PER_BUCKET);
        assert_eq!(evicted, 5 + 10_000 - 16);
        let (bytes, _) = b.read(t.bucket(g)).unwrap();
        assert!(bytes.len() < 16 * 24, "{} bytes", bytes.len());
    }

    #[test]
    fn a_bucket_of_the_old_encoding_reads_as_empty() {
        let t = BudgetTable::for_keys(16);
        let mut b = InProcess::default();
        let mut old = vec![1u8];
        old.extend_from_slice(&7u64.to_le_bytes());
        old.extend_from_slice(&[0; 17]);
        assert_eq!(b.write(t.bucket(1), &old, 0), CasWrite::Written);
        assert_eq!(t.read(&mut b, 1, &[7]).unwrap(), [Slices::default()]);
        t.add(&mut b, 1, &[add(8, 2, 10)], 0, 0);
        assert_eq!(keys_in(&t, &mut b, 1), [8]);
        // A malformed tail is dropped; the entries before it stay.
        let (mut bytes, v) = b.read(t.bucket(1)).unwrap();
        bytes.extend_from_slice(&[9, 9, 9]);
        assert_eq!(b.write(t.bucket(1), &bytes, v), CasWrite::Written);
        assert_eq!(total(&t, &mut b, 1, 8, 0), 2);
    }

    #[test]
    fn an_entry_is_compact_and_bounded() {
        // Sixty slices of a 31-day window, small amounts: 3 bytes a slice.
        let s = slice_ms(2_678_400_000);
        assert_eq!(s, 44_640_000);
        let now = 1_700_000_000_000u64;
        let mut e = Entry {
            key: u64::MAX,
            cap: 5_000_000,
            slice_ms: s,
            last_ms: now,
            slices: Slices::default(),
        };
        for i in 0..SLICES {
            e.slices.add(now - i * s, 100 + i, now, s);
        }
        let mut out = vec![];
        encode_into(&mut out, &e);
        assert!(out.len() <= 8 + 4 + 4 + 6 + 1 + 4 + 60 * 3, "{}", out.len());
        let mut with_version = vec![VERSION];
        with_version.extend_from_slice(&out);
        let back = decode(&with_version, |_| true);
        let mut want = e.clone();
        want.slices.spent.sort_unstable();
        let mut got = back[0].clone();
        got.slices.spent.sort_unstable();
        assert_eq!(got, want);
        // The largest numbers everywhere stay within the bound.
        let big = Entry {
            key: u64::MAX,
            cap: u64::MAX,
            slice_ms: u64::MAX,
            last_ms: u64::MAX,
            slices: Slices {
                spent: (0..SLICES)
                    .map(|i| (u64::MAX - i * (u64::MAX / 64), u64::MAX))
                    .collect(),
            },
        };
        let mut out = vec![VERSION];
        encode_into(&mut out, &big);
        assert!(out.len() <= 1 + MAX_ENTRY_BYTES);
        assert_eq!(decode(&out, |_| true).len(), 1);
    }

    #[test]
    fn a_31_day_window_counts_exactly() {
        let t = BudgetTable::for_keys(16);
        let mut b = InProcess::default();
        let window = 31 * 86_400_000;
        let s = slice_ms(window);
        let start = 1_700_000_000_000u64;
        let a = Add {
            key: 5,
            slice_ms: s,
            amount: 7,
            cap: 7,
        };
        t.add(&mut b, 1, &[a], start, start);
        let read = |b: &mut InProcess, _: u64| t.read(b, 1, &[5]).unwrap()[0].clone();
        let first = start / s * s;
        // Counted until the slice 60 later begins, gone then.
        assert_eq!(read(&mut b, start).total(first + 60 * s - 1, s), 7);
        assert_eq!(read(&mut b, start).total(first + 60 * s, s), 0);
        assert_eq!(
            read(&mut b, start).until_below(7, start, s),
            first + 60 * s - start
        );
        assert!(first + 60 * s - start <= window);
        // A later add drops it then, not before.
        t.add(
            &mut b,
            1,
            &[Add { amount: 1, ..a }],
            first + 60 * s - 1,
            first + 60 * s - 1,
        );
        assert_eq!(read(&mut b, 0).total(first + 60 * s - 1, s), 8);
        t.add(
            &mut b,
            1,
            &[Add { amount: 1, ..a }],
            first + 60 * s,
            first + 60 * s,
        );
        assert_eq!(read(&mut b, 0).total(first + 60 * s, s), 2);
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
                            cap: 10,
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

    /// A small random source for the measurements.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            // splitmix64
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
    }

    /// Fill a table for `max_keys` keys with `fill` of that many keys, in
    /// random groups of 1 to 3 keys, each spending in its window: the
    /// fraction of the keys evicted.
    fn evicted_at(max_keys: u64, fill: f64, seed: u64) -> f64 {
        let t = BudgetTable::for_keys(max_keys);
        let mut b = InProcess::default();
        let mut rng = Rng(seed);
        let want = (max_keys as f64 * fill) as u64;
        let (mut keys, mut evicted) = (0u64, 0u64);
        while keys < want {
            let n = 1 + rng.next() % 3;
            let group = rng.next();
            let adds: Vec<Add> = (0..n)
                .map(|_| Add {
                    key: rng.next(),
                    slice_ms: 60_000,
                    amount: 1 + rng.next() % 100,
                    cap: 1000,
                })
                .collect();
            keys += n;
            match t.add(&mut b, group, &adds, keys, keys) {
                Added::Done { evicted: e, .. } => evicted += u64::from(e),
                Added::Failed => panic!("failed"),
            }
        }
        evicted as f64 / keys as f64
    }

    /// The sizing rule, measured (the numbers in docs/configuration.md):
    /// `cargo test -p loopguard-core sizing -- --nocapture` prints them.
    #[test]
    fn sizing_evicts_little_below_half_full() {
        let max_keys = 16 * 1024;
        let mut at = vec![];
        for fill in [0.25, 0.5, 0.75, 1.0] {
            let f = (0..2).map(|s| evicted_at(max_keys, fill, s)).sum::<f64>() / 2.0;
            eprintln!(
                "{:>3.0}% of max_tracked_keys: {:.3}% of keys evicted",
                fill * 100.0,
                f * 100.0
            );
            at.push(f);
        }
        assert!(at[0] < 0.005, "{at:?}");
        assert!(at[1] < 0.03, "{at:?}");
        assert!(at[3] < 0.25, "{at:?}");
        assert!(at.windows(2).all(|w| w[0] <= w[1]), "{at:?}");
    }

    /// A key's model: its slices as added, and whether it is in the table.
    #[derive(Clone, Default)]
    struct Model {
        slices: Slices,
        cap: u64,
        last_ms: u64,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Random adds of groups of up to 8 keys into a one- or two-bucket
        /// table: a key never evicted reads exactly what was added to it;
        /// every key that went had nothing in its window, or is counted
        /// and had no more to lose than any that stayed; the bucket never
        /// holds more than its bound.
        #[test]
        fn reads_are_what_was_added_and_the_bucket_stays_bounded(
            steps in proptest::collection::vec(
                (0u64..4, proptest::collection::vec((0u64..24, 0u64..50), 1..=8), 0u64..3_000, 0u64..3),
                1..120,
            ),
            keys in 16u64..40,
        ) {
            let t = BudgetTable::for_keys(keys);
            let mut b = InProcess::default();
            let mut models: std::collections::HashMap<u64, Model> = Default::default();
            let mut now = 0u64;
            let s = 1000;
            for (group, adds, dt, back) in steps {
                now += dt;
                let at = now.saturating_sub(back * s);
                // A key belongs to one group: key k of group g.
                let mut seen = vec![];
                let adds: Vec<Add> = adds
                    .into_iter()
                    .filter(|(k, _)| {
                        let fresh = !seen.contains(k);
                        seen.push(*k);
                        fresh
                    })
                    .map(|(k, amount)| Add {
                        key: group * 100 + k,
                        slice_ms: s,
                        amount,
                        cap: 10 + (k * 7) % 60,
                    })
                    .collect();
                let Added::Done { evicted, .. } = t.add(&mut b, group, &adds, at, now) else {
                    panic!("failed")
                };
                for a in &adds {
                    let m = models.entry(a.key).or_default();
                    m.slices.add(at, a.amount, now, s);
                    m.cap = a.cap;
                    m.last_ms = now;
                }
                // Which keys each bucket holds.
                let mut held = vec![];
                for bucket in t.range() {
                    let (bytes, _) = b.read(bucket).unwrap();
                    prop_assert!(bytes.len() <= MAX_BUCKET_BYTES);
                    let entries = decode(&bytes, |_| true);
                    prop_assert!(entries.len() <= PER_BUCKET);
                    held.extend(entries.iter().map(|e| e.key));
                }
                let stake = |m: &Model| Stake::of(&Entry {
                    key: 0, cap: m.cap, slice_ms: s, last_ms: m.last_ms, slices: m.slices.clone(),
                }, now);
                let mut gone = vec![];
                let ids: Vec<u64> = models.keys().copied().collect();
                let mut reads = std::collections::HashMap::new();
                for g in 0..4 {
                    let of: Vec<u64> = ids.iter().copied().filter(|k| k / 100 == g).collect();
                    reads.extend(of.iter().copied().zip(t.read(&mut b, g, &of).unwrap()));
                }
                for (key, m) in models.iter_mut() {
                    let got = reads.remove(key).unwrap_or_default();
                    if held.contains(key) {
                        // The same slices, once what left the window is
                        // dropped.
                        let (mut got, mut want) = (got, m.slices.clone());
                        got.prune(now, s);
                        want.prune(now, s);
                        let (mut got, mut want) = (got.spent, want.spent);
                        got.sort_unstable();
                        want.sort_unstable();
                        prop_assert_eq!(got, want, "key {}", key);
                    } else {
                        prop_assert!(got.spent.is_empty());
                        if m.slices.total(now, s) > 0 {
                            gone.push((stake(m), t.bucket(key / 100)));
                        }
                        *m = Model::default();
                    }
                }
                prop_assert_eq!(gone.len() as u32, evicted);
                // Each key that went had no more to lose than any that
                // stayed in its bucket.
                for (lost, bucket) in &gone {
                    for (key, m) in &models {
                        if held.contains(key) && t.bucket(key / 100) == *bucket {
                            prop_assert!(*lost <= stake(m));
                        }
                    }
                }
            }
        }
    }
}
