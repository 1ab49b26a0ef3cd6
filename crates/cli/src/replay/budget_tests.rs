//! `loopguard replay` on recorded traffic with recorded usage under spend
//! caps: the recorded usage is what the engine's response path reads (as
//! Envoy read the provider's), the caps act on the request after the
//! crossing, on the recorded clock, and the report says per cap what it
//! rejected and warned, the keys it touched and when it first rejected;
//! `--set` sweeps a cap found by its name.

use super::tests::{replay, Dir};
use super::*;
use serde_json::json;

const START: u64 = 1_795_000_000_000;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shipped budget example and the fixture: a wandering agent (40
/// turns of Claude Sonnet 4, 20 s apart, context growing from 26K tokens,
/// never repeating itself) and a healthy GPT-4o mini session.
fn example() -> (String, String) {
    let r = root();
    (
        r.join("examples/budget/envoy.yaml").display().to_string(),
        r.join("crates/cli/testdata/budget.jsonl")
            .display()
            .to_string(),
    )
}

fn run_json(args: &[&str]) -> Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    serde_json::from_str(&replay(&a).unwrap().1).unwrap()
}

fn verdicts(path: &str) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_session_cap_stops_the_wanderer_after_the_crossing() {
    let (cfg, traffic) = example();
    let d = Dir::new("budget-example");
    let v = d.0.join("v.jsonl").display().to_string();
    let r = run_json(&["--config", &cfg, "--verdicts", &v, &traffic]);
    let p = &r["runs"][0]["policies"][0];
    // Not a loop: the caps catch it.
    assert_eq!(p["loops_found"], 0, "{p}");
    assert_eq!(p["actions"], json!({"reject": 10, "allow": 42}));
    assert_eq!(
        (
            p["requests_touched"].as_u64(),
            p["callers_touched"].as_u64()
        ),
        (Some(10), Some(1))
    );
    let caps = &p["budgets"]["caps"];
    // 30 turns cost $5.18 (the 30th crossed $5); the 10 after it are refused.
    assert_eq!(
        caps[0],
        json!({"name": "session-hour", "per": "session", "unit": "usd", "cap": "5.00",
               "window_seconds": 3600, "action": "reject", "rejected": 10, "warned": 4,
               "keys_touched": 1, "keys_at_cap": 1, "keys_at_least": false,
               "first_rejected_ms": crate::replay::input::time::rfc3339("2026-11-24T09:10:00.000Z").unwrap(),
               "spent": "5.18"})
    );
    assert_eq!(
        (
            caps[1]["name"].as_str(),
            caps[1]["rejected"].as_u64(),
            caps[1]["keys_touched"].as_u64()
        ),
        (Some("caller-day"), Some(0), Some(0))
    );
    assert_eq!(p["budgets"]["responses_estimated"], 0);
    let v = verdicts(&v);
    // The wanderer's turns are 20 s apart from 09:00:00, the other
    // session's at 09:00:30 and every minute after.
    let wanderer: Vec<&Value> = v
        .iter()
        .filter(|v| v["at_ms"].as_u64().unwrap() % 20_000 == 0)
        .collect();
    assert_eq!(wanderer.len(), 40);
    let first_refused = wanderer[30];
    assert_eq!(first_refused["status"], 429);
    assert_eq!(first_refused["action"], "reject");
    assert_eq!(first_refused["budget"]["rejected"], "session-hour");
    // The session's own spending (the cap's $5.18 is both sessions').
    assert_eq!(
        first_refused["budget"]["header"],
        "session-hour; spent=5.17; cap=5.00; unit=usd; window=3600"
    );
    assert_eq!(
        first_refused["decision"],
        json!({"policy": "agents", "mode": "enforce", "action": "reject", "budget": "session-hour"})
    );
    // Warned from $4 (warn_at 0.8): the answers carried the header.
    let warned: Vec<&str> = wanderer[..30]
        .iter()
        .filter_map(|v| v["budget"]["header"].as_str())
        .collect();
    assert_eq!(warned.len(), 4, "{warned:?}");
    assert!(
        warned[0].starts_with("session-hour; spent=4."),
        "{warned:?}"
    );
    assert!(wanderer[..26].iter().all(|v| v["budget"].is_null()));
    let (_, text) = replay(&["--config", &cfg, &traffic]).unwrap();
    assert!(text.contains("    budget session-hour: $5.00 per session in 3600 s (reject): 10 requests rejected (the first at 2026-11-24T09:10:00.000Z), 4 warned; 1 key touched, 1 at the cap; $5.18 spent\n"), "{text}");
    assert!(text.contains("    budget caller-day: $50.00 per caller in 86400 s (reject): 0 requests rejected, 0 warned; 0 keys touched, 0 at the cap; $5.18 spent\n"), "{text}");
}

