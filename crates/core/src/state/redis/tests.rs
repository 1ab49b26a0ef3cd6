//! The wire format of both topologies: bodies, answers, and the resend
//! after `NOSCRIPT`.

use super::*;
use crate::state::window::{Forgave, WindowQuery, WindowState};

/// A budget answer that came with `status`.
fn parse_budget(status: &str, body: &[u8], n: usize) -> Result<Vec<(u64, u64)>, StoreFailure> {
    budget_answer(Some(status), body, n)
}

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
    let body = hit_call("edge-1", &Hit::exact(fp, 0, q()), "7f.3/x").body(Invoke::Function);
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
    let body = hit_call("edge-1", &hit, "n1").body(Invoke::Function);
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
    let single = store(RedisTopology::Single);
    let hex = "ab".repeat(16);
    assert_eq!(
        body_of(&single, &single.take_back_of(&hit.take_back(3)), false),
        format!("FCALL/loopguard_forgive/2/lg:edge-1:{{{hex}}}:w/lg:edge-1:{{{hex}}}:wfg/beef-2a/60000/3")
    );
    // The hit's own call logs it under the same member.
    assert!(body_of(&single, &single.hit_of(&hit), false).ends_with("/beef-2a"));
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

fn store(topology: RedisTopology) -> RedisStore {
    RedisStore::new(
        config::RedisStore {
            topology,
            cluster: "redis".into(),
            path: "/".into(),
            authority: "webdis".into(),
            timeout_ms: 100,
            on_error: config::OnStoreError::Local,
        },
        "edge-1",
        0xbeef,
    )
}

/// The webdis body `store` sends for `call` (`full`: with the whole
/// script).
fn body_of(store: &RedisStore, call: &Call, full: bool) -> String {
    String::from_utf8(store.send(call, full).body).unwrap()
}

#[test]
fn a_cluster_store_calls_the_script_by_its_sha1_with_the_entry_first() {
    let fp = Fingerprint([0xab; 16]);
    let mut hit = Hit::exact(fp, 0, q());
    hit.id = 0x2a;
    let sha = Script::shipped().sha1;
    let hex = "ab".repeat(16);
    let (cluster, single) = (store(RedisTopology::Cluster), store(RedisTopology::Single));
    assert_eq!(
        body_of(&cluster, &cluster.hit_of(&hit), false),
        format!("EVALSHA/{sha}/3/lg:edge-1:{{{hex}}}:w/lg:edge-1:{{{hex}}}:cd/lg:edge-1:{{{hex}}}:ev/loopguard_hit/60000/5/5/30000/3/60000/beef-2a")
    );
    // The single-node store is unchanged: the function, by name.
    assert!(body_of(&single, &single.hit_of(&hit), false)
        .starts_with("FCALL/loopguard_hit/3/lg:edge-1:"));
    assert_eq!(
        body_of(&cluster, &cluster.take_back_of(&hit.take_back(3)), false),
        format!("EVALSHA/{sha}/2/lg:edge-1:{{{hex}}}:w/lg:edge-1:{{{hex}}}:wfg/loopguard_forgive/beef-2a/60000/3")
    );
}

