//! The one ladder every guard climbs: steps that apply from a measure on
//! (a count of repeats, a share of a cap), the highest one reached
//! applying. A guard's ladder is explicit rungs (`loop_detection`'s
//! `escalation`, each step at its own count; a budget's warning, then its
//! cap) or consecutive steps from a threshold (tool loops and MCP: one
//! more step per occurrence past it, the last one staying).

/// The rung `measure` reaches among `rungs`: its 1-based level and its
/// step (the last rung, in order, whose start it has reached); `None`
/// below them all.
pub fn climb<S: Copy>(rungs: impl IntoIterator<Item = (u64, S)>, measure: u64) -> Option<(u32, S)> {
    let reached = rungs
        .into_iter()
        .enumerate()
        .filter(|(_, (at, _))| measure >= *at);
    let (i, (_, step)) = reached.last()?;
    Some((u32::try_from(i + 1).unwrap_or(u32::MAX), step))
}

/// [`climb`] of consecutive steps: step `k` (from 0) applies from
/// `threshold + k` on.
pub fn consecutive<S: Copy>(steps: &[S], threshold: u32, measure: u32) -> Option<(u32, S)> {
    let rungs = (u64::from(threshold)..).zip(steps.iter().copied());
    climb(rungs, u64::from(measure))
}

/// A share of a cap in thousandths (rounded down): `spent` reaches
/// `permille` of `cap` exactly when this is at least `permille`.
pub fn permille(spent: u64, cap: u64) -> u64 {
    let share = u128::from(spent) * 1000 / u128::from(cap.max(1));
    u64::try_from(share).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rungs_and_consecutive_steps() {
        let rungs = [(3, 'w'), (5, 't'), (8, 'r')];
        let at = |m| climb(rungs, m);
        assert_eq!(
            [at(2), at(3), at(7), at(8), at(99)],
            [
                None,
                Some((1, 'w')),
                Some((2, 't')),
                Some((3, 'r')),
                Some((3, 'r'))
            ]
        );
        let steps = ['n', 'b'];
        assert_eq!(consecutive(&steps, 3, 2), None);
        assert_eq!(consecutive(&steps, 3, 3), Some((1, 'n')));
        assert_eq!(consecutive(&steps, 3, 4), Some((2, 'b')));
        assert_eq!(consecutive(&steps, 3, 40), Some((2, 'b')));
        assert_eq!(consecutive::<char>(&[], 3, 40), None);
    }

    proptest! {
        /// Consecutive steps: the level is how far past the threshold,
        /// capped at the last step.
        #[test]
        fn consecutive_is_the_capped_distance(len in 1usize..6, threshold in 0u32..50, measure in 0u32..100) {
            let steps: Vec<usize> = (0..len).collect();
            let want = (measure >= threshold).then(|| {
                let k = ((measure - threshold) as usize).min(len - 1);
                (k as u32 + 1, k)
            });
            prop_assert_eq!(consecutive(&steps, threshold, measure), want);
        }

        /// The share reaches a permille exactly when the cross product does.
        #[test]
        fn permille_is_exact(spent in 0u64..u64::MAX, cap in 1u64..u64::MAX, p in 0u64..2000) {
            let exact = u128::from(spent) * 1000 >= u128::from(cap) * u128::from(p);
            prop_assert_eq!(permille(spent, cap) >= p, exact);
        }
    }
}
