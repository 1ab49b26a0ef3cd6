//! The `budget` block: defaults, every field's bounds, and the rules tying
//! them together; each error names the policy and the field.

use super::budget::*;
use super::tests::{err_of, with};
use super::*;
use serde_json::json;

fn budget(v: Value) -> Value {
    with(&["policies", "0", "spec", "budget"], v)
}

fn one(limit: Value) -> Value {
    budget(json!({ "limits": [limit] }))
}

#[test]
fn defaults_and_units() {
    let cfg = Config::from_value(&budget(json!({"limits": [
        {"name": "hour", "per": "session", "window_seconds": 3600, "usd": 5},
        {"name": "day-tokens", "per": "caller", "window_seconds": 86400, "tokens": 2000000},
        {"name": "turns", "per": "conversation", "window_seconds": 60, "calls": 200}]})))
    .unwrap();
    let b = cfg.policies[0].budget.clone().unwrap();
    assert_eq!(b.action, BudgetAction::Reject);
    assert_eq!(b.warn_at_permille, 800);
    assert_eq!(
        b.session,
        vec![SessionSource::Header("x-session-id".into())]
    );
    assert_eq!(b.max_tracked_keys, 8192);
    assert_eq!(b.limits[0].cap, Cap::MicroUsd(5_000_000));
    assert_eq!(b.limits[0].window_ms, 3_600_000);
    assert_eq!(b.limits[1].cap, Cap::Tokens(2_000_000, TokensOf::All));
    assert_eq!(b.limits[2].cap, Cap::Calls(200));
    assert_eq!(b.limits[2].per, BudgetPer::Conversation);
    assert!(b.has_per(BudgetPer::Session) && b.has_per(BudgetPer::Conversation) && b.has_usd());
    // A policy with only a budget is a policy.
    assert!(cfg.policies[0].is_active());
    let cfg = Config::from_value(&budget(json!({
        "limits": [{"name": "t", "per": "caller", "window_seconds": 60, "tokens": 5, "tokens_of": "input"}],
        "action": "warn", "warn_at": 0, "max_tracked_keys": 64,
        "session": ["body:metadata.session_id", "header:X-LiteLLM-Trace-Id", "body:user"]})))
    .unwrap();
    let b = cfg.policies[0].budget.clone().unwrap();
    assert_eq!(b.action, BudgetAction::Warn);
    assert_eq!(b.warn_at_permille, 0);
    assert_eq!(b.limits[0].cap, Cap::Tokens(5, TokensOf::Input));
    assert_eq!(
        b.session,
        vec![
            SessionSource::Body(vec!["metadata".into(), "session_id".into()]),
            SessionSource::Header("x-litellm-trace-id".into()),
            SessionSource::Body(vec!["user".into()]),
        ]
    );
}

