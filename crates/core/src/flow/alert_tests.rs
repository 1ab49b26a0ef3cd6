//! Alerts: queued, sent from the tick, bounded; a missing webhook secret
//! refuses the configuration.

use super::tests::{exact, root_calls, Harness};
use super::*;
use crate::state::store::tests::MemoryBackend;
use serde_json::json;

#[test]
fn alerts_are_queued_sent_from_the_tick_and_bounded() {
    let mut h = Harness::new(
        json!({"alerts": {"webhook": {"cluster": "hooks", "authority": "hooks.example.com", "hmac_secret_env": "SECRET"}},
        "policies": [{"id": "p", "spec": exact(2)}]}),
    );
    h.get("/v1/a");
    let detected = h.get("/v1/a");
    assert!(detected.effects.contains(&Effect::ArmTick));
    let t = h.tick();
    let (ids, sent): (Vec<u32>, Vec<&StoreCall>) = root_calls(&t).into_iter().unzip();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].cluster, "hooks");
    assert!(sent[0]
        .headers
        .iter()
        .any(|(k, v)| *k == "x-loopguard-signature" && v.starts_with("sha256=")));
    let mut out = Effects::new();
    h.engine.on_root_call_sent(ids[0], Ok(5), h.now, &mut out);
    h.engine.on_root_reply(5, Some("204"), b"", h.now, &mut out);
    assert_eq!(h.metric(&out, "loopguard.webhook_total.result.sent"), 1);
    h.engine.on_root_reply(6, None, b"", h.now, &mut out);
    // Another alert, which the host could not send; an id no call was
    // given is nobody's.
    h.get("/v1/b");
    h.get("/v1/b");
    let t = h.tick();
    let [(id, _)] = root_calls(&t)[..] else {
        panic!("{t:?}")
    };
    h.engine
        .on_root_call_sent(id + 100, Err("no cluster".into()), h.now, &mut out);
    h.engine
        .on_root_call_sent(id, Err("no cluster".into()), h.now, &mut out);
    assert_eq!(h.metric(&out, "loopguard.webhook_total.result.failed"), 2);
    assert_eq!(
        out.iter()
            .filter(|e| matches!(e, Effect::Log(Level::Warn, _)))
            .count(),
        1,
        "rate-limited"
    );
    // More alerts than the queue holds are dropped and counted.
    let mut out = Effects::new();
    for i in 0..(MAX_QUEUED_ALERTS + 3) {
        h.engine.emit_event(&json!({"n": i}), true, h.now, &mut out);
    }
    assert_eq!(h.metric(&out, "loopguard.webhook_total.result.dropped"), 3);
}

#[test]
fn a_missing_webhook_secret_refuses_the_configuration() {
    let cfg = Config::from_value(&json!({"alerts": {"webhook": {"cluster": "c", "authority": "a", "hmac_secret_env": "NOPE"}},
        "policies": [{"id": "p", "spec": exact(2)}]}))
    .unwrap();
    let err = Engine::new(cfg, "t", |_| Ok(MemoryBackend::default()), |_| None, 1)
        .err()
        .unwrap();
    assert!(
        err.starts_with("alerts.webhook.hmac_secret_env names NOPE, which is not set"),
        "{err}"
    );
}
