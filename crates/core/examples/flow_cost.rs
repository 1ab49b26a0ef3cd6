//! Development aid: run one request body through the whole flow many
//! times with a policy (the bench's 16 KB chat with `near`, say), for a
//! profiler (`valgrind --tool=callgrind`) to count where the instructions
//! go natively.
//!
//!     cargo run --release -p loopguard-core --example flow_cost -- BODY.json near 200
//!     cargo run --release -p loopguard-core --example flow_cost -- BODY.json tool_loops 200
//!     cargo run --release -p loopguard-core --example flow_cost -- mcp 200
//!     cargo run --release -p loopguard-core --example flow_cost -- mcp-cold 200
//!     cargo run --release -p loopguard-core --example flow_cost -- BODY.json llm_tail 200 budget
//!
//! With `budget`, the policy also has the bench's two spend caps, and each
//! request's response passes (its headers, a body without usage).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use loopguard_core::config::Config;
use loopguard_core::flow::{Effects, Engine, Request};
use loopguard_core::request::{RequestFacts, RequestHead};
use loopguard_core::state::store::InProcess;

struct Facts;

impl RequestFacts for Facts {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        match name {
            "authorization" => Some(b"Bearer sk-bench".to_vec()),
            "content-type" => Some(b"application/json".to_vec()),
            _ => None,
        }
    }
    fn source_address(&self) -> Option<String> {
        None
    }
    fn verified_claim(&self, _: &str, _: &str) -> Option<Vec<u8>> {
        None
    }
    fn route_name(&self) -> Option<String> {
        None
    }
    fn route_policy(&self) -> Option<String> {
        None
    }
}

/// `mcp`: tools/call requests (a new call each time, from 1000 callers'
/// sessions) and their 1 KB results, read as they pass.
/// `cold`: every result is new (no digest remembered from an earlier one).
fn mcp(n: u32, cold: bool) {
    let cfg = Config::from_value(
        &serde_json::json!({"policies": [{"id": "p", "spec": {"selector": {},
        "mcp": {"enabled": true}}}]}),
    )
    .unwrap();
    let mut engine = Engine::new(cfg, "bench", |_| Ok(InProcess::default()), |_| None, 1).unwrap();
    let head = RequestHead {
        method: "POST",
        path: "/mcp",
        authority: "x",
    };
    let result = serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {
        "content": [{"type": "text", "text": format!("3 results: {}", "doc-a4d07475 ".repeat(75))}],
        "isError": false}})
    .to_string();
    let mut out = Effects::new();
    for i in 0..n {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"search","arguments":{{"query":"release notes","page":{i}}}}}}}"#
        );
        let mut r = Request::new(i);
        let now = 1_000 + 100 * u64::from(i);
        engine.on_headers(&mut r, &head, &Facts, false, now, &mut out);
        engine.on_body(
            &mut r,
            body.len(),
            true,
            Some(body.as_bytes()),
            now,
            &mut out,
        );
        engine.on_response_headers(&mut r, Some(200), now, &mut out);
        engine.on_response_content_type(&mut r, Some("application/json"), now, &mut out);
        let fresh;
        let body = if cold {
            fresh = result.replacen("3 results", &format!("{i} results"), 1);
            fresh.as_bytes()
        } else {
            result.as_bytes()
        };
        engine.on_response_body(&mut r, body, true, now, &mut out);
        out.clear();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(mode @ ("mcp" | "mcp-cold")) = args.get(1).map(String::as_str) {
        return mcp(
            args.get(2).map_or(200, |s| s.parse().unwrap()),
            mode == "mcp-cold",
        );
    }
    let body = std::fs::read(&args[1]).unwrap();
    let similarity = args.get(2).map_or("near", String::as_str);
    let n: u32 = args.get(3).map_or(200, |s| s.parse().unwrap());
    // `tool_loops`: the tool-loop judge alone; else loop detection in
    // that similarity mode.
    let spec = if similarity == "tool_loops" {
        serde_json::json!({"selector": {}, "tool_loops": {"enabled": true}})
    } else {
        serde_json::json!({"selector": {}, "loop_detection": {"enabled": true, "window_seconds": 1,
            "threshold_identical_requests": 64, "similarity": similarity}})
    };
    let budget = args.get(4).is_some_and(|a| a == "budget");
    let mut spec = spec;
    if budget {
        spec["budget"] = serde_json::json!({"limits": [
            {"name": "hour", "per": "caller", "window_seconds": 3600, "tokens": 1_000_000_000_000u64},
            {"name": "calls", "per": "caller", "window_seconds": 60, "calls": 1_000_000_000}]});
    }
    let cfg =
        Config::from_value(&serde_json::json!({"policies": [{"id": "p", "spec": spec}]})).unwrap();
    let mut engine = Engine::new(cfg, "bench", |_| Ok(InProcess::default()), |_| None, 1).unwrap();
    let head = RequestHead {
        method: "POST",
        path: "/v1/chat/completions",
        authority: "x",
    };
    let mut out = Effects::new();
    for i in 0..n {
        let mut r = Request::new(i);
        engine.on_headers(
            &mut r,
            &head,
            &Facts,
            false,
            1_000 + 100 * u64::from(i),
            &mut out,
        );
        engine.on_body(
            &mut r,
            body.len(),
            true,
            Some(&body),
            1_000 + 100 * u64::from(i),
            &mut out,
        );
        if budget {
            let now = 1_000 + 100 * u64::from(i);
            engine.on_response_headers(&mut r, Some(200), now, &mut out);
            engine.on_response_content_type(&mut r, Some("text/plain"), now, &mut out);
            engine.on_done(&mut r, &mut out);
        }
        out.clear();
    }
}
