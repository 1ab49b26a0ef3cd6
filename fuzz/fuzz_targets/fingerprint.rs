//! Any request (method, path with query, headers, body) through every
//! fingerprint mode: no panic, and the same request always gives the same
//! fingerprint.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard_core::config::Config;
use loopguard_core::detect::fingerprint::Pending;
use loopguard_core::request::{RequestFacts, RequestHead};

struct Facts<'a> {
    headers: Vec<(&'a [u8], &'a [u8])>,
}

impl RequestFacts for Facts<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers.iter().find(|(k, _)| *k == name.as_bytes()).map(|(_, v)| v.to_vec())
    }
    fn source_address(&self) -> Option<String> {
        self.header("x-peer").map(|v| String::from_utf8_lossy(&v).into_owned())
    }
    fn verified_claim(&self, _payload_key: &str, claim: &str) -> Option<Vec<u8>> {
        self.header(claim)
    }
    fn route_name(&self) -> Option<String> {
        None
    }
    fn route_policy(&self) -> Option<String> {
        None
    }
}

const MODES: [&str; 3] = ["exact", "llm_tail", "session"];

fuzz_target!(|data: &[u8]| {
    // Fields separated by 0xff: method, path, body, then header name/value pairs.
    let mut parts = data.split(|&b| b == 0xff);
    let method = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let body = parts.next().unwrap_or_default();
    let rest: Vec<&[u8]> = parts.collect();
    let headers: Vec<(&[u8], &[u8])> = rest.chunks(2).filter_map(|c| Some((*c.first()?, *c.get(1)?))).collect();
    let facts = Facts { headers };
    let head = RequestHead { method: &method, path: &path, authority: "h" };
    for mode in MODES {
        let json = format!(
            r#"{{"policies": [{{"id": "p", "spec": {{"selector": {{}},
                "limit_keys": ["header:authorization", "query:user", "jwt:sub", "jwt_verified:sub", "ip:address"],
                "loop_detection": {{"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "{mode}"}}}}}}]}}"#
        );
        let Ok(cfg) = Config::parse(json.as_bytes()) else { continue };
        let Some(policy) = cfg.policies.first() else { continue };
        let a = Pending::start(&cfg, policy, &head, &facts).finish(body);
        let b = Pending::start(&cfg, policy, &head, &facts).finish(body);
        assert_eq!(a, b);
    }
});
