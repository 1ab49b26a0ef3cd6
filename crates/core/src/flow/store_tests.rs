//! The stores through the flow: the local table's lost races, and every
//! answer (or none) of the shared store with each `on_error`.

use super::tests::{detection, exact, Harness, Sent};
use super::*;
use crate::state::store::CallReply;
use serde_json::json;

// --- the local store ---------------------------------------------------------------

#[test]
fn cas_conflict_exhausted_fails_open_counted_and_logged_once() {
    let mut h = Harness::policy(exact(2));
    h.engine.local.backend.conflicts_ahead = u32::MAX;
    let first = h.get("/v1/x");
    assert_eq!((first.step, first.status()), (Step::Continue, 200));
    assert_eq!(
        h.metric(&first.effects, "loopguard.store_fail_open_total"),
        1
    );
    assert_eq!(first.logs(Level::Warn).len(), 1);
    assert!(first.logs(Level::Warn)[0].contains("store contention for policy \"p\""));
    let second = h.get("/v1/x");
    assert_eq!(second.status(), 200);
    assert!(
        second.logs(Level::Warn).is_empty(),
        "logged at most every 10 s"
    );
}

#[test]
fn lost_races_are_retried_and_counted() {
    let mut h = Harness::policy(exact(2));
    h.engine.local.backend.conflicts_ahead = 3;
    let s = h.get("/v1/x");
    assert_eq!(h.metric(&s.effects, "loopguard.store_cas_retries_total"), 3);
    assert_eq!(h.get("/v1/x").status(), 429, "the hit was recorded once");
}

// --- the shared store -----------------------------------------------------------------

fn redis(on_error: &str, threshold: u32) -> Harness {
    Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis", "on_error": on_error},
        "policies": [{"id": "p", "spec": exact(threshold)}]}),
    )
}

/// webdis's answer to one hit: count, until-allowed ms, cooldown ms, event.
fn answer(count: u32, until: u64, event: i64) -> CallReply {
    CallReply {
        status: Some("200".into()),
        body: format!(r#"{{"FCALL":[{count},{until},0,{event}]}}"#).into_bytes(),
    }
}

impl Harness {
    /// A request that waits for the shared store: its call sent as token.
    fn waiting(&mut self, token: u32) -> Sent {
        let mut s = self.get("/v1/r");
        assert_eq!(s.step, Step::Pause);
        let call = s.call().expect("a store call").clone();
        assert_eq!(call.cluster, "webdis");
        assert!(String::from_utf8_lossy(&call.body).starts_with("FCALL/loopguard_hit/3/lg:test:{"));
        s.step = self
            .engine
            .on_call_sent(&mut s.req, Ok(token), self.now, &mut s.effects);
        assert_eq!(s.step, Step::Pause);
        s
    }
}

#[test]
fn redis_answers_decide_like_the_local_table() {
    let mut h = redis("local", 3);
    let mut a = h.waiting(7);
    assert_eq!(h.reply(&mut a, 7, answer(1, 0, -1)), Step::Continue);
    assert_eq!(
        h.metric(&a.effects, "loopguard.store_calls_total.result.ok"),
        1
    );
    let mut b = h.waiting(8);
    assert_eq!(h.reply(&mut b, 8, answer(3, 42_000, 0)), Step::Pause);
    assert_eq!(b.status(), 429);
    assert_eq!(
        b.reply()
            .unwrap()
            .headers
            .iter()
            .find(|(k, _)| *k == "retry-after")
            .unwrap()
            .1,
        "42"
    );
    // A reply carrying another token is not this request's.
    let mut c = h.waiting(9);
    assert_eq!(h.reply(&mut c, 99, answer(1, 0, -1)), Step::Pause);
    assert!(c.effects.is_empty());
}

#[test]
fn redis_answer_late_a_throttle_counts_from_when_the_wait_began() {
    let mut h = Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis"},
        "policies": [{"id": "p", "spec": detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "action": "throttle", "throttle_step_ms": 100}))}]}),
    );
    let mut s = h.waiting(1);
    let began = h.now;
    h.now += 150; // the answer takes 150 ms
    assert_eq!(h.reply(&mut s, 1, answer(2, 0, -1)), Step::Pause);
    h.now = began + 199;
    assert!(!h.tick().contains(&Effect::Resume(s.req.id)));
    h.now = began + 200;
    assert!(h.tick().contains(&Effect::Resume(s.req.id)));
}