#[test]
fn noscript_resends_the_whole_script_once_the_cluster_store_sees_it() {
    let hit = Hit::exact(Fingerprint([0xab; 16]), 0, q());
    let noscript = br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
    let cluster = store(RedisTopology::Cluster);
    assert!(cluster.needs_script(Some("200"), noscript));
    let body = body_of(&cluster, &cluster.hit_of(&hit), true);
    let script = Script::shipped();
    let sent = format!("EVAL/{}/3/", encode_arg(&script.source));
    assert!(body.starts_with(&sent), "{}", &body[..80]);
    let cached = body_of(&cluster, &cluster.hit_of(&hit), false);
    assert_eq!(
        &body[sent.len()..],
        &cached[cached.find("/3/").unwrap() + 3..],
        "the same keys and arguments"
    );
    // Anything else is not a NOSCRIPT: an answer, another error, a 503, no
    // answer; and the single-node store never needs the script.
    for (status, reply) in [
        (Some("200"), &br#"{"EVALSHA":[1,0,0,-1]}"#[..]),
        (Some("200"), br#"{"EVALSHA":[false,"upstream failure"]}"#),
        (Some("200"), br#"{"EVALSHA":[false,"ERR x NOSCRIPT"]}"#),
        (Some("503"), br#"{"EVALSHA":[false,"NOSCRIPT"]}"#),
        (None, b""),
    ] {
        assert!(!cluster.needs_script(status, reply), "{status:?}");
    }
    assert!(!store(RedisTopology::Single).needs_script(Some("200"), noscript));
    let tb = body_of(&cluster, &cluster.take_back_of(&hit.take_back(2)), true);
    assert!(tb.starts_with(&sent.replace("/3/", "/2/")));
}

#[test]
fn script_answers_parse_like_function_answers() {
    for command in ["FCALL", "EVALSHA", "EVAL"] {
        let body = format!(r#"{{"{command}":[5,59955,30000,0]}}"#);
        assert_eq!(
            parse_reply("200", body.as_bytes()),
            Ok(WindowState {
                count: 5,
                until_allowed_ms: 59_955,
                cooldown_remaining_ms: 30_000,
                event: Some(0)
            })
        );
        let body = format!(r#"{{"{command}":1}}"#);
        assert_eq!(
            parse_take_back("200", body.as_bytes()),
            Ok(Forgave::Forgiven)
        );
    }
    // Errors the cluster path answers with while a master fails over.
    for err in [
        "upstream failure",
        "CLUSTERDOWN The cluster is down",
        "CROSSSLOT Keys in request don't hash to the same slot",
    ] {
        let body = format!(r#"{{"EVALSHA":[false,"{err}"]}}"#);
        assert_eq!(
            parse_reply("200", body.as_bytes()),
            Err(StoreFailure::Reply(err.into()))
        );
    }
    assert!(parse_reply("200", br#"{"GET":[1,0,0,-1]}"#).is_err());
    assert!(parse_reply("200", br#"[1,0,0,-1]"#).is_err());
}

fn budget_keys_of_a_request() -> [BudgetKey; 2] {
    [
        BudgetKey {
            key: 0x0123_4567_89ab_cdef,
            slice_ms: 60_000,
            add: 1_500,
            cap: 5_000_000,
        },
        BudgetKey {
            key: 7,
            slice_ms: 1_000,
            add: 0,
            cap: 0,
        },
    ]
}

#[test]
fn a_request_s_budget_keys_share_the_caller_s_hash_tag() {
    let keys = budget_keys_of_a_request();
    assert_eq!(
        budget_keys("edge-1", 0xab, &keys),
        [
            "lg:edge-1:{b00000000000000ab}:0123456789abcdef",
            "lg:edge-1:{b00000000000000ab}:0000000000000007",
        ]
    );
    // Another caller: another tag; no keys, no store keys.
    assert!(budget_keys("edge-1", u64::MAX, &keys[..1])[0]
        .starts_with("lg:edge-1:{bffffffffffffffff}:"));
    assert!(budget_keys("edge-1", 1, &[]).is_empty());
}

#[test]
fn a_budget_call_carries_the_time_then_each_key_s_numbers() {
    let keys = budget_keys_of_a_request();
    let call = budget_call("edge-1", 0xab, &keys, 1_700_000_123_456);
    assert_eq!(call.entry, Entry::Budget);
    assert_eq!(call.entry.name(), "loopguard_budget");
    assert_eq!(
        call.args,
        [
            "1700000123456",
            "60000",
            "1500",
            "5000000",
            "1000",
            "0",
            "0"
        ]
    );
    let tag = "lg:edge-1:{b00000000000000ab}";
    let (single, cluster) = (store(RedisTopology::Single), store(RedisTopology::Cluster));
    assert_eq!(
        body_of(&single, &single.budget_of(0xab, &keys, 1_700_000_123_456), false),
        format!("FCALL/loopguard_budget/2/{tag}:0123456789abcdef/{tag}:0000000000000007/1700000123456/60000/1500/5000000/1000/0/0")
    );
    let sha = Script::shipped().sha1;
    assert_eq!(
        body_of(&cluster, &cluster.budget_of(0xab, &keys, 1_700_000_123_456), false),
        format!("EVALSHA/{sha}/2/{tag}:0123456789abcdef/{tag}:0000000000000007/loopguard_budget/1700000123456/60000/1500/5000000/1000/0/0")
    );
    // Past what Lua counts exactly, numbers are sent as 2^53 - 1; a slice is
    // at least a millisecond.
    let huge = BudgetKey {
        key: 1,
        slice_ms: 0,
        add: u64::MAX,
        cap: u64::MAX,
    };
    assert_eq!(
        budget_call("x", 1, &[huge], u64::MAX).args,
        [
            "9007199254740991",
            "1",
            "9007199254740991",
            "9007199254740991"
        ]
    );
}

/// A request's most caps (8, of windows up to 31 days) under one caller:
/// one call carries every key, under one hash tag, and its answer is read
/// for all 8.
#[test]
fn eight_caps_of_one_caller_go_in_one_call() {
    use crate::state::budget::slice_ms;
    let windows = [
        60,
        600,
        3_600,
        86_400,
        7 * 86_400,
        30 * 86_400,
        31 * 86_400,
        120,
    ];
    let keys: Vec<BudgetKey> = (0..8u64)
        .zip(windows)
        .map(|(i, w)| BudgetKey {
            key: 0x100 + i,
            slice_ms: slice_ms(w * 1000),
            add: i,
            cap: 1_000 + i,
        })
        .collect();
    assert_eq!(keys.len(), crate::config::budget::MAX_LIMITS);
    let call = budget_call("edge-1", 0xab, &keys, 1_700_000_123_456);
    assert_eq!(call.keys.len(), 8);
    assert!(call
        .keys
        .iter()
        .all(|k| k.starts_with("lg:edge-1:{b00000000000000ab}:")));
    assert_eq!(call.args.len(), 1 + 3 * 8);
    // The 30- and 31-day windows' slices go out as they are (the library
    // takes up to 31 days / 60).
    assert_eq!(call.args[3 * 5 + 1], "43200000");
    assert_eq!(call.args[3 * 6 + 1], "44640000");
    assert!(
        crate::state::redis::script::LIBRARY.contains("local max_budget_window_ms = 31 * day_ms")
    );
    let body = format!(
        r#"{{"FCALL":[{}]}}"#,
        (0..16).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
    );
    let read = parse_budget("200", body.as_bytes(), 8).unwrap();
    assert_eq!(read.len(), 8);
    assert_eq!(read[7], (14, 15));
}

#[test]
fn budget_answers_are_read_key_by_key() {
    for command in ["FCALL", "EVALSHA", "EVAL"] {
        let body = format!(r#"{{"{command}":[5000123,1260000,0,0]}}"#);
        assert_eq!(
            parse_budget("200", body.as_bytes(), 2),
            Ok(vec![(5_000_123, 1_260_000), (0, 0)])
        );
    }
    assert_eq!(parse_budget("200", br#"{"FCALL":[]}"#, 0), Ok(vec![]));
    // Redis's errors, and the script not cached on a cluster node.
    assert_eq!(
        parse_budget("200", br#"{"FCALL":[false,"loopguard: bad arguments"]}"#, 1),
        Err(StoreFailure::Reply("loopguard: bad arguments".into()))
    );
    assert!(matches!(
        parse_budget(
            "200",
            br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#,
            1
        ),
        Err(StoreFailure::Reply(m)) if m.starts_with("NOSCRIPT")
    ));
    // A wrong length, or elements that are not counts.
    for bad in [
        &br#"{"FCALL":[1,0,2,0]}"#[..],
        br#"{"FCALL":[1,0,2]}"#,
        br#"{"FCALL":[1]}"#,
        br#"{"FCALL":[1,"x"]}"#,
        br#"{"FCALL":[-1,0]}"#,
        br#"{"FCALL":[1.5,0]}"#,
        br#"{"FCALL":7}"#,
        br#"{"GET":[1,0]}"#,
        b"{}",
        b"",
        b"\xff",
    ] {
        assert!(
            matches!(parse_budget("200", bad, 1), Err(StoreFailure::Reply(_))),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    for gone in ["502", "503", "504"] {
        assert!(matches!(
            parse_budget(gone, b"upstream connect error", 1),
            Err(StoreFailure::Unavailable(_))
        ));
    }
    assert_eq!(
        parse_budget("403", b"", 1),
        Err(StoreFailure::Status("403".into()))
    );
}

#[test]
fn noscript_resends_a_budget_call_with_the_whole_script() {
    let keys = budget_keys_of_a_request();
    let cluster = store(RedisTopology::Cluster);
    let call = cluster.budget_of(0xab, &keys, 42);
    let body = body_of(&cluster, &call, true);
    let sent = format!("EVAL/{}/2/", encode_arg(&Script::shipped().source));
    assert!(body.starts_with(&sent), "{}", &body[..80]);
    let cached = body_of(&cluster, &call, false);
    assert_eq!(
        &body[sent.len()..],
        &cached[cached.find("/2/").unwrap() + 3..],
        "the same keys and arguments"
    );
    assert!(body.ends_with("/loopguard_budget/42/60000/1500/5000000/1000/0/0"));
}
