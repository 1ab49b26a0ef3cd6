//! Tests of the HTML page: self-contained, escaped, one strip per loop, the sweep, odd shapes.

use super::chart::nice_max;
use super::format::{count, duration, utc, utc_ms};
use super::timeline::{MARK_W, STRIP_W};
use super::*;
use serde_json::json;

const DANGEROUS: &str = "<script>alert(\"x\")</script> & 'co'";

fn sample() -> Value {
    json!({
        "inputs": {
            "files": ["traffic.jsonl", "more <b>traffic</b>.json"],
            "read": 1234,
            "skipped": 5,
            "skipped_not_listed": 3,
            "skipped_entries": [
                {"place": "traffic.jsonl:17", "reason": "not JSON: <oops>"},
                {"place": "traffic.jsonl:18"}
            ],
            "first_ms": 1_764_000_000_000u64,
            "last_ms": 1_764_003_600_000u64
        },
        "notes": ["the configuration uses the Redis store: replay counts as one replica would"],
        "runs": [
            {
                "config": "examples/recommended/envoy.yaml",
                "setting": {"path": "policies.agents.loop_detection.threshold_identical_requests", "value": 3},
                "requests": 1234,
                "policies": [
                    {
                        "id": "agents", "requests": 1200, "loops_found": 2,
                        "callers_touched": 2, "requests_touched": 17,
                        "actions": {"reject": 5, "throttle": 0, "warn": 2, "nudge": 7, "directive": 3},
                        "tokens": {"touched": 45678, "estimated": true},
                        "loops": [
                            {
                                "caller": DANGEROUS, "model": "gpt-4o",
                                "kind": "fingerprint", "tier": "identical",
                                "first_ms": 1_764_000_100_000u64, "last_ms": 1_764_000_160_000u64,
                                "turns": 6, "actions": {"reject": 2, "warn": 1},
                                "tokens": 12345, "tokens_estimated": true,
                                "timeline": [
                                    {"at_ms": 1_764_000_100_000u64, "action": "allow"},
                                    {"at_ms": 1_764_000_110_000u64, "action": "allow"},
                                    {"at_ms": 1_764_000_120_000u64, "action": "warn"},
                                    {"at_ms": 1_764_000_130_000u64, "action": "nudge"},
                                    {"at_ms": 1_764_000_150_000u64, "action": "reject"},
                                    {"at_ms": 1_764_000_160_000u64, "action": "reject"}
                                ]
                            },
                            {
                                "caller": "source 10.0.0.7",
                                "model": null, "kind": "tool_loop",
                                "first_ms": 1_764_000_200_000u64, "last_ms": 1_764_000_200_000u64,
                                "turns": 1,
                                "timeline": [{"at_ms": 1_764_000_200_000u64, "action": "throttle"}]
                            }
                        ],
                        "loops_not_listed": 0
                    },
                    {"id": "quiet", "shadow": true, "callers_touched": 5000, "callers_touched_at_least": true}
                ]
            },
            {
                "config": "examples/recommended/envoy.yaml",
                "setting": {"path": "policies.agents.loop_detection.threshold_identical_requests", "value": 4},
                "requests": 1234,
                "policies": [
                    {
                        "id": "agents", "loops_found": 1, "requests_touched": 4,
                        "loops": [
                            {"caller": "header x-agent=a&b", "kind": "near",
                             "timeline": [
                                 {"at_ms": 1_764_000_300_000u64, "action": "directive"},
                                 {"at_ms": 1_764_000_301_000u64, "action": "mystery"},
                                 {"at_ms": 1_764_000_302_000u64}
                             ]}
                        ],
                        "loops_not_listed": 3
                    }
                ]
            }
        ],
        "sweep": {
            "path": "policies.agents.loop_detection.threshold_identical_requests",
            "rows": [
                {"value": 3, "loops_found": 9, "requests_touched": 40, "callers_touched": 5},
                {"value": 4, "loops_found": 4, "requests_touched": 17, "callers_touched": 2},
                {"value": 5, "loops_found": 1, "requests_touched": null}
            ]
        }
    })
}

