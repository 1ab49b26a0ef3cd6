//! A retry is not a loop: an attempt the provider failed (5xx, 429) is
//! taken back, up to `forgive_failed_attempts` per fingerprint and window;
//! a client sending again after successes is still counted.

use super::tests::{detection, root_calls, Harness};
use super::*;
use crate::state::store::CallReply;
use serde_json::json;

const CHAT: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"Summarise the incident."}]}"#;

fn policy(extra: serde_json::Value) -> Harness {
    let mut ld = json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3});
    for (k, v) in extra.as_object().unwrap() {
        ld[k] = v.clone();
    }
    Harness::policy(detection(ld))
}

/// Send the chat, answer it with `status` if it went upstream; its status
/// as the client saw it, and the answer's effects.
fn attempt(h: &mut Harness, status: u32) -> (u32, Effects) {
    h.now += 500;
    let mut s = h.post(CHAT);
    let seen = s.status();
    if seen == 429 {
        return (429, Effects::new());
    }
    let out = h.answer(&mut s, status);
    (seen, out)
}

#[test]
fn an_sdk_retrying_after_provider_errors_is_not_a_loop() {
    let mut h = policy(json!({}));
    // The provider fails twice, the SDK retries the same body; the third
    // attempt succeeds, and the conversation moves on.
    let (a, out) = attempt(&mut h, 500);
    assert_eq!(a, 200);
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.forgiven"
        ),
        1
    );
    assert_eq!(attempt(&mut h, 503).0, 200);
    assert_eq!(attempt(&mut h, 200).0, 200);
    // Without forgiveness the third attempt would have been the third hit.
    let mut strict = policy(json!({"forgive_failed_attempts": 0}));
    assert_eq!(attempt(&mut strict, 500).0, 200);
    assert_eq!(attempt(&mut strict, 500).0, 200);
    assert_eq!(attempt(&mut strict, 200).0, 429);
}

#[test]
fn a_client_hammering_after_successes_is_still_counted() {
    let mut h = policy(json!({}));
    assert_eq!(attempt(&mut h, 200).0, 200);
    assert_eq!(attempt(&mut h, 200).0, 200);
    assert_eq!(attempt(&mut h, 200).0, 429);
    // And a success in between a failure's forgiveness keeps counting:
    // only the failed attempt is taken back.
    let mut h = policy(json!({}));
    assert_eq!(attempt(&mut h, 200).0, 200);
    assert_eq!(attempt(&mut h, 529).0, 200);
    assert_eq!(attempt(&mut h, 200).0, 200);
    assert_eq!(attempt(&mut h, 200).0, 429);
}

#[test]
fn forgiveness_is_bounded_per_window() {
    let mut h = policy(json!({"forgive_failed_attempts": 2}));
    let (_, out) = attempt(&mut h, 500);
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.forgiven"
        ),
        1
    );
    attempt(&mut h, 500);
    // The third failure stays counted, and so on: a provider down for good
    // with a client hammering it is eventually a loop.
    let (a, out) = attempt(&mut h, 500);
    assert_eq!(a, 200);
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.counted"
        ),
        1
    );
    assert_eq!(attempt(&mut h, 500).0, 200);
    assert_eq!(attempt(&mut h, 500).0, 429);
    // Once the window has passed, failures are forgiven again.
    h.now += 61_000;
    let (_, out) = attempt(&mut h, 500);
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.forgiven"
        ),
        1
    );
}

#[test]
fn only_failures_of_the_provider_are_taken_back() {
    for status in [400, 401, 404, 408, 413, 422, 200, 201] {
        let mut h = policy(json!({}));
        assert_eq!(attempt(&mut h, status).0, 200);
        assert_eq!(attempt(&mut h, status).0, 200);
        assert_eq!(attempt(&mut h, status).0, 429, "status {status}");
    }
    for status in [429, 500, 502, 503, 504, 529] {
        let mut h = policy(json!({}));
        assert_eq!(attempt(&mut h, status).0, 200);
        assert_eq!(attempt(&mut h, status).0, 200);
        assert_eq!(attempt(&mut h, status).0, 200, "status {status}");
    }
}

#[test]
fn loopguards_own_rejection_and_requests_it_did_not_count_take_nothing_back() {
    let mut h = policy(json!({}));
    attempt(&mut h, 200);
    attempt(&mut h, 200);
    // The third is rejected by loopguard: its 429 is not the provider's.
    let mut third = h.post(CHAT);
    assert_eq!(third.status(), 429);
    let out = h.answer(&mut third, 429);
    assert!(out
        .iter()
        .all(|e| !matches!(e, Effect::Count(..) | Effect::SendStoreCall(_))));
    // A request no policy matched (a GET with no body is judged too, but a
    // policy that matches nothing) has nothing to take back either.
    let mut h = Harness::policy(json!({"selector": {"methods": ["PUT"]},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}));
    let mut s = h.post(CHAT);
    assert!(h.answer(&mut s, 503).is_empty());
}

#[test]
fn near_mode_takes_a_failed_attempt_back_too() {
    let mut h = policy(json!({"similarity": "near"}));
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Translate the release notes into German."},
        {"role": "assistant", "content": "Here is the translation of the release notes into German: ..."},
        {"role": "user", "content": "Now into French, please."}]})
    .to_string();
    let send = |h: &mut Harness, status: u32| {
        h.now += 500;
        let mut s = h.post(&body);
        let seen = s.status();
        if seen != 429 {
            h.answer(&mut s, status);
        }
        seen
    };
    assert_eq!(send(&mut h, 500), 200);
    assert_eq!(send(&mut h, 500), 200);
    assert_eq!(send(&mut h, 200), 200);
    assert_eq!(send(&mut h, 200), 200);
    assert_eq!(send(&mut h, 200), 429);
}