#[test]
fn a_sweep_finds_a_cap_by_its_name() {
    let (cfg, traffic) = example();
    let r = run_json(&[
        "--config",
        &cfg,
        "--set",
        "policies.agents.budget.limits.session-hour.usd=2,5,10",
        &traffic,
    ]);
    let rows: Vec<(f64, u64)> = r["sweep"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["value"].as_f64().unwrap(),
                row["budget_rejected"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, [(2.0, 24), (5.0, 10), (10.0, 0)]);
    assert_eq!(
        r["runs"][0]["policies"][0]["budgets"]["caps"][0]["cap"],
        "2.00"
    );
    let (_, text) = replay(&[
        "--config",
        &cfg,
        "--set",
        "policies.agents.budget.limits.session-hour.usd=2,5",
        &traffic,
    ])
    .unwrap();
    assert!(
        text.contains("callers touched   budget rejections\n"),
        "{text}"
    );
    assert!(text.contains("  envoy.yaml = 2                          0                 24                 1                  24\n"), "{text}");
    // A sweep without budgets keeps its columns.
    let d = Dir::new("budget-sweep");
    let plain = d.write("p.json", r#"{"policies": [{"id": "agents", "spec": {"selector": {"pathPrefix": "/v1/"},
      "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}}]}"#);
    let r = run_json(&[
        "--config",
        &plain,
        "--set",
        "policies.agents.loop_detection.threshold_identical_requests=2,3",
        &traffic,
    ]);
    assert!(r["sweep"]["rows"][0]["budget_rejected"].is_null());
    let (_, text) = replay(&[
        "--config",
        &plain,
        "--set",
        "policies.agents.loop_detection.threshold_identical_requests=2,3",
        &traffic,
    ])
    .unwrap();
    assert!(!text.contains("budget rejections"), "{text}");
    // A cap no limit is named: the path says where it stopped.
    let err = replay(&[
        "--config",
        &cfg,
        "--set",
        "policies.agents.budget.limits.hourly.usd=2",
        &traffic,
    ])
    .unwrap_err();
    assert!(err.contains("policies.agents.budget.limits has no field or item hourly (lists are walked by item id, name or position)"), "{err}");
}

#[test]
fn in_shadow_mode_the_caps_only_say_what_they_would_have_rejected() {
    let (cfg, traffic) = example();
    let d = Dir::new("budget-shadow");
    let v = d.0.join("v.jsonl").display().to_string();
    let r = run_json(&[
        "--config",
        &cfg,
        "--verdicts",
        &v,
        "--set",
        "policies.agents.mode=shadow",
        &traffic,
    ]);
    let p = &r["runs"][0]["policies"][0];
    assert_eq!(p["shadow"], true);
    assert_eq!(p["actions"]["reject"], 10);
    let cap = &p["budgets"]["caps"][0];
    assert_eq!(
        (cap["rejected"].as_u64(), cap["keys_at_cap"].as_u64()),
        (Some(10), Some(1))
    );
    // Forwarded: every turn spent.
    assert_eq!(cap["spent"], "8.05");
    let v = verdicts(&v);
    assert!(v.iter().all(|v| v["status"].is_null()));
    let would: Vec<&Value> = v
        .iter()
        .filter(|v| !v["budget"].is_null() && v["budget"]["rejected"] == "session-hour")
        .collect();
    assert_eq!(would.len(), 10);
    assert_eq!(would[0]["budget"]["shadow"], true);
    assert!(
        would[0]["budget"]["header"].is_null(),
        "shadow mode sends no header"
    );
    let (_, text) = replay(&[
        "--config",
        &cfg,
        "--set",
        "policies.agents.mode=shadow",
        &traffic,
    ])
    .unwrap();
    assert!(
        text.contains("10 requests would have been rejected (the first at"),
        "{text}"
    );
}

/// `n` calls of caller `key` (session `session`), `gap_ms` apart from
/// `start`, each answered `status` with `usage` recorded (or none).
fn calls(
    key: &str,
    session: Option<&str>,
    n: u64,
    start: u64,
    gap_ms: u64,
    status: u16,
    usage: Option<Value>,
) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut headers = json!({"authorization": format!("Bearer {key}"), "content-type": "application/json"});
            if let Some(s) = session {
                headers["x-session-id"] = json!(s);
            }
            let mut response = json!({"status": status});
            if let Some(u) = &usage {
                response["usage"] = u.clone();
            }
            json!({"timestamp": start + i * gap_ms, "method": "POST", "path": "/v1/chat/completions",
                   "headers": headers,
                   "body": json!({"model": "gpt-4o", "messages": [{"role": "user", "content": format!("step {key} {i} {}", "x".repeat(396))}]}).to_string(),
                   "response": response})
            .to_string()
        })
        .collect()
}

