//! One configuration's run over the traffic: the filter's own engine
//! (`loopguard_core::flow`), fed each recorded request at its recorded time
//! on a simulated clock, with the fingerprint table in this process's
//! memory. What the engine asks the host to do is read back as the verdict
//! Envoy would have applied.

use super::record::Recorded;
use loopguard_core::act::reply::LocalReply;
use loopguard_core::config::{AccessLog, Config, StoreConfig};
use loopguard_core::detect::fingerprint::{self, Pending};
use loopguard_core::flow::{Effect, Effects, Engine, Request, Step};
use loopguard_core::request::policy::{self, Selection};
use loopguard_core::request::RequestHead;
use loopguard_core::state::store::InProcess;
use serde_json::Value;
use std::collections::HashMap;

/// What the filter did to one request (or, in shadow mode, would have).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The policy that applies (none: the request passes untouched).
    pub policy: Option<String>,
    /// `pass` (no policy, or not judged), `exempt`, `allow`, `warn`,
    /// `throttle`, `nudge`, `directive` or `reject`: the strongest of the
    /// fingerprint's and the tool-loop ladder's.
    pub action: &'static str,
    /// The policy is in shadow mode: `action` was only logged.
    pub shadow: bool,
    /// The local reply's status (a reject).
    pub status: Option<u32>,
    /// A throttle's delay.
    pub delay_ms: Option<u64>,
    /// The count's fingerprint (near mode: the caller's record), when the
    /// request was counted.
    pub fingerprint: Option<String>,
    pub count: Option<u32>,
    /// The tool-loop verdict (`x-loopguard-tool-loop`), when there was one.
    pub tool_loop: Option<String>,
    /// Detection events the request raised (`loop.detected`,
    /// `loop.tool.detected`).
    pub events: Vec<Value>,
    /// The body was not judged (over `max_body_bytes`, or not readable).
    pub skipped_body: bool,
    /// The last decision record published (what Envoy's access log shows
    /// as `%FILTER_STATE(wasm.loopguard:PLAIN)%`).
    pub decision: Option<Value>,
}

/// Actions from weakest to strongest.
const ORDER: [&str; 8] = [
    "pass",
    "exempt",
    "allow",
    "warn",
    "nudge",
    "directive",
    "throttle",
    "reject",
];

fn rank(action: &str) -> usize {
    ORDER.iter().position(|a| *a == action).unwrap_or(0)
}

fn known(action: &str) -> &'static str {
    ORDER
        .iter()
        .find(|a| **a == action)
        .copied()
        .unwrap_or("allow")
}

/// One configuration's engine on a simulated clock.
pub struct Simulation {
    engine: Engine<InProcess>,
    config: Config,
    out: Effects,
    /// The clock: the latest recorded time seen (never runs backwards).
    now: u64,
    next_id: u32,
    /// Throttled requests waiting for the tick, with the status their
    /// answer will have.
    held: HashMap<u32, (Request, Option<u32>)>,
}

