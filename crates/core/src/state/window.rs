//! Sliding-log window arithmetic.
//!
//! A hit at time `t` is inside the window at time `now` while
//! `now - t < window` (milliseconds). The log keeps the newest hits only, up
//! to a capacity the policy needs, oldest first.

/// What a store needs to know to record a hit for a policy. It travels with
/// every call, so a store needs no per-policy configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowQuery {
    pub window_ms: u64,
    /// Hits the record keeps (at most 1024).
    pub capacity: u32,
    /// The count at which requests are rejected: `until_allowed_ms` is
    /// measured against it, and reaching it starts the cooldown.
    pub trip_at: u32,
    /// 0 for none.
    pub cooldown_ms: u64,
    /// The count from which a hit is a detection (the first step).
    pub detect_at: u32,
    /// A detection is reported (logged, alerted) at most once per this
    /// interval per fingerprint; detections in between are counted.
    pub event_every_ms: u64,
}

/// The answer of a store after recording a hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowState {
    /// Identical hits inside the window, this one included (capped at the
    /// record's capacity).
    pub count: u32,
    /// Milliseconds until a further identical request would stay below
    /// `trip_at` if the client stopped now; 0 when it already would.
    pub until_allowed_ms: u64,
    /// Milliseconds of cooldown left (0 when none is running). A cooldown
    /// starts when `trip_at` is reached and none is running; hits during it
    /// do not extend it.
    pub cooldown_remaining_ms: u64,
    /// `Some(n)` when this hit is a detection to report: the first of the
    /// fingerprint in `event_every_ms`, `n` being the detections since the
    /// last report that were not reported.
    pub event: Option<u32>,
}

impl WindowState {
    /// A fingerprint's first hit.
    pub const FIRST: WindowState = WindowState {
        count: 1,
        until_allowed_ms: 0,
        cooldown_remaining_ms: 0,
        event: None,
    };
}

/// One fingerprint's sliding log and cooldown.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HitRecord {
    /// Hit times, oldest first.
    pub hits: Vec<u64>,
    /// 0 when no cooldown was ever started.
    pub cooldown_until: u64,
    /// When a detection of this fingerprint was last reported (0: never).
    pub last_event: u64,
    /// Detections since then that were not reported.
    pub suppressed: u32,
    /// When attempts the provider failed were forgiven (in the window).
    pub forgiven: Vec<u64>,
}

impl HitRecord {
    /// Record a hit at `now` and answer the window state.
    pub fn record(&mut self, now: u64, q: &WindowQuery) -> WindowState {
        push_hit(&mut self.hits, now, now, q, |t| t);
        let count = u32::try_from(self.hits.len()).unwrap_or(u32::MAX);
        // A cooldown from the future (the clock moved back) lasts at most
        // one cooldown from now.
        self.cooldown_until = self.cooldown_until.min(now.saturating_add(q.cooldown_ms));
        if self.cooldown_until <= now && q.cooldown_ms > 0 && count >= q.trip_at {
            self.cooldown_until = now.saturating_add(q.cooldown_ms);
        }
        let cooldown_remaining_ms = self.cooldown_until.saturating_sub(now);
        let detected = count >= q.detect_at || cooldown_remaining_ms > 0;
        let (last, suppressed) = (&mut self.last_event, &mut self.suppressed);
        let event = detected
            .then(|| report(last, suppressed, now, q.event_every_ms))
            .flatten();
        WindowState {
            count,
            until_allowed_ms: until_allowed(&self.hits, now, q.window_ms, q.trip_at),
            cooldown_remaining_ms,
            event,
        }
    }

    /// The attempt recorded at `at` was failed by the provider: take its
    /// hit back, as the window's forgiveness allows.
    pub fn forgive(&mut self, at: u64, now: u64, f: &Forgiveness) -> Forgave {
        let (hits, forgiven) = (&mut self.hits, &mut self.forgiven);
        forgive(hits, forgiven, |t| t, |_| true, at, now, f)
    }

    /// When this record stops mattering: its newest hit has left the window
    /// and its cooldown is over.
    pub fn expires_at(&self, window_ms: u64) -> u64 {
        let newest = self.hits.last().map_or(0, |t| t.saturating_add(window_ms));
        newest.max(self.cooldown_until)
    }
}

