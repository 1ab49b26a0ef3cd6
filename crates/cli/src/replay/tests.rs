//! `loopguard replay` through its command line, on traffic written here.

use super::*;
use serde_json::json;
use std::path::PathBuf;

pub(super) struct Dir(pub(super) PathBuf);

impl Dir {
    pub(super) fn new(name: &str) -> Dir {
        let d =
            std::env::temp_dir().join(format!("loopguard-replay-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    pub(super) fn write(&self, name: &str, text: &str) -> String {
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

/// `loopguard replay ARGS`: its exit code and report, or what it said on
/// stderr when it stopped.
pub(super) fn replay(args: &[&str]) -> Result<(i32, String), String> {
    let args: Vec<&str> = std::iter::once("replay")
        .chain(args.iter().copied())
        .collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = crate::run(&args, &mut out, &mut err, false);
    let err = String::from_utf8(err).unwrap();
    if code != 0 {
        return Err(err);
    }
    assert!(!err.contains('\r'), "no progress off a terminal: {err:?}");
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
        .contains("error: the following required arguments were not provided:\n  --config <FILE>"));
    assert!(replay(&["--config", &cfg])
        .unwrap_err()
        .contains("error: the following required arguments were not provided:\n  <TRAFFIC>..."));
    assert!(replay(&["--config", &cfg, "--bogus", "x"])
        .unwrap_err()
        .contains("error: unexpected argument '--bogus' found"));
    assert!(
        replay(&["--config", &cfg, "--set", "a=1", "--set", "b=2", "x"])
            .unwrap_err()
            .contains("error: one --set per replay (a sweep varies one field)")
    );
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

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// The shipped sample traffic and the recommended setup.
fn sample() -> (String, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cfg = root.join("examples/recommended/envoy.yaml");
    let traffic = std::fs::read_to_string(root.join("examples/replay/traffic.jsonl")).unwrap();
    (cfg.display().to_string(), traffic)
}

/// The sample as a HAR file: each line an entry.
fn as_har(jsonl: &str) -> String {
    let entries: Vec<Value> = jsonl
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let headers: Vec<Value> = v["headers"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| json!({"name": k, "value": v}))
                .collect();
            json!({"startedDateTime": v["timestamp"],
                   "request": {"method": v["method"], "url": format!("http://gateway{}", v["path"].as_str().unwrap()),
                               "headers": headers, "postData": {"mimeType": "application/json", "text": v["body"]}},
                   "response": {"status": v["response"]["status"],
                                "content": {"text": json!({"usage": v["response"]["usage"]}).to_string()}}})
        })
        .collect();
    json!({"log": {"version": "1.2", "creator": {"name": "t", "version": "1"}, "entries": entries}})
        .to_string()
}

#[test]
fn gzip_inputs_give_the_plain_files_report() {
    let d = Dir::new("gzip");
    let (cfg, text) = sample();
    let har = as_har(&text);
    for (name, content) in [("traffic.jsonl", &text), ("traffic.har", &har)] {
        let plain = d.write(name, content);
        let gz = d.0.join(format!("{name}.gz"));
        std::fs::write(&gz, gzip(content.as_bytes())).unwrap();
        let gz = gz.display().to_string();
        for json in [false, true] {
            let args = |t: &str| {
                let mut a = vec!["--config", cfg.as_str(), t];
                if json {
                    a.insert(0, "--json");
                }
                a.into_iter().map(String::from).collect::<Vec<_>>()
            };
            let run = |t: &str| {
                let a = args(t);
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                replay(&a).unwrap().1
            };
            let (want, got) = (run(&plain), run(&gz));
            assert_eq!(got.replace(&gz, &plain), want, "{name}");
            if json {
                let r: Value = serde_json::from_str(&want).unwrap();
                assert_eq!(r["inputs"]["read"], 52, "{name}");
                assert_eq!(r["inputs"]["skipped"], 0, "{name}");
                assert_eq!(r["runs"][0]["policies"][0]["loops_found"], 3, "{name}");
            }
        }
    }
}

#[test]
fn a_corrupt_gzip_file_is_reported_as_skipped_and_the_rest_replayed() {
    let d = Dir::new("corrupt");
    let cfg = d.write("cfg.json", EXACT);
    let text = lines("sk", "{}", 400, 1_795_000_000_000, 1000).join("\n") + "\n";
    let gz = gzip(text.as_bytes());
    let cut = d.0.join("cut.jsonl.gz");
    std::fs::write(&cut, &gz[..gz.len() * 2 / 3]).unwrap();
    let good = d.0.join("good.jsonl.gz");
    std::fs::write(
        &good,
        gzip(
            lines("sk2", "{}", 3, 1_795_000_000_000, 1000)
                .join("\n")
                .as_bytes(),
        ),
    )
    .unwrap();
    let (code, out) = replay(&[
        "--config",
        &cfg,
        "--json",
        &cut.display().to_string(),
        &good.display().to_string(),
    ])
    .unwrap();
    assert_eq!(code, 0);
    let r: Value = serde_json::from_str(&out).unwrap();
    let read = r["inputs"]["read"].as_u64().unwrap();
    assert!(read > 3 && read < 403, "{read}");
    assert_eq!(r["inputs"]["skipped"], 1);
    let s = &r["inputs"]["skipped_entries"][0];
    let place = s["place"].as_str().unwrap();
    assert_eq!(place, format!("{}:{}", cut.display(), read - 3 + 1), "{s}");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .starts_with("cannot read: gzip: "),
        "{s}"
    );
}

#[test]
fn a_directory_input_reads_its_gz_files() {
    let d = Dir::new("dir");
    let cfg = d.write("cfg.json", EXACT);
    let t = d.0.join("traffic");
    std::fs::create_dir_all(&t).unwrap();
    // One caller's five identical requests, spread over every kind of file.
    let all = lines("sk", "{\"q\":1}", 5, 1_795_000_000_000, 1000);
    std::fs::write(t.join("a.jsonl.gz"), gzip(all[0..2].join("\n").as_bytes())).unwrap();
    std::fs::write(t.join("b.jsonl"), all[2].clone()).unwrap();
    std::fs::write(t.join("c.har.gz"), gzip(as_har(&all[3]).as_bytes())).unwrap();
    let v: Value = serde_json::from_str(&all[4]).unwrap();
    let trace = json!({"http_buffered_trace": {"request": {
        "headers": [{"key": ":method", "value": "POST"}, {"key": ":path", "value": v["path"]},
                    {"key": ":authority", "value": "gateway"}, {"key": "authorization", "value": v["headers"]["authorization"]}],
        "body": {"as_bytes": "eyJxIjoxfQ=="},
        "headers_received_time": "2026-11-18T11:06:44.000Z"}}});
    let ms = crate::replay::input::time::rfc3339("2026-11-18T11:06:44.000Z").unwrap();
    assert_eq!(ms, 1_795_000_004_000, "the trace is the fifth request");
    std::fs::write(
        t.join("d_trace.json.gz"),
        gzip(trace.to_string().as_bytes()),
    )
    .unwrap();
    std::fs::write(t.join("notes.txt.gz"), gzip(b"not traffic")).unwrap();
    let (_, out) = replay(&["--config", &cfg, "--json", &t.display().to_string()]).unwrap();
    let r: Value = serde_json::from_str(&out).unwrap();
    let files: Vec<&str> = r["inputs"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            "a.jsonl.gz",
            "b.jsonl",
            "c.har.gz",
            "d_trace.json.gz",
            "notes.txt.gz"
        ]
    );
    assert_eq!(r["inputs"]["read"], 5, "{r}");
    assert_eq!(r["inputs"]["skipped"], 1);
    assert!(r["inputs"]["skipped_entries"][0]["reason"]
        .as_str()
        .unwrap()
        .starts_with("not a traffic file replay knows"));
    let p = &r["runs"][0]["policies"][0];
    assert_eq!(
        (p["loops_found"].as_u64(), p["actions"]["reject"].as_u64()),
        (Some(1), Some(3)),
        "{p}"
    );
}
