//! MCP histories in a shared store: replicas sharing one Redis judge an
//! agent's calls as one history wherever each lands, a store that fails
//! falls back as `store.on_error` says, and a caller opening thousands of
//! sessions does not push another caller's loop out of the local table.

use super::tests::{Harness, Sent};
use super::*;
use crate::state::store::CallReply;
use serde_json::{json, Value};
use std::collections::HashMap;

/// `loopguard_mcp` as the Lua library keeps it (the agreement test holds
/// the library to the local table; this holds the flow to the library's
/// protocol): webdis bodies in, webdis JSON out.
#[derive(Default)]
struct FakeRedis {
    lists: HashMap<String, Vec<String>>,
    real: HashMap<String, u64>,
    down: bool,
    calls: u32,
}

fn decode(part: &str) -> String {
    let mut out = Vec::new();
    let b = part.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(&part[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

impl FakeRedis {
    fn serve(&mut self, call: &StoreCall) -> CallReply {
        self.calls += 1;
        if self.down {
            return CallReply {
                status: Some("503".into()),
                body: Vec::new(),
            };
        }
        let body = String::from_utf8(call.body.clone()).unwrap();
        let parts: Vec<String> = body.split('/').map(decode).collect();
        assert_eq!(&parts[..3], ["FCALL", "loopguard_mcp", "2"], "{body}");
        let (h, r, args) = (&parts[3], &parts[4], &parts[5..]);
        let result = if args.len() == 2 {
            let mut out = vec![json!(self.real.get(r).copied().unwrap_or(0))];
            out.extend(self.lists.get(h).into_iter().flatten().map(|e| json!(e)));
            Value::Array(out)
        } else {
            let flags: u8 = args[3].parse().unwrap();
            if flags & 2 == 0 || self.lists.contains_key(h) {
                let list = self.lists.entry(h.clone()).or_default();
                list.push(args[2].clone());
                let extra = list.len().saturating_sub(16);
                list.drain(..extra);
                if flags & 4 == 0 {
                    self.real.insert(r.clone(), args[1].parse().unwrap());
                }
            }
            json!(1)
        };
        CallReply {
            status: Some("200".into()),
            body: json!({ "FCALL": result }).to_string().into_bytes(),
        }
    }
}

fn replica() -> Harness {
    Harness::new(json!({
        "store": {"type": "redis_webdis", "cluster": "webdis", "on_error": "local"},
        "policies": [{"id": "p", "spec": {"selector": {"pathPrefix": "/mcp"},
            "mcp": {"enabled": true}}}]}))
}

/// Send every store call the last event asked for, until none is left:
/// the request's step then.
fn settle(h: &mut Harness, s: &mut Sent, redis: &mut FakeRedis, mut out: Effects) -> Step {
    let mut step = s.step;
    let mut token = 100;
    loop {
        let call = out.iter().find_map(|e| match e {
            Effect::SendStoreCall(c) => Some(c.clone()),
            _ => None,
        });
        s.effects.append(&mut out);
        let Some(call) = call else {
            return step;
        };
        token += 1;
        step = h
            .engine
            .on_call_sent(&mut s.req, Ok(token), h.now, &mut out);
        let reply = redis.serve(&call);
        if step == Step::Pause {
            step = h
                .engine
                .on_store_reply(&mut s.req, token, &reply, h.now, &mut out);
        }
    }
}

/// One `tools/call` of `search` through a replica: whether the server got
/// it, and the client's answer.
fn call(h: &mut Harness, redis: &mut FakeRedis, id: u32) -> (bool, Value) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "search", "arguments": {"q": "x"}}})
    .to_string();
    h.now += 1_000;
    let mut s = h.send(
        "POST",
        "/mcp",
        &[("mcp-session-id", "s1"), ("authorization", "Bearer k")],
        body.as_bytes(),
    );
    let first = std::mem::take(&mut s.effects);
    s.step = settle(h, &mut s, redis, first);
    if let Some(reply) = s.reply() {
        assert_eq!(s.step, Step::Pause);
        return (false, serde_json::from_str(&reply.body).unwrap());
    }
    assert_eq!(s.step, Step::Continue);
    let result = json!({"jsonrpc": "2.0", "id": id, "result": {
        "content": [{"type": "text", "text": "3 results"}], "isError": false}})
    .to_string();
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
    let step = h
        .engine
        .on_response_body(&mut s.req, result.as_bytes(), true, h.now, &mut out);
    let mut client: Value = serde_json::from_str(&result).unwrap();
    for e in &out {
        if let Effect::ReplaceResponseBody { body, .. } = e {
            client = serde_json::from_slice(body).unwrap();
        }
    }
    if step == Step::Pause {
        assert!(
            s.req.response_held(),
            "the result's end waits for the store"
        );
        assert_eq!(settle(h, &mut s, redis, out), Step::Continue);
    }
    (true, client)
}

