//! Which policy applies to a request, and whether it is exempt.

use crate::config::{normalize_host, Config, ExemptMatch, PathMatch, Policy};
use crate::request::{limit_key_values, RequestFacts, RequestHead};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// The index of the policy that applies.
    Policy(usize),
    /// No policy applies: the request passes untouched.
    None,
    /// The route names a policy id this configuration does not have: the
    /// request passes (the host logs it once).
    UnknownRoutePolicy(String),
}

/// The policy for a request: with `route_metadata` on, the one its Envoy
/// route names in metadata (`filter_metadata.loopguard.policy`), regardless
/// of selectors; otherwise the first policy whose selector matches.
pub fn select(config: &Config, head: &RequestHead<'_>, facts: &dyn RequestFacts) -> Selection {
    let routed = config.route_metadata.then(|| facts.route_policy());
    if let Some(id) = routed.flatten() {
        let i = config.policy_index(&id);
        return i.map_or(Selection::UnknownRoutePolicy(id), Selection::Policy);
    }
    let path = head.path_only();
    // Host normalisation allocates and the route name is a host call: do
    // each once, and only if some policy filters on it.
    let mut host: Option<String> = None;
    let mut route: Option<Option<String>> = None;
    let found = config.policies.iter().position(|p| {
        let sel = &p.selector;
        let method = |m: &String| m.eq_ignore_ascii_case(head.method);
        let method_ok = sel.methods.is_empty() || sel.methods.iter().any(method);
        if !path_matches(&sel.path, path) || !method_ok {
            return false;
        }
        if !sel.hosts.is_empty() {
            let host = host.get_or_insert_with(|| normalize_host(head.authority));
            if !sel.hosts.iter().any(|h| host_matches(h, host)) {
                return false;
            }
        }
        sel.routes.is_empty()
            || route
                .get_or_insert_with(|| facts.route_name())
                .as_ref()
                .is_some_and(|name| sel.routes.iter().any(|r| r == name))
    });
    found.map_or(Selection::None, Selection::Policy)
}

/// Whether the request matches one of the policy's exemptions (such
/// requests are never counted).
pub fn is_exempt(
    config: &Config,
    policy: &Policy,
    head: &RequestHead<'_>,
    facts: &dyn RequestFacts,
) -> bool {
    policy.exempt.iter().any(|e| {
        let values = limit_key_values(&e.key, head, facts, &config.jwt_payload_in_metadata);
        match &e.matcher {
            ExemptMatch::Present(want) => values.is_empty() != *want,
            ExemptMatch::Values(allowed) => values
                .iter()
                .any(|v| allowed.iter().any(|a| a.as_bytes() == v.as_slice())),
        }
    })
}

/// Segment-aware path matching: prefix `/v1/` matches `/v1/x`; prefix `/v1`
/// matches `/v1` and `/v1/x` but not `/v10`.
pub fn path_matches(rule: &PathMatch, path: &str) -> bool {
    match rule {
        PathMatch::Any => true,
        PathMatch::Exact(p) => path == p,
        PathMatch::Prefix(p) => {
            path.starts_with(p.as_str())
                && (p.ends_with('/')
                    || path.len() == p.len()
                    || path.as_bytes().get(p.len()) == Some(&b'/'))
        }
    }
}

