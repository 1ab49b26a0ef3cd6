//! `loopguard`, the operators' command line: check configurations before
//! they reach the proxies, see how the filter fingerprints a request, and
//! replay recorded traffic through any configuration.
//! Every verdict comes from the filter's own code: `loopguard_core::config`
//! validates, `loopguard_core::request::policy` selects and
//! `loopguard_core::detect::fingerprint` digests.

mod check;
mod discover;
mod documents;
mod explain;
mod replay;
mod request_file;

use loopguard_core::config::Config;
use std::io::Write;
use std::path::Path;

pub const USAGE: &str = "\
loopguard: check loopguard configurations, explain fingerprints, replay traffic

usage:
  loopguard check [--strict] FILE...
      Validate every loopguard configuration in the files (a policy JSON, an
      Envoy bootstrap or xDS resource with the loopguard Wasm filter, an ECDS
      discovery response, an Istio WasmPlugin, an Envoy Gateway
      EnvoyExtensionPolicy; YAML files may hold several documents) and warn
      about setups that silently do less than intended. Files given together
      are checked together (a WasmPlugin with its EnvoyFilter and
      VirtualService). Exits 1 on any error (with --strict, on any warning).
  loopguard explain --config FILE [--filter NAME] --request FILE [--json]
      Show which policy applies to the request, the fingerprint's
      components in order and the digest the filter computes. The request is
      raw HTTP/1.1 (request line, headers, blank line, body) or JSON/YAML:
      {method, path, headers, body | body_json, route, route_policy,
      source_address, verified_claims}. --filter picks one configuration when
      the file holds several (a filter, WasmPlugin or policy name).
  loopguard replay --config FILE [--config FILE...] [--filter NAME]
                   [--set PATH=V1,V2,...] [--json] [--html FILE]
                   [--verdicts FILE] TRAFFIC...
      Run recorded traffic (JSON Lines, HAR 1.2, Envoy tap traces, or
      directories of them) through each configuration with the filter's own
      engine on the recorded clock, and report per policy the loops found,
      what each action would have done and to how many requests and
      callers, and the tokens those requests carried. --set replays once
      per value of one field (a sweep); --verdicts writes what the filter
      did to each request, one JSON line each; --html writes a
      self-contained page with a timeline per looping caller.
  loopguard schema
      Print the JSON Schema of the configuration (schema/loopguard.schema.json).
  loopguard redis-script [--sha1]
      Print the Lua library in the script form a Redis Cluster store runs
      (store.topology cluster: EVALSHA, then EVAL on NOSCRIPT), or only its
      SHA1, e.g. to SCRIPT LOAD it on every node ahead of traffic.
  loopguard --version
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = run(&args, &mut std::io::stdout(), &mut std::io::stderr());
    std::process::exit(code);
}

/// Run the CLI with `args` (without the program name); the process exit
/// code. Output goes to `out`, diagnostics to `err`.
fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let result = match args.first().map(String::as_str) {
        Some("check") => cmd_check(args.get(1..).unwrap_or(&[]), out),
        Some("explain") => cmd_explain(args.get(1..).unwrap_or(&[]), out),
        Some("replay") => replay::command(args.get(1..).unwrap_or(&[]), out, err),
        Some("schema") => {
            let schema = loopguard_core::config::schema();
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            );
            Ok(0)
        }
        Some("redis-script") => {
            let script = loopguard_core::state::redis::Script::shipped();
            match args.get(1..).unwrap_or(&[]) {
                [] => {
                    let _ = write!(out, "{}", script.source);
                    Ok(0)
                }
                [flag] if flag == "--sha1" => {
                    let _ = writeln!(out, "{}", script.sha1);
                    Ok(0)
                }
                _ => Err("redis-script: the only option is --sha1".to_string()),
            }
        }
        Some("--version") | Some("version") => {
            let _ = writeln!(out, "loopguard {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        Some("-h") | Some("--help") | Some("help") => {
            let _ = write!(out, "{USAGE}");
            Ok(0)
        }
        _ => Err(format!("expected a command\n\n{USAGE}")),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            let _ = writeln!(err, "loopguard: {message}");
            2
        }
    }
}

