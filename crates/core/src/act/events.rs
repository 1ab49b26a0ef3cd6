//! What operators get about detections: the structured event logged once
//! per fingerprint and window, and the signed webhook alert built from it.

use crate::act::decision::Decision;
use crate::act::reply::insert;
use crate::config::{Mode, Webhook};
use crate::detect::fingerprint::Fingerprinted;
use crate::detect::verdict::{StepName, Verdict};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The `loop.detected` event of a decision (for a detection the store chose
/// to report: `suppressed` are the detections of the same fingerprint since
/// its last event that were counted but not logged). Never raw keys or
/// message text: the caller appears only inside the fingerprint digest.
pub fn loop_detected(d: &Decision, made: &Fingerprinted, suppressed: u32) -> Option<Value> {
    let action = d.verdict.action()?;
    let n = d.verdict.notice()?;
    let cooldown = match &d.verdict {
        crate::act::decision::Verdict::Reject(r) => r.cooldown_seconds,
        _ => 0,
    };
    Some(json!({
        "event": "loop.detected",
        "policy": n.policy_id,
        "fingerprint": n.fingerprint.hex(),
        "hit_count": n.count,
        "window_seconds": n.window_seconds,
        "action": action.as_str(),
        "mode": if d.shadow { "shadow" } else { "enforce" },
        "session": made.session,
        "model": made.model,
        "cooldown_seconds": cooldown,
        "suppressed": suppressed,
    }))
}

/// The event of a repetition guard's verdict (`loop.tool.detected`,
/// `loop.mcp.detected`): the tier, the level and step reached, the
/// occurrences, the tool when one is named (an answer loop names none),
/// and the caller when known.
pub fn verdict_event<S: StepName, E>(
    name: &str,
    policy_id: &str,
    v: &Verdict<S, E>,
    tool: Option<String>,
    shadow: bool,
    caller: Option<&str>,
) -> Value {
    let mut event = json!({
        "event": name,
        "tier": v.tier.as_str(),
        "level": v.level,
        "step": v.step.as_str(),
        "occurrences": v.occurrences,
        "policy": policy_id,
        "mode": if shadow { "shadow" } else { "enforce" },
    });
    if let Some(tool) = tool {
        insert(&mut event, "tool", Value::String(tool));
    }
    if let Some(c) = caller {
        insert(&mut event, "caller", json!(c));
    }
    event
}

/// A hash of who calls under a policy (FNV-1a over the policy id and the
/// framed identity): stable across workers and replicas, and cheap. Shown
/// as a tag ([`caller_tag`]); never the identity itself.
pub fn caller_hash(policy_id: &str, identity: &[u8]) -> u64 {
    let mut h = crate::request::Fnv::default();
    h.write(policy_id.as_bytes());
    h.write(&[0xff]);
    h.write(identity);
    h.0
}

/// A caller hash as the 12 hex characters metrics and events show.
pub fn caller_tag(hash: u64) -> String {
    format!("{:012x}", hash >> 16)
}

/// Add who is looping and what the loop spent so far to a detection event:
/// `caller` (a 12-hex tag of the caller's identity, as the metrics' caller
/// label shows it) and `spent` (the tokens this process's responses of the
/// loop reported, with `usd` when the model is priced): read from the
/// ledger, so the loop's requests before the one that was stopped.
pub fn add_spend(
    event: &mut Value,
    caller: &str,
    spend: Option<&crate::state::ledger::Spend>,
    priced: bool,
) {
    insert(event, "caller", Value::String(caller.to_string()));
    let s = spend.copied().unwrap_or_default();
    let mut spent = json!({
        "responses": s.responses,
        "input_tokens": s.input,
        "output_tokens": s.output,
    });
    if priced {
        // Micro-dollars to dollars, exactly as a decimal.
        insert(&mut spent, "usd", json!(s.microusd as f64 / 1e6));
    }
    insert(event, "spent", spent);
}

/// The decision as Envoy's access log can print it (filter state
/// `wasm.loopguard`, `%FILTER_STATE(wasm.loopguard:PLAIN)%`): a compact JSON
/// object with the policy, mode, action (`allow`, `warn`, `throttle`,
/// `reject`, `exempt`, a ladder's step) and the guard's fields (a repeat's
/// `fingerprint` and `count`, a spend cap's `budget`, a tool or MCP loop's
/// `tool_loop`).
pub fn access_log<const N: usize>(
    policy_id: &str,
    mode: Mode,
    action: &str,
    fields: [(&str, Value); N],
) -> String {
    let mut log = json!({"policy": policy_id, "mode": mode.as_str(), "action": action});
    for (name, value) in fields {
        insert(&mut log, name, value);
    }
    log.to_string()
}

/// The fields of a decision that matched no repeat.
pub const NO_REPEAT: [(&str, Value); 2] = [("fingerprint", Value::Null), ("count", Value::Null)];

/// A webhook request, ready to dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    pub body: String,
    /// `sha256=<hex HMAC of the body>`, when a secret is configured.
    pub signature: Option<String>,
}

