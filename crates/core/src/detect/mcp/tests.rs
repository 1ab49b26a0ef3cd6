use super::*;
use crate::config::{Classes, McpKey};

fn cfg(ladder: &[McpStep]) -> Mcp {
    Mcp {
        same_result_min: 3,
        same_error_min: 3,
        cycle_min: 3,
        exempt_tools: vec!["poll".to_string()],
        ladder: ladder.to_vec(),
        error_code: -31_000,
        key: McpKey::Session,
        window_ms: 600_000,
        recheck_ms: 60_000,
        result_classes: Classes::defaults(),
        arguments_mask: Classes::NONE,
    }
}

const A: u64 = 1;
const B: u64 = 2;
const C: u64 = 3;

fn e(call: u64, result: u64) -> Entry {
    Entry {
        call,
        result,
        content: result,
        ..Entry::default()
    }
}

fn steps(c: &Mcp, history: &[Entry], call: u64) -> Option<(Tier, u32, McpStep)> {
    judge(c, history, call).map(|v| (v.tier, v.occurrences, v.step))
}

#[test]
fn the_same_call_with_the_same_result_climbs_the_ladder() {
    let c = cfg(&[McpStep::Note, McpStep::Block, McpStep::Error]);
    let mut h = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(steps(&c, &h, A).map(|(_, n, s)| (n, s)));
        h.push(e(A, 10));
    }
    assert_eq!(
        seen,
        vec![
            None,
            None,
            Some((3, McpStep::Note)),
            Some((4, McpStep::Block)),
            Some((5, McpStep::Error)),
            Some((6, McpStep::Error)),
        ]
    );
    let v = judge(&c, &h, A).unwrap();
    assert_eq!(
        (v.tier, v.level, v.evidence.period),
        (Tier::Identical, 3, 1)
    );
    assert_eq!(v.evidence.expected, e(A, 10));
    // Another call is not judged by A's run.
    assert_eq!(steps(&c, &h, B), None);
}

#[test]
fn a_result_that_changes_is_progress() {
    let c = cfg(&[McpStep::Note, McpStep::Block]);
    // Polling a job: the same call, a new result every time.
    let polling: Vec<Entry> = (0..10).map(|i| e(A, 100 + i)).collect();
    assert_eq!(steps(&c, &polling, A), None);
    // The run counts from the last change.
    let h = [e(A, 1), e(A, 1), e(A, 2), e(A, 2)];
    assert_eq!(steps(&c, &h, A), Some((Tier::Identical, 3, McpStep::Note)));
}

#[test]
fn another_call_in_between_or_an_unread_result_breaks_the_run() {
    let c = cfg(&[McpStep::Block]);
    assert_eq!(steps(&c, &[e(A, 1), e(A, 1), e(B, 5), e(A, 1)], A), None);
    let unread = Entry {
        unread: true,
        ..e(A, 1)
    };
    assert_eq!(steps(&c, &[e(A, 1), unread, e(A, 1)], A), None);
    assert_eq!(steps(&c, &[e(A, 1), e(A, 1), unread], A), None);
}

#[test]
fn the_same_failure_is_judged_by_its_own_threshold() {
    let mut c = cfg(&[McpStep::Block]);
    c.same_error_min = 2;
    let failed = Entry {
        failed: true,
        ..e(A, 9)
    };
    assert_eq!(
        steps(&c, &[failed], A),
        Some((Tier::Failing, 2, McpStep::Block))
    );
    // A different failure each time is not the same way.
    let other = Entry {
        failed: true,
        ..e(A, 8)
    };
    assert_eq!(
        steps(&c, &[failed, other], A),
        Some((Tier::Failing, 2, McpStep::Block))
    );
    c.same_error_min = 3;
    assert_eq!(steps(&c, &[failed, other], A), None);
}

#[test]
fn cycles_of_two_and_three_calls() {
    let c = cfg(&[McpStep::Note, McpStep::Block]);
    let ab = [e(A, 1), e(B, 2), e(A, 1), e(B, 2)];
    assert_eq!(steps(&c, &ab[..2], A), None);
    assert_eq!(steps(&c, &ab, A), Some((Tier::Cycle, 3, McpStep::Note)));
    let v = judge(&c, &ab, A).unwrap();
    assert_eq!((v.evidence.period, v.evidence.expected), (2, e(A, 1)));
    let abab = [ab.as_slice(), ab.as_slice()].concat();
    assert_eq!(steps(&c, &abab, A), Some((Tier::Cycle, 5, McpStep::Block)));
    // The cycle's next call is B after A.
    assert_eq!(
        steps(&c, &abab[..5], B),
        Some((Tier::Cycle, 3, McpStep::Note))
    );
    assert_eq!(steps(&c, &abab, B), None);
    let abc = [e(A, 1), e(B, 2), e(C, 3), e(A, 1), e(B, 2), e(C, 3)];
    assert_eq!(steps(&c, &abc, A), Some((Tier::Cycle, 3, McpStep::Note)));
    // A result that changed in a round is progress.
    let moved = [e(A, 1), e(B, 2), e(A, 7), e(B, 2)];
    assert_eq!(steps(&c, &moved, A), None);
    // Switched off.
    let mut off = cfg(&[McpStep::Block]);
    off.cycle_min = 0;
    assert_eq!(steps(&off, &abab, A), None);
}

#[test]
fn exempt_tools_are_named() {
    let c = cfg(&[McpStep::Block]);
    assert!(exempt(&c, "poll"));
    assert!(!exempt(&c, "search"));
}

#[test]
fn a_cycle_needs_a_round_seen_repeating() {
    let mut c = cfg(&[McpStep::Block]);
    c.cycle_min = 2;
    // Read X, edit Y, read X: nothing has repeated with its result yet.
    assert_eq!(steps(&c, &[e(A, 1), e(B, 2)], A), None);
    // Read X, edit Y, read X (same), edit Y: now a round has repeated.
    assert_eq!(
        steps(&c, &[e(A, 1), e(B, 2), e(A, 1)], B),
        Some((Tier::Cycle, 2, McpStep::Block))
    );
}