/// `pattern` is lower-case without port; `*.example.com` matches any
/// subdomain of example.com (not example.com itself), as in Envoy's virtual
/// host domains.
fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        None => pattern == host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::tests::FakeFacts;
    use serde_json::json;

    fn cfg(selectors: Vec<serde_json::Value>) -> Config {
        let policies: Vec<_> = selectors
            .into_iter()
            .enumerate()
            .map(|(i, s)| json!({"id": format!("p{i}"), "spec": {"selector": s,
                "loop_detection": {"enabled": true, "window_seconds": 1, "threshold_identical_requests": 2}}}))
            .collect();
        Config::from_value(&json!({ "policies": policies })).unwrap()
    }

    fn pick_with(
        c: &Config,
        method: &str,
        path: &str,
        authority: &str,
        f: &FakeFacts,
    ) -> Option<String> {
        match select(
            c,
            &RequestHead {
                method,
                path,
                authority,
            },
            f,
        ) {
            Selection::Policy(i) => Some(c.policies[i].id.clone()),
            Selection::None => None,
            Selection::UnknownRoutePolicy(id) => Some(format!("unknown:{id}")),
        }
    }

    fn pick(c: &Config, method: &str, path: &str, authority: &str) -> Option<String> {
        pick_with(c, method, path, authority, &FakeFacts::default())
    }

    #[test]
    fn prefix_is_segment_aware() {
        let c = cfg(vec![json!({"pathPrefix": "/v1"})]);
        assert_eq!(pick(&c, "GET", "/v1", "h"), Some("p0".into()));
        assert_eq!(pick(&c, "GET", "/v1/x", "h"), Some("p0".into()));
        assert_eq!(pick(&c, "GET", "/v10", "h"), None);
        assert_eq!(pick(&c, "GET", "/v1?x=1", "h"), Some("p0".into()));
        let c = cfg(vec![json!({"pathPrefix": "/v1/"})]);
        assert_eq!(pick(&c, "GET", "/v1/x", "h"), Some("p0".into()));
        assert_eq!(pick(&c, "GET", "/v1/", "h"), Some("p0".into()));
        assert_eq!(pick(&c, "GET", "/v1", "h"), None);
        let c = cfg(vec![json!({"pathPrefix": "/"})]);
        assert_eq!(pick(&c, "GET", "/anything", "h"), Some("p0".into()));
    }

    #[test]
    fn exact_ignores_query() {
        let c = cfg(vec![json!({"pathExact": "/v1/chat/completions"})]);
        assert_eq!(
            pick(&c, "POST", "/v1/chat/completions?a=1", "h"),
            Some("p0".into())
        );
        assert_eq!(pick(&c, "POST", "/v1/chat/completions/", "h"), None);
        assert_eq!(pick(&c, "POST", "/v1/chat", "h"), None);
    }

    #[test]
    fn methods_and_hosts() {
        let c = cfg(vec![
            json!({"methods": ["POST"], "hosts": ["api.example.com", "*.corp.example"]}),
        ]);
        assert_eq!(
            pick(&c, "POST", "/", "API.Example.com:443"),
            Some("p0".into())
        );
        assert_eq!(pick(&c, "post", "/", "api.example.com"), Some("p0".into()));
        assert_eq!(pick(&c, "GET", "/", "api.example.com"), None);
        assert_eq!(pick(&c, "POST", "/", "other.example.com"), None);
        assert_eq!(
            pick(&c, "POST", "/", "a.corp.example:80"),
            Some("p0".into())
        );
        assert_eq!(pick(&c, "POST", "/", "corp.example"), None);
    }

    #[test]
    fn first_match_wins_and_no_match_passes() {
        let c = cfg(vec![
            json!({"pathPrefix": "/v1/batch"}),
            json!({"pathPrefix": "/v1"}),
        ]);
        assert_eq!(pick(&c, "POST", "/v1/batch/jobs", "h"), Some("p0".into()));
        assert_eq!(pick(&c, "POST", "/v1/chat", "h"), Some("p1".into()));
        assert_eq!(pick(&c, "POST", "/v2/chat", "h"), None);
    }

    #[test]
    fn route_names_and_route_metadata() {
        let mut c = cfg(vec![
            json!({"routes": ["chat"]}),
            json!({"pathPrefix": "/v1"}),
        ]);
        c.route_metadata = true;
        let mut f = FakeFacts::default();
        assert_eq!(pick_with(&c, "POST", "/v1/x", "h", &f), Some("p1".into()));
        f.route_name = Some("chat".into());
        assert_eq!(pick_with(&c, "POST", "/v1/x", "h", &f), Some("p0".into()));
        // Route metadata wins over every selector.
        f.route_policy = Some("p1".into());
        assert_eq!(
            pick_with(&c, "GET", "/elsewhere", "h", &f),
            Some("p1".into())
        );
        f.route_policy = Some("nope".into());
        assert_eq!(
            pick_with(&c, "POST", "/v1/x", "h", &f),
            Some("unknown:nope".into())
        );
        // Off (the default): route metadata is not even read.
        c.route_metadata = false;
        f.route_policy = Some("p1".into());
        f.route_name = None;
        assert_eq!(pick_with(&c, "GET", "/elsewhere", "h", &f), None);
    }

    #[test]
    fn exemptions_match_presence_or_values() {
        let c = Config::from_value(&json!({"policies": [{"id": "p", "spec": {"selector": {},
            "exempt": [{"key": "header:x-batch-id", "present": true},
                       {"key": "header:x-api-key-id", "values": ["ci-runner", "evals"]},
                       {"key": "query:mode", "values": ["batch"]}],
            "loop_detection": {"enabled": true, "window_seconds": 1, "threshold_identical_requests": 2}}}]})).unwrap();
        let p = &c.policies[0];
        let head = RequestHead {
            method: "POST",
            path: "/v1/x",
            authority: "h",
        };
        let ex = |f: &FakeFacts, path: &str| is_exempt(&c, p, &RequestHead { path, ..head }, f);
        assert!(!ex(&FakeFacts::default(), "/v1/x"));
        assert!(ex(&FakeFacts::default().with("x-batch-id", ""), "/v1/x"));
        assert!(ex(
            &FakeFacts::default().with("x-api-key-id", "evals"),
            "/v1/x"
        ));
        assert!(!ex(
            &FakeFacts::default().with("x-api-key-id", "prod"),
            "/v1/x"
        ));
        assert!(ex(
            &FakeFacts::default(),
            "/v1/x?mode=interactive&mode=batch"
        ));
        let c2 = Config::from_value(&json!({"policies": [{"id": "p", "spec": {"selector": {},
            "exempt": [{"key": "header:x-user", "present": false}],
            "loop_detection": {"enabled": true, "window_seconds": 1, "threshold_identical_requests": 2}}}]})).unwrap();
        assert!(is_exempt(
            &c2,
            &c2.policies[0],
            &head,
            &FakeFacts::default()
        ));
        assert!(!is_exempt(
            &c2,
            &c2.policies[0],
            &head,
            &FakeFacts::default().with("x-user", "u")
        ));
    }
}
