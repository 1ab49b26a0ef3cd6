//! Near mode's window record: one per (policy, caller, model), holding the
//! signatures of the caller's recent hits. A hit is a repeat of an earlier
//! one when their tails share at least the policy's `near_similarity` of
//! their words and the same anchor (see [`crate::detect::similarity`]);
//! the count of a hit is the number of its repeats in the window, itself
//! included, and drives the same decision as an exact count.
//!
//! The record keeps the newest `capacity` hits (`near_history`), so a
//! caller with many conversations in parallel sees the oldest ones pushed
//! out; the cooldowns its loops started, each for the signature that
//! tripped it, so a cooldown stops that loop, not every request of the
//! caller; each loop's event state, so every loop is reported (once per
//! interval), not only the caller's first; and the attempts forgiven
//! because the provider failed them (per signature: a retry repeats its
//! attempt).

use crate::detect::similarity::{NearThreshold, Signature};
use crate::state::window::{self, Forgave, Forgiveness, WindowQuery, WindowState};

/// Cooldowns a record keeps (the newest ones).
pub const MAX_COOLDOWNS: usize = 8;
/// Loops whose event state a record keeps.
pub const MAX_EVENTS: usize = 8;

/// What a near hit compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NearProbe {
    pub signature: Signature,
    pub threshold: NearThreshold,
}

impl NearProbe {
    fn near(&self, other: &Signature) -> bool {
        self.signature.is_near(other, self.threshold)
    }

    /// The times of the entries of `list` near this probe.
    fn times(self, list: &[(Signature, u64)]) -> impl Iterator<Item = u64> + '_ {
        list.iter().filter(move |(h, _)| self.near(h)).map(|e| e.1)
    }
}

/// A caller's recent near hits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NearRecord {
    /// `(signature, time)`, oldest first.
    pub hits: Vec<(Signature, u64)>,
    /// `(signature, until)`: loops in cooldown.
    pub cooldowns: Vec<(Signature, u64)>,
    /// Per loop: when its detection was last reported, and how many since
    /// were not.
    pub events: Vec<NearEvent>,
    /// Attempts the provider failed that were forgiven (in the window):
    /// their signature, and when. A retry repeats its attempt byte for
    /// byte, so the budget is per signature: a provider failing every
    /// request of a busy caller does not spend one loop's forgiveness.
    pub forgiven: Vec<(Signature, u64)>,
}

/// A loop's event state, by the signature of its first reported hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NearEvent {
    pub signature: Signature,
    pub last: u64,
    pub suppressed: u32,
}

impl NearRecord {
    /// Record a hit at `now` and answer the window state of its repeats.
    pub fn record(&mut self, now: u64, q: &WindowQuery, probe: NearProbe) -> WindowState {
        window::push_hit(&mut self.hits, (probe.signature, now), now, q, |e| &mut e.1);
        let repeats: Vec<u64> = probe.times(&self.hits).collect();
        let count = u32::try_from(repeats.len()).unwrap_or(u32::MAX);

        // A cooldown from the future (the clock moved back) lasts at most
        // one cooldown from now.
        let limit = now.saturating_add(q.cooldown_ms);
        for (_, until) in self.cooldowns.iter_mut() {
            *until = (*until).min(limit);
        }
        self.cooldowns.retain(|&(_, until)| until > now);
        let running = probe.times(&self.cooldowns).max();
        let cooldown_until = match running {
            Some(until) => until,
            None if q.cooldown_ms > 0 && count >= q.trip_at => {
                if self.cooldowns.len() >= MAX_COOLDOWNS {
                    self.cooldowns.remove(0);
                }
                self.cooldowns.push((probe.signature, limit));
                limit
            }
            None => now,
        };
        let cooldown_remaining_ms = cooldown_until.saturating_sub(now);

        let detected = count >= q.detect_at || cooldown_remaining_ms > 0;
        let event = detected.then(|| self.report(now, q, probe)).flatten();
        WindowState {
            count,
            until_allowed_ms: window::until_allowed(&repeats, now, q.window_ms, q.trip_at),
            cooldown_remaining_ms,
            event,
        }
    }