/// How many attempts the provider failed a record may take back within
/// a window (`forgive_failed_attempts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forgiveness {
    pub window_ms: u64,
    pub max: u32,
}

/// What became of a failed attempt's hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgave {
    /// Taken back: the attempt is not loop evidence.
    Forgiven,
    /// The window's forgiveness is used up: the attempt counts.
    OverBudget,
    /// The hit is no longer in the record (it left the window, or was
    /// evicted): nothing to take back.
    NotFound,
}

/// Take back the newest hit of `log` recorded at `at` that is `alike` (an
/// attempt the provider failed), if it is still in the window and fewer
/// than `f.max` attempts alike were taken back within it. `forgiven`
/// remembers what was taken back (the hit, `time` (an entry's hit time)
/// set to `now`), at most [`MAX_FORGIVEN`] entries.
pub fn forgive<T>(
    log: &mut Vec<T>,
    forgiven: &mut Vec<T>,
    time: fn(&mut T) -> &mut u64,
    alike: impl Fn(&T) -> bool,
    at: u64,
    now: u64,
    f: &Forgiveness,
) -> Forgave {
    let found = log.iter_mut().rposition(|e| *time(e) == at && alike(e));
    forgiven.retain_mut(|e| in_window(*time(e), now, f.window_ms));
    let Some(i) = found.filter(|_| in_window(at, now, f.window_ms)) else {
        return Forgave::NotFound;
    };
    if forgiven.iter().filter(|e| alike(e)).count() >= f.max as usize {
        return Forgave::OverBudget;
    }
    let mut entry = log.remove(i);
    *time(&mut entry) = now;
    if forgiven.len() >= MAX_FORGIVEN {
        forgiven.remove(0);
    }
    forgiven.push(entry);
    Forgave::Forgiven
}

/// Whether a hit at `at` still counts at `now` (a hit from the future, the
/// clock having moved back, counts as now).
pub fn in_window(at: u64, now: u64, window_ms: u64) -> bool {
    now.saturating_sub(at.min(now)) < window_ms
}

/// Forgiven attempts a record remembers (the budget is at most 16).
pub const MAX_FORGIVEN: usize = 16;

/// Whether a detection at `now` is reported: the first in `every_ms`
/// (answering how many were not reported since the last one), or counted
/// as suppressed. `last_event` (0: never) and `suppressed` are the
/// record's.
pub fn report(last_event: &mut u64, suppressed: &mut u32, now: u64, every_ms: u64) -> Option<u32> {
    if *last_event == 0 || now.saturating_sub((*last_event).min(now)) >= every_ms {
        *last_event = now;
        Some(std::mem::take(suppressed))
    } else {
        *suppressed = suppressed.saturating_add(1);
        None
    }
}

/// Record a hit in a sliding log (oldest first; `time` is an entry's hit
/// time): drop hits that left the window, clamp hits from the future (the
/// clock moved backwards) to `now` so they expire one window from now at
/// the latest, append `entry`, and keep the newest `capacity`.
pub fn push_hit<T>(
    log: &mut Vec<T>,
    entry: T,
    now: u64,
    q: &WindowQuery,
    time: fn(&mut T) -> &mut u64,
) {
    log.retain_mut(|e| {
        let t = time(e);
        *t = (*t).min(now);
        now - *t < q.window_ms
    });
    log.push(entry);
    let excess = log.len().saturating_sub(q.capacity.max(1) as usize);
    log.drain(..excess);
}

