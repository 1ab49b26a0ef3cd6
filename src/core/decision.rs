//! The verdict: pure, from the policy and the store's answer.

use super::config::{Action, Detection, Policy};
use super::fingerprint::Fingerprint;
use super::window::{WindowQuery, WindowState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forward the request.
    Allow { count: u32 },
    /// Answer 429 without contacting the upstream.
    Reject(Rejection),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub policy_id: String,
    pub fingerprint: Fingerprint,
    /// Identical requests inside the window, this one included.
    pub hit_count: u32,
    pub window_seconds: u64,
    /// Until this fingerprint would be allowed again if the client stopped.
    pub retry_after_ms: u64,
    /// This request tripped the action (the ones before it were allowed):
    /// the moment worth logging.
    pub first: bool,
}

/// What the store must record and measure for this policy.
pub fn window_query(d: &Detection) -> WindowQuery {
    WindowQuery {
        window_ms: d.window_ms(),
        capacity: d.hits_to_keep(),
        trip_at: d.threshold,
    }
}

pub fn decide(policy: &Policy, d: &Detection, fp: &Fingerprint, state: &WindowState) -> Verdict {
    if state.count < d.threshold {
        return Verdict::Allow { count: state.count };
    }
    match d.action {
        Action::Reject => Verdict::Reject(Rejection {
            policy_id: policy.id.clone(),
            fingerprint: *fp,
            hit_count: state.count,
            window_seconds: d.window_seconds,
            // The triggering hit itself is in the window, so this is > 0;
            // keep it so even if a store rounds.
            retry_after_ms: state.until_allowed_ms.max(1),
            first: state.previous_count < d.threshold,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::Config;
    use serde_json::json;

    fn policy() -> Policy {
        Config::from_value(&json!({"policies": [{"id": "p", "spec": {"selector": {},
            "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 5}}}]}))
        .unwrap()
        .policies[0]
            .clone()
    }

    #[test]
    fn below_threshold_allows_at_threshold_rejects() {
        let p = policy();
        let d = p.detection.clone().unwrap();
        let fp = Fingerprint([3; 16]);
        assert_eq!(
            decide(
                &p,
                &d,
                &fp,
                &WindowState {
                    count: 4,
                    previous_count: 3,
                    until_allowed_ms: 0
                }
            ),
            Verdict::Allow { count: 4 }
        );
        match decide(
            &p,
            &d,
            &fp,
            &WindowState {
                count: 5,
                previous_count: 4,
                until_allowed_ms: 36_200,
            },
        ) {
            Verdict::Reject(r) => {
                assert_eq!(r.hit_count, 5);
                assert_eq!(r.retry_after_ms, 36_200);
                assert_eq!(r.window_seconds, 60);
                assert_eq!(r.policy_id, "p");
                assert!(r.first);
            }
            v => panic!("{v:?}"),
        }
        assert_eq!(
            window_query(&d),
            WindowQuery {
                window_ms: 60_000,
                capacity: 5,
                trip_at: 5
            }
        );
    }
}
