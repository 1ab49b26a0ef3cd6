//! The shared store's wire format: one Redis Function call per hit, sent to
//! webdis as `FCALL/loopguard_hit/3/<keys>/<args>` in a POST body, answered
//! as JSON. The function itself is `envoy/redis/loopguard.lua`.

use crate::config;
use crate::detect::fingerprint::Fingerprint;
use crate::state::store::{
    CallReply, Hit, StoreAnswer, StoreCall, StoreFailure, StoreReceipt, StoreStep, TakeBack,
    WindowStore,
};
use crate::state::window::{Forgave, WindowState};
use serde_json::Value;

/// The shared store: one Redis Function call per hit through webdis. It
/// never answers at once: [`WindowStore::record`] asks the host to send the
/// call, and [`WindowStore::complete`] reads the reply.
pub struct RedisStore {
    cfg: config::RedisStore,
    /// The plugin's name: keeps deployments sharing one Redis apart.
    namespace: String,
    /// Makes each hit's log member unique among every Envoy sharing the
    /// store: a random seed per plugin instance, and the hit's id.
    seed: u64,
}

impl RedisStore {
    pub fn new(cfg: config::RedisStore, namespace: &str, seed: u64) -> RedisStore {
        RedisStore {
            cfg,
            namespace: namespace.to_string(),
            seed,
        }
    }

    /// A hit's log member: unique among every Envoy sharing the store.
    fn nonce(&self, id: u64) -> String {
        format!("{:x}-{:x}", self.seed, id)
    }

    fn call(&self, body: String) -> StoreCall {
        StoreCall {
            cluster: self.cfg.cluster.clone(),
            headers: vec![
                (":method", "POST".to_string()),
                (":path", self.cfg.path.clone()),
                (":authority", self.cfg.authority.clone()),
                ("content-type", "text/plain".to_string()),
            ],
            body: body.into_bytes(),
            timeout_ms: self.cfg.timeout_ms,
        }
    }

    /// The call taking a hit back (`loopguard_forgive`): its attempt was
    /// failed by the provider. Its reply is read by [`parse_take_back`].
    pub fn take_back(&self, t: &TakeBack) -> StoreCall {
        self.call(take_back_body(&self.namespace, t, &self.nonce(t.id)))
    }
}

impl WindowStore for RedisStore {
    fn record(&mut self, hit: &Hit) -> StoreStep {
        let nonce = self.nonce(hit.id);
        StoreStep::Call(self.call(call_body(&self.namespace, hit, &nonce)))
    }

    fn complete(&mut self, _hit: &Hit, reply: &CallReply) -> StoreAnswer {
        let Some(status) = &reply.status else {
            return StoreAnswer::Failed(StoreFailure::Unavailable(
                "no answer within the timeout, or the connection failed".to_string(),
            ));
        };
        match parse_reply(status, &reply.body) {
            Ok(state) => StoreAnswer::Ready(StoreReceipt {
                state,
                evicted: false,
                added: false,
                cas_retries: 0,
            }),
            Err(failure) => StoreAnswer::Failed(failure),
        }
    }
}

/// The store keys of a fingerprint: the sliding log, the cooldown and the
/// event state, under one hash tag so a Redis Cluster keeps them on one
/// shard. `namespace` (the plugin's name) keeps deployments sharing one
/// Redis apart, as the plugin name does in shared data. Keys hold digests
/// and the plugin name only, never request content or API keys.
pub fn keys(namespace: &str, fp: &Fingerprint) -> [String; 3] {
    let hex = fp.hex();
    [
        format!("lg:{namespace}:{{{hex}}}:w"),
        format!("lg:{namespace}:{{{hex}}}:cd"),
        format!("lg:{namespace}:{{{hex}}}:ev"),
    ]
}

