//! One configuration's run over the traffic: the filter's own engine
//! (`loopguard_core::flow`), fed each recorded request at its recorded time
//! on a simulated clock, with the fingerprint table in this process's
//! memory. What the engine asks the host to do is read back as the verdict
//! Envoy would have applied.

use super::budget::{self, BudgetNames, BudgetSpend, BudgetVerdict};
use super::mcp::{without_own_note, McpHistory, McpVerdict};
use super::record::{Answer, Recorded};
use loopguard_core::act::reply::LocalReply;
use loopguard_core::config::{AccessLog, Config, McpKey, StoreConfig};
use loopguard_core::detect::fingerprint::{self, Pending};
use loopguard_core::flow::{Effect, Effects, Engine, Request, Step};
use loopguard_core::metrics::Kind;
use loopguard_core::request::policy::{self, Selection};
use loopguard_core::request::RequestHead;
use loopguard_core::state::store::InProcess;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashMap;

/// What the filter did to one request (or, in shadow mode, would have).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The policy that applies (none: the request passes untouched).
    pub policy: Option<String>,
    /// `pass` (no policy, or not judged), `exempt`, `allow`, `warn`,
    /// `throttle`, `nudge`, `directive` or `reject`: the strongest of the
    /// fingerprint's, the tool-loop ladder's and a spend cap's (a policy
    /// with only a budget publishes no decision for what it lets through:
    /// `pass`); under an MCP policy
    /// `allow` (a call judged and forwarded), `note` (a note inserted into
    /// its result), `block`, `error` or `reject`.
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
    /// What this request did under an MCP policy.
    pub mcp: McpVerdict,
    /// What the policy's spend caps did to it.
    pub budget: BudgetVerdict,
}

/// Actions from weakest to strongest: an MCP note is as strong as a
/// nudge (the real answer, with words added); a blocked call and a
/// JSON-RPC error stop the call as a 429 does.
const ORDER: [&str; 11] = [
    "pass",
    "exempt",
    "allow",
    "warn",
    "note",
    "nudge",
    "directive",
    "throttle",
    "block",
    "error",
    "reject",
];

pub(super) fn rank(action: &str) -> usize {
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
    /// Throttled requests waiting for the tick, with the answer they will
    /// get.
    held: HashMap<u32, Held>,
    budget_names: BudgetNames,
    /// What the budget keys spent (read from every response, throttled
    /// ones too).
    budget_spend: BudgetSpend,
}

/// A throttled request and its recorded answer.
struct Held {
    r: Request,
    status: Option<u32>,
    answer: Option<Answer>,
    mcp: bool,
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
            budget_names: BudgetNames::of(&config),
            config,
            out: Vec::new(),
            now: 0,
            next_id: 1,
            held: HashMap::new(),
            budget_spend: BudgetSpend::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the budget keys spent so far.
    pub fn budget_spend(&self) -> &BudgetSpend {
        &self.budget_spend
    }