impl Simulation {
    /// Set up `config` as the filter would; counts stay in this process
    /// (a Redis store is replaced by the local table, which is what one
    /// replica alone would count: the report says so).
    pub fn new(mut config: Config) -> Result<Simulation, String> {
        config.store = StoreConfig::Local;
        // Every judged request publishes its decision: that is how replay
        // reads it back.
        config.access_log = AccessLog::All;
        // A webhook's secret is read from the VM's environment; replay
        // sends no alerts, so any value does.
        let engine = Engine::new(
            config.clone(),
            "replay",
            |_| Ok(InProcess::default()),
            |_| Some("replay".to_string()),
            0x5eed,
        )?;
        Ok(Simulation {
            engine,
            config,
            out: Vec::new(),
            now: 0,
            next_id: 1,
            held: HashMap::new(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Replay one request at its time.
    pub fn request(&mut self, rec: &Recorded) -> Verdict {
        self.advance(rec.at_ms);
        let now = self.now;
        let req = &rec.request;
        let head = RequestHead {
            method: &req.method,
            path: &req.path,
            authority: &req.authority,
        };
        let mut verdict = Verdict {
            action: "pass",
            ..Verdict::default()
        };
        if let Selection::Policy(i) = policy::select(&self.config, &head, req) {
            verdict.policy = self.config.policies.get(i).map(|p| p.id.clone());
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let mut r = Request::new(id);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let no_body = req.body.is_empty();
        let mut step = self
            .engine
            .on_headers(&mut r, &head, req, no_body, now, &mut out);
        if !no_body && !replied(&out) {
            let size = req.body.len();
            let body = r.wants_body(size, true).then_some(req.body.as_slice());
            if step == Step::Pause && body.is_none() {
                verdict.skipped_body = true;
            }
            step = self.engine.on_body(&mut r, size, true, body, now, &mut out);
        }
        read_effects(&out, &mut verdict);
        for (name, value) in r.client_headers() {
            if *name == "x-loopguard-delay-ms" {
                verdict.delay_ms = value.parse().ok();
            }
        }
        let status = rec
            .response
            .as_ref()
            .and_then(|a| a.status)
            .map(u32::from)
            .or(Some(200));
        if verdict.status.is_some() {
            // Answered by loopguard: the client gets the local reply.
            self.engine.on_done(&mut r, &mut out);
        } else if step == Step::Pause {
            // Throttled: the tick resumes it, then it goes upstream.
            self.held.insert(id, (r, status));
        } else {
            self.engine
                .on_response_headers(&mut r, status, now, &mut out);
            self.engine.on_done(&mut r, &mut out);
        }
        self.out = out;
        verdict
    }

    /// Move the clock to `at` (never back), running the tick as the
    /// filter would on the way: throttled requests resume when due.
    pub fn advance(&mut self, at: u64) {
        if at <= self.now {
            return;
        }
        if !self.held.is_empty() {
            // The filter ticks every few ms; replay ticks once at each
            // request's time, and at the end.
            self.tick(at);
        }
        self.now = at;
    }

    /// Let every throttled request finish (the end of the traffic).
    pub fn finish(&mut self) {
        let end = self.now.saturating_add(3_600_000);
        self.tick(end);
    }

    fn tick(&mut self, at: u64) {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        self.engine.on_tick(at, &mut out);
        let resumed: Vec<u32> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Resume(id) => Some(*id),
                _ => None,
            })
            .collect();
        for id in resumed {
            if let Some((mut r, status)) = self.held.remove(&id) {
                out.clear();
                self.engine
                    .on_response_headers(&mut r, status, at, &mut out);
                self.engine.on_done(&mut r, &mut out);
            }
        }
        self.out = out;
    }

    /// Who is calling under `policy_id`, as a digest of the caller's
    /// identity (the policy's limit keys, or the API key): cheap, and never
    /// the key itself.
    pub fn caller_key(&self, rec: &Recorded, policy_id: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let Some(p) = self.config.policies.iter().find(|p| p.id == policy_id) else {
            return 0;
        };
        let req = &rec.request;
        let head = RequestHead {
            method: &req.method,
            path: &req.path,
            authority: &req.authority,
        };
        let pending = Pending::start(&self.config, p, &head, req);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        pending.identity().hash(&mut h);
        h.finish()
    }

    /// The caller as `explain` shows it (keys redacted) and the model, for
    /// a request that is part of a loop.
    pub fn caller(&self, rec: &Recorded, policy_id: &str) -> (String, Option<String>) {
        let Some(p) = self.config.policies.iter().find(|p| p.id == policy_id) else {
            return (String::new(), None);
        };
        let req = &rec.request;
        let head = RequestHead {
            method: &req.method,
            path: &req.path,
            authority: &req.authority,
        };
        let e = fingerprint::explain(&self.config, p, &head, req, &req.body);
        let caller: Vec<String> = e
            .components
            .iter()
            .filter_map(|c| {
                c.name
                    .strip_prefix("caller: ")
                    .map(|n| format!("{n}={}", c.value))
            })
            .collect();
        (caller.join("; "), e.made.model)
    }
}

fn replied(out: &Effects) -> bool {
    out.iter().any(|e| matches!(e, Effect::LocalReply(..)))
}

/// Read the engine's effects into the verdict.
fn read_effects(out: &[Effect], v: &mut Verdict) {
    for e in out {
        match e {
            Effect::SetFilterState(name, record) if name == "loopguard" => {
                let Ok(rec) = serde_json::from_str::<Value>(record) else {
                    continue;
                };
                v.decision = Some(rec.clone());
                let action = rec.get("action").and_then(Value::as_str).unwrap_or("");
                let action = known(action);
                if rank(action) >= rank(v.action) {
                    v.action = action;
                }
                if let Some(p) = rec.get("policy").and_then(Value::as_str) {
                    v.policy = Some(p.to_string());
                }
                v.shadow |= rec.get("mode").and_then(Value::as_str) == Some("shadow");
                if let Some(fp) = rec.get("fingerprint").and_then(Value::as_str) {
                    v.fingerprint = Some(fp.to_string());
                }
                if let Some(c) = rec.get("count").and_then(Value::as_u64) {
                    v.count = u32::try_from(c).ok();
                }
                if let Some(t) = rec.get("tool_loop").and_then(Value::as_str) {
                    v.tool_loop = Some(t.to_string());
                }
            }
            Effect::LocalReply(LocalReply { status, .. }, _) => v.status = Some(*status),
            Effect::Log(_, line) if line.starts_with("{\"") => {
                if let Ok(event) = serde_json::from_str::<Value>(line) {
                    let name = event.get("event").and_then(Value::as_str).unwrap_or("");
                    if name == "loop.detected" || name == "loop.tool.detected" {
                        v.events.push(event);
                    }
                }
            }
            _ => {}
        }
    }
}