/// A new request at time T is allowed when fewer than `trip_at - 1` earlier
/// hits lie in its window. That holds once the `(trip_at - 1)`th newest hit
/// has left the window: at `t + window`.
pub fn until_allowed(log: &[u64], now: u64, window_ms: u64, trip_at: u32) -> u64 {
    let k = trip_at.saturating_sub(1) as usize;
    // With k = 0, `i` is the log's length: no hit, no wait.
    let kth_newest = log.len().checked_sub(k).and_then(|i| log.get(i));
    kth_newest.map_or(0, |&t| (t + window_ms).saturating_sub(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn record_hit(log: &mut Vec<u64>, now: u64, q: &WindowQuery) -> WindowState {
        // A fresh record around the log: every detection is reported.
        let mut r = HitRecord {
            hits: std::mem::take(log),
            ..HitRecord::default()
        };
        let s = r.record(now, q);
        *log = r.hits;
        s
    }

    #[test]
    fn a_hit_that_left_the_window_is_not_taken_back() {
        let q = q(1_000, 5);
        let f = Forgiveness {
            window_ms: 1_000,
            max: 3,
        };
        let mut r = HitRecord::default();
        r.record(100, &q);
        r.record(200, &q);
        // 100 left the window at 1100, though no hit has trimmed it yet.
        assert_eq!(r.forgive(100, 1_100, &f), Forgave::NotFound);
        assert_eq!(r.hits, [100, 200]);
        assert_eq!(r.forgive(200, 1_199, &f), Forgave::Forgiven);
        assert_eq!(r.hits, [100]);
    }

    fn st(count: u32, until_allowed_ms: u64) -> WindowState {
        WindowState {
            count,
            until_allowed_ms,
            cooldown_remaining_ms: 0,
            event: (count >= 3).then_some(0),
        }
    }

    #[test]
    fn nth_hit_trips_and_retry_after_follows_the_n_minus_1th_newest() {
        let mut log = Vec::new();
        let q = q(10_000, 3);
        assert_eq!(record_hit(&mut log, 1_000, &q), st(1, 0));
        assert_eq!(record_hit(&mut log, 2_000, &q), st(2, 9_000));
        // Third hit trips; allowed again once the 2nd newest (t=2000) leaves.
        assert_eq!(record_hit(&mut log, 3_000, &q), st(3, 9_000));
        // The log is full: later hits still see the threshold reached.
        assert_eq!(record_hit(&mut log, 3_500, &q), st(3, 9_500));
    }

    #[test]
    fn boundary_is_exclusive() {
        let mut log = Vec::new();
        let q = q(1_000, 2);
        record_hit(&mut log, 0, &q);
        assert_eq!(record_hit(&mut log, 999, &q).count, 2);
        let mut log = Vec::new();
        record_hit(&mut log, 0, &q);
        assert_eq!(record_hit(&mut log, 1_000, &q).count, 1);
    }

    #[test]
    fn clock_going_backwards_is_bounded() {
        let mut log = vec![10_000_000];
        let q = q(1_000, 5);
        // Clock jumped back an hour: the future hit counts as now...
        assert_eq!(record_hit(&mut log, 10_000_000 - 3_600_000, &q).count, 2);
        // ...and is gone one window later.
        assert_eq!(
            record_hit(&mut log, 10_000_000 - 3_600_000 + 1_000, &q).count,
            1
        );
    }

    #[test]
    fn cooldown_starts_at_the_trip_and_is_not_extended() {
        let q = WindowQuery {
            window_ms: 1_000,
            capacity: 2,
            trip_at: 2,
            cooldown_ms: 5_000,
            detect_at: 2,
            event_every_ms: 5_000,
        };
        let mut r = HitRecord::default();
        assert_eq!(r.record(0, &q).cooldown_remaining_ms, 0);
        let s = r.record(100, &q);
        assert_eq!((s.count, s.cooldown_remaining_ms), (2, 5_000));
        // Hits during the cooldown do not extend it, even when they trip.
        assert_eq!(r.record(2_000, &q).cooldown_remaining_ms, 3_100);
        let s = r.record(4_000, &q);
        assert_eq!((s.count, s.cooldown_remaining_ms), (1, 1_100));
        assert_eq!(r.expires_at(1_000), 5_100);
        // Over: a calm request sees none; a new trip starts a new one.
        assert_eq!(r.record(6_000, &q).cooldown_remaining_ms, 0);
        assert_eq!(r.record(6_100, &q).cooldown_remaining_ms, 5_000);
    }

    #[test]
    fn cooldown_from_a_clock_that_moved_back_is_bounded() {
        let q = WindowQuery {
            window_ms: 1_000,
            capacity: 2,
            trip_at: 2,
            cooldown_ms: 5_000,
            detect_at: 2,
            event_every_ms: 5_000,
        };
        let mut r = HitRecord {
            cooldown_until: 1_000_000,
            ..HitRecord::default()
        };
        assert_eq!(r.record(10, &q).cooldown_remaining_ms, 5_000);
    }

    #[test]
    fn detections_are_reported_once_per_interval_and_the_rest_counted() {
        let q = WindowQuery {
            window_ms: 1_000,
            capacity: 2,
            trip_at: 2,
            cooldown_ms: 0,
            detect_at: 2,
            event_every_ms: 1_000,
        };
        let mut r = HitRecord::default();
        let events: Vec<Option<u32>> = [0, 10, 20, 30, 500, 1_015, 1_020, 5_000, 5_010]
            .iter()
            .map(|&t| r.record(t, &q).event)
            .collect();
        // 0: not a detection. 10: first detection, reported. 20..500 counted
        // (3). 1015: an interval later, reported with those 3. 5000 is calm,
        // 5010 a new detection.
        assert_eq!(
            events,
            vec![
                None,
                Some(0),
                None,
                None,
                None,
                Some(3),
                None,
                None,
                Some(1)
            ]
        );
    }

    /// Brute force: the whole history, no capacity, straight from the
    /// definition.
    fn reference(history: &[u64], now: u64, window: u64, trip_at: u32) -> (u32, u64) {
        let count = history.iter().filter(|&&t| now - t < window).count() as u32;
        // Smallest T >= now at which fewer than trip_at-1 hits are in window.
        let mut t = now;
        loop {
            let n = history
                .iter()
                .filter(|&&h| t >= h && t - h < window)
                .count() as u32;
            if n + 1 < trip_at || trip_at <= 1 {
                return (count, t - now);
            }
            t += 1;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The capped sliding log agrees with the brute-force definition on
        /// every decision: the count up to capacity, whether the threshold
        /// is reached, and the exact time until allowed.
        #[test]
        fn sliding_log_matches_brute_force(
            gaps in prop::collection::vec(0u64..400, 1..60),
            window in 1u64..1_500,
            trip_at in 2u32..8,
            extra_capacity in 0u32..4,
        ) {
            let capacity = trip_at + extra_capacity;
            let q = WindowQuery { window_ms: window, capacity, trip_at, cooldown_ms: 0, detect_at: trip_at, event_every_ms: window };
            let mut log = Vec::new();
            let mut history = Vec::new();
            let mut now = 10_000u64;
            for gap in gaps {
                now += gap;
                history.push(now);
                let got = record_hit(&mut log, now, &q);
                let (count, until) = reference(&history, now, window, trip_at);
                prop_assert_eq!(got.count, count.min(capacity));
                prop_assert_eq!(got.count >= trip_at, count >= trip_at);
                prop_assert_eq!(got.until_allowed_ms, until);
                prop_assert!(log.len() <= capacity as usize);
            }
        }

        /// Against a brute-force cooldown: rejected while the window holds
        /// trip_at hits or a cooldown started by such a moment still runs.
        #[test]
        fn cooldown_matches_brute_force(
            gaps in prop::collection::vec(0u64..700, 1..60),
            window in 1u64..1_500,
            cooldown in 1u64..3_000,
            trip_at in 2u32..6,
        ) {
            let q = WindowQuery { window_ms: window, capacity: trip_at, trip_at, cooldown_ms: cooldown, detect_at: trip_at, event_every_ms: window.max(cooldown) };
            let mut r = HitRecord::default();
            let mut history = Vec::new();
            let mut cooldown_until = 0u64;
            let mut now = 10_000u64;
            for gap in gaps {
                now += gap;
                history.push(now);
                let got = r.record(now, &q);
                let (count, _) = reference(&history, now, window, trip_at);
                if cooldown_until <= now && count >= trip_at {
                    cooldown_until = now + cooldown;
                }
                prop_assert_eq!(got.cooldown_remaining_ms, cooldown_until.saturating_sub(now));
            }
        }

        /// Not a fixed window and not a TTL refreshed on every hit: hits
        /// spaced more than window/(N-1) apart never trip, however long the
        /// loop runs.
        #[test]
        fn steady_slow_hits_never_trip(trip_at in 2u32..6, window in 100u64..2_000, n in 1usize..50) {
            let spacing = window / u64::from(trip_at - 1) + 1;
            let q = q(window, trip_at);
            let mut log = Vec::new();
            for i in 0..n {
                let s = record_hit(&mut log, 1_000 + i as u64 * spacing, &q);
                prop_assert!(s.count < trip_at);
            }
        }
    }
}
