//! The command line as operators type it: help, usage errors, exit codes.

use super::*;

fn run_args(args: &[&str]) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(args, &mut out, &mut err, false);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn redis_script_prints_the_script_and_its_sha1() {
    let (code, script, _) = run_args(&["redis-script"]);
    assert_eq!(code, 0);
    assert!(script.contains("return entry(KEYS, {unpack(ARGV, 2)})"));
    let (code, sha, _) = run_args(&["redis-script", "--sha1"]);
    assert_eq!(code, 0);
    let shipped = loopguard_core::state::redis::Script::shipped();
    assert_eq!(script, shipped.source);
    assert_eq!(sha.trim(), shipped.sha1);
    let (code, _, err) = run_args(&["redis-script", "--x"]);
    assert_eq!(code, 2);
    assert!(err.contains("unexpected argument '--x' found"), "{err}");
}

#[test]
fn every_subcommand_answers_help_with_its_options() {
    let cases: [(&str, &[&str]); 6] = [
        (
            "",
            &[
                "check",
                "explain",
                "replay",
                "schema",
                "redis-script",
                "--version",
            ],
        ),
        ("check", &["--strict", "<FILE>...", "Exits 1 on any error"]),
        (
            "explain",
            &[
                "--config <FILE>",
                "--request <FILE>",
                "--filter <NAME>",
                "--json",
            ],
        ),
        (
            "replay",
            &[
                "--config <FILE>",
                "--filter <NAME>",
                "--set <PATH=V1,V2,...>",
                "--json",
                "--html <FILE>",
                "--verdicts <FILE>",
                "--quiet",
                "--no-progress",
                "<TRAFFIC>...",
                "gzip",
            ],
        ),
        ("schema", &["JSON Schema"]),
        ("redis-script", &["--sha1", "EVALSHA"]),
    ];
    for (sub, names) in cases {
        let mut forms = vec![vec![sub, "--help"], vec![sub, "-h"], vec!["help", sub]];
        if sub.is_empty() {
            forms = vec![vec!["--help"], vec!["-h"], vec!["help"]];
        }
        for args in forms {
            let (code, out, err) = run_args(&args);
            assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
            let usage = if sub.is_empty() {
                "Usage: loopguard".to_string()
            } else {
                format!("Usage: loopguard {sub}")
            };
            assert!(out.contains(&usage), "{args:?}: {out}");
            // The summary (-h) names every option; the long help has the
            // descriptions too.
            let long = args != [sub, "-h"] && args != ["-h"];
            for name in names {
                if long || name.starts_with('-') || name.starts_with('<') {
                    assert!(out.contains(name), "{args:?} lacks {name}: {out}");
                }
            }
        }
    }
    let (code, out, _) = run_args(&["replay", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("--set replays once per value of one field (a sweep)"),
        "{out}"
    );
    assert!(out.contains("shows its progress on stderr when stderr is a terminal"));
}

#[test]
fn usage_errors_exit_2() {
    // No subcommand: the help, on stderr.
    let (code, out, err) = run_args(&[]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(err.contains("Usage: loopguard <COMMAND>"), "{err}");
    let (code, _, err) = run_args(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unrecognized subcommand 'frobnicate'"),
        "{err}"
    );
    let (code, _, err) = run_args(&["check"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the following required arguments were not provided:\n  <FILE>..."),
        "{err}"
    );
    let (code, _, err) = run_args(&["check", "--lenient", "x.yaml"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unexpected argument '--lenient' found"),
        "{err}"
    );
    let (code, _, err) = run_args(&["explain", "--config", "x"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the following required arguments were not provided:\n  --request <FILE>"),
        "{err}"
    );
    assert!(err.contains("Usage: loopguard explain"), "{err}");
    let (code, _, err) = run_args(&["explain", "--config"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("a value is required for '--config <FILE>' but none was supplied"),
        "{err}"
    );
    let (code, _, err) = run_args(&["replay", "t.jsonl"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the following required arguments were not provided:\n  --config <FILE>"),
        "{err}"
    );
    let (code, _, err) = run_args(&["replay", "--config", "c.json"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the following required arguments were not provided:\n  <TRAFFIC>..."),
        "{err}"
    );
    let (code, _, err) = run_args(&["replay", "--config", "c.json", "--bogus", "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("unexpected argument '--bogus' found"), "{err}");
    // A sweep varies one field: --set once, checked before any file is
    // read.
    let (code, _, err) = run_args(&[
        "replay", "--config", "c.json", "--set", "a.b=1,2", "--set", "a.c=3", "t.jsonl",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: one --set per replay (a sweep varies one field)\n"),
        "{err}"
    );
    assert!(
        err.contains("Usage: loopguard replay [OPTIONS] --config <FILE> <TRAFFIC>..."),
        "{err}"
    );
    let (code, _, err) = run_args(&[
        "replay", "--config", "c.json", "--set", "nothing", "t.jsonl",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: --set nothing: expected PATH=VALUE[,VALUE...]\n"),
        "{err}"
    );
    // What a command meets is said with its own words, exit 2 too.
    let (code, _, err) = run_args(&[
        "explain",
        "--config",
        "/nonexistent/c.json",
        "--request",
        "r",
    ]);
    assert_eq!(code, 2);
    assert!(err.starts_with("loopguard: /nonexistent/c.json"), "{err}");
}

#[test]
fn the_version() {
    let version = format!("loopguard {}\n", env!("CARGO_PKG_VERSION"));
    for args in [&["--version"][..], &["-V"], &["version"]] {
        assert_eq!(
            run_args(args),
            (0, version.clone(), String::new()),
            "{args:?}"
        );
    }
}

#[test]
fn check_exit_codes() {
    let dir = std::env::temp_dir().join(format!("loopguard-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.json");
    std::fs::write(&good, r#"{"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}}]}"#).unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"policies": [{"id": "p", "spec": {"selector": {}, "loop_detecton": {}}}]}"#,
    )
    .unwrap();
    let (code, out, _) = run_args(&["check", good.to_str().unwrap()]);
    assert_eq!(
        (code, out.trim_end()),
        (0, "1 configuration checked in 1 file: 0 errors, 0 warnings")
    );
    let (code, out, _) = run_args(&["check", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("bad.json: error: policy \"p\": loop_detecton is not a known field (did you mean \"loop_detection\"?)"), "{out}");
    let (code, out, _) = run_args(&[
        "check",
        "--strict",
        good.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(
        out.ends_with("2 configurations checked in 2 files: 1 error, 0 warnings\n"),
        "{out}"
    );
    let (code, out, _) = run_args(&["check", dir.join("missing.json").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("missing.json: cannot read"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