/// The store keys of a near-mode record (a caller and model): the history
/// of signatures, the cooldowns and each loop's event state.
pub fn near_keys(namespace: &str, fp: &Fingerprint) -> [String; 3] {
    let hex = fp.hex();
    [
        format!("lg:{namespace}:{{{hex}}}:n"),
        format!("lg:{namespace}:{{{hex}}}:ncd"),
        format!("lg:{namespace}:{{{hex}}}:nev"),
    ]
}

/// The webdis request body recording one hit (`loopguard_hit`, or
/// `loopguard_near` for a near-mode hit). `nonce` makes the hit's log
/// member unique among concurrent callers.
pub fn call_body(namespace: &str, hit: &Hit, nonce: &str) -> String {
    let q = &hit.query;
    let mut args = vec![
        q.window_ms.to_string(),
        q.capacity.to_string(),
        q.trip_at.to_string(),
        q.cooldown_ms.to_string(),
        q.detect_at.to_string(),
        q.event_every_ms.to_string(),
        nonce.to_string(),
    ];
    let (function, [a, b, c]) = match &hit.near {
        None => ("loopguard_hit", keys(namespace, &hit.key)),
        Some(p) => {
            args.push(p.signature.hex());
            args.push(p.threshold.min_matches.to_string());
            ("loopguard_near", near_keys(namespace, &hit.key))
        }
    };
    fcall(function, &[a, b, c], &args)
}

/// `FCALL/<function>/<n keys>/<keys>/<args>`, each part encoded.
fn fcall(function: &str, keys: &[String], args: &[String]) -> String {
    let mut out = format!("FCALL/{function}/{}", keys.len());
    for part in keys.iter().chain(args.iter()) {
        out.push('/');
        out.push_str(&encode_arg(part));
    }
    out
}

/// The keys of what a record forgave: beside its log, in its hash tag.
fn forgiven_key(log_key: &str) -> String {
    format!("{log_key}fg")
}

/// The webdis request body taking back the hit logged as `nonce`
/// (`loopguard_forgive`).
pub fn take_back_body(namespace: &str, t: &TakeBack, nonce: &str) -> String {
    let [log, _, _] = match t.near {
        None => keys(namespace, &t.key),
        Some(_) => near_keys(namespace, &t.key),
    };
    let forgiven = forgiven_key(&log);
    fcall(
        "loopguard_forgive",
        &[log, forgiven],
        &[
            nonce.to_string(),
            t.forgiveness.window_ms.to_string(),
            t.forgiveness.max.to_string(),
        ],
    )
}

/// Read the answer to [`take_back_body`]: `{"FCALL": 1}` forgiven, `0` the
/// window's forgiveness used up, `-1` the hit is gone.
pub fn parse_take_back(status: &str, body: &[u8]) -> Result<Forgave, StoreFailure> {
    if !status.starts_with('2') {
        return Err(StoreFailure::Status(status.to_string()));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|_| StoreFailure::Reply("the answer is not JSON".to_string()))?;
    match v.get("FCALL").and_then(Value::as_i64) {
        Some(1) => Ok(Forgave::Forgiven),
        Some(0) => Ok(Forgave::OverBudget),
        Some(-1) => Ok(Forgave::NotFound),
        _ => Err(StoreFailure::Reply(
            "the FCALL result is not 1, 0 or -1".to_string(),
        )),
    }
}