fn write_traffic(d: &Dir, mut lines: Vec<String>) -> String {
    lines.sort_by_key(|l| serde_json::from_str::<Value>(l).unwrap()["timestamp"].as_u64());
    d.write("t.jsonl", &(lines.join("\n") + "\n"))
}

fn budget_config(d: &Dir, budget: Value) -> String {
    d.write(
        "cfg.json",
        &json!({"prices": {"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10}},
                "policies": [{"id": "agents", "spec": {"selector": {"pathPrefix": "/v1/"}, "budget": budget}}]})
        .to_string(),
    )
}

#[test]
fn recorded_usage_is_what_the_caps_count() {
    let d = Dir::new("budget-usage");
    let cfg = budget_config(
        &d,
        json!({"limits": [{"name": "tokens", "per": "caller", "window_seconds": 3600, "tokens": 5000}]}),
    );
    // 1000 + 200 tokens a call: the 5th call starts at 4800, the 6th at
    // 6000 is refused.
    let t = write_traffic(
        &d,
        calls(
            "sk-a",
            None,
            8,
            START,
            1000,
            200,
            Some(json!({"prompt_tokens": 1000, "completion_tokens": 200})),
        ),
    );
    let r = run_json(&["--config", &cfg, &t]);
    let cap = &r["runs"][0]["policies"][0]["budgets"]["caps"][0];
    assert_eq!(
        (cap["rejected"].as_u64(), cap["spent"].as_str()),
        (Some(3), Some("6000")),
        "{cap}"
    );
    assert_eq!(cap["first_rejected_ms"], START + 5000);
    assert_eq!(
        r["runs"][0]["policies"][0]["budgets"]["responses_estimated"],
        0
    );
    // Without usage, spending is estimated (about 4 bytes a token of the
    // request, and the output the call may have generated: no max_tokens,
    // 4096), counted and said in the header: two calls fill the cap.
    let t = write_traffic(&d, calls("sk-a", None, 8, START, 1000, 200, None));
    let r = run_json(&["--config", &cfg, &t]);
    let p = &r["runs"][0]["policies"][0];
    assert_eq!(p["budgets"]["responses_estimated"], 2);
    assert_eq!(p["budgets"]["caps"][0]["rejected"], 6);
    assert!(
        r["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .contains("policy agents: 2 responses had no usage recorded")),
        "{}",
        r["notes"]
    );
}

#[test]
fn calls_count_per_session_and_a_provider_failure_is_no_call() {
    let d = Dir::new("budget-calls");
    let cfg = budget_config(
        &d,
        json!({"limits": [{"name": "turns", "per": "session", "window_seconds": 600, "calls": 3}], "warn_at": 0}),
    );
    let mut lines = calls("sk-a", Some("s-1"), 5, START, 1000, 200, None);
    // Another session of the same caller has its own count; a provider's
    // 503s spend nothing; a request without a session is under no cap.
    lines.extend(calls(
        "sk-a",
        Some("s-2"),
        2,
        START + 10_000,
        1000,
        503,
        None,
    ));
    lines.extend(calls(
        "sk-a",
        Some("s-2"),
        3,
        START + 20_000,
        1000,
        200,
        None,
    ));
    lines.extend(calls("sk-a", None, 6, START + 30_000, 1000, 200, None));
    let t = write_traffic(&d, lines);
    let r = run_json(&["--config", &cfg, &t]);
    let cap = &r["runs"][0]["policies"][0]["budgets"]["caps"][0];
    assert_eq!(
        (
            cap["rejected"].as_u64(),
            cap["keys_at_cap"].as_u64(),
            cap["warned"].as_u64()
        ),
        (Some(2), Some(1), Some(0)),
        "{cap}"
    );
    assert_eq!(cap["spent"], "6");
}

#[test]
fn the_window_slides_on_the_recorded_clock() {
    let d = Dir::new("budget-window");
    let cfg = budget_config(
        &d,
        json!({"limits": [{"name": "minute", "per": "caller", "window_seconds": 60, "calls": 3}], "action": "reject"}),
    );
    // Three calls, a fourth refused; 70 s later the window has slid.
    let mut lines = calls("sk-a", None, 4, START, 1000, 200, None);
    lines.extend(calls("sk-a", None, 1, START + 70_000, 1000, 200, None));
    let t = write_traffic(&d, lines);
    let v = d.0.join("v.jsonl").display().to_string();
    let r = run_json(&["--config", &cfg, "--verdicts", &v, &t]);
    assert_eq!(
        r["runs"][0]["policies"][0]["budgets"]["caps"][0]["rejected"],
        1
    );
    let statuses: Vec<Value> = verdicts(&v).iter().map(|v| v["status"].clone()).collect();
    assert_eq!(
        statuses,
        [
            json!(null),
            json!(null),
            json!(null),
            json!(429),
            json!(null)
        ]
    );
    // With action warn, the cap only tells: the 4th call is at the cap
    // (from 0.8 of it, the 3rd started at 2 calls, under 2.4).
    let cfg = budget_config(
        &d,
        json!({"limits": [{"name": "minute", "per": "caller", "window_seconds": 60, "calls": 3}], "action": "warn"}),
    );
    let r = run_json(&["--config", &cfg, "--verdicts", &v, &t]);
    let cap = &r["runs"][0]["policies"][0]["budgets"]["caps"][0];
    assert_eq!(
        (
            cap["rejected"].as_u64(),
            cap["warned"].as_u64(),
            cap["action"].as_str()
        ),
        (Some(0), Some(1), Some("warn")),
        "{cap}"
    );
    assert_eq!(cap["spent"], "5");
    let v = verdicts(&v);
    assert_eq!(
        v[3]["budget"]["header"],
        "minute; spent=3; cap=3; unit=calls; window=60"
    );
    assert_eq!(v[3]["budget"]["warned"], json!(["minute"]));
}

#[test]
fn a_usage_only_recording_reads_as_the_providers_answer() {
    use crate::replay::budget::usage_body;
    use crate::replay::record::{usage_in_body, Usage};
    for u in [
        Usage {
            input: 26_000,
            output: 800,
            cached_input: 20_000,
            cache_write: 1_000,
            reasoning: 0,
            cost_microusd: None,
        },
        Usage {
            input: 1200,
            output: 300,
            cached_input: 0,
            cache_write: 0,
            reasoning: 120,
            cost_microusd: None,
        },
        // Counts that do not add up: OpenAI's form keeps the input.
        Usage {
            input: 10,
            output: 1,
            cached_input: 50,
            cache_write: 0,
            reasoning: 0,
            cost_microusd: None,
        },
        // A cost the upstream reported (OpenRouter's usage.cost).
        Usage {
            input: 100,
            output: 10,
            cached_input: 0,
            cache_write: 0,
            reasoning: 0,
            cost_microusd: Some(1_234_567),
        },
    ] {
        assert_eq!(usage_in_body(&usage_body(&u)), Some(u));
    }
}

#[test]
fn the_page_has_a_table_of_caps_and_the_sweep_a_column() {
    let (cfg, traffic) = example();
    let d = Dir::new("budget-html");
    let page = d.0.join("r.html").display().to_string();
    replay(&[
        "--config",
        &cfg,
        "--html",
        &page,
        "--set",
        "policies.agents.budget.limits.session-hour.usd=2,5",
        &traffic,
    ])
    .unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<th>Budget rejections</th>"));
    assert!(html.contains("<tr><td class=\"left\"><code>session-hour</code></td><td class=\"left\">$5.00 per session in 3,600 s (reject)</td><td>10</td><td>4</td><td>1</td><td>1</td><td class=\"left\">2026-11-24 09:10:00 UTC</td><td>$5.18</td></tr>"), "{html}");
}

/// One call of caller `key` at `at`, to `model`, answered 200 with
/// `usage` recorded.
fn call_to(key: &str, model: &str, at: u64, usage: Value) -> String {
    json!({"timestamp": at, "method": "POST", "path": "/v1/chat/completions",
           "headers": {"authorization": format!("Bearer {key}"), "content-type": "application/json"},
           "body": json!({"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": format!("hello {at}")}]}).to_string(),
           "response": {"status": 200, "usage": usage}})
    .to_string()
}

