//! The verdict: pure, from the policy and the store's answer.

use crate::config::{Action, Detection, Mode, Policy, Similarity};
use crate::detect::fingerprint::{Fingerprint, Fingerprinted};
use crate::detect::similarity::NearThreshold;
use crate::state::near::NearProbe;
use crate::state::store::Hit;
use crate::state::window::{WindowQuery, WindowState};

/// What loopguard does with a request (or, in shadow mode, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forward the request.
    Allow,
    /// Forward it, with warning headers to the upstream and the client.
    Warn(Notice),
    /// Hold it for `delay_ms`, then forward it.
    Throttle { notice: Notice, delay_ms: u64 },
    /// Answer 429 without contacting the upstream.
    Reject(Rejection),
}

impl Verdict {
    /// The action taken, if any.
    pub fn action(&self) -> Option<Action> {
        match self {
            Verdict::Allow => None,
            Verdict::Warn(_) => Some(Action::Warn),
            Verdict::Throttle { .. } => Some(Action::Throttle),
            Verdict::Reject(_) => Some(Action::Reject),
        }
    }

    pub fn notice(&self) -> Option<&Notice> {
        match self {
            Verdict::Allow => None,
            Verdict::Warn(n) | Verdict::Throttle { notice: n, .. } => Some(n),
            Verdict::Reject(r) => Some(&r.notice),
        }
    }
}

/// The facts every action reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub policy_id: String,
    pub fingerprint: Fingerprint,
    /// Identical requests inside the window, this one included.
    pub count: u32,
    pub window_seconds: u64,
    /// Counted as near-identical (`near` mode), not identical.
    pub near: bool,
    /// Counted from the conversation's own turns (near mode's repeats),
    /// not from the window.
    pub turns: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub notice: Notice,
    /// Until this fingerprint would be allowed again if the client stopped:
    /// the later of the window and the cooldown.
    pub retry_after_ms: u64,
    /// The policy's cooldown (0 for none).
    pub cooldown_seconds: u64,
}

/// A verdict and whether it is only observed (shadow mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub shadow: bool,
}

/// What the store must record and measure for this policy (`fallback`: a
/// session-mode request without a session id, judged by the fallback
/// ladder).
pub fn window_query(d: &Detection, fallback: bool) -> WindowQuery {
    let ladder = d.ladder(fallback);
    WindowQuery {
        window_ms: d.window_ms(),
        capacity: ladder.hits_to_keep(),
        trip_at: ladder.reject_at().unwrap_or_else(|| ladder.threshold()),
        cooldown_ms: d.cooldown_seconds * 1000,
        detect_at: ladder.threshold(),
        event_every_ms: d.window_ms().max(d.cooldown_seconds * 1000),
    }
}

/// The hit a finished fingerprint records: its key, the window, and for
/// near mode the signature to compare in the caller's record (whose
/// history is `near_history` long). `id` tells this hit from every other
/// (the shared store's log member), so a failed attempt can be taken back.
pub fn hit(policy: &Policy, d: &Detection, made: &Fingerprinted, now_ms: u64, id: u64) -> Hit {
    let mut query = window_query(d, made.fallback);
    let near = match (&d.similarity, made.near) {
        (
            Similarity::Near {
                similarity_milli,
                history,
                ..
            },
            Some(signature),
        ) => {
            query.capacity = *history;
            Some(NearProbe {
                signature,
                threshold: NearThreshold::from_milli(*similarity_milli),
            })
        }
        _ => None,
    };
    Hit {
        key: store_key(policy, &made.fingerprint),
        now_ms,
        query,
        near,
        id,
    }
}

/// The key a policy counts a fingerprint under: shadow policies count in a
/// key space of their own.
pub fn store_key(policy: &Policy, fp: &Fingerprint) -> Fingerprint {
    match policy.mode {
        Mode::Enforce => *fp,
        Mode::Shadow => fp.shadow_key(),
    }
}