/// Percent-encode an argument for webdis: `/` separates arguments, `?`
/// starts a query, `.` can start an output-format extension and `+` may
/// read as a space; anything but unreserved characters and `:{}` is
/// encoded.
pub fn encode_arg(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    for b in arg.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~' | b':' | b'{' | b'}') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Read webdis's answer to [`call_body`]: `{"FCALL": [count, until_allowed_ms,
/// cooldown_remaining_ms, event]}`.
pub fn parse_reply(status: &str, body: &[u8]) -> Result<WindowState, StoreFailure> {
    if matches!(status, "502" | "503" | "504") {
        // Envoy's own answers (connect failure, timeout) or webdis without
        // its Redis: no usable answer, as with no answer at all.
        return Err(StoreFailure::Unavailable(format!(
            "HTTP {status} (webdis unreachable or too slow, or its Redis is down)"
        )));
    }
    if !status.starts_with('2') {
        return Err(StoreFailure::Status(status.to_string()));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|_| StoreFailure::Reply("the answer is not JSON".to_string()))?;
    let reply = v
        .get("FCALL")
        .ok_or_else(|| StoreFailure::Reply("the answer has no FCALL result".to_string()))?;
    let items = reply
        .as_array()
        .ok_or_else(|| StoreFailure::Reply("the FCALL result is not a list".to_string()))?;
    if items.first() == Some(&Value::Bool(false)) {
        let msg = items.get(1).and_then(Value::as_str).unwrap_or("error");
        return Err(StoreFailure::Reply(msg.chars().take(200).collect()));
    }
    let num = |i: usize| -> Result<i64, StoreFailure> {
        items.get(i).and_then(Value::as_i64).ok_or_else(|| {
            StoreFailure::Reply(format!("element {i} of the FCALL result is not a number"))
        })
    };
    let count = num(0)?;
    let until = num(1)?;
    let remaining = num(2)?;
    let event = num(3)?;
    Ok(WindowState {
        count: u32::try_from(count.max(0)).unwrap_or(u32::MAX),
        until_allowed_ms: u64::try_from(until.max(0)).unwrap_or(0),
        cooldown_remaining_ms: u64::try_from(remaining.max(0)).unwrap_or(0),
        event: u32::try_from(event).ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::window::WindowQuery;

    fn q() -> WindowQuery {
        WindowQuery {
            window_ms: 60_000,
            capacity: 5,
            trip_at: 5,
            cooldown_ms: 30_000,
            detect_at: 3,
            event_every_ms: 60_000,
        }
    }

    #[test]
    fn encodes_separators_and_extensions() {
        assert_eq!(encode_arg("a/b+c?d.e"), "a%2Fb%2Bc%3Fd%2Ee");
        assert_eq!(encode_arg("lg:{ab12}:w"), "lg:{ab12}:w");
        assert_eq!(encode_arg("100%"), "100%25");
        assert_eq!(encode_arg("x y\u{e9}"), "x%20y%C3%A9");
    }

    #[test]
    fn call_body_carries_keys_and_policy_numbers() {
        let fp = Fingerprint([0xab; 16]);
        let body = call_body("edge-1", &Hit::exact(fp, 0, q()), "7f.3/x");
        let hex = "ab".repeat(16);
        assert_eq!(
            body,
            format!("FCALL/loopguard_hit/3/lg:edge-1:{{{hex}}}:w/lg:edge-1:{{{hex}}}:cd/lg:edge-1:{{{hex}}}:ev/60000/5/5/30000/3/60000/7f%2E3%2Fx")
        );
        // Exactly 3 + 3 keys + 7 arguments, slash-separated.
        assert_eq!(body.split('/').count(), 3 + 3 + 7);
    }

    #[test]
    fn a_near_hit_calls_the_near_function_with_its_signature() {
        let fp = Fingerprint([0xcd; 16]);
        let signature = crate::detect::similarity::Signature {
            anchor: 0x0102_0304,
            payload: 0,
            bins: [0x00ff_0000_0000_0a0b, 0, 0, 0, 0, u64::MAX],
        };
        let hit = Hit {
            key: fp,
            now_ms: 0,
            query: q(),
            near: Some(crate::state::near::NearProbe {
                signature,
                threshold: crate::detect::similarity::NearThreshold { min_matches: 120 },
            }),
            id: 1,
        };
        let body = call_body("edge-1", &hit, "n1");
        let hex = "cd".repeat(16);
        let sig = format!(
            "0102030400000000{}{}{}",
            "00ff000000000a0b",
            "0".repeat(16 * 4),
            "f".repeat(16)
        );
        assert_eq!(
            body,
            format!("FCALL/loopguard_near/3/lg:edge-1:{{{hex}}}:n/lg:edge-1:{{{hex}}}:ncd/lg:edge-1:{{{hex}}}:nev/60000/5/5/30000/3/60000/n1/{sig}/120")
        );
    }

    #[test]
    fn a_failed_attempt_is_taken_back_by_its_nonce() {
        let fp = Fingerprint([0xab; 16]);
        let mut hit = Hit::exact(fp, 7, q());
        hit.id = 0x2a;
        let store = RedisStore::new(
            config::RedisStore {
                cluster: "redis".into(),
                path: "/".into(),
                authority: "webdis".into(),
                timeout_ms: 100,
                on_error: config::OnStoreError::Local,
            },
            "edge-1",
            0xbeef,
        );
        let call = store.take_back(&hit.take_back(3));
        let hex = "ab".repeat(16);
        assert_eq!(
            String::from_utf8(call.body).unwrap(),
            format!("FCALL/loopguard_forgive/2/lg:edge-1:{{{hex}}}:w/lg:edge-1:{{{hex}}}:wfg/beef-2a/60000/3")
        );
        // The hit's own call logs it under the same member.
        let StoreStep::Call(recorded) = RedisStore::new(
            config::RedisStore {
                cluster: "redis".into(),
                path: "/".into(),
                authority: "webdis".into(),
                timeout_ms: 100,
                on_error: config::OnStoreError::Local,
            },
            "edge-1",
            0xbeef,
        )
        .record(&hit) else {
            panic!("the shared store always calls");
        };
        assert!(String::from_utf8(recorded.body)
            .unwrap()
            .ends_with("/beef-2a"));
        assert_eq!(
            parse_take_back("200", br#"{"FCALL":1}"#),
            Ok(Forgave::Forgiven)
        );
        assert_eq!(
            parse_take_back("200", br#"{"FCALL":0}"#),
            Ok(Forgave::OverBudget)
        );
        assert_eq!(
            parse_take_back("200", br#"{"FCALL":-1}"#),
            Ok(Forgave::NotFound)
        );
        assert!(parse_take_back("200", br#"{"FCALL":[false,"x"]}"#).is_err());
        assert!(parse_take_back("503", b"").is_err());
    }

    #[test]
    fn parses_answers_and_errors() {
        assert_eq!(
            parse_reply("200", br#"{"FCALL":[5,59955,30000,0]}"#),
            Ok(WindowState {
                count: 5,
                until_allowed_ms: 59_955,
                cooldown_remaining_ms: 30_000,
                event: Some(0)
            })
        );
        assert_eq!(
            parse_reply("200", br#"{"FCALL":[1,0,0,-1]}"#)
                .unwrap()
                .event,
            None
        );
        assert_eq!(
            parse_reply(
                "200",
                br#"{"FCALL":[false,"NOPERM this user has no permissions"]}"#
            ),
            Err(StoreFailure::Reply(
                "NOPERM this user has no permissions".into()
            ))
        );
        for gone in ["502", "503", "504"] {
            assert!(matches!(
                parse_reply(gone, b"upstream connect error"),
                Err(StoreFailure::Unavailable(_))
            ));
        }
        assert_eq!(
            parse_reply("500", b""),
            Err(StoreFailure::Status("500".into()))
        );
        assert_eq!(
            parse_reply("403", b""),
            Err(StoreFailure::Status("403".into()))
        );
        for bad in [
            &b""[..],
            b"{}",
            br#"{"FCALL": 3}"#,
            br#"{"FCALL": [1, "x", 0, 0]}"#,
            br#"{"FCALL": [1, 0]}"#,
            b"\xff",
        ] {
            assert!(
                matches!(parse_reply("200", bad), Err(StoreFailure::Reply(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