#[test]
fn unpriced_calls_are_counted_and_swept_by_budget_unpriced() {
    let d = Dir::new("budget-unpriced");
    let cfg = budget_config(
        &d,
        json!({"limits": [
            {"name": "usd", "per": "caller", "window_seconds": 3600, "usd": 100},
            {"name": "calls", "per": "caller", "window_seconds": 3600, "calls": 1000}]}),
    );
    // Three calls to a model no price names, one to a priced one.
    let usage = json!({"prompt_tokens": 100_000, "completion_tokens": 0});
    let mut lines: Vec<String> = (0..3)
        .map(|i| call_to("sk-a", "acme-large-2", START + i * 1000, usage.clone()))
        .collect();
    lines.push(call_to("sk-a", "gpt-4o", START + 5000, usage.clone()));
    let t = write_traffic(&d, lines);
    let r = run_json(&[
        "--config",
        &cfg,
        "--set",
        "budget.unpriced=max,reject,ignore",
        &t,
    ]);
    let budgets = |i: usize| r["runs"][i]["policies"][0]["budgets"].clone();
    let spent = |i: usize| budgets(i)["caps"][0]["spent"].as_str().unwrap().to_string();
    // max: charged the highest input price of all (no provider known);
    // gpt-4o's 100k input tokens at its configured $2.50 a million.
    let highest = loopguard_core::config::Prices::default().highest_for("acme-large-2");
    assert_eq!(highest.source.as_str(), "table_max");
    let max_cost = 3 * highest.rate.input / 10 + 250_000;
    assert_eq!(
        spent(0),
        loopguard_core::config::budget::show_usd(max_cost),
        "{}",
        budgets(0)
    );
    assert_eq!(
        (
            budgets(0)["unpriced"].as_str(),
            budgets(0)["calls_unpriced"].as_u64()
        ),
        (Some("max"), Some(3))
    );
    // reject: the three are refused before they go (403), not calls.
    assert_eq!(
        (
            budgets(1)["unpriced"].as_str(),
            budgets(1)["calls_unpriced"].as_u64()
        ),
        (Some("reject"), Some(3))
    );
    assert_eq!(spent(1), "0.25");
    assert_eq!(budgets(1)["caps"][1]["spent"], "1");
    assert_eq!(r["runs"][1]["policies"][0]["actions"]["reject"], 3);
    // ignore: no dollars, the calls still count.
    assert_eq!(spent(2), "0.25");
    assert_eq!(budgets(2)["caps"][1]["spent"], "4");
    assert_eq!(budgets(2)["calls_unpriced"], 3);
    // The text says it under the caps.
    let (_, text) = replay(&["--config", &cfg, &t]).unwrap();
    assert!(
        text.contains("    budget: 3 calls to a model no price names (unpriced: max: charged at the highest price of their provider)\n"),
        "{text}"
    );
    let (_, text) = replay(&["--config", &cfg, "--set", "budget.unpriced=reject", &t]).unwrap();
    assert!(
        text.contains(
            "    budget: 3 calls to a model no price names (unpriced: reject: refused)\n"
        ),
        "{text}"
    );
    // Another value is refused before anything is read.
    let err = replay(&["--config", &cfg, "--set", "budget.unpriced=free", &t]).unwrap_err();
    assert!(
        err.contains(
            "--set budget.unpriced=free: budget.unpriced is max, reject or ignore (got free)"
        ),
        "{err}"
    );
    // A configuration without a dollar cap has nothing to set.
    let calls_only = budget_config(
        &d,
        json!({"limits": [{"name": "calls", "per": "caller", "window_seconds": 3600, "calls": 9}]}),
    );
    let err = replay(&["--config", &calls_only, "--set", "budget.unpriced=max", &t]).unwrap_err();
    assert!(
        err.contains(
            "budget.unpriced applies to dollar caps, and no policy has a budget with a usd limit"
        ),
        "{err}"
    );
}

