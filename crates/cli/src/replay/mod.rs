//! `loopguard replay`: recorded traffic through one or more configurations,
//! offline, with the filter's own engine on a clock driven by the recorded
//! times. What it reports is what the filter would have done, request by
//! request (the agreement tests in `tests/e2e/test_replay.py` and, for MCP
//! traffic, `tests/e2e/test_replay_mcp.py` hold it to that against a real
//! Envoy).
//!
//! - `input/`: the traffic formats (JSON Lines, HAR, Envoy tap traces),
//!   merged in time order, with each response's content type and body
//!   (its first 1 MiB);
//! - `simulate`: one configuration's engine and clock, fed each request and
//!   its recorded response as Envoy feeds the filter; `budget`: what it
//!   reads of the spend caps from the engine's effects, and what the budget
//!   keys spent; `mcp`: a request's part of a verdict under an MCP policy;
//! - `report`: the tally, as JSON and text; `html`: the page;
//! - `sweep`: `--set PATH=V1,V2,...`;
//! - `progress`: what has been read so far, on a terminal.

mod budget;
mod html;
pub(crate) mod input;
mod mcp;
mod progress;
pub mod record;
mod report;
mod simulate;
mod sweep;

use crate::args::ReplayArgs;
use crate::Stop;
use clap::error::ErrorKind;
use loopguard_core::config::{Config, StoreConfig};
use progress::Progress;
use report::Tally;
use serde_json::{json, Value};
use simulate::{Simulation, Verdict};
use std::collections::BTreeMap;
use std::io::Write;
use sweep::Sweep;

/// Skipped entries listed in the report (all are counted).
const MAX_SKIPPED_LISTED: usize = 100;
/// Distinct notes about entries kept for the report's header.
const MAX_ENTRY_NOTES: usize = 20;

/// One configuration to replay through (a sweep gives one per value).
struct Run {
    config_file: String,
    setting: Option<(String, Value)>,
    /// The configuration counts in Redis (replay counts locally).
    shared: bool,
    sim: Simulation,
    tally: Tally,
}

/// `--set`, read: no sweep, or one (a sweep varies one field).
fn sweep(a: &ReplayArgs) -> Result<Option<Sweep>, Stop> {
    match a.sets.as_slice() {
        [] => Ok(None),
        [one] => Sweep::parse(one)
            .map(Some)
            .map_err(|e| Stop::Usage(ErrorKind::ValueValidation, e)),
        _ => Err(Stop::Usage(
            ErrorKind::ArgumentConflict,
            "one --set per replay (a sweep varies one field)".to_string(),
        )),
    }
}

/// The runs: each configuration, or each configuration at each swept
/// value.
fn runs(a: &ReplayArgs, sweep: Option<&Sweep>) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for file in &a.configs {
        let (location, bytes) = crate::config_bytes(file, a.filter.as_deref())?;
        let settings: Vec<Option<(String, Value)>> = match sweep {
            None => vec![None],
            Some(s) => s
                .values
                .iter()
                .map(|v| Some((s.path.clone(), v.clone())))
                .collect(),
        };
        for setting in settings {
            let config = match &setting {
                None => Config::parse(&bytes).map_err(|e| format!("{location}: {e}"))?,
                Some((path, v)) => {
                    let mut json: Value =
                        serde_json::from_slice(&bytes).map_err(|e| format!("{location}: {e}"))?;
                    sweep::set(&mut json, path, v.clone())
                        .map_err(|e| format!("{location}: {e}"))?;
                    let changed = serde_json::to_vec(&json).map_err(|e| e.to_string())?;
                    Config::parse(&changed)
                        .map_err(|e| format!("{location} with {path}={v}: {e}"))?
                }
            };
            let shared = matches!(config.store, StoreConfig::RedisWebdis(_));
            let sim = Simulation::new(config).map_err(|e| format!("{location}: {e}"))?;
            let tally = Tally::new(&sim);
            runs.push(Run {
                config_file: file.clone(),
                setting,
                shared,
                sim,
                tally,
            });
        }
    }
    Ok(runs)
}