#[test]
fn redis_timeout_falls_back_to_the_local_table() {
    let mut h = redis("local", 2);
    let timeout = CallReply {
        status: None,
        body: Vec::new(),
    };
    let mut a = h.waiting(1);
    assert_eq!(h.reply(&mut a, 1, timeout.clone()), Step::Continue);
    assert_eq!(
        h.metric(&a.effects, "loopguard.store_calls_total.result.unavailable"),
        1
    );
    assert_eq!(
        h.metric(&a.effects, "loopguard.store_fallback_total.action.local"),
        1
    );
    assert!(
        a.logs(Level::Warn)[0].starts_with("redis store unavailable: no answer within the timeout")
    );
    let mut b = h.waiting(2);
    assert_eq!(
        h.reply(&mut b, 2, timeout),
        Step::Pause,
        "counted locally: the 2nd hit trips"
    );
    assert_eq!(b.status(), 429);
    assert!(b.logs(Level::Warn).is_empty(), "logged at most every 10 s");
}

#[test]
fn redis_timeout_with_allow_passes_unchecked() {
    let mut h = redis("allow", 2);
    for token in 1..=3 {
        let mut s = h.waiting(token);
        assert_eq!(h.reply(&mut s, token, CallReply::default()), Step::Continue);
        assert_eq!(
            h.metric(&s.effects, "loopguard.store_fallback_total.action.allow"),
            1
        );
        assert_eq!(h.metric(&s.effects, "loopguard.store_fail_open_total"), 0);
    }
}

#[test]
fn redis_garbage_reply_is_a_reply_error_and_falls_back() {
    let mut h = redis("local", 5);
    let mut s = h.waiting(1);
    let garbage = CallReply {
        status: Some("200".into()),
        body: b"<html>not webdis</html>".to_vec(),
    };
    assert_eq!(h.reply(&mut s, 1, garbage), Step::Continue);
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.reply"),
        1
    );
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_fallback_total.action.local"),
        1
    );
    assert_eq!(
        h.metric(&s.effects, "loopguard.table_entries_used"),
        1,
        "counted in the local table"
    );
}

#[test]
fn redis_error_reply_and_error_statuses_fall_back() {
    let mut h = redis("local", 5);
    let cases = [
        (
            CallReply {
                status: Some("200".into()),
                body: br#"{"FCALL":[false,"NOSCRIPT no such function"]}"#.to_vec(),
            },
            "reply",
            "NOSCRIPT",
        ),
        (
            CallReply {
                status: Some("403".into()),
                body: Vec::new(),
            },
            "status",
            "HTTP 403",
        ),
        (
            CallReply {
                status: Some("503".into()),
                body: b"upstream connect error".to_vec(),
            },
            "unavailable",
            "HTTP 503",
        ),
    ];
    for (i, (reply, result, said)) in cases.into_iter().enumerate() {
        h.now += 20_000; // past the log's rate limit
        let token = u32::try_from(i).unwrap();
        let mut s = h.waiting(token);
        assert_eq!(h.reply(&mut s, token, reply), Step::Continue);
        assert_eq!(
            h.metric(
                &s.effects,
                &format!("loopguard.store_calls_total.result.{result}")
            ),
            1
        );
        assert!(
            s.logs(Level::Warn)[0].contains(said),
            "{:?}",
            s.logs(Level::Warn)
        );
    }
}

#[test]
fn redis_call_the_host_could_not_send_falls_back_at_once() {
    let mut h = redis("local", 2);
    let mut s = h.get("/v1/r");
    let step = h.engine.on_call_sent(
        &mut s.req,
        Err("no cluster \"webdis\"".into()),
        h.now,
        &mut s.effects,
    );
    assert_eq!(step, Step::Continue);
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.unavailable"),
        1
    );
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_fallback_total.action.local"),
        1
    );
}