/// The callers and timeline lengths of every loop, in page order.
fn loops_of(report: &Value) -> Vec<(String, usize)> {
    let mut loops = Vec::new();
    for run in report["runs"].as_array().unwrap() {
        for policy in run["policies"].as_array().unwrap() {
            for lp in policy["loops"].as_array().into_iter().flatten() {
                loops.push((
                    lp["caller"].as_str().unwrap().to_string(),
                    lp["timeline"].as_array().unwrap().len(),
                ));
            }
        }
    }
    loops
}

fn assert_self_contained(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.contains("<meta charset=\"utf-8\">"));
    assert!(html.contains("<title>"));
    assert_eq!(html.matches("<style>").count(), 1);
    let lower = html.to_lowercase();
    for banned in [
        "<script",
        "<link",
        "@import",
        "url(",
        "href=\"http",
        "src=\"http",
        "src=",
    ] {
        assert!(!lower.contains(banned), "page contains {banned:?}");
    }
    for tag in ["html", "svg", "table", "details", "section", "div", "ul"] {
        assert_eq!(
            html.matches(&format!("<{tag}")).count(),
            html.matches(&format!("</{tag}>")).count(),
            "unbalanced <{tag}>"
        );
    }
    assert!(html.trim_end().ends_with("</html>"));
}

#[test]
fn renders_a_self_contained_page() {
    let report = sample();
    let html = render(&report);
    assert_self_contained(&html);
    assert!(html.contains("<title>loopguard replay: traffic.jsonl and 1 more</title>"));
}