/// The webhook payload: the event with a timestamp, signed with the
/// secret (HMAC-SHA256 of the exact body bytes).
pub fn alert(event: &Value, now_ms: u64, secret: Option<&[u8]>) -> Alert {
    let mut payload = event.clone();
    insert(&mut payload, "timestamp", json!(rfc3339(now_ms)));
    let body = payload.to_string();
    let signature = secret.map(|key| format!("sha256={}", hex(&hmac_sha256(key, body.as_bytes()))));
    Alert { body, signature }
}

/// The headers of a webhook call.
pub fn alert_headers(w: &Webhook, a: &Alert) -> Vec<(&'static str, String)> {
    let mut h = vec![
        (":method", "POST".to_string()),
        (":path", w.path.clone()),
        (":authority", w.authority.clone()),
        ("content-type", "application/json".to_string()),
        ("user-agent", "loopguard".to_string()),
    ];
    h.extend(a.signature.clone().map(|s| ("x-loopguard-signature", s)));
    h
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    let digest = (key.len() > BLOCK).then(|| Sha256::digest(key));
    let key = digest.as_deref().unwrap_or(key);
    k.iter_mut().zip(key).for_each(|(slot, byte)| *slot = *byte);
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(message);
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC
/// (`2026-11-22T01:02:03.456Z`).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let rem = secs % 86_400;
    let (year, month, day) = civil((secs / 86_400) as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ms % 1000
    )
}

/// The (year, month, day) of a count of days since 1970-01-01, proleptic
/// Gregorian (Howard Hinnant's algorithm).
pub fn civil(days: i64) -> (i64, i64, i64) {
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::decision::{Notice, Rejection, Verdict};
    use crate::config::{Action, Config};
    use crate::detect::fingerprint::Fingerprint;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_309_323_456), "2026-11-22T01:02:03.456Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    fn decision(shadow: bool) -> Decision {
        Decision {
            verdict: Verdict::Reject(Rejection {
                notice: Notice {
                    policy_id: "p".into(),
                    fingerprint: Fingerprint([1; 16]),
                    count: 5,
                    window_seconds: 60,
                    near: false,
                    turns: false,
                },
                retry_after_ms: 1000,
                cooldown_seconds: 30,
            }),
            shadow,
        }
    }

    #[test]
    fn loop_detected_event_and_signed_alert() {
        let made = Fingerprinted {
            fingerprint: Fingerprint([1; 16]),
            fallback: false,
            unparsed: false,
            format: None,
            model: Some("gpt-4o".into()),
            session: Some("s-1".into()),
            near: None,
            repeats: 0,
        };
        let e = loop_detected(&decision(false), &made, 4).unwrap();
        assert_eq!(
            e,
            json!({"event": "loop.detected", "policy": "p", "fingerprint": "01".repeat(16), "hit_count": 5,
            "window_seconds": 60, "action": "reject", "mode": "enforce", "session": "s-1", "model": "gpt-4o",
            "cooldown_seconds": 30, "suppressed": 4})
        );
        assert_eq!(
            loop_detected(&decision(true), &made, 0).unwrap()["mode"],
            "shadow"
        );
        let a = alert(&e, 1_795_309_323_456, Some(b"secret"));
        let body: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(body["timestamp"], "2026-11-22T01:02:03.456Z");
        assert_eq!(body["fingerprint"], "01".repeat(16));
        assert_eq!(
            a.signature,
            Some(format!(
                "sha256={}",
                hex(&hmac_sha256(b"secret", a.body.as_bytes()))
            ))
        );
        assert_eq!(alert(&e, 0, None).signature, None);
        let allow = Decision {
            verdict: Verdict::Allow,
            shadow: false,
        };
        assert_eq!(loop_detected(&allow, &made, 0), None);
        let _ = Action::Reject;
    }

    #[test]
    fn access_log_records() {
        let v: Value = serde_json::from_str(&access_log(
            "p",
            Mode::Enforce,
            "allow",
            [("fingerprint", json!("02".repeat(16))), ("count", json!(1))],
        ))
        .unwrap();
        assert_eq!(
            v,
            json!({"policy": "p", "mode": "enforce", "action": "allow", "fingerprint": "02".repeat(16), "count": 1})
        );
        let v: Value =
            serde_json::from_str(&access_log("p", Mode::Shadow, "exempt", NO_REPEAT)).unwrap();
        assert_eq!(
            v,
            json!({"policy": "p", "mode": "shadow", "action": "exempt", "fingerprint": null, "count": null})
        );
        let v: Value = serde_json::from_str(&access_log(
            "p",
            Mode::Enforce,
            "nudge",
            [("tool_loop", json!("identical;tool=t;level=1"))],
        ))
        .unwrap();
        assert_eq!(v["tool_loop"], "identical;tool=t;level=1");
    }

    #[test]
    fn alert_headers_name_the_receiver() {
        let cfg = Config::from_value(&json!({"alerts": {"webhook": {"cluster": "alerts", "authority": "hooks.example.com", "path": "/lg"}},
            "policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {"enabled": false}}}]})).unwrap();
        let w = cfg.webhook.unwrap();
        let a = Alert {
            body: "{}".into(),
            signature: Some("sha256=ab".into()),
        };
        let h = alert_headers(&w, &a);
        assert!(h.contains(&(":authority", "hooks.example.com".to_string())));
        assert!(h.contains(&(":path", "/lg".to_string())));
        assert!(h.contains(&("x-loopguard-signature", "sha256=ab".to_string())));
    }
}