/// Run `loopguard replay`; the exit code. With `progress`, what it has
/// read so far is redrawn on `err` (a terminal) while it runs.
pub fn command(
    a: &ReplayArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    progress: bool,
) -> Result<i32, Stop> {
    let sweep = sweep(a)?;
    let mut runs = runs(a, sweep.as_ref())?;
    let mut progress = Progress::new(progress);
    let replayed = replay_all(a, &mut runs, &mut progress, err);
    // Cleared whatever happened: a message or the report follows.
    progress.clear(err);
    let Replayed {
        merged,
        read,
        skipped,
        no_response,
        skipped_entries,
        first_ms,
        last_ms,
        entry_notes,
    } = replayed?;
    for run in &mut runs {
        run.sim.finish();
        run.tally.finish(&run.sim);
    }
    let mut notes = notes(&runs, no_response, merged.out_of_order, read);
    for run in &runs {
        notes.extend(run.tally.mcp_notes(&run.config_file));
        notes.extend(run.tally.budget_notes(&run.config_file));
    }
    notes.dedup();
    for (note, n) in entry_notes {
        notes.push(format!(
            "{n} request{}: {note}",
            if n == 1 { "" } else { "s" }
        ));
    }
    let report = json!({
        "inputs": {
            "files": merged.files,
            "read": read,
            "skipped": skipped,
            "skipped_entries": skipped_entries,
            "skipped_not_listed": skipped.saturating_sub(MAX_SKIPPED_LISTED as u64),
            "first_ms": first_ms,
            "last_ms": last_ms,
        },
        "notes": notes,
        "runs": runs.iter().map(|r| {
            let mut v = r.tally.to_json();
            if let Some(o) = v.as_object_mut() {
                o.insert("config".to_string(), json!(r.config_file));
                o.insert("setting".to_string(), match &r.setting {
                    None => Value::Null,
                    Some((path, value)) => json!({"path": path, "value": value}),
                });
            }
            v
        }).collect::<Vec<_>>(),
        "sweep": sweep.as_ref().map(|s| json!({
            "path": s.path,
            "rows": runs.iter().map(|r| {
                let (loops, requests, callers) = r.tally.totals();
                json!({
                    "config": r.config_file,
                    "value": r.setting.as_ref().map(|(_, v)| v.clone()),
                    "loops_found": loops,
                    "requests_touched": requests,
                    "callers_touched": callers,
                    "budget_rejected": r.tally.budget_rejected(),
                })
            }).collect::<Vec<_>>(),
        })),
    });
    if let Some(path) = &a.html {
        std::fs::write(path, html::render(&report))
            .map_err(|e| format!("{path}: cannot write: {e}"))?;
        let _ = writeln!(err, "loopguard: wrote {path}");
    }
    let shown = if a.json {
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    } else {
        report::render(&report)
    };
    out.write_all(shown.as_bytes())
        .map_err(|e| format!("cannot write the report: {e}"))?;
    Ok(0)
}

/// What was read, once every entry went through every run.
struct Replayed {
    merged: input::Merged,
    read: u64,
    skipped: u64,
    no_response: u64,
    skipped_entries: Vec<Value>,
    first_ms: Option<u64>,
    last_ms: Option<u64>,
    /// What readers noted about entries, with how many each concerns.
    entry_notes: BTreeMap<String, u64>,
}

