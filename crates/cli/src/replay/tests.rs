//! `loopguard replay` through its command line, on traffic written here.

use super::*;
use serde_json::json;
use std::path::PathBuf;

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d =
            std::env::temp_dir().join(format!("loopguard-replay-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn write(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn replay(args: &[&str]) -> Result<(i32, String), String> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = command(&args, &mut out, &mut err)?;
    Ok((code, String::from_utf8(out).unwrap()))
}

const EXACT: &str = r#"{"policies": [{"id": "agents", "spec": {
  "selector": {"pathPrefix": "/v1/"},
  "limit_keys": ["header:authorization"],
  "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3,
                     "similarity": "exact", "action": "reject"}}}]}"#;

/// `n` identical requests from `key`, `gap_ms` apart from `start`.
fn lines(key: &str, body: &str, n: usize, start: u64, gap_ms: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            json!({"timestamp": start + i as u64 * gap_ms, "method": "POST", "path": "/v1/chat/completions",
                   "headers": {"authorization": format!("Bearer {key}")}, "body": body,
                   "response": {"status": 200, "usage": {"prompt_tokens": 100, "completion_tokens": 10}}})
            .to_string()
        })
        .collect()
}

#[test]
fn a_loop_is_found_and_rejected_from_its_threshold() {
    let d = Dir::new("loop");
    let cfg = d.write("cfg.json", EXACT);
    let mut traffic = lines("sk-loop", "{\"q\":1}", 5, 1_795_000_000_000, 1000);
    traffic.extend(lines("sk-fine", "{\"q\":2}", 2, 1_795_000_000_500, 1000));
    traffic.sort_by_key(|l| serde_json::from_str::<Value>(l).unwrap()["timestamp"].as_u64());
    traffic.push("{\"path\": \"/v1/x\"}".to_string());
    let t = d.write("t.jsonl", &(traffic.join("\n") + "\n"));
    let verdicts = d.0.join("v.jsonl").display().to_string();
    let (code, out) = replay(&["--config", &cfg, "--json", "--verdicts", &verdicts, &t]).unwrap();
    assert_eq!(code, 0);
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["inputs"]["read"], 7);
    assert_eq!(r["inputs"]["skipped"], 1);
    assert_eq!(
        r["inputs"]["skipped_entries"][0]["reason"],
        "timestamp is required"
    );
    let p = &r["runs"][0]["policies"][0];
    assert_eq!(p["id"], "agents");
    assert_eq!(p["requests"], 7);
    assert_eq!(p["loops_found"], 1);
    assert_eq!(p["requests_touched"], 3);
    assert_eq!(p["actions"]["reject"], 3);
    assert_eq!(p["actions"]["allow"], 4);
    assert_eq!(p["callers_touched"], 1);
    assert_eq!(p["tokens"], json!({"touched": 330, "estimated": false}));
    let l = &p["loops"][0];
    assert!(
        l["caller"]
            .as_str()
            .unwrap()
            .starts_with("header:authorization=<redacted"),
        "{l}"
    );
    assert!(!l["caller"].as_str().unwrap().contains("sk-loop"));
    assert_eq!(
        (l["turns"].as_u64(), l["kind"].as_str()),
        (Some(3), Some("fingerprint"))
    );
    assert_eq!(l["first_ms"], 1_795_000_002_000u64);
    assert_eq!(l["last_ms"], 1_795_000_004_000u64);
    let v: Vec<Value> = std::fs::read_to_string(&verdicts)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let actions: Vec<&str> = v.iter().map(|v| v["action"].as_str().unwrap()).collect();
    // In time order: loop at 0, 1000, 2000..; the other caller at 500, 1500.
    assert_eq!(
        actions,
        ["allow", "allow", "allow", "allow", "reject", "reject", "reject"]
    );
    assert_eq!(v[4]["status"], 429);
    assert!(
        v[4]["place"].as_str().unwrap().ends_with("t.jsonl:5"),
        "{}",
        v[4]
    );
    assert!(r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| !n.as_str().unwrap().contains("earlier than")));
}

