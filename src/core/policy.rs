//! Which policy applies to a request.

use super::config::{normalize_host, Config, PathMatch, Policy, Selector};
use super::request::RequestHead;

/// The first policy whose selector matches, with its index; `None` lets the
/// request pass untouched.
pub fn select<'c>(config: &'c Config, head: &RequestHead<'_>) -> Option<(usize, &'c Policy)> {
    let path = head.path_only();
    // Host normalisation allocates; do it once, and only if some policy
    // filters on hosts.
    let mut host: Option<String> = None;
    config.policies.iter().enumerate().find(|(_, p)| {
        let sel = &p.selector;
        if !path_matches(&sel.path, path) || !method_matches(sel, head.method) {
            return false;
        }
        if sel.hosts.is_empty() {
            return true;
        }
        let host = host.get_or_insert_with(|| normalize_host(head.authority));
        sel.hosts.iter().any(|h| host_matches(h, host))
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

fn method_matches(sel: &Selector, method: &str) -> bool {
    sel.methods.is_empty() || sel.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
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

    fn pick(c: &Config, method: &str, path: &str, authority: &str) -> Option<String> {
        select(
            c,
            &RequestHead {
                method,
                path,
                authority,
            },
        )
        .map(|(_, p)| p.id.clone())
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
}