    /// Add what the effects say budget keys spent.
    fn account(&mut self, out: &[Effect]) {
        budget::account(
            out,
            self.engine.registry().defs(),
            &self.budget_names,
            &mut self.budget_spend,
        );
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
        let mut mcp = false;
        if let Selection::Policy(i) = policy::select(&self.config, &head, req) {
            let p = self.config.policies.get(i);
            verdict.policy = p.map(|p| p.id.clone());
            mcp = p.is_some_and(|p| p.mcp.is_some());
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
        read_effects(
            &out,
            &mut verdict,
            mcp,
            self.engine.registry().defs(),
            &self.budget_names,
        );
        for (name, value) in r.client_headers() {
            match *name {
                "x-loopguard-delay-ms" => verdict.delay_ms = value.parse().ok(),
                budget::HEADER => verdict.budget.header = Some(value.clone()),
                _ => {}
            }
        }
        let status = rec
            .response
            .as_ref()
            .and_then(|a| a.status)
            .map(u32::from)
            .or(Some(200));
        self.account(&out);
        if verdict.status.is_some() {
            // Answered by loopguard: the client gets the local reply.
            self.engine.on_done(&mut r, &mut out);
        } else if step == Step::Pause {
            // Throttled: the tick resumes it, then it goes upstream.
            let held = Held {
                r,
                status,
                answer: rec.response.clone(),
                mcp,
            };
            self.held.insert(id, held);
        } else {
            let from = out.len();
            let fed = respond(
                &mut self.engine,
                &mut r,
                rec.response.as_ref(),
                status,
                mcp,
                now,
                &mut out,
            );
            verdict.mcp.result_missing = fed.missing;
            verdict.mcp.own_note_removed = fed.own_note_removed;
            let after = out.get(from..).unwrap_or(&[]);
            read_effects(
                after,
                &mut verdict,
                mcp,
                self.engine.registry().defs(),
                &self.budget_names,
            );
            self.account(after);
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
        // The spend counted since the last flush, among others.
        self.account(&out);
        let resumed: Vec<u32> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Resume(id) => Some(*id),
                _ => None,
            })
            .collect();
        for id in resumed {
            if let Some(mut h) = self.held.remove(&id) {
                out.clear();
                respond(
                    &mut self.engine,
                    &mut h.r,
                    h.answer.as_ref(),
                    h.status,
                    h.mcp,
                    at,
                    &mut out,
                );
                self.account(&out);
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

    /// What tells a request's MCP history apart beyond its caller's
    /// identity, as the report shows it: the client's address when
    /// nothing else tells the caller (no limit keys, no API key), and the
    /// session, when its policy keys MCP histories by session and the
    /// request names one (as a digest: a session id lets whoever holds it
    /// into the session).
    pub fn mcp_history(&self, rec: &Recorded, policy_id: &str) -> McpHistory {
        let mut h = McpHistory::default();
        let Some(p) = self.config.policies.iter().find(|p| p.id == policy_id) else {
            return h;
        };
        let Some(cfg) = p.mcp.as_ref() else {
            return h;
        };
        let req = &rec.request;
        if p.limit_keys.is_empty() && loopguard_core::request::api_key(req).is_none() {
            h.address = req.source_address.as_deref().map(|a| {
                let address = loopguard_core::request::address_without_port(a);
                format!("address {address}")
            });
        }
        let head = loopguard_core::request::mcp::Head::read(req);
        if let (McpKey::Session, Some(session)) = (cfg.key, head.session) {
            let mut d = loopguard_core::request::Fnv::default();
            d.write(session.as_bytes());
            h.session = Some(format!("mcp session #{:08x}", d.0 >> 32));
        }
        h
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

/// What feeding a recorded answer to the response path found.
#[derive(Debug, Default)]
struct Fed {
    missing: Option<&'static str>,
    own_note_removed: bool,
}

/// The response path as Envoy runs it: the headers (status), the content
/// type when the engine asks for it, the body when it wants it (the
/// recorded bytes in one chunk, ending the stream unless the recording cut
/// them; an empty body gets no body callback, as in Envoy), then the end
/// of the stream. `mcp`: the request is under an MCP policy, whose
/// forwarded calls' results build the history.
fn respond(
    engine: &mut Engine<InProcess>,
    r: &mut Request,
    answer: Option<&Answer>,
    status: Option<u32>,
    mcp: bool,
    at: u64,
    out: &mut Effects,
) -> Fed {
    let mut fed = Fed::default();
    engine.on_response_headers(r, status, at, out);
    if mcp && r.wants_content_type() && answer.is_some_and(|a| a.by_loopguard) {
        // A forwarded call whose recorded answer is loopguard's own (its
        // status too): the server's result is unknown.
        fed.missing = Some("answered_by_loopguard");
        r.forget_mcp_call();
        engine.on_done(r, out);
        return fed;
    }
    // Usage recorded without the body: read from a body that reports it.
    let reported = budget::with_reported_usage(answer, mcp);
    let answer = reported.as_ref().or(answer);
    if r.wants_content_type() {
        let content_type = answer.and_then(|a| a.content_type.as_deref());
        let body = answer.and_then(|a| a.body.as_ref());
        if mcp && content_type.is_none() && body.is_none() && status == Some(200) {
            // Nothing of the result was recorded: replay cannot tell what
            // the call got, so it leaves it out of the history.
            fed.missing = Some("not_recorded");
            r.forget_mcp_call();
            engine.on_done(r, out);
            return fed;
        }
        engine.on_response_content_type(r, content_type, at, out);
    }
    if r.wants_response_body() {
        match answer.and_then(|a| a.body.as_deref().map(|b| (b, a.body_cut))) {
            Some((body, cut)) if !body.is_empty() => {
                let body = if mcp {
                    let (b, removed) = without_own_note(body);
                    fed.own_note_removed = removed;
                    b
                } else {
                    Cow::Borrowed(body)
                };
                engine.on_response_body(r, &body, !cut, at, out);
            }
            _ => {}
        }
        if mcp && r.wants_response_body() {
            fed.missing = Some(match answer.and_then(|a| a.body.as_ref()) {
                None => "not_recorded",
                Some(_) => "incomplete",
            });
            r.forget_mcp_call();
        }
    }
    engine.on_done(r, out);
    fed
}

fn replied(out: &Effects) -> bool {
    out.iter().any(|e| matches!(e, Effect::LocalReply(..)))
}

/// Read the engine's effects into the verdict (`mcp`: the request is
/// under an MCP policy, whose decisions name an MCP loop).
fn read_effects(
    out: &[Effect],
    v: &mut Verdict,
    mcp: bool,
    defs: &[(String, Kind)],
    budgets: &BudgetNames,
) {
    for e in out {
        if budgets.read(e, defs, v) {
            continue;
        }
        match e {
            Effect::Count(id, _)
                if mcp
                    && defs
                        .get(id.0 as usize)
                        .is_some_and(|(n, _)| n.starts_with("loopguard.mcp_calls_total.")) =>
            {
                // Judged and let through, unless something stronger is
                // said.
                v.mcp.judged = true;
                if rank("allow") > rank(v.action) {
                    v.action = "allow";
                }
            }
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
                    if mcp {
                        v.mcp.loop_header = Some(t.to_string());
                    } else {
                        v.tool_loop = Some(t.to_string());
                    }
                }
            }
            Effect::LocalReply(
                LocalReply {
                    status, headers, ..
                },
                _,
            ) => {
                v.status = Some(*status);
                v.budget.reply_headers(headers);
            }
            Effect::CountNamed(name, _) if name.starts_with("loopguard.mcp_unjudged_total.") => {
                if let Some((_, reason)) = name.rsplit_once(".reason.") {
                    v.mcp.unjudged = Some(reason.to_string());
                }
            }
            Effect::ReplaceResponseBody { .. } if mcp => v.mcp.note_added = true,
            Effect::Log(_, line) if line.starts_with("{\"") => {
                if let Ok(event) = serde_json::from_str::<Value>(line) {
                    let name = event.get("event").and_then(Value::as_str).unwrap_or("");
                    if matches!(
                        name,
                        "loop.detected" | "loop.tool.detected" | "loop.mcp.detected"
                    ) {
                        v.events.push(event);
                    } else {
                        v.budget.event(name, &event);
                    }
                }
            }
            _ => {}
        }
    }
}