/// Open the traffic and run every entry through every run, writing
/// `--verdicts` and drawing the progress as it goes.
fn replay_all(
    a: &ReplayArgs,
    runs: &mut [Run],
    progress: &mut Progress,
    err: &mut dyn Write,
) -> Result<Replayed, String> {
    let mut merged = input::Merged::open(&a.traffic, &mut |done, total| {
        progress.opening(err, done, total);
    })?;
    let mut verdicts = match &a.verdicts {
        None => None,
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("{path}: cannot write: {e}"))?,
        )),
    };
    let (mut read, mut skipped, mut no_response) = (0u64, 0u64, 0u64);
    let mut skipped_entries = Vec::new();
    let (mut first_ms, mut last_ms) = (None, None);
    let mut entry_notes = BTreeMap::new();
    while let Some(entry) = merged.next() {
        progress.reading(err, read, skipped, merged.files_done(), merged.files.len());
        let rec = match entry {
            Ok(rec) => rec,
            Err(s) => {
                skipped += 1;
                if skipped_entries.len() < MAX_SKIPPED_LISTED {
                    skipped_entries.push(json!({"place": s.place, "reason": s.reason}));
                }
                continue;
            }
        };
        read += 1;
        first_ms.get_or_insert(rec.at_ms);
        last_ms = Some(rec.at_ms);
        if rec.response.as_ref().and_then(|r| r.status).is_none() {
            no_response += 1;
        }
        // What a reader noted about an entry (a lossy body, usage it could
        // not read): said once in the header, with how many it concerns.
        for n in &rec.request.notes {
            if let Some(count) = entry_notes.get_mut(n) {
                *count += 1;
            } else if entry_notes.len() < MAX_ENTRY_NOTES {
                entry_notes.insert(n.clone(), 1u64);
            }
        }
        for (i, run) in runs.iter_mut().enumerate() {
            let v = run.sim.request(&rec);
            run.tally.add(&run.sim, &rec, &v);
            if let Some(w) = verdicts.as_mut() {
                let line = verdict_line(i, &rec, &v);
                writeln!(w, "{line}").map_err(|e| format!("--verdicts: cannot write: {e}"))?;
            }
        }
    }
    if let Some(mut w) = verdicts {
        w.flush()
            .map_err(|e| format!("--verdicts: cannot write: {e}"))?;
    }
    Ok(Replayed {
        merged,
        read,
        skipped,
        no_response,
        skipped_entries,
        first_ms,
        last_ms,
        entry_notes,
    })
}

/// One line of `--verdicts`: what the filter did to one request in one
/// run.
fn verdict_line(run: usize, rec: &record::Recorded, v: &Verdict) -> Value {
    json!({
        "run": run,
        "place": rec.place,
        "at_ms": rec.at_ms,
        "policy": v.policy,
        "action": v.action,
        "shadow": v.shadow,
        "status": v.status,
        "delay_ms": v.delay_ms,
        "count": v.count,
        "tool_loop": v.tool_loop,
        "mcp_loop": v.mcp.loop_header,
        "mcp": mcp_json(v),
        "budget": budget_json(v),
        "body_judged": !v.skipped_body,
        "decision": v.decision,
    })
}

/// An MCP request's verdict: `null` unless the request is under an MCP
/// policy and something was judged, passed unjudged or left unread.
fn mcp_json(v: &Verdict) -> Value {
    let m = &v.mcp;
    if !m.judged && m.unjudged.is_none() && m.loop_header.is_none() {
        return Value::Null;
    }
    let count = m.field("count").and_then(|c| c.parse::<u64>().ok());
    json!({
        "judged": m.judged,
        "step": m.field("step"),
        "tier": m.field("tier"),
        "tool": m.field("tool"),
        "count": count,
        "note_added": m.note_added,
        "unjudged": m.unjudged,
        "result_missing": m.result_missing,
        "own_note_removed": m.own_note_removed,
    })
}

/// A request's budget verdict: `null` unless a cap rejected it or it
/// carried a warning.
fn budget_json(v: &Verdict) -> Value {
    let b = &v.budget;
    if b.rejected.is_none() && b.warned.is_empty() && b.header.is_none() {
        return Value::Null;
    }
    json!({
        "rejected": b.rejected,
        "shadow": !b.shadow.is_empty(),
        "warned": b.warned,
        "header": b.header,
    })
}

/// What the report header says about what replay cannot know.
fn notes(runs: &[Run], no_response: u64, out_of_order: u64, read: u64) -> Vec<String> {
    let mut notes = Vec::new();
    for r in runs {
        notes.push(if r.shared {
            format!("{}: the configuration counts in Redis, shared by every replica: replay counts all of this traffic in one table, which is what Redis gives while it answers (when it does not, the filter falls back as configured and counts differ)", r.config_file)
        } else {
            format!("{}: the local store counts per Envoy process: replay counts all of this traffic in one table, as one Envoy seeing all of it would; behind a load balancer over N replicas, each sees part of it and counts fewer repeats", r.config_file)
        });
    }
    if no_response > 0 {
        notes.push(format!("{no_response} of {read} requests have no recorded response status: replay takes them as answered 200 (a retry after a provider error is forgiven only when that error was recorded)"));
    }
    if out_of_order > 0 {
        notes.push(format!("{out_of_order} entries were earlier than the one before them in their file: replayed at the later time"));
    }
    notes.push("times are the recorded ones: a throttle's delay does not move later requests, and webhooks are not sent".to_string());
    notes
}

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod mcp_tests;
#[cfg(test)]
mod tests;
