//! Development aid: for each request of a corpus scenario file, near mode's
//! signature, whether its newest answer made progress, and its estimated
//! similarity to the earlier requests of the same caller.
//!
//!     cargo run -p loopguard-core --example near_pairs -- tests/corpus/scenarios/<id>.json
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use loopguard_core::config::Config;
use loopguard_core::detect::fingerprint;
use loopguard_core::detect::progress;
use loopguard_core::request::llm;
use loopguard_core::request::{RequestFacts, RequestHead};
use serde_json::Value;
use std::collections::HashMap;

struct Facts(HashMap<String, String>);

impl RequestFacts for Facts {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.0.get(name).map(|v| v.as_bytes().to_vec())
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

fn main() {
    let path = std::env::args().nth(1).expect("a scenario file");
    let extra = std::env::args().nth(2).unwrap_or_else(|| "{}".to_string());
    let sc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut ld = serde_json::json!({"enabled": true, "window_seconds": 600, "threshold_identical_requests": 3, "similarity": "near"});
    for (k, v) in serde_json::from_str::<Value>(&extra)
        .unwrap()
        .as_object()
        .unwrap()
    {
        ld[k] = v.clone();
    }
    let cfg = Config::from_value(&serde_json::json!({"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": ld}}]})).unwrap();
    let policy = &cfg.policies[0];
    let mut seen: Vec<(
        String,
        String,
        loopguard_core::detect::similarity::Signature,
    )> = Vec::new();
    println!("{} {} loop_turn={}", sc["id"], sc["label"], sc["loop_turn"]);
    for (i, r) in sc["requests"].as_array().unwrap().iter().enumerate() {
        let headers: HashMap<String, String> = r["headers"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.to_lowercase(), v.as_str().unwrap_or("").to_string()))
            .collect();
        let body = serde_json::to_vec(&r["body"]).unwrap();
        let pathv = r["path"].as_str().unwrap();
        let head = RequestHead {
            method: "POST",
            path: pathv,
            authority: "x",
        };
        let facts = Facts(headers.clone());
        let e = fingerprint::explain(&cfg, policy, &head, &facts, &body);
        let caller = format!("{}", e.made.fingerprint);
        let progressed = llm::parse(&body, pathv, policy.items_needed())
            .map(|req| {
                progress::answer_progressed_at(
                    &req.tool_history(None),
                    &req,
                    policy.volatile.classes,
                    None,
                    0,
                )
            })
            .unwrap_or(false);
        let Some(sig) = e.made.near else {
            println!("{:>3} (no signature)", i + 1);
            continue;
        };
        let mut sims: Vec<String> = seen
            .iter()
            .rev()
            .filter(|(c, _, _)| *c == caller)
            .take(8)
            .map(|(_, n, s)| {
                if s.anchor == sig.anchor {
                    let code = if sig.payload != 0 && sig.payload == s.payload {
                        "=code"
                    } else {
                        ""
                    };
                    format!("{n}:{:.2}{code}", sig.similarity(s))
                } else {
                    format!("{n}:anchor")
                }
            })
            .collect();
        sims.truncate(8);
        println!(
            "{:>3} {}{} anchor={:08x} | {}",
            i + 1,
            if progressed { "P" } else { "-" },
            r.get("response")
                .map_or(String::new(), |x| format!(" [{}]", x["status"])),
            sig.anchor,
            sims.join(" ")
        );
        seen.push((caller, format!("{}", i + 1), sig));
    }
}