#[test]
fn every_field_is_checked_and_named() {
    let ok = json!({"name": "n", "per": "caller", "window_seconds": 60, "calls": 1});
    let with_field = |k: &str, v: Value| {
        let mut l = ok.clone();
        l[k] = v;
        one(l)
    };
    let cases: Vec<(Value, &str)> = vec![
        (budget(json!({})), "budget.limits is required"),
        (
            budget(json!({"limits": []})),
            "budget.limits must list at least one cap",
        ),
        (
            budget(json!({"limits": vec![ok.clone(); 9]})),
            "budget.limits may list at most 8 caps",
        ),
        (
            budget(json!({"limits": [ok.clone(), ok.clone()]})),
            "budget.limits[1].name \"n\" is used by more than one cap",
        ),
        (
            with_field("name", json!("Big")),
            "budget.limits[0].name must match [a-z0-9_-]{1,32}",
        ),
        (
            with_field("name", json!("caller")),
            "budget.limits[0].name \"caller\" is a metric label name",
        ),
        (with_field("per", json!("team")), "per"),
        (
            with_field("window_seconds", json!(59)),
            "budget.limits[0].window_seconds must be >= 60",
        ),
        (
            with_field("window_seconds", json!(2_678_401)),
            "budget.limits[0].window_seconds must be <= 2678400",
        ),
        (
            one(json!({"name": "n", "per": "caller", "calls": 1})),
            "budget.limits[0].window_seconds is required",
        ),
        (
            one(json!({"name": "n", "per": "caller", "window_seconds": 60})),
            "budget.limits[0] must give exactly one cap: usd, tokens or calls",
        ),
        (
            with_field("usd", json!(5)),
            "budget.limits[0] must give exactly one cap",
        ),
        (
            one(json!({"name": "n", "per": "caller", "window_seconds": 60, "usd": 0})),
            "budget.limits[0].usd must be a number of dollars above 0",
        ),
        (
            one(json!({"name": "n", "per": "caller", "window_seconds": 60, "usd": "5"})),
            "budget.limits[0].usd must be a number of dollars above 0",
        ),
        (
            one(json!({"name": "n", "per": "caller", "window_seconds": 60, "tokens": 0})),
            "budget.limits[0].tokens must be >= 1",
        ),
        (
            with_field("calls", json!(1_000_000_001u64)),
            "budget.limits[0].calls must be <= 1000000000",
        ),
        (
            with_field("tokens_of", json!("input")),
            "budget.limits[0].tokens_of applies only to a tokens cap",
        ),
        (
            budget(json!({"limits": [ok.clone()], "warn_at": 1})),
            "budget.warn_at must be a number from 0 (no warning) to below 1",
        ),
        (
            budget(json!({"limits": [ok.clone()], "action": "throttle"})),
            "action",
        ),
        (
            budget(json!({"limits": [ok.clone()], "session": []})),
            "budget.session must not be empty",
        ),
        (
            budget(json!({"limits": [ok.clone()], "session": ["cookie:x"]})),
            "budget.session[0] must be header:<name>, body:<field>, jwt:<claim> or jwt_verified:<claim>",
        ),
        (
            budget(json!({"limits": [ok.clone()], "user": ["jwt:"]})),
            "budget.user[0] must be header:<name>, body:<field>, jwt:<claim>",
        ),
        (
            budget(json!({"limits": [ok.clone()], "user": []})),
            "budget.user must not be empty",
        ),
        (
            budget(json!({"limits": [ok.clone()], "unpriced": "max"})),
            "budget.unpriced applies only to a dollar cap",
        ),
        (
            budget(json!({"limits": [{"name": "n", "per": "caller", "window_seconds": 60, "usd": 1}], "unpriced": "free"})),
            "unpriced",
        ),
        // Validated after rounding: nothing becomes zero or switches off.
        (
            one(json!({"name": "n", "per": "caller", "window_seconds": 60, "usd": 1e-7})),
            "budget.limits[0].usd 1e-7 rounds to $0 (caps are kept in micro-dollars): the smallest cap is 0.000001",
        ),
        (
            budget(json!({"limits": [ok.clone()], "warn_at": 0.9995})),
            "budget.warn_at 0.9995 rounds to 1 (warn_at is kept in thousandths), which would switch the warning off",
        ),
        (
            budget(json!({"limits": [ok.clone()], "warn_at": 0.0004})),
            "budget.warn_at 0.0004 rounds to 0",
        ),
        (
            budget(json!({"limits": [ok.clone()], "session": ["header:bad header"]})),
            "budget.session[0] names no valid header",
        ),
        (
            budget(json!({"limits": [ok.clone()], "session": ["body:a.b.c"]})),
            "budget.session[0] must name a body field or a field of one",
        ),
        (
            budget(json!({"limits": [ok.clone()], "max_tracked_keys": 63})),
            "budget.max_tracked_keys must be >= 64",
        ),
        (budget(json!({"limits": [ok.clone()], "extra": 1})), "extra"),
    ];
    for (cfg, expect) in cases {
        let e = err_of(cfg);
        assert!(e.contains(expect), "{e} !~ {expect}");
        assert!(e.starts_with("policy \""), "{e}");
    }
}

#[test]
fn users_windows_and_unpriced_models_are_configured() {
    let cfg = Config::from_value(&json!({"policies": [{"id": "p", "spec": {"selector": {},
        "budget": {"limits": [
            {"name": "month", "per": "user", "window_seconds": 2_678_400, "usd": 100},
            {"name": "tiny", "per": "caller", "window_seconds": 60, "usd": 0.000001}],
            "user": ["header:x-end-user", "jwt:sub", "jwt_verified:email", "body:metadata.user_id"],
            "unpriced": "reject", "warn_at": 0.999}}}]}))
    .unwrap();
    let b = cfg.policies[0].budget.as_ref().unwrap();
    assert!(b.has_per(BudgetPer::User));
    assert_eq!(b.limits[0].per, BudgetPer::User);
    assert_eq!(b.limits[0].window_ms, 2_678_400_000);
    assert_eq!(b.limits[1].cap, Cap::MicroUsd(1));
    assert_eq!(b.warn_at_permille, 999);
    assert_eq!(b.unpriced, Unpriced::Reject);
    assert_eq!(
        b.user,
        vec![
            SessionSource::Header("x-end-user".into()),
            SessionSource::Jwt("sub".into()),
            SessionSource::JwtVerified("email".into()),
            SessionSource::Body(vec!["metadata".into(), "user_id".into()]),
        ]
    );
    // The defaults: OpenAI's user fields, then Anthropic's; unpriced
    // models charged at the highest price.
    let cfg = Config::from_value(&json!({"policies": [{"id": "p", "spec": {"selector": {},
        "budget": {"limits": [{"name": "h", "per": "user", "window_seconds": 60, "usd": 1}]}}}]}))
    .unwrap();
    let b = cfg.policies[0].budget.as_ref().unwrap();
    assert_eq!(b.unpriced, Unpriced::Max);
    assert_eq!(
        b.user.iter().map(SessionSource::show).collect::<Vec<_>>(),
        [
            "body:user",
            "body:safety_identifier",
            "body:metadata.user_id"
        ]
    );
}

#[test]
fn a_budget_is_not_for_an_mcp_policy() {
    let cfg = json!({"policies": [{"id": "m", "spec": {"selector": {}, "mcp": {"enabled": true},
        "budget": {"limits": [{"name": "n", "per": "caller", "window_seconds": 60, "calls": 1}]}}}]});
    assert!(err_of(cfg).contains("budget cannot be combined with mcp"));
}