#[test]
fn through_the_shared_store_the_hit_is_taken_back_from_the_tick() {
    let mut h = Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis"},
        "policies": [{"id": "p", "spec": detection(json!({"enabled": true, "window_seconds": 60,
            "threshold_identical_requests": 3}))}]}),
    );
    let recorded = |h: &mut Harness, token: u32| {
        let mut s = h.post(CHAT);
        assert_eq!(s.step, Step::Pause);
        let hit_body = String::from_utf8(s.call().unwrap().body.clone()).unwrap();
        let nonce = hit_body.rsplit('/').next().unwrap().to_string();
        s.step = h
            .engine
            .on_call_sent(&mut s.req, Ok(token), h.now, &mut s.effects);
        let ok = CallReply {
            status: Some("200".into()),
            body: br#"{"FCALL":[1,0,0,-1]}"#.to_vec(),
        };
        assert_eq!(h.reply(&mut s, token, ok), Step::Continue);
        (s, nonce)
    };
    let (mut s, nonce) = recorded(&mut h, 1);
    // The provider answers 503: the take-back waits for the tick.
    let out = h.answer(&mut s, 503);
    assert!(out.contains(&Effect::ArmTick));
    let tick = h.tick();
    let (ids, calls): (Vec<u32>, Vec<&StoreCall>) = root_calls(&tick).into_iter().unzip();
    assert_eq!(calls.len(), 1);
    let body = String::from_utf8(calls[0].body.clone()).unwrap();
    assert!(body.starts_with("FCALL/loopguard_forgive/2/"), "{body}");
    assert!(body.contains(&format!("/{nonce}/60000/3")), "{body}");
    // Sent from the root context; its answer is counted there, however
    // long ago the stream ended.
    let mut out = Effects::new();
    h.engine.on_root_call_sent(ids[0], Ok(7), h.now, &mut out);
    h.engine
        .on_root_reply(7, Some("200"), br#"{"FCALL":1}"#, h.now, &mut out);
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.forgiven"
        ),
        1
    );
    assert_eq!(h.metric(&out, "loopguard.webhook_total.result.sent"), 0);
    // A take-back the store could not answer, or the host could not send,
    // is counted as unrecorded.
    let (mut s, _) = recorded(&mut h, 2);
    h.answer(&mut s, 500);
    let id = root_calls(&h.tick())[0].0;
    let mut out = Effects::new();
    h.engine.on_root_call_sent(id, Ok(8), h.now, &mut out);
    h.engine.on_root_reply(8, None, b"", h.now, &mut out);
    let (mut s, _) = recorded(&mut h, 3);
    h.answer(&mut s, 500);
    let id = root_calls(&h.tick())[0].0;
    h.engine
        .on_root_call_sent(id, Err("no cluster".into()), h.now, &mut out);
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.unrecorded"
        ),
        2
    );
}

#[test]
fn on_a_cluster_a_take_back_answered_noscript_is_sent_once_more_in_full() {
    let mut h = Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis", "topology": "cluster"},
        "policies": [{"id": "p", "spec": detection(json!({"enabled": true, "window_seconds": 60,
            "threshold_identical_requests": 3}))}]}),
    );
    let mut s = h.post(CHAT);
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(1), h.now, &mut s.effects);
    let ok = CallReply {
        status: Some("200".into()),
        body: br#"{"EVALSHA":[1,0,0,-1]}"#.to_vec(),
    };
    assert_eq!(h.reply(&mut s, 1, ok), Step::Continue);
    h.answer(&mut s, 503);
    let sent = |tick: &Effects| -> Vec<(u32, String)> {
        root_calls(tick)
            .into_iter()
            .map(|(id, c)| (id, String::from_utf8(c.body.clone()).unwrap()))
            .collect()
    };
    let (ids, first): (Vec<u32>, Vec<String>) = sent(&h.tick()).into_iter().unzip();
    assert_eq!(first.len(), 1);
    assert!(first[0].starts_with("EVALSHA/"), "{}", first[0]);
    assert!(first[0].contains("/loopguard_forgive/"));
    let noscript = br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
    let mut out = Effects::new();
    h.engine.on_root_call_sent(ids[0], Ok(7), h.now, &mut out);
    h.engine
        .on_root_reply(7, Some("200"), noscript, h.now, &mut out);
    assert!(out.contains(&Effect::ArmTick));
    // Every store call's outcome is counted, a take-back's too; its
    // failed_attempts result waits for the resend's answer.
    assert_eq!(
        h.metric(&out, "loopguard.store_calls_total.result.noscript"),
        1
    );
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.unrecorded"
        ),
        0,
        "not counted until the resend is answered"
    );
    let (ids, again): (Vec<u32>, Vec<String>) = sent(&h.tick()).into_iter().unzip();
    assert_eq!(again.len(), 1);
    assert!(again[0].starts_with("EVAL/"));
    let tail = |b: &str| b[b.find("/2/").unwrap()..].to_string();
    assert_eq!(tail(&again[0]), tail(&first[0]));
    let mut out = Effects::new();
    h.engine.on_root_call_sent(ids[0], Ok(8), h.now, &mut out);
    // A second NOSCRIPT is not sent again: the take-back is unrecorded.
    h.engine
        .on_root_reply(8, Some("200"), noscript, h.now, &mut out);
    assert!(sent(&h.tick()).is_empty());
    assert_eq!(
        h.metric(
            &out,
            "loopguard.failed_attempts_total.policy.p.result.unrecorded"
        ),
        1
    );
}
