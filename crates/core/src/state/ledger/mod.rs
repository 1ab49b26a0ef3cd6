//! What each loop spent: per loop key (the fingerprint its hits are
//! counted under, or for a tool-loop policy the conversation), the tokens
//! and micro-dollars its requests' responses reported and its newest
//! response's usage, kept in the same backend as the fingerprint table
//! (Envoy shared data: every worker of the process sees it).
//!
//! Each worker keeps its own part in its own memory and publishes it to a
//! region of buckets only it writes ([`Ledger`]): a response costs one
//! unconditional write, no read and no race. Reading a loop's spending (at
//! a detection, or a rejection's estimate) merges every worker's region. A
//! worker that finds no free region (more than [`MAX_WORKERS`] VMs since the
//! process started) adds to a shared region with compare-and-swap instead.
//! A region is [`REGION`] buckets of [`PER_BUCKET`] entries (about 280 KB
//! at most per worker).
//!
//! A key not added to for [`IDLE_MS`] starts again from zero: a loop is a
//! run of requests, and the same question asked tomorrow is another one.
//! When a bucket is full, its entry added to longest ago makes room.

use crate::state::bytes::Reader;
use crate::state::store::{cas, place, BucketBackend, CasWrite, MAX_CAS_ATTEMPTS};
use std::collections::HashMap;
use std::ops::Range;

/// Buckets per region.
pub const REGION: u32 = 1024;
/// The first ledger bucket in the backend (after any fingerprint table's:
/// the table has at most 2^20 buckets).
const BASE: u32 = 0xF000_0000;
/// The shared region (workers without one of their own add to it with
/// compare-and-swap): created with the table.
pub const BUCKETS: Range<u32> = BASE..BASE + REGION;
/// The count of regions taken by workers: created with the table.
pub const REGISTRY: u32 = BASE - 1;
/// Workers that get a region of their own.
pub const MAX_WORKERS: u32 = 64;
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

/// The first byte of a bucket: its encoding's version (a bucket written by
/// another encoding reads as empty).
const VERSION: u8 = 1;

fn decode(bytes: &[u8]) -> Vec<Entry> {
    let Some((&VERSION, bytes)) = bytes.split_first() else {
        return Vec::new();
    };
    bytes
        .chunks_exact(ENTRY)
        .take(PER_BUCKET)
        .filter_map(|c| {
            // As `encode` writes them (a whole entry: every read succeeds).
            let mut r = Reader(c);
            Some(Entry {
                key: r.u64()?,
                at_ms: r.u64()?,
                spend: Spend {
                    input: r.u64()?,
                    output: r.u64()?,
                    microusd: r.u64()?,
                    last_input: r.u64()?,
                    last_output: r.u64()?,
                    last_microusd: r.u64()?,
                    responses: r.u32()?,
                },
            })
        })
        .collect()
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + entries.len() * ENTRY);
    out.push(VERSION);
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

/// A key's bucket within a region.
fn bucket(key: u64) -> u32 {
    // The key is a digest's first bytes: any bits spread evenly.
    u32::try_from(key.rotate_right(20) % u64::from(REGION)).unwrap_or(0)
}

/// The first bucket of worker `w`'s region.
fn region(w: u32) -> u32 {
    BASE + (w + 1) * REGION
}

/// What an add came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Added, after this many lost races.
    Done { cas_retries: u32 },
    /// The backend failed, or every attempt lost its race: not added.
    Failed,
}

/// Loop `key`'s bucket `old` with a response's usage (and its cost) added.
fn added(old: &[u8], key: u64, input: u64, output: u64, microusd: u64, now_ms: u64) -> Vec<u8> {
    let mut entries = decode(old);
    let fresh = Entry {
        key,
        at_ms: now_ms,
        spend: Spend::default(),
    };
    // A key seen once (most traffic never repeats) makes room before
    // a repeating one (a loop); then the stalest.
    let found = entries.iter().position(|e| e.key == key);
    let rank = |e: &Entry| (e.spend.responses > 1, e.at_ms);
    let i = found.unwrap_or_else(|| place(&mut entries, PER_BUCKET, fresh, rank).0);
    if let Some(e) = entries.get_mut(i) {
        if now_ms.saturating_sub(e.at_ms) > IDLE_MS {
            e.spend = Spend::default();
        }
        e.at_ms = e.at_ms.max(now_ms);
        let s = &mut e.spend;
        s.responses = s.responses.saturating_add(1);
        s.input = s.input.saturating_add(input);
        s.output = s.output.saturating_add(output);
        s.microusd = s.microusd.saturating_add(microusd);
        s.last_input = input;
        s.last_output = output;
        s.last_microusd = microusd;
    }
    encode(&entries)
}

/// Loop `key`'s entry in a bucket's bytes, unless idle.
fn find(bytes: &[u8], key: u64, now_ms: u64) -> Option<Entry> {
    decode(bytes)
        .into_iter()
        .find(|e| e.key == key && now_ms.saturating_sub(e.at_ms) <= IDLE_MS)
}