#[test]
fn reported_costs_and_tunnels_are_counted_per_policy() {
    let d = Dir::new("budget-reported");
    let cfg = budget_config(
        &d,
        json!({"limits": [{"name": "usd", "per": "caller", "window_seconds": 3600, "usd": 100}]}),
    );
    // OpenRouter's usage.cost wins over the price: $0.25 a call.
    let usage = json!({"prompt_tokens": 1_000_000, "completion_tokens": 0, "cost": 0.25});
    let mut lines: Vec<String> = (0..2)
        .map(|i| call_to("sk-a", "gpt-4o", START + i * 1000, usage.clone()))
        .collect();
    // A WebSocket upgrade: checked and charged as one call as it opens.
    lines.push(
        json!({"timestamp": START + 3000, "method": "GET", "path": "/v1/realtime",
               "headers": {"authorization": "Bearer sk-a", "connection": "Upgrade", "upgrade": "websocket"},
               "response": {"status": 101}})
        .to_string(),
    );
    let t = write_traffic(&d, lines);
    let r = run_json(&["--config", &cfg, &t]);
    let b = &r["runs"][0]["policies"][0]["budgets"];
    assert_eq!(b["caps"][0]["spent"], "0.50", "{b}");
    assert_eq!(
        (b["calls_reported_cost"].as_u64(), b["tunnels"].as_u64()),
        (Some(2), Some(1))
    );
    let (_, text) = replay(&["--config", &cfg, &t]).unwrap();
    assert!(
        text.contains("    budget: 2 calls priced at the cost the upstream reported\n"),
        "{text}"
    );
    assert!(
        text.contains("    budget: 1 tunnel opened, each charged as one call (what passed through is not read)\n"),
        "{text}"
    );
    let page = d.0.join("r.html").display().to_string();
    replay(&["--config", &cfg, "--html", &page, &t]).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<p class=\"muted\">2 calls priced at the cost the upstream reported.</p>"),
        "{html}"
    );
    assert!(html.contains("<p class=\"muted\">1 tunnel opened, each charged as one call (what passed through is not read).</p>"));
}