#[test]
fn redis_reply_for_a_request_that_already_left_does_nothing() {
    let mut h = redis("local", 2);
    let mut s = h.waiting(5);
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(h.reply(&mut s, 5, answer(9, 1000, 0)), Step::Pause);
    assert!(s.effects.is_empty(), "no resume, no reply, no metric");
}

#[test]
fn redis_reply_after_the_client_gave_up_while_throttled_does_nothing() {
    let mut h = Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis"},
        "policies": [{"id": "p", "spec": detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "action": "throttle", "throttle_step_ms": 1000}))}]}),
    );
    let mut s = h.waiting(3);
    assert_eq!(
        h.reply(&mut s, 3, answer(2, 0, -1)),
        Step::Pause,
        "throttled"
    );
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(h.metric(&out, "loopguard.throttle_pending"), -1);
    // A late duplicate of the reply: ignored.
    assert_eq!(h.reply(&mut s, 3, answer(2, 0, -1)), Step::Pause);
    assert!(s.effects.is_empty());
    // The throttle queue forgot it: the tick resumes nothing.
    h.now += 10_000;
    let t = h.tick();
    assert!(!t.iter().any(|e| matches!(e, Effect::Resume(_))));
    assert!(t.contains(&Effect::StopTick));
}

// --- a Redis Cluster: the script, and the resend after NOSCRIPT --------------------------

fn noscript() -> CallReply {
    CallReply {
        status: Some("200".into()),
        body: br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#.to_vec(),
    }
}

fn cluster_store(threshold: u32) -> Harness {
    Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis", "topology": "cluster"},
        "policies": [{"id": "p", "spec": exact(threshold)}]}),
    )
}

fn body_of(call: &StoreCall) -> String {
    String::from_utf8(call.body.clone()).unwrap()
}

#[test]
fn a_cluster_node_without_the_script_gets_it_once_and_the_request_is_decided() {
    let mut h = cluster_store(2);
    let mut s = h.get("/v1/r");
    let first = body_of(s.call().expect("a store call"));
    assert!(first.starts_with("EVALSHA/"), "{first}");
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(1), h.now, &mut s.effects);
    // The node answers NOSCRIPT: the request keeps waiting, and the same
    // hit goes out again with the whole script.
    assert_eq!(h.reply(&mut s, 1, noscript()), Step::Pause);
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.noscript"),
        1
    );
    let again = body_of(s.call().expect("the call again"));
    assert!(again.starts_with("EVAL/"), "{}", &again[..40]);
    let tail = |b: &str| b[b.find("/3/").unwrap()..].to_string();
    assert_eq!(tail(&again), tail(&first), "the same keys, entry and nonce");
    // Its answer comes with the new token; the old one is stale.
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(2), h.now, &mut s.effects);
    let scripted = |count: u32| CallReply {
        status: Some("200".into()),
        body: format!(r#"{{"EVAL":[{count},0,0,-1]}}"#).into_bytes(),
    };
    assert_eq!(h.reply(&mut s, 1, scripted(1)), Step::Pause);
    assert!(s.effects.is_empty());
    assert_eq!(h.reply(&mut s, 2, scripted(2)), Step::Pause);
    assert_eq!(s.status(), 429, "decided on the resent call's count");
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.ok"),
        1
    );
}

#[test]
fn a_second_noscript_is_a_store_failure_not_a_loop_of_resends() {
    let mut h = cluster_store(2);
    let mut s = h.get("/v1/r");
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(1), h.now, &mut s.effects);
    assert_eq!(h.reply(&mut s, 1, noscript()), Step::Pause);
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(2), h.now, &mut s.effects);
    assert_eq!(h.reply(&mut s, 2, noscript()), Step::Continue);
    assert!(s.call().is_none());
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.reply"),
        1
    );
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_fallback_total.action.local"),
        1
    );
}

#[test]
fn a_single_node_store_never_resends() {
    let mut h = redis("local", 2);
    let mut s = h.waiting(1);
    assert_eq!(h.reply(&mut s, 1, noscript()), Step::Continue);
    assert!(s.call().is_none());
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.noscript"),
        0
    );
}
