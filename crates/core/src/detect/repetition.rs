//! Repetition judged one way for every history: a run of one call, and
//! cycles of two or three calls, at the end of a sequence, over a small
//! interface (whether item `i` is the same as item `j`), fed by a
//! conversation's tool calls and by MCP calls alike.

/// How long the end of a sequence of `n` items that repeats with `period`
/// is: its last round (`period` items), then every item before it that is
/// the same as the item `period` after it. 0 when `n < period`.
pub fn periodic_end(n: usize, period: usize, same: impl Fn(usize, usize) -> bool) -> usize {
    if n < period || period == 0 {
        return 0;
    }
    let mut len = period;
    while len < n && same(n - 1 - len, n - 1 - len + period) {
        len += 1;
    }
    len
}

/// Whether the last `period` items are one call made again and again: a
/// run, not a cycle.
pub fn one_call(n: usize, period: usize, same_call: impl Fn(usize, usize) -> bool) -> bool {
    let Some(start) = n.checked_sub(period) else {
        return false;
    };
    (start + 1..n).all(|i| same_call(start, i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_and_cycles() {
        let s = b"xabababab";
        let same = |i: usize, j: usize| s[i] == s[j];
        assert_eq!(periodic_end(s.len(), 2, same), 8);
        assert_eq!(periodic_end(s.len(), 1, same), 1);
        assert_eq!(periodic_end(s.len(), 3, same), 3);
        assert_eq!(periodic_end(1, 2, same), 0);
        assert!(!one_call(s.len(), 2, same));
        assert!(one_call(3, 2, |_, _| true));
    }

    proptest! {
        /// Against its definition: the longest end whose every item
        /// (before the last round) equals the one `period` after it.
        #[test]
        fn periodic_end_is_the_longest_periodic_suffix(s in proptest::collection::vec(0u8..3, 0..30), p in 1usize..4) {
            let n = s.len();
            let want = if n < p { 0 } else {
                (p..=n).rev().find(|&len| (n - len..n - p).all(|k| s[k] == s[k + p])).unwrap_or(p)
            };
            prop_assert_eq!(periodic_end(n, p, |i, j| s[i] == s[j]), want);
        }
    }
}