#[test]
fn a_window_expires_on_the_recorded_clock() {
    let d = Dir::new("window");
    let cfg = d.write(
        "cfg.json",
        &EXACT.replace("\"window_seconds\": 60", "\"window_seconds\": 2"),
    );
    // Repeats 1.5 s apart never reach 3 in a 2 s window.
    let t = d.write(
        "t.jsonl",
        &(lines("sk", "{}", 6, 1_795_000_000_000, 1500).join("\n") + "\n"),
    );
    let (_, out) = replay(&["--config", &cfg, "--json", &t]).unwrap();
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["runs"][0]["policies"][0]["loops_found"], 0);
    let t = d.write(
        "t2.jsonl",
        &(lines("sk", "{}", 6, 1_795_000_000_000, 500).join("\n") + "\n"),
    );
    let (_, out) = replay(&["--config", &cfg, "--json", &t]).unwrap();
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["runs"][0]["policies"][0]["actions"]["reject"], 4);
}

#[test]
fn a_sweep_gives_one_row_per_value() {
    let d = Dir::new("sweep");
    let cfg = d.write("cfg.json", EXACT);
    let t = d.write(
        "t.jsonl",
        &(lines("sk", "{}", 5, 1_795_000_000_000, 1000).join("\n") + "\n"),
    );
    let (_, out) = replay(&[
        "--config",
        &cfg,
        "--json",
        "--set",
        "policies.agents.loop_detection.threshold_identical_requests=2,3,5,6",
        &t,
    ])
    .unwrap();
    let r: Value = serde_json::from_str(&out).unwrap();
    let rows: Vec<(i64, u64)> = r["sweep"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["value"].as_i64().unwrap(),
                row["requests_touched"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, [(2, 4), (3, 3), (5, 1), (6, 0)]);
    assert_eq!(r["runs"].as_array().unwrap().len(), 4);
    let (_, text) = replay(&[
        "--config",
        &cfg,
        "--set",
        "policies.agents.loop_detection.threshold_identical_requests=2,3",
        &t,
    ])
    .unwrap();
    assert!(
        text.contains("sweep of policies.agents.loop_detection.threshold_identical_requests"),
        "{text}"
    );
    let err = replay(&[
        "--config",
        &cfg,
        "--set",
        "policies.agents.loop_detection.threshold_identical_requests=0.5",
        &t,
    ])
    .unwrap_err();
    assert!(err.contains("threshold_identical_requests=0.5"), "{err}");
    let err = replay(&[
        "--config",
        &cfg,
        "--set",
        "policies.agents.loop_detection.treshold=3",
        &t,
    ])
    .unwrap_err();
    assert!(err.contains("treshold is not a known field"), "{err}");
}

#[test]
fn tokens_are_estimated_without_usage_and_said_so() {
    let d = Dir::new("tokens");
    let cfg = d.write("cfg.json", EXACT);
    let body = "x".repeat(400);
    let t: Vec<String> = (0..4)
        .map(|i| json!({"timestamp": 1_795_000_000_000u64 + i * 10, "path": "/v1/a", "headers": {"authorization": "k"}, "body": body}).to_string())
        .collect();
    let t = d.write("t.jsonl", &(t.join("\n") + "\n"));
    let (_, out) = replay(&["--config", &cfg, "--json", &t]).unwrap();
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        r["runs"][0]["policies"][0]["tokens"],
        json!({"touched": 200, "estimated": true})
    );
    assert!(r["notes"].as_array().unwrap().iter().any(|n| n
        .as_str()
        .unwrap()
        .starts_with("4 of 4 requests have no recorded response status")));
    let (_, text) = replay(&["--config", &cfg, &t]).unwrap();
    assert!(
        text.contains("tokens in touched requests: 200 (estimated"),
        "{text}"
    );
}

