//! A budget key's spending over a sliding window, kept as [`SLICES`]
//! slices of the window: what was spent in each, newest first. A spend at
//! `t` lands in slice `t / slice_ms` and counts while the current slice is
//! less than [`SLICES`] slices later, so it leaves the window between
//! `window - slice_ms` and `window` after it was made. The Redis library
//! (`envoy/redis/loopguard.lua`, `loopguard_budget`) keeps the same slices
//! with the same arithmetic (`tests/redis_agreement.rs` compares them).

/// Slices per window.
pub const SLICES: u64 = 60;

/// A slice's length for a window (a window is 60 s to 31 days, so one
/// second to 44,640 s: every slice number and wait of a millisecond clock
/// is exact in `u64`, and in the Redis library's doubles below 2^53).
pub fn slice_ms(window_ms: u64) -> u64 {
    (window_ms / SLICES).max(1)
}

/// The slices of one key: absolute slice numbers and their amounts, at
/// most [`SLICES`] of them, in no particular order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slices {
    pub spent: Vec<(u64, u64)>,
}

impl Slices {
    /// The first slice still inside the window at `now`.
    fn first_in(now: u64, slice_ms: u64) -> u64 {
        (now / slice_ms).saturating_sub(SLICES - 1)
    }

    /// Drop the slices that left the window at `now`.
    pub fn prune(&mut self, now: u64, slice_ms: u64) {
        let first = Self::first_in(now, slice_ms);
        self.spent.retain(|&(i, _)| i >= first);
    }

    /// Add `amount` spent at `at` (dated in the past within the window, or
    /// at `now`); a spend dated before the window counts for nothing.
    pub fn add(&mut self, at: u64, amount: u64, now: u64, slice_ms: u64) {
        self.prune(now, slice_ms);
        let i = at / slice_ms;
        if i < Self::first_in(now, slice_ms) || amount == 0 {
            return;
        }
        match self.spent.iter_mut().find(|(j, _)| *j == i) {
            Some((_, n)) => *n = n.saturating_add(amount),
            None => self.spent.push((i, amount)),
        }
        // A clock far ahead on one writer could add slices past the newest:
        // keep the newest SLICES.
        if self.spent.len() as u64 > SLICES {
            self.spent.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
            self.spent.truncate(SLICES as usize);
        }
    }

    /// Spent inside the window at `now`.
    pub fn total(&self, now: u64, slice_ms: u64) -> u64 {
        let first = Self::first_in(now, slice_ms);
        self.spent
            .iter()
            .filter(|(i, _)| *i >= first)
            .fold(0u64, |t, (_, n)| t.saturating_add(*n))
    }

    /// Milliseconds from `now` until the total is below `cap` (0: it is
    /// already), if no more is spent: the oldest slices leave first.
    pub fn until_below(&self, cap: u64, now: u64, slice_ms: u64) -> u64 {
        let mut left = self.total(now, slice_ms);
        if left < cap {
            return 0;
        }
        let first = Self::first_in(now, slice_ms);
        let mut inside = self.spent.clone();
        inside.retain(|(i, _)| *i >= first);
        inside.sort_unstable();
        for (i, n) in inside {
            left = left.saturating_sub(n);
            if left < cap {
                return ((i + SLICES) * slice_ms).saturating_sub(now);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: every spend with its time, summed by the rule.
    fn reference(events: &[(u64, u64)], now: u64, slice_ms: u64) -> u64 {
        let first = (now / slice_ms).saturating_sub(SLICES - 1);
        events
            .iter()
            .filter(|(t, _)| t / slice_ms >= first)
            .map(|(_, n)| n)
            .sum()
    }

    #[test]
    fn a_spend_leaves_the_window_with_its_slice() {
        let s = slice_ms(3_600_000);
        assert_eq!(s, 60_000);
        let mut w = Slices::default();
        w.add(90_000, 5, 90_000, s); // slice 1
        assert_eq!(w.total(90_000, s), 5);
        // Still inside in slice 60 (59 later), gone in slice 61.
        assert_eq!(w.total(60 * 60_000 + 59_999, s), 5);
        assert_eq!(w.total(61 * 60_000, s), 0);
        assert_eq!(w.until_below(5, 90_000, s), 61 * 60_000 - 90_000);
        assert_eq!(w.until_below(6, 90_000, s), 0);
    }

    #[test]
    fn until_below_counts_the_oldest_out_first() {
        let s = 1000;
        let mut w = Slices::default();
        w.add(0, 3, 0, s);
        w.add(10_000, 3, 10_000, s);
        w.add(20_000, 3, 20_000, s);
        // 9 spent, cap 7: the first slice (0) must leave, at 60 s.
        assert_eq!(w.until_below(7, 20_000, s), 40_000);
        // Cap 4: two must leave: slice 10 leaves at 70 s.
        assert_eq!(w.until_below(4, 20_000, s), 50_000);
    }

    #[test]
    fn a_31_day_window_counts_to_the_millisecond() {
        let window = 31 * 86_400_000;
        let s = slice_ms(window);
        assert_eq!(s * SLICES, window);
        let now = 1_700_000_000_000u64;
        let mut w = Slices::default();
        w.add(now, 5, now, s);
        w.add(now + 10 * 86_400_000, 7, now + 10 * 86_400_000, s);
        let leaves = (now / s + SLICES) * s;
        assert!(leaves - now <= window && leaves - now > window - s);
        assert_eq!(w.total(leaves - 1, s), 12);
        assert_eq!(w.total(leaves, s), 7);
        assert_eq!(w.until_below(12, now, s), leaves - now);
        assert_eq!(
            w.until_below(7, now, s),
            (((now + 10 * 86_400_000) / s) + SLICES) * s - now
        );
        // A spend dated before the window at the time it is added counts for
        // nothing.
        let mut late = Slices::default();
        late.add(now, 3, leaves, s);
        assert_eq!(late.total(leaves, s), 0);
        assert!(late.spent.is_empty());
    }

    proptest! {
        #[test]
        fn the_total_is_the_reference_sum(
            steps in proptest::collection::vec((0u64..5_000, 0u64..1_000), 1..200),
            slice in 1u64..2_000,
        ) {
            let mut w = Slices::default();
            let mut events = Vec::new();
            let mut now = 0u64;
            for (dt, amount) in steps {
                now += dt;
                // Dated at now, or up to a few slices back.
                let at = now.saturating_sub(dt % (3 * slice));
                w.add(at, amount, now, slice);
                if at / slice >= (now / slice).saturating_sub(SLICES - 1) {
                    events.push((at, amount));
                }
                prop_assert_eq!(w.total(now, slice), reference(&events, now, slice));
                prop_assert!(w.spent.len() as u64 <= SLICES);
            }
        }

        #[test]
        fn until_below_is_the_first_moment_under_the_cap(
            amounts in proptest::collection::vec((0u64..100, 1u64..50), 1..40),
            cap in 1u64..500,
        ) {
            let s = 100;
            let mut w = Slices::default();
            let mut now = 0;
            for (dt, n) in amounts {
                now += dt;
                w.add(now, n, now, s);
            }
            let wait = w.until_below(cap, now, s);
            prop_assert!(w.total(now + wait, s) < cap);
            if wait > 0 {
                prop_assert!(w.total(now + wait - 1, s) >= cap);
            }
        }
    }
}