/// Which of `n` calls reached the server, and which were noted.
fn calls(replicas: &mut [Harness], redis: &mut FakeRedis, n: u32) -> (Vec<bool>, Vec<bool>) {
    let k = replicas.len();
    (1..=n)
        .map(|i| {
            let h = &mut replicas[(i as usize - 1) % k];
            let (went, client) = call(h, redis, i);
            let noted = client["result"]["content"]
                .as_array()
                .is_some_and(|c| c.len() == 2);
            (went, noted)
        })
        .unzip()
}

#[test]
fn alternating_replicas_stop_a_loop_at_the_same_call_as_one() {
    let mut redis = FakeRedis::default();
    let one = calls(&mut [replica()], &mut redis, 6);
    let mut redis = FakeRedis::default();
    let two = calls(&mut [replica(), replica()], &mut redis, 6);
    assert_eq!(one, two);
    // The third call gets a note, the fourth is answered by loopguard.
    assert_eq!(one.0, [true, true, true, false, false, false]);
    assert_eq!(one.1, [false, false, true, false, false, false]);
    // A read and an add per call (an answered call's add included).
    assert_eq!(redis.calls, 12);
}

#[test]
fn with_the_store_down_calls_pass_and_one_replica_still_stops_its_loop() {
    let mut redis = FakeRedis {
        down: true,
        ..Default::default()
    };
    let mut h = replica();
    let (went, _) = calls(std::slice::from_mut(&mut h), &mut redis, 6);
    assert_eq!(went, [true, true, true, false, false, false]);
    // Alternating over two replicas, each judges its own calls: slower,
    // but still stopped.
    let mut redis = FakeRedis {
        down: true,
        ..Default::default()
    };
    let (went, _) = calls(&mut [replica(), replica()], &mut redis, 8);
    assert_eq!(went, [true, true, true, true, true, true, false, false]);
    // With on_error: allow, a call the store fails passes unjudged.
    let mut h = Harness::new(json!({
        "store": {"type": "redis_webdis", "cluster": "webdis", "on_error": "allow"},
        "policies": [{"id": "p", "spec": {"selector": {"pathPrefix": "/mcp"},
            "mcp": {"enabled": true}}}]}));
    let mut redis = FakeRedis {
        down: true,
        ..Default::default()
    };
    let (went, _) = calls(std::slice::from_mut(&mut h), &mut redis, 6);
    assert_eq!(went, [true; 6]);
}

#[test]
fn a_caller_opening_thousands_of_sessions_does_not_save_another_s_loop() {
    let mut h =
        Harness::policy(json!({"selector": {"pathPrefix": "/mcp"}, "mcp": {"enabled": true}}));
    let round = |h: &mut Harness, key: &str, session: &str, id: u32, tool: &str| -> bool {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {"q": "x"}}})
        .to_string();
        h.now += 1;
        let auth = format!("Bearer {key}");
        let mut s = h.send(
            "POST",
            "/mcp",
            &[("mcp-session-id", session), ("authorization", &auth)],
            body.as_bytes(),
        );
        if s.step == Step::Pause {
            return false;
        }
        let result = json!({"jsonrpc": "2.0", "id": id, "result": {
            "content": [{"type": "text", "text": "same"}], "isError": false}})
        .to_string();
        let mut out = h.answer(&mut s, 200);
        h.engine
            .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
        h.engine
            .on_response_body(&mut s.req, result.as_bytes(), true, h.now, &mut out);
        s.effects.extend(out);
        let evicted: i64 = s
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::CountNamed(n, k)
                    if n == "loopguard.mcp_histories_evicted_total.policy.p" =>
                {
                    Some(*k)
                }
                _ => None,
            })
            .sum();
        EVICTED.with(|c| c.set(c.get() + evicted));
        true
    };
    // The victim's loop: two calls in.
    assert!(round(&mut h, "victim", "v", 1, "search"));
    assert!(round(&mut h, "victim", "v", 2, "search"));
    // Another caller opens 6,000 sessions (more than the region holds).
    for i in 0..6_000u32 {
        assert!(round(&mut h, "flood", &format!("f{i}"), i, "list"));
    }
    assert!(
        EVICTED.with(std::cell::Cell::get) > 0,
        "push-outs are counted"
    );
    // The victim's third call is noted, its fourth answered by loopguard,
    // as without the flood.
    assert!(round(&mut h, "victim", "v", 3, "search"));
    assert!(!round(&mut h, "victim", "v", 4, "search"));
}

thread_local! {
    static EVICTED: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}