#[test]
fn usage_errors() {
    let d = Dir::new("errors");
    let cfg = d.write("cfg.json", EXACT);
    assert!(replay(&["t.jsonl"])
        .unwrap_err()
        .contains("--config FILE is required"));
    assert!(replay(&["--config", &cfg])
        .unwrap_err()
        .contains("at least one traffic file"));
    assert!(replay(&["--config", &cfg, "--bogus", "x"])
        .unwrap_err()
        .contains("unknown option --bogus"));
    assert!(replay(&["--config", &cfg, "/nonexistent/t.jsonl"])
        .unwrap_err()
        .contains("no such file or directory"));
    let bad = d.write(
        "bad.json",
        r#"{"policies": [{"id": "p", "spec": {"selector": {}, "loop_detecton": {}}}]}"#,
    );
    let t = d.write("t.jsonl", "");
    assert!(replay(&["--config", &bad, &t])
        .unwrap_err()
        .contains("loop_detecton"));
}

#[test]
fn html_and_json_describe_the_same_loops() {
    let d = Dir::new("html");
    let cfg = d.write("cfg.json", EXACT);
    let mut traffic = lines("sk-a", "{\"q\":1}", 4, 1_795_000_000_000, 1000);
    traffic.extend(lines("sk-b", "{\"q\":2}", 4, 1_795_000_000_500, 1000));
    traffic.sort_by_key(|l| serde_json::from_str::<Value>(l).unwrap()["timestamp"].as_u64());
    let t = d.write("t.jsonl", &(traffic.join("\n") + "\n"));
    let page = d.0.join("r.html").display().to_string();
    let (_, out) = replay(&[
        "--config",
        &cfg,
        "--json",
        "--html",
        &page,
        "--set",
        "policies.agents.loop_detection.threshold_identical_requests=2,3",
        &t,
    ])
    .unwrap();
    let r: Value = serde_json::from_str(&out).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(!html.contains("<script src") && !html.contains("href=\"http"));
    for run in r["runs"].as_array().unwrap() {
        for l in run["policies"][0]["loops"].as_array().unwrap() {
            let caller = l["caller"]
                .as_str()
                .unwrap()
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            assert!(html.contains(&caller), "{caller}");
        }
    }
    // One strip per loop of each run, and the sweep's chart.
    let loops: usize = r["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["policies"][0]["loops"].as_array().unwrap().len())
        .sum();
    assert_eq!(loops, 4);
    assert_eq!(html.matches("<svg").count(), loops + 1);
}

#[test]
fn what_a_reader_notes_about_entries_is_in_the_header_once() {
    let d = Dir::new("notes");
    let cfg = d.write("cfg.json", EXACT);
    std::fs::create_dir_all(d.0.join("traces")).unwrap();
    for i in 0..3 {
        let trace = json!({"http_buffered_trace": {"request": {
            "headers": [{"key": ":method", "value": "POST"}, {"key": ":path", "value": "/v1/chat/completions"},
                        {"key": ":authority", "value": "api"}, {"key": "authorization", "value": "k"}],
            "body": {"as_string": "{\"q\":1}"},
            "headers_received_time": format!("2026-11-25T18:00:0{i}.000Z")}}});
        d.write(&format!("traces/trace_{i}.json"), &trace.to_string());
    }
    let dir = d.0.join("traces").display().to_string();
    let (_, out) = replay(&["--config", &cfg, "--json", &dir]).unwrap();
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            r["inputs"]["read"].as_u64(),
            r["inputs"]["skipped"].as_u64()
        ),
        (Some(3), Some(0)),
        "{r}"
    );
    let notes: Vec<&str> = r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(
        notes
            .iter()
            .filter(|n| n.contains("JSON_BODY_AS_STRING"))
            .count(),
        1,
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("3 requests: the body was read from as_string")),
        "{notes:?}"
    );
    assert_eq!(r["runs"][0]["policies"][0]["actions"]["reject"], 1);
}