#[test]
fn escapes_strings_from_the_report() {
    let html = render(&sample());
    assert!(!html.contains(DANGEROUS));
    assert!(!html.contains("<script>"));
    assert!(html.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;co&#39;"));
    assert!(html.contains("more &lt;b&gt;traffic&lt;/b&gt;.json"));
    assert!(!html.contains("<b>"));
    assert!(html.contains("not JSON: &lt;oops&gt;"));
    assert!(html.contains("header x-agent=a&amp;b"));
    assert!(!html.contains("x-agent=a&b"));
    // An unknown action gets the fixed "other" class, never its own name.
    assert!(html.contains("mark mark-other"));
    assert!(!html.contains("mark-mystery"));
}

#[test]
fn one_timeline_per_loop_with_one_mark_per_entry() {
    let report = sample();
    let html = render(&report);
    let loops = loops_of(&report);
    assert_eq!(loops.len(), 3);
    // One SVG per loop, plus the sweep's chart.
    assert_eq!(html.matches("<svg").count(), loops.len() + 1);
    let timelines: Vec<&str> = html
        .split("<svg")
        .skip(1)
        .filter(|s| s.starts_with(" class=\"timeline\""))
        .map(|s| s.split("</svg>").next().unwrap())
        .collect();
    assert_eq!(timelines.len(), loops.len());
    for ((caller, len), svg) in loops.iter().zip(&timelines) {
        assert!(html.contains(&esc(caller)), "caller {caller} missing");
        assert_eq!(svg.matches("class=\"mark ").count(), *len, "{caller}");
    }
    // The legend is not drawn with marks.
    assert_eq!(html.matches("class=\"mark ").count(), 6 + 1 + 3);
    assert!(html.contains("class=\"mark mark-reject\""));
    assert!(html.contains("class=\"mark mark-throttle\""));
    assert!(html.contains("class=\"legend\""));
    // A loop of one instant still has its mark, in the strip's middle.
    let single = timelines[1];
    assert!(single.contains(&format!("x=\"{:.1}\"", STRIP_W / 2.0 - MARK_W / 2.0)));
}

#[test]
fn shows_the_header_tables_and_loop_facts() {
    let html = render(&sample());
    assert!(html.contains("2025-11-24 16:00:00 UTC to 2025-11-24 17:00:00 UTC (1 h 0 min)"));
    assert!(html.contains("<dd>1,234</dd>"));
    assert!(html.contains("<details>"));
    assert!(html.contains("2 skipped entries listed (of 5)"));
    assert!(html.contains("Shadow mode"));
    assert!(html.contains("<td>at least 5,000</td>"));
    assert!(html.contains("traffic.jsonl:17"));
    assert!(html.contains("Redis store"));
    assert!(html.contains("45,678 (estimate)"));
    assert!(html.contains("12,345 tokens (estimate)"));
    assert!(html.contains("model <code>gpt-4o</code>"));
    assert!(html.contains("kind fingerprint (tier identical)"));
    assert!(html.contains("6 turns"));
    assert!(html.contains("no model"));
    assert!(html.contains("3 more loops not listed"));
    assert!(html.contains("No loops found."));
    assert!(html.contains("<code>policies.agents.loop_detection.threshold_identical_requests</code> set to <code>4</code>"));
    assert!(html.contains("(no action)</title>"));
}

#[test]
fn draws_the_sweep() {
    let html = render(&sample());
    let chart = html
        .split("<svg class=\"chart\"")
        .nth(1)
        .and_then(|s| s.split("</svg>").next())
        .unwrap();
    // Both series, a point and a value label per known value.
    assert_eq!(chart.matches("class=\"pt pt-loops\"").count(), 3);
    assert_eq!(chart.matches("class=\"pt pt-touched\"").count(), 2);
    assert!(chart.contains("class=\"line-loops\""));
    assert!(chart.contains("class=\"line-touched\""));
    assert!(chart.contains(">loops found<"));
    assert!(chart.contains(">requests touched<"));
    assert!(chart.contains(">40</text>"));
    assert!(chart.contains(">9</text>"));
    assert!(chart.contains("threshold_identical_requests</text>"));
    // And the rows as a table after it.
    let after = html.split("<svg class=\"chart\"").nth(1).unwrap();
    assert!(after.contains("<th class=\"left\">Value</th>"));
    assert_eq!(after.matches("<tr><td class=\"left\"><code>").count(), 3);
}

#[test]
fn an_empty_report_says_so() {
    for report in [
        json!({}),
        Value::Null,
        json!([]),
        json!({"runs": [], "sweep": null}),
    ] {
        let html = render(&report);
        assert_self_contained(&html);
        assert!(html.contains("Nothing to show"), "{html}");
        assert!(!html.contains("<svg"));
    }
}

#[test]
fn odd_shapes_do_not_panic() {
    let odd = json!({
        "inputs": {"files": "not a list", "read": -3, "first_ms": "soon", "skipped_entries": [7, null]},
        "notes": [null, 3, {"a": "<b>"}],
        "runs": [null, 5, {"policies": [null, {"actions": [], "loops": [null, {"timeline": [null, {"at_ms": 1.5}]}]}]}],
        "sweep": {"rows": [{"value": "a"}, {"value": {"x": 1}, "loops_found": 2}, 7]}
    });
    let html = render(&odd);
    assert_self_contained(&html);
    assert!(html.contains("{&quot;a&quot;:&quot;&lt;b&gt;&quot;}"));
    assert!(html.contains("1 timeline entry without a time, not drawn."));
    let sweep_only = json!({"sweep": {"path": "p", "rows": [{"value": 2, "loops_found": 0, "requests_touched": 0}]}});
    let html = render(&sweep_only);
    assert_self_contained(&html);
    assert!(html.contains("the report has no runs"));
    assert_eq!(html.matches("<svg").count(), 1);
}

#[test]
fn formats_times_and_counts() {
    assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(utc(1_764_000_000_000), "2025-11-24 16:00:00 UTC");
    assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    assert_eq!(utc_ms(1_764_000_000_123), "2025-11-24 16:00:00.123 UTC");
    assert_eq!(duration(850), "850 ms");
    assert_eq!(duration(12_500), "12.5 s");
    assert_eq!(duration(185_000), "3 min 5 s");
    assert_eq!(count(0), "0");
    assert_eq!(count(999), "999");
    assert_eq!(count(1_000), "1,000");
    assert_eq!(count(45_678), "45,678");
    assert_eq!(count(1_234_567), "1,234,567");
    assert_eq!(nice_max(0), 2);
    assert_eq!(nice_max(3), 4);
    assert_eq!(nice_max(9), 10);
    assert_eq!(nice_max(40), 40);
    assert_eq!(nice_max(41), 60);
    assert_eq!(nice_max(1_234), 2_000);
    assert!(nice_max(u64::MAX) >= u64::MAX - 1);
    assert_eq!(esc("a\u{0}b"), "a\u{FFFD}b");
}
