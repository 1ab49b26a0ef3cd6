//! `loopguard`, the operators' command line: check configurations before
//! they reach the proxies, see how the filter fingerprints a request, and
//! replay recorded traffic through any configuration.
//! Every verdict comes from the filter's own code: `loopguard_core::config`
//! validates, `loopguard_core::request::policy` selects and
//! `loopguard_core::detect::fingerprint` digests.

mod args;
mod check;
mod discover;
mod documents;
mod explain;
mod prices;
mod replay;
mod request_file;

use args::{CheckArgs, Cli, Command, ExplainArgs};
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use loopguard_core::config::Config;
use std::ffi::{OsStr, OsString};
use std::io::{IsTerminal, Write};
use std::path::Path;

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let terminal = std::io::stderr().is_terminal();
    let code = run(
        &args,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
        terminal,
    );
    std::process::exit(code);
}

/// Why a command stopped before its work was done; both exit 2.
#[derive(Debug)]
pub enum Stop {
    /// It was called wrongly: said as clap says its own usage errors, with
    /// the subcommand's usage.
    Usage(ErrorKind, String),
    /// It met something it cannot go on with (a file, a configuration).
    Failed(String),
}

impl From<String> for Stop {
    fn from(message: String) -> Stop {
        Stop::Failed(message)
    }
}

/// Run the CLI with `args` (without the program name); the process exit
/// code: 0, 1 when `check` found errors, 2 for usage errors and failures.
/// Output goes to `out`, diagnostics to `err`; `terminal` says that `err`
/// is a terminal, where `replay` shows its progress.
fn run<S: AsRef<OsStr>>(
    args: &[S],
    out: &mut dyn Write,
    err: &mut dyn Write,
    terminal: bool,
) -> i32 {
    let words = std::iter::once(OsStr::new("loopguard")).chain(args.iter().map(AsRef::as_ref));
    let cli = match Cli::try_parse_from(words) {
        Ok(cli) => cli,
        // --help and --version are "errors" clap prints to stdout, exit 0.
        Err(e) => return clap_error(&e, out, err),
    };
    let (name, result) = match cli.command {
        Command::Check(a) => ("check", cmd_check(&a, out)),
        Command::Explain(a) => ("explain", cmd_explain(&a, out)),
        Command::Replay(a) => (
            "replay",
            replay::command(&a, out, err, terminal && !a.quiet),
        ),
        Command::Prices(a) => ("prices", prices::command(&a, out)),
        Command::Schema => {
            let schema = loopguard_core::config::schema();
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            );
            ("schema", Ok(0))
        }
        Command::RedisScript(a) => {
            let script = loopguard_core::state::redis::Script::shipped();
            if a.sha1 {
                let _ = writeln!(out, "{}", script.sha1);
            } else {
                let _ = write!(out, "{}", script.source);
            }
            ("redis-script", Ok(0))
        }
        Command::Version => {
            let _ = writeln!(out, "loopguard {}", env!("CARGO_PKG_VERSION"));
            ("version", Ok(0))
        }
    };
    match result {
        Ok(code) => code,
        Err(Stop::Usage(kind, message)) => {
            let mut cli = Cli::command();
            cli.build();
            let e = match cli.find_subcommand_mut(name) {
                Some(sub) => sub.error(kind, message),
                None => cli.error(kind, message),
            };
            clap_error(&e, out, err)
        }
        Err(Stop::Failed(message)) => {
            let _ = writeln!(err, "loopguard: {message}");
            2
        }
    }
}

/// Print what clap said (help and the version on `out`, usage errors on
/// `err`); its exit code.
fn clap_error(e: &clap::Error, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let text = e.render().to_string();
    let _ = if e.use_stderr() {
        err.write_all(text.as_bytes())
    } else {
        out.write_all(text.as_bytes())
    };
    e.exit_code()
}

fn cmd_check(a: &CheckArgs, out: &mut dyn Write) -> Result<i32, Stop> {
    let files = &a.files;
    let envoy = match a.envoy.as_deref().map(check::versions::EnvoyTarget::parse) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(why)) => return Err(Stop::Usage(ErrorKind::InvalidValue, why)),
    };
    let mut docs = Vec::new();
    let mut failed = false;
    for f in files {
        match documents::read(Path::new(f)) {
            Ok(d) => docs.extend(d),
            Err(e) => {
                let _ = writeln!(out, "{e}");
                failed = true;
            }
        }
    }
    let findings = check::check_for(&docs, envoy.as_ref());
    for f in &findings {
        let _ = writeln!(out, "{f}");
    }
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    let errors = count(check::Severity::Error) + usize::from(failed);
    let warnings = count(check::Severity::Warning);
    let configs = discover::find(&docs).len() + check::native::find(&docs).len();
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
    Ok(if errors > 0 || (a.strict && warnings > 0) {
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

fn cmd_explain(a: &ExplainArgs, out: &mut dyn Write) -> Result<i32, Stop> {
    let cfg = load_config(&a.config, a.filter.as_deref())?;
    let request = &a.request;
    let bytes = std::fs::read(request).map_err(|e| format!("{request}: cannot read: {e}"))?;
    let req = explain::read_request(request, &bytes)?;
    let v = explain::explain(&cfg, &req);
    if a.json {
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
    // (location, whether `want` names it, bytes): the Wasm filter's
    // configurations, then the native module's.
    type Candidate<'a> = (
        String,
        Box<dyn Fn(&str) -> bool + 'a>,
        &'a Result<Vec<u8>, String>,
    );
    let wasm = discover::find(&docs);
    let native = check::native::find(&docs);
    let mut found: Vec<Candidate<'_>> = Vec::new();
    for f in &wasm {
        let named: Box<dyn Fn(&str) -> bool> = match &f.origin {
            discover::Origin::Envoy { filter, .. } => Box::new(move |want| filter == want),
            _ => Box::new(move |want| f.doc.name() == want || f.doc.object_name() == want),
        };
        found.push((f.location(), named, &f.bytes));
    }
    for n in &native {
        let named: Box<dyn Fn(&str) -> bool> = match &n.host {
            check::native::Host::Envoy { filter, .. } => Box::new(move |want| filter == want),
            check::native::Host::Gateway { .. } => {
                Box::new(move |want| n.doc.name() == want || n.doc.object_name() == want)
            }
        };
        found.push((n.location(), named, &n.bytes));
    }
    let chosen: Vec<&Candidate<'_>> = found
        .iter()
        .filter(|(_, named, _)| filter.is_none_or(named))
        .collect();
    let (location, _, bytes) = match chosen.as_slice() {
        [one] => *one,
        [] if found.is_empty() => return Err(format!("{file}: holds no loopguard configuration")),
        [] => {
            return Err(format!(
                "{file}: no loopguard configuration named {}; there are: {}",
                filter.unwrap_or(""),
                found
                    .iter()
                    .map(|(l, _, _)| l.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        }
        many => {
            return Err(format!(
                "{file} holds {} loopguard configurations; pick one with --filter: {}",
                many.len(),
                many.iter()
                    .map(|(l, _, _)| l.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        }
    };
    let bytes = bytes.as_ref().map_err(|e| format!("{location}: {e}"))?;
    Ok((location.clone(), bytes.clone()))
}

#[cfg(test)]
mod tests;