fn cmd_check(args: &[String], out: &mut dyn Write) -> Result<i32, String> {
    let mut strict = false;
    let mut files = Vec::new();
    for a in args {
        match a.as_str() {
            "--strict" => strict = true,
            flag if flag.starts_with('-') => return Err(format!("check: unknown option {flag}")),
            file => files.push(file),
        }
    }
    if files.is_empty() {
        return Err("check: give at least one file".to_string());
    }
    let mut docs = Vec::new();
    let mut failed = false;
    for f in &files {
        match documents::read(Path::new(f)) {
            Ok(d) => docs.extend(d),
            Err(e) => {
                let _ = writeln!(out, "{e}");
                failed = true;
            }
        }
    }
    let findings = check::check(&docs);
    for f in &findings {
        let _ = writeln!(out, "{f}");
    }
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    let errors = count(check::Severity::Error) + usize::from(failed);
    let warnings = count(check::Severity::Warning);
    let configs = discover::find(&docs).len();
    let _ = writeln!(
        out,
        "{} configuration{} checked in {} file{}: {errors} error{}, {warnings} warning{}",
        configs,
        plural(configs),
        files.len(),
        plural(files.len()),
        plural(errors),
        plural(warnings)
    );
    Ok(if errors > 0 || (strict && warnings > 0) {
        1
    } else {
        0
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn cmd_explain(args: &[String], out: &mut dyn Write) -> Result<i32, String> {
    let (mut config, mut request, mut filter, mut as_json) = (None, None, None, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" => config = it.next(),
            "--request" => request = it.next(),
            "--filter" => filter = it.next(),
            "--json" => as_json = true,
            other => return Err(format!("explain: unexpected argument {other}")),
        }
    }
    let config = config.ok_or("explain: --config FILE is required")?;
    let request = request.ok_or("explain: --request FILE is required")?;
    let cfg = load_config(config, filter.map(String::as_str))?;
    let bytes = std::fs::read(request).map_err(|e| format!("{request}: cannot read: {e}"))?;
    let req = explain::read_request(request, &bytes)?;
    let v = explain::explain(&cfg, &req);
    if as_json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        );
    } else {
        let _ = write!(out, "{}", explain::render(&v));
    }
    Ok(0)
}

/// The one loopguard configuration in `file` (or the one `filter` names),
/// validated by the filter's own code.
fn load_config(file: &str, filter: Option<&str>) -> Result<Config, String> {
    let (location, bytes) = config_bytes(file, filter)?;
    Config::parse(&bytes).map_err(|e| format!("{location}: {e}"))
}

/// Where the one loopguard configuration in `file` (or the one `filter`
/// names) is, and its JSON.
fn config_bytes(file: &str, filter: Option<&str>) -> Result<(String, Vec<u8>), String> {
    let docs = documents::read(Path::new(file)).map_err(|e| e.to_string())?;
    let found = discover::find(&docs);
    let chosen: Vec<&discover::Found<'_>> = found
        .iter()
        .filter(|f| {
            filter.is_none_or(|want| match &f.origin {
                discover::Origin::Envoy { filter, .. } => filter == want,
                _ => f.doc.name() == want || f.doc.object_name() == want,
            })
        })
        .collect();
    let f = match chosen.as_slice() {
        [one] => *one,
        [] if found.is_empty() => return Err(format!("{file}: holds no loopguard configuration")),
        [] => {
            return Err(format!(
                "{file}: no loopguard configuration named {}; there are: {}",
                filter.unwrap_or(""),
                found
                    .iter()
                    .map(|f| f.location())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        }
        many => {
            return Err(format!(
                "{file} holds {} loopguard configurations; pick one with --filter: {}",
                many.len(),
                many.iter()
                    .map(|f| f.location())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        }
    };
    let bytes = f
        .bytes
        .as_ref()
        .map_err(|e| format!("{}: {e}", f.location()))?;
    Ok((f.location(), bytes.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> (i32, String, String) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&args, &mut out, &mut err);
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
        assert_eq!(run_args(&["redis-script", "--x"]).0, 2);
    }

    #[test]
    fn usage_errors_exit_2() {
        assert_eq!(run_args(&[]).0, 2);
        let (code, _, err) = run_args(&["check"]);
        assert_eq!(code, 2);
        assert!(err.contains("give at least one file"));
        let (code, _, err) = run_args(&["explain", "--config", "x"]);
        assert_eq!(code, 2);
        assert!(err.contains("--request FILE is required"));
        assert_eq!(
            run_args(&["--version"]).1,
            format!("loopguard {}\n", env!("CARGO_PKG_VERSION"))
        );
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
        let (code, out, _) = run_args(&["check", dir.join("missing.json").to_str().unwrap()]);
        assert_eq!(code, 1);
        assert!(out.contains("missing.json: cannot read"), "{out}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