    /// The attempt recorded at `at` with signature `sig` was failed by the
    /// provider: take its hit back, as the window's forgiveness allows.
    pub fn forgive(&mut self, sig: &Signature, at: u64, now: u64, f: &Forgiveness) -> Forgave {
        let alike = |e: &(Signature, u64)| e.0 == *sig;
        let (hits, forgiven) = (&mut self.hits, &mut self.forgiven);
        window::forgive(hits, forgiven, |e| &mut e.1, alike, at, now, f)
    }

    /// Report a detection of the loop near `probe`, once per interval.
    fn report(&mut self, now: u64, q: &WindowQuery, probe: NearProbe) -> Option<u32> {
        // A loop's state lasts while it can still suppress, or has
        // suppressed detections to report.
        let keep = q.event_every_ms.max(q.window_ms);
        self.events
            .retain(|e| e.suppressed > 0 || now.saturating_sub(e.last.min(now)) < keep);
        // The loop whose signature agrees most with this one; of equals,
        // the least signature (in hex), as the Lua picks it.
        let nearest = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| probe.near(&e.signature))
            .max_by_key(|(_, e)| {
                (
                    e.signature.matches(&probe.signature),
                    std::cmp::Reverse(e.signature.hex()),
                )
            })
            .map(|(i, _)| i);
        let e = match nearest {
            Some(i) => self.events.get_mut(i)?,
            None => {
                if self.events.len() >= MAX_EVENTS {
                    let events = self.events.iter().enumerate();
                    let oldest = events.min_by_key(|(_, e)| (e.last.min(now), e.signature.hex()));
                    if let Some((oldest, _)) = oldest {
                        self.events.remove(oldest);
                    }
                }
                self.events.push(NearEvent {
                    signature: probe.signature,
                    ..NearEvent::default()
                });
                self.events.last_mut()?
            }
        };
        window::report(&mut e.last, &mut e.suppressed, now, q.event_every_ms)
    }

    /// When this record stops mattering: its newest hit has left the window
    /// and its cooldowns are over.
    pub fn expires_at(&self, window_ms: u64) -> u64 {
        let newest = self.hits.last().map(|h| h.1.saturating_add(window_ms));
        let cooldown = self.cooldowns.iter().map(|&(_, u)| u).max().unwrap_or(0);
        newest.unwrap_or(0).max(cooldown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::similarity::BINS;
    use proptest::prelude::*;

    fn q(window_ms: u64, trip_at: u32, capacity: u32) -> WindowQuery {
        WindowQuery {
            window_ms,
            capacity,
            trip_at,
            cooldown_ms: 0,
            detect_at: trip_at,
            event_every_ms: window_ms,
        }
    }

    /// A signature whose bin `i` holds 1 where bit `i` of `h` is set (0
    /// elsewhere): two of them disagree in as many bins as their `h`
    /// differ in bits.
    fn sig(h: u64) -> Signature {
        let mut s = Signature::default();
        for i in 0..64 {
            if h >> i & 1 == 1 {
                s.bins[i / 32] |= 1 << (2 * (i % 32));
            }
        }
        s
    }

    /// Near when at most `distance` bins disagree.
    fn within(distance: u32) -> NearThreshold {
        NearThreshold {
            min_matches: BINS as u32 - distance,
        }
    }

    fn probe(h: u64) -> NearProbe {
        NearProbe {
            signature: sig(h),
            threshold: within(3),
        }
    }

    #[test]
    fn near_hits_count_far_ones_do_not() {
        let mut r = NearRecord::default();
        let q = q(60_000, 3, 64);
        assert_eq!(r.record(0, &q, probe(0b0000)).count, 1);
        // Three bins apart: a repeat.
        assert_eq!(r.record(10, &q, probe(0b0111)).count, 2);
        // Far from both: its own first hit.
        assert_eq!(r.record(20, &q, probe(u64::MAX)).count, 1);
        // One bin from the first, two from the second: the third repeat.
        let s = r.record(30, &q, probe(0b0001));
        assert_eq!(s.count, 3);
        assert_eq!(s.event, Some(0));
        // Allowed again once the second-newest repeat (at 10) has left.
        assert_eq!(s.until_allowed_ms, 10 + 60_000 - 30);
    }

    #[test]
    fn hits_leave_the_window_and_the_history_is_bounded() {
        let mut r = NearRecord::default();
        let q = q(1_000, 3, 4);
        for t in 0..10 {
            r.record(t, &q, probe(t << 20));
        }
        assert_eq!(r.hits.len(), 4);
        assert_eq!(r.record(5_000, &q, probe(0)).count, 1);
        assert_eq!(r.hits.len(), 1);
    }

    #[test]
    fn a_cooldown_holds_its_loop_not_the_caller() {
        let mut r = NearRecord::default();
        let q = WindowQuery {
            cooldown_ms: 30_000,
            ..q(1_000, 2, 64)
        };
        r.record(0, &q, probe(0));
        let s = r.record(10, &q, probe(1));
        assert_eq!(s.cooldown_remaining_ms, 30_000);
        // Later, out of the window: the loop is still in cooldown...
        let s = r.record(5_000, &q, probe(2));
        assert_eq!(s.cooldown_remaining_ms, 25_010);
        // ...another conversation of the caller is not.
        let s = r.record(5_000, &q, probe(u64::MAX));
        assert_eq!(s.cooldown_remaining_ms, 0);
        assert_eq!(s.count, 1);
        assert!(r.expires_at(1_000) >= 30_010);
    }

    #[test]
    fn cooldowns_are_bounded() {
        let mut r = NearRecord::default();
        let q = WindowQuery {
            cooldown_ms: 30_000,
            ..q(60_000, 2, 64)
        };
        for i in 0..20u64 {
            let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            r.record(i * 10, &q, probe(h));
            r.record(i * 10 + 1, &q, probe(h));
        }
        assert!(r.cooldowns.len() <= MAX_COOLDOWNS);
        assert!(r.events.len() <= MAX_EVENTS);
    }

    #[test]
    fn each_loop_is_reported_once_per_interval() {
        let mut r = NearRecord::default();
        let q = q(60_000, 2, 64);
        r.record(0, &q, probe(0));
        assert_eq!(r.record(10, &q, probe(1)).event, Some(0));
        // The same loop again: suppressed.
        assert_eq!(r.record(20, &q, probe(0)).event, None);
        // Another loop of the caller: reported too.
        r.record(30, &q, probe(u64::MAX));
        assert_eq!(r.record(40, &q, probe(u64::MAX - 1)).event, Some(0));
        // After the interval, the first loop's suppressed count comes out.
        assert_eq!(r.record(60_020, &q, probe(0)).count, 1);
        assert_eq!(r.record(60_030, &q, probe(0)).event, Some(1));
        assert_eq!(r.record(60_040, &q, probe(1)).event, None);
    }

    #[test]
    fn ties_between_loops_go_to_the_least_signature_as_in_redis() {
        // Two loops one bin away from the probe each: equally near. The
        // state updated is the one with the least signature in hex
        // (sig(0b01) < sig(0b10)), whatever their order in the record.
        let q = q(60_000, 3, 64);
        let event = |h: u64| NearEvent {
            signature: sig(h),
            last: 1_000,
            suppressed: 0,
        };
        let mut r = NearRecord {
            events: vec![event(0b10), event(0b01)],
            ..NearRecord::default()
        };
        assert!(sig(0b01).hex() < sig(0b10).hex());
        assert_eq!(r.report(1_001, &q, probe(0)), None);
        let suppressed: Vec<(String, u32)> = r
            .events
            .iter()
            .map(|e| (e.signature.hex(), e.suppressed))
            .collect();
        assert_eq!(
            suppressed,
            [(sig(0b10).hex(), 0), (sig(0b01).hex(), 1)],
            "the nearest, then the least signature"
        );
        // A full record: a new loop replaces the oldest; of equally old
        // ones, the least signature (times from the future count as now).
        let far = |k: u64| 0xff_u64 << (8 * k);
        let mut r = NearRecord {
            events: (0..MAX_EVENTS as u64)
                .rev()
                .map(|k| NearEvent {
                    signature: sig(far(k)),
                    // The least signature's time is in the future (the
                    // clock moved back): as old as the others, not newer.
                    last: if k == 4 { 9_999 } else { 5_001 },
                    suppressed: 1,
                })
                .collect(),
            ..NearRecord::default()
        };
        let least = (0..MAX_EVENTS as u64)
            .map(|k| sig(far(k)).hex())
            .min()
            .unwrap();
        assert_eq!(least, sig(far(4)).hex());
        assert_eq!(r.report(5_001, &q, probe(0)), Some(0));
        assert_eq!(r.events.len(), MAX_EVENTS);
        assert!(r.events.iter().all(|e| e.signature.hex() != least));
        assert!(r.events.iter().any(|e| e.signature == sig(0)));
    }

    #[test]
    fn a_failed_attempt_is_taken_back_up_to_the_budget_of_its_signature() {
        let mut r = NearRecord::default();
        let q = q(60_000, 3, 64);
        let f = Forgiveness {
            window_ms: 60_000,
            max: 2,
        };
        // An attempt failed twice by the provider and retried as it was.
        r.record(0, &q, probe(0));
        assert_eq!(r.forgive(&sig(0), 0, 5, &f), Forgave::Forgiven);
        r.record(10, &q, probe(0));
        assert_eq!(r.forgive(&sig(0), 10, 15, &f), Forgave::Forgiven);
        assert!(r.hits.is_empty());
        r.record(20, &q, probe(0));
        // Its forgiveness is used up: the third failure stays counted.
        assert_eq!(r.forgive(&sig(0), 20, 25, &f), Forgave::OverBudget);
        assert_eq!(r.hits.len(), 1);
        // Another request of the caller (another signature) has its own.
        r.record(30, &q, probe(0b1));
        assert_eq!(r.forgive(&sig(0b1), 30, 35, &f), Forgave::Forgiven);
        // A hit that is not there (another time).
        assert_eq!(r.forgive(&sig(0), 21, 40, &f), Forgave::NotFound);
        // After the window, forgiveness is back.
        r.record(70_000, &q, probe(0));
        assert_eq!(r.forgive(&sig(0), 70_000, 70_001, &f), Forgave::Forgiven);
        // What is remembered is bounded.
        for i in 0..40u64 {
            r.record(80_000 + i, &q, probe(i << 8));
            r.forgive(&sig(i << 8), 80_000 + i, 80_000 + i, &f);
        }
        assert!(r.forgiven.len() <= window::MAX_FORGIVEN);
        // A hit that has left the window counts no more: nothing to take
        // back, though no later hit has trimmed it from the history yet
        // (as in Redis, whose log key may not have expired either).
        r.record(200_000, &q, probe(0b11));
        assert_eq!(
            r.forgive(&sig(0b11), 200_000, 260_000, &f),
            Forgave::NotFound
        );
        assert_eq!(
            r.forgive(&sig(0b11), 200_000, 259_999, &f),
            Forgave::Forgiven
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Against a brute-force reference: the count is the number of
        /// hits in the window (newest `capacity`) within the distance.
        #[test]
        fn count_matches_a_brute_force_reference(
            events in prop::collection::vec((0u64..4, 0u64..400), 1..120),
            distance in 0u32..3,
            capacity in 1u32..16,
        ) {
            let q = q(1_000, 1_000, capacity);
            let mut r = NearRecord::default();
            let mut all: Vec<(u64, u64)> = Vec::new();
            let mut now = 0u64;
            for (which, gap) in events {
                now += gap;
                // Four signatures 0, 1, 3, 7 bins apart from the first.
                let h = (1u64 << (which * 2)) - 1;
                let s = r.record(now, &q, NearProbe { signature: sig(h), threshold: within(distance) });
                all.push((h, now));
                let in_window: Vec<_> = all.iter().filter(|(_, t)| now - t < q.window_ms).collect();
                let kept = &in_window[in_window.len().saturating_sub(capacity as usize)..];
                let want = kept.iter().filter(|(g, _)| (g ^ h).count_ones() <= distance).count() as u32;
                prop_assert_eq!(s.count, want);
            }
        }
    }
}
