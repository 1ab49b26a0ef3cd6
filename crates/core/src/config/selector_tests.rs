//! Which requests a policy judges and who the caller is: exemptions,
//! routes, verified claims, the selector and the limit keys.

use super::tests::{base, err_of, with, without};
use super::*;
use serde_json::json;

#[test]
fn exemptions() {
    let ex = |e: Value| with(&["policies", "0", "spec", "exempt"], e);
    let cfg = Config::from_value(&ex(json!([
        {"key": "header:X-Batch-Id", "present": true},
        {"key": "header:x-api-key-id", "values": ["ci-runner"]}])))
    .unwrap();
    assert_eq!(
        cfg.policies[0].exempt,
        vec![
            Exemption {
                key: LimitKey::Header("x-batch-id".into()),
                matcher: ExemptMatch::Present(true)
            },
            Exemption {
                key: LimitKey::Header("x-api-key-id".into()),
                matcher: ExemptMatch::Values(vec!["ci-runner".into()])
            },
        ]
    );
    assert!(err_of(ex(json!([{"key": "header:a"}])))
        .contains("exempt[0] must give exactly one of \"present\" or \"values\""));
    assert!(err_of(ex(
        json!([{"key": "header:a", "present": true, "values": ["x"]}])
    ))
    .contains("exactly one of"));
    assert!(err_of(ex(json!([{"present": true}]))).contains("exempt[0].key is required"));
    assert!(err_of(ex(json!([{"key": "cookie:a", "present": true}])))
        .contains("exempt[0].key must be header:<name>"));
    assert!(err_of(ex(json!([{"key": "header:a", "value": "x"}])))
        .contains("exempt[0].value is not a known field (did you mean \"values\"?)"));
    assert!(err_of(ex(json!({"key": "header:a"}))).contains("exempt must be a list"));
}

#[test]
fn routes_and_verified_claims() {
    let cfg = Config::from_value(&with(
        &["policies", "0", "spec", "selector", "routes"],
        json!(["chat", "tools"]),
    ))
    .unwrap();
    assert_eq!(cfg.policies[0].selector.routes, vec!["chat", "tools"]);
    assert!(cfg.uses_route_names());
    assert!(!Config::from_value(&base()).unwrap().uses_route_names());
    assert!(err_of(with(
        &["policies", "0", "spec", "selector", "routes"],
        json!([""])
    ))
    .contains("selector.routes[0] must not be empty"));
    let cfg = Config::from_value(&with(
        &["policies", "0", "spec", "limit_keys"],
        json!(["jwt_verified:sub"]),
    ))
    .unwrap();
    assert_eq!(
        cfg.policies[0].limit_keys,
        vec![LimitKey::JwtVerified("sub".into())]
    );
    assert_eq!(cfg.jwt_payload_in_metadata, "jwt_payload");
    let cfg = Config::from_value(&with(&["jwt_payload_in_metadata"], json!("claims"))).unwrap();
    assert_eq!(cfg.jwt_payload_in_metadata, "claims");
}

#[test]
fn selector_validation() {
    let sel = |s: Value| with(&["policies", "0", "spec", "selector"], s);
    assert!(err_of(sel(json!({"pathExact": "/a", "pathPrefix": "/b"})))
        .contains("selector may give pathExact or pathPrefix, not both"));
    assert!(err_of(sel(json!({"pathPrefix": "v1"})))
        .contains("selector.pathPrefix must start with \"/\""));
    assert!(err_of(sel(json!({"pathExact": "/a?b=1"}))).contains("must not contain a query"));
    assert!(err_of(sel(json!({"methods": []}))).contains("selector.methods must not be empty"));
    assert!(err_of(sel(json!({"methods": ["GET", "P O"]})))
        .contains("selector.methods[1] must be an HTTP method token"));
    assert!(err_of(sel(json!({"methods": "GET"})))
        .contains("selector.methods must be a list of strings"));
    assert!(
        err_of(sel(json!({"hosts": ["a b"]}))).contains("selector.hosts[0] must be a host name")
    );
    assert!(err_of(sel(json!("x"))).contains("selector must be an object"));
    assert!(err_of(without(&["policies", "0", "spec", "selector"]))
        .contains("selector is required (use {} to match every request)"));
    let cfg = Config::from_value(&sel(json!({"hosts": ["*.Example.com", "[::1]:80"]}))).unwrap();
    assert_eq!(
        cfg.policies[0].selector.hosts,
        vec!["*.example.com", "[::1]"]
    );
}

#[test]
fn limit_key_validation() {
    let lk = |s: Value| with(&["policies", "0", "spec", "limit_keys"], s);
    assert!(err_of(lk(json!(["cookie:x"]))).contains("limit_keys[0] must be header:<name>, query:<name>, jwt:<claim>, jwt_verified:<claim> or ip:address (got \"cookie:x\")"));
    assert!(err_of(lk(json!(["header:"]))).contains("limit_keys[0] names no header"));
    assert!(err_of(lk(json!(["ip:port"]))).contains("must be ip:address"));
    assert!(err_of(lk(json!(["header:a b"]))).contains("invalid header name"));
    assert!(err_of(lk(json!(["header:X-A", "header:x-a"])))
        .contains("limit_keys[1] repeats \"header:x-a\""));
    assert!(err_of(lk(json!([3]))).contains("limit_keys[0] must be a string (got 3)"));
    assert!(err_of(lk(json!("header:x"))).contains("limit_keys must be a list"));
    assert!(err_of(lk(json!(["nocolon"]))).contains("limit_keys[0] must be"));
}