fn count_of(bytes: &[u8]) -> u32 {
    Reader(bytes).u32().unwrap_or(0)
}

/// Regions taken so far (0 if the registry cannot be read).
fn registered<B: BucketBackend>(backend: &mut B) -> u32 {
    backend.read(REGISTRY).map_or(0, |(b, _)| count_of(&b))
}

/// One worker's way into the ledger.
#[derive(Debug, Default)]
pub struct Ledger {
    /// This worker's region (`None`: the shared one, with compare-and-swap).
    slot: Option<u32>,
    /// This worker's region, as published: bucket -> bytes.
    mine: HashMap<u32, Vec<u8>>,
}

impl Ledger {
    /// Take a region of one's own (the next free one), or add to the shared
    /// region when none is free or the backend fails.
    pub fn join<B: BucketBackend>(backend: &mut B) -> Ledger {
        let mut ledger = Ledger::default();
        for _ in 0..MAX_CAS_ATTEMPTS {
            let Some((bytes, version)) = backend.read(REGISTRY) else {
                return ledger;
            };
            let taken = count_of(&bytes);
            if taken >= MAX_WORKERS {
                return ledger;
            }
            match backend.write(REGISTRY, &(taken + 1).to_le_bytes(), version) {
                // A worker that created the registry late may have reset
                // it: join again unless the count still holds.
                CasWrite::Written if registered(backend) > taken => {
                    ledger.slot = Some(taken);
                    return ledger;
                }
                CasWrite::Written | CasWrite::Conflict => continue,
                CasWrite::Failed => return ledger,
            }
        }
        ledger
    }

    /// This worker's region (`None`: it adds to the shared one).
    #[cfg(test)]
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// Add a response's tokens (and their cost) to loop `key`'s spending.
    pub fn add<B: BucketBackend>(
        &mut self,
        backend: &mut B,
        key: u64,
        input: u64,
        output: u64,
        microusd: u64,
        now_ms: u64,
    ) -> Added {
        let b = bucket(key);
        let Some(w) = self.slot else {
            let add = |old: &[u8]| ((), Some(added(old, key, input, output, microusd, now_ms)));
            return match cas(backend, BUCKETS.start + b, None, add) {
                Ok((_, cas_retries)) => Added::Done { cas_retries },
                Err(_) => Added::Failed,
            };
        };
        // This worker's copy first (in its own memory: never contended),
        // then the bucket published as a whole.
        let mine = self.mine.entry(b).or_default();
        *mine = added(mine, key, input, output, microusd, now_ms);
        match backend.publish(region(w) + b, mine) {
            true => Added::Done { cas_retries: 0 },
            false => Added::Failed,
        }
    }

    /// This worker's own part of loop `key`'s spending (no host call), if
    /// it has one.
    pub fn own<B: BucketBackend>(&self, backend: &mut B, key: u64, now_ms: u64) -> Option<Spend> {
        let base = self.slot.map_or(BUCKETS.start, region);
        self.part(backend, base, key, now_ms).map(|e| e.spend)
    }

    /// Loop `key`'s entry in the region starting at `base` (this worker's
    /// own from its memory), unless idle.
    fn part<B: BucketBackend>(
        &self,
        backend: &mut B,
        base: u32,
        key: u64,
        now: u64,
    ) -> Option<Entry> {
        if self.slot.map(region) == Some(base) {
            return find(self.mine.get(&bucket(key))?, key, now);
        }
        find(&backend.read(base + bucket(key))?.0, key, now)
    }

    /// Loop `key`'s spending so far, over every worker (`None`: nothing
    /// recorded, or idle for longer than [`IDLE_MS`]): the totals summed,
    /// the newest response's usage from the worker that served it last.
    pub fn spend<B: BucketBackend>(&self, backend: &mut B, key: u64, now: u64) -> Option<Spend> {
        // This worker's own part is read even if the registry is not.
        let workers = registered(backend)
            .max(self.slot.map_or(0, |w| w + 1))
            .min(MAX_WORKERS);
        let regions = std::iter::once(BUCKETS.start).chain((0..workers).map(region));
        let parts: Vec<Entry> = regions
            .filter_map(|base| self.part(backend, base, key, now))
            .collect();
        let newest = parts.iter().max_by_key(|e| e.at_ms)?.spend;
        let mut total = Spend {
            last_input: newest.last_input,
            last_output: newest.last_output,
            last_microusd: newest.last_microusd,
            ..Spend::default()
        };
        for p in &parts {
            total.responses = total.responses.saturating_add(p.spend.responses);
            total.input = total.input.saturating_add(p.spend.input);
            total.output = total.output.saturating_add(p.spend.output);
            total.microusd = total.microusd.saturating_add(p.spend.microusd);
        }
        Some(total)
    }
}

#[cfg(test)]
mod tests;