/// The decision of a policy's loop detection from the window state and,
/// in near mode, `repeats`: the turns in a row the request's own history
/// shows near each other (0 in the other modes). When they outnumber the window's
/// count, they decide: a growing conversation repeating itself is judged
/// by its turns, whatever their pace (the same conversation sent again
/// is rejected again until it moves on, so `retry-after` is the window).
pub fn decide(
    policy: &Policy,
    d: &Detection,
    fp: &Fingerprint,
    fallback: bool,
    state: &WindowState,
    repeats: u32,
) -> Decision {
    let turns = repeats > state.count;
    let state = &if turns {
        WindowState {
            count: repeats,
            until_allowed_ms: state.until_allowed_ms.max(d.window_ms()),
            ..*state
        }
    } else {
        *state
    };
    let ladder = d.ladder(fallback);
    let notice = || Notice {
        policy_id: policy.id.clone(),
        fingerprint: *fp,
        count: state.count,
        window_seconds: d.window_seconds,
        near: matches!(d.similarity, Similarity::Near { .. }),
        turns,
    };
    let reject = |retry_after_ms: u64| {
        Verdict::Reject(Rejection {
            notice: notice(),
            retry_after_ms: retry_after_ms.max(1),
            cooldown_seconds: d.cooldown_seconds,
        })
    };
    let in_cooldown = state.cooldown_remaining_ms > 0;
    let verdict = match ladder.step_at(state.count) {
        _ if in_cooldown => reject(state.cooldown_remaining_ms.max(state.until_allowed_ms)),
        None => Verdict::Allow,
        Some(s) => match s.action {
            Action::Warn => Verdict::Warn(notice()),
            Action::Throttle => Verdict::Throttle {
                notice: notice(),
                delay_ms: (u64::from(state.count) * ladder.throttle_step_ms)
                    .min(ladder.throttle_max_delay_ms),
            },
            // The triggering hit itself is in the window, so this is > 0;
            // kept so even if a store rounds.
            Action::Reject => reject(state.until_allowed_ms),
        },
    };
    Decision {
        verdict,
        shadow: policy.mode == Mode::Shadow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use serde_json::{json, Value};

    fn policy(ld: Value) -> Policy {
        Config::from_value(
            &json!({"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": ld}}]}),
        )
        .unwrap()
        .policies[0]
            .clone()
    }

    fn st(count: u32, until_allowed_ms: u64, cooldown_remaining_ms: u64) -> WindowState {
        WindowState {
            count,
            until_allowed_ms,
            cooldown_remaining_ms,
            event: None,
        }
    }

    fn run(p: &Policy, s: WindowState) -> Verdict {
        let d = p.detection.clone().unwrap();
        decide(p, &d, &Fingerprint([3; 16]), false, &s, 0).verdict
    }

    #[test]
    fn below_threshold_allows_at_threshold_rejects() {
        let p = policy(
            json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 5}),
        );
        assert_eq!(run(&p, st(4, 0, 0)), Verdict::Allow);
        match run(&p, st(5, 36_200, 0)) {
            Verdict::Reject(r) => {
                assert_eq!(r.notice.count, 5);
                assert_eq!(r.retry_after_ms, 36_200);
                assert_eq!(r.notice.window_seconds, 60);
                assert_eq!(r.notice.policy_id, "p");
            }
            v => panic!("{v:?}"),
        }
        let d = p.detection.clone().unwrap();
        assert_eq!(
            window_query(&d, false),
            WindowQuery {
                window_ms: 60_000,
                capacity: 5,
                trip_at: 5,
                cooldown_ms: 0,
                detect_at: 5,
                event_every_ms: 60_000,
            }
        );
    }

    #[test]
    fn throttle_delay_escalates_with_the_count_up_to_the_cap() {
        let p = policy(
            json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3,
            "action": "throttle", "throttle_step_ms": 100, "throttle_max_delay_ms": 450}),
        );
        assert_eq!(run(&p, st(2, 0, 0)), Verdict::Allow);
        let delay = |c| match run(&p, st(c, 0, 0)) {
            Verdict::Throttle { delay_ms, .. } => delay_ms,
            v => panic!("{v:?}"),
        };
        assert_eq!(
            (delay(3), delay(4), delay(5), delay(9)),
            (300, 400, 450, 450)
        );
    }

    #[test]
    fn warn_forwards_with_a_notice() {
        let p = policy(
            json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 2, "action": "warn"}),
        );
        match run(&p, st(2, 0, 0)) {
            Verdict::Warn(n) => assert_eq!(n.count, 2),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn ladder_picks_the_step_by_count() {
        let p = policy(
            json!({"enabled": true, "window_seconds": 60, "escalation": [
            {"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}, {"at": 8, "action": "reject"}]}),
        );
        let d = p.detection.clone().unwrap();
        assert_eq!(window_query(&d, false).trip_at, 8);
        let action = |c: u32| run(&p, st(c, 5_000, 0)).action();
        assert_eq!(action(2), None);
        assert_eq!(action(3), Some(Action::Warn));
        assert_eq!(action(4), Some(Action::Warn));
        assert_eq!(action(5), Some(Action::Throttle));
        assert_eq!(action(7), Some(Action::Throttle));
        assert_eq!(action(8), Some(Action::Reject));
        match run(&p, st(8, 5_000, 0)) {
            Verdict::Reject(r) => assert_eq!(r.retry_after_ms, 5_000),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn cooldown_rejects_even_below_the_threshold() {
        let p = policy(
            json!({"enabled": true, "window_seconds": 10, "threshold_identical_requests": 3, "cooldown_seconds": 30}),
        );
        let d = p.detection.clone().unwrap();
        assert_eq!(window_query(&d, false).cooldown_ms, 30_000);
        match run(&p, st(1, 0, 12_000)) {
            Verdict::Reject(r) => {
                assert_eq!(r.retry_after_ms, 12_000);
                assert_eq!(r.cooldown_seconds, 30);
            }
            v => panic!("{v:?}"),
        }
        // The larger of the cooldown and window remainders.
        match run(&p, st(3, 9_000, 4_000)) {
            Verdict::Reject(r) => assert_eq!(r.retry_after_ms, 9_000),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn session_fallback_uses_the_scaled_ladder() {
        let p = policy(
            json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "session"}),
        );
        let d = p.detection.clone().unwrap();
        assert_eq!(window_query(&d, true).trip_at, 15);
        assert_eq!(window_query(&d, true).capacity, 15);
        let fp = Fingerprint([1; 16]);
        assert_eq!(
            decide(&p, &d, &fp, true, &st(14, 0, 0), 0).verdict,
            Verdict::Allow
        );
        assert_eq!(
            decide(&p, &d, &fp, true, &st(15, 10, 0), 0)
                .verdict
                .action(),
            Some(Action::Reject)
        );
        assert_eq!(
            decide(&p, &d, &fp, false, &st(3, 10, 0), 0)
                .verdict
                .action(),
            Some(Action::Reject)
        );
    }

    #[test]
    fn shadow_policies_observe_in_their_own_key_space() {
        let mut p = policy(
            json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 2}),
        );
        let fp = Fingerprint([9; 16]);
        assert_eq!(store_key(&p, &fp), fp);
        p.mode = Mode::Shadow;
        assert_ne!(store_key(&p, &fp), fp);
        let d = p.detection.clone().unwrap();
        let decision = decide(&p, &d, &fp, false, &st(2, 100, 0), 0);
        assert!(decision.shadow);
        assert_eq!(decision.verdict.action(), Some(Action::Reject));
        // The reported fingerprint is the request's, not the shadow key.
        assert_eq!(decision.verdict.notice().unwrap().fingerprint, fp);
    }
}
