//! MCP traffic through a policy with `mcp`: a `tools/call` POST is read
//! once its body is complete, judged against the caller's (or session's)
//! recent calls, and either forwarded (its result read as it passes, and
//! added to the history) or answered by loopguard in the protocol's own
//! shape. Everything else (`initialize`, `server/discover`, `tools/list`,
//! notifications, GET streams, DELETE) passes untouched; odd bodies and
//! results pass too, counted.
//!
//! Histories live in the local table, and with a shared store in Redis as
//! well: the call waits for its history from Redis, and the end of its
//! result (or loopguard's answer) waits until Redis has the call, so an
//! agent whose calls alternate between replicas is one history. When
//! Redis fails, `store.on_error` says whether the call is judged by this
//! replica's own history (`local`) or passes unjudged (`allow`).

use super::enact::event_key;
use super::store::asks::{Answer, Ask};
use super::store::writes::Write;
use super::{count_opt, policy_with, usage, Effect, Effects, Engine, Level, Request, Step};
use crate::act::reply::LocalReply;
use crate::act::shadow::verdict_line;
use crate::act::{events, mcp_reply};
use crate::config::{Mcp, McpKey, McpStep, Mode, OnStoreError, Policy, StepName};
use crate::detect::mcp::{self as judge, Entry, McpVerdict};
use crate::metrics::mcp::{self as m, McpUnjudged};
use crate::request::mcp::{self as read, Head, Message, ToolCall};
use crate::request::RequestFacts;
use crate::response::{
    self,
    mcp::{Framing, NotePlan, ResultReader, Seen},
};
use crate::state::mcp_sessions::{self, HistoryId, Recent};
use crate::state::redis::mcp::parse_history;
use crate::state::store::BucketBackend;
use serde_json::json;
use std::rc::Rc;

/// The local reply detail of a call loopguard answered.
const ANSWERED: &str = "loopguard_mcp_loop_detected";

/// An MCP request on its way: its headers' facts, then the call it
/// forwarded and the reader of its result.
#[derive(Debug, Default)]
pub(super) struct McpStream {
    policy: usize,
    head: Head,
    /// The client's address (without its port).
    address: Option<String>,
    /// Nothing but the address tells this caller apart (no limit keys, no
    /// API key).
    anonymous: bool,
    call: Option<Forwarded>,
    /// The response's status, for a call that went on.
    pub(super) status: Option<u32>,
    reader: Option<ResultReader>,
}

/// An MCP request waiting for the shared store: for its history (then
/// it is judged), or until the store has loopguard's answer to it (then
/// the answer goes to the client).
#[derive(Debug)]
pub(super) enum McpWait {
    History(HistoryId, ToolCall),
    Answer(Box<LocalReply>, Write),
}

/// A call that goes to the server, and joins its history with its result.
#[derive(Debug)]
struct Forwarded {
    /// Whose history the call joins.
    id: HistoryId,
    digest: u64,
    tool: String,
    /// The loop a note is planned for.
    noted: Option<McpVerdict>,
    /// The history's bucket as the call's judge read it (the result's
    /// append tries over it first).
    snapshot: Option<(Vec<u8>, u32)>,
    note_added: bool,
}

/// A call or result passed on unjudged, counted by why (`Store`: a history
/// the store could not read or write; the call passed unjudged, or its
/// result was not recorded).
pub(super) fn unjudged(policy_id: &str, why: McpUnjudged) -> Effect {
    Effect::CountNamed(m::unjudged(policy_id, why), 1)
}

impl McpStream {
    pub(super) fn new(policy: usize, p: &Policy, facts: &dyn RequestFacts) -> McpStream {
        let anonymous = p.limit_keys.is_empty() && crate::request::api_key(facts).is_none();
        let address = facts
            .source_address()
            .map(|a| crate::request::address_without_port(&a).to_string());
        McpStream {
            policy,
            head: Head::read(facts),
            address,
            anonymous,
            ..McpStream::default()
        }
    }
}

impl Request {
    /// Whether the host should pass the response's `content-type`
    /// ([`Engine::on_response_content_type`]): its usage is read, or an
    /// MCP result.
    pub fn wants_content_type(&self) -> bool {
        self.reads_usage() || self.mcp.as_ref().is_some_and(|s| s.call.is_some())
    }

    /// The host cannot know what a forwarded call got (a replay whose
    /// recording lacks the result): the call is left out of its history,
    /// instead of joining it as unread when the stream ends.
    pub fn forget_mcp_call(&mut self) {
        self.mcp = None;
    }

    pub(super) fn reads_mcp_result(&self) -> bool {
        self.mcp
            .as_ref()
            .and_then(|s| s.reader.as_ref())
            .is_some_and(ResultReader::reading)
    }
}

/// The history a call joins: the caller's, and its session's when the
/// policy keys by session and the protocol has one. Without a session
/// (protocol 2026-07-28 is stateless), the caller's calls from one address
/// are one history: agents that share an API key on other hosts are kept
/// apart. A caller known by nothing else (no limit keys, no API key) is
/// always told apart by its address. Its owner is the caller (and that
/// address), whatever its session.
fn history_id(caller: u64, cfg: &Mcp, stream: &McpStream, seed: u64) -> HistoryId {
    let mut h = crate::request::Fnv(caller ^ 0x6d63_705f_6869_7374);
    let session = match cfg.key {
        McpKey::Session => stream.head.session.as_deref(),
        McpKey::Caller => None,
    };
    let by_address = stream.anonymous || (cfg.key == McpKey::Session && session.is_none());
    if let (true, Some(a)) = (by_address, &stream.address) {
        h.write(&[2]);
        h.write(a.as_bytes());
    }
    let mut owner = crate::request::Fnv(caller);
    if let (true, Some(a)) = (stream.anonymous, &stream.address) {
        owner.write(a.as_bytes());
    }
    if let Some(s) = session {
        h.write(&[1]);
        h.write(s.as_bytes());
    }
    HistoryId::new(h.0, owner.0, seed)
}

impl<B: BucketBackend> Engine<B> {
    /// The whole body of a request under an MCP policy.
    pub(super) fn decide_mcp(
        &mut self,
        r: &mut Request,
        policy: &Policy,
        cfg: &Mcp,
        body: &[u8],
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let Some(stream) = r.mcp.as_mut() else {
            return Step::Continue;
        };
        let call = match read::read(body, &stream.head, cfg.arguments_mask) {
            Message::Call(c) => c,
            other => {
                r.mcp = None;
                if let Message::Unjudged(why) = other {
                    out.push(unjudged(&policy.id, McpUnjudged::Request(why)));
                    let line = format!("mcp request passed unjudged ({})", why.as_str());
                    out.push(Effect::Log(Level::Debug, line));
                }
                return Step::Continue;
            }
        };
        if judge::exempt(cfg, &call.tool) {
            r.mcp = None;
            out.push(Effect::CountNamed(m::exempt(&policy.id), 1));
            self.publish_decision(out, (policy, true), "exempt", || events::NO_REPEAT);
            return Step::Continue;
        }
        count_opt(out, self.registry.mcp_calls(stream.policy), 1);
        let id = history_id(r.caller, cfg, stream, self.mcp_seed);
        if let Some(shared) = self.shared.as_ref() {
            let read = shared.mcp_of(id.key, cfg.window_ms, now, None);
            return self.ask(r, read, Ask::Mcp(McpWait::History(id, call)), out);
        }
        let ours = (stream.policy, policy);
        let recent = self.local_history(policy, cfg, id, now, out);
        self.judge_mcp(r, ours, cfg, call, id, recent, now, out)
    }

    /// The call's history in this replica's table (empty when the table
    /// failed: counted, and the call is judged as a first).
    fn local_history(
        &mut self,
        policy: &Policy,
        cfg: &Mcp,
        id: HistoryId,
        now: u64,
        out: &mut Effects,
    ) -> Recent {
        mcp_sessions::read(&mut self.local.backend, id, now, cfg.window_ms).unwrap_or_else(|_| {
            out.push(unjudged(&policy.id, McpUnjudged::Store));
            Recent::default()
        })
    }

    /// Judge a call against its history: forwarded (a note planned, or in
    /// shadow mode what would have been done logged), or answered.
    #[allow(clippy::too_many_arguments)]
    fn judge_mcp(
        &mut self,
        r: &mut Request,
        (index, policy): (usize, &Policy),
        cfg: &Mcp,
        call: ToolCall,
        id: HistoryId,
        recent: Recent,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        // A loop loopguard has been answering goes to the server again
        // once `recheck_seconds` have passed since its last real result:
        // the job may have finished, the service come back.
        let verdict = judge::judge(cfg, &recent.entries, call.digest).filter(|v| {
            !v.step.answers() || now.saturating_sub(recent.last_real_ms) < cfg.recheck_ms
        });
        let shadow = policy.mode == Mode::Shadow;
        match &verdict {
            Some(v) if shadow => {
                self.acted_on(r, (index, policy), &call.tool, v, id.key, now, out);
                let tool = crate::detect::tool_loops::safe_tool_name(&call.tool);
                let count = ("count", v.occurrences);
                let line = verdict_line("mcp loop", &policy.id, v, Some(tool), count);
                self.shadow(line, out);
            }
            // Answered instead of the server, and the answer added to the
            // history (the loop goes on climbing while the call repeats);
            // with a shared store, the answer goes once the store has it.
            Some(v) if v.step != McpStep::Note => {
                r.mcp = None;
                let Some(reply) = mcp_reply::reply(cfg, &policy.id, &call.id, &call.tool, v) else {
                    return Step::Continue;
                };
                self.acted_on(r, (index, policy), &call.tool, v, id.key, now, out);
                let answered = Entry {
                    call: call.digest,
                    answered: true,
                    unread: false,
                    ..v.evidence.expected
                };
                let snapshot = recent.snapshot;
                let write =
                    self.record_call((index, policy), cfg, id, answered, snapshot, now, out);
                let Some((write, call)) = write.and_then(|w| self.write_call(&w).map(|c| (w, c)))
                else {
                    return self.answer(r, None, reply, ANSWERED, out);
                };
                let wait = McpWait::Answer(Box::new(reply), write);
                return self.ask(r, call, Ask::Mcp(wait), out);
            }
            _ => {}
        }
        // Forwarded. A note goes into the result if it is the same again
        // (counted and reported then). Only `content` can be compared as it
        // passes: a loop whose result had structured content gets no note
        // (that content may be what changes).
        let noted =
            verdict.filter(|v| !shadow && response::mcp::has_only_content(&v.evidence.expected));
        if let Some(s) = r.mcp.as_mut() {
            s.call = Some(Forwarded {
                id,
                digest: call.digest,
                tool: call.tool,
                noted,
                snapshot: recent.snapshot,
                note_added: false,
            });
        }
        Step::Continue
    }

    /// The shared store's answer to the MCP request's call (or why none
    /// came): judge the call by the history read (by this replica's own
    /// when the store failed and `store.on_error` is `local`; passed
    /// unjudged when `allow`), or send loopguard's answer now that the
    /// store has it.
    pub(super) fn on_mcp_answer(
        &mut self,
        r: &mut Request,
        w: McpWait,
        answer: Answer<'_>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let (id, call) = match w {
            McpWait::Answer(reply_to_client, write) => {
                self.write_done(&write, answer, out);
                return self.answer(r, None, *reply_to_client, ANSWERED, out);
            }
            McpWait::History(id, call) => (id, call),
        };
        let read = answer.and_then(|reply| parse_history(reply.status.as_deref(), &reply.body));
        self.count_call(read.as_ref().err(), out);
        let config = Rc::clone(&self.config);
        let Some(index) = r.mcp.as_ref().map(|s| s.policy) else {
            return Step::Continue;
        };
        let Some((policy, cfg)) = policy_with(&config, index, |p| p.mcp.as_ref()) else {
            return Step::Continue;
        };
        let local = "MCP calls are judged by this replica's histories";
        let recent = match read {
            Ok(recent) => recent,
            Err(f) => match self.store_fallback(&f, local, "MCP calls are", now, out) {
                OnStoreError::Local => self.local_history(policy, cfg, id, now, out),
                // Passed unjudged: judged as a first call.
                OnStoreError::Allow => {
                    out.push(unjudged(&policy.id, McpUnjudged::Store));
                    Recent::default()
                }
            },
        };
        self.judge_mcp(r, (index, policy), cfg, call, id, recent, now, out)
    }

    /// Add a call to its history: in the local table (a live history
    /// pushed out is counted), and with a shared store, the write that adds
    /// it there.
    #[allow(clippy::too_many_arguments)]
    fn record_call(
        &mut self,
        (index, policy): (usize, &Policy),
        cfg: &Mcp,
        id: HistoryId,
        entry: Entry,
        snapshot: Option<(Vec<u8>, u32)>,
        now: u64,
        out: &mut Effects,
    ) -> Option<Write> {
        let backend = &mut self.local.backend;
        match mcp_sessions::append_after(backend, id, entry, now, cfg.window_ms, snapshot) {
            Ok(added) if added.evicted => out.push(Effect::CountNamed(m::evicted(&policy.id), 1)),
            Ok(_) => {}
            Err(_) => out.push(unjudged(&policy.id, McpUnjudged::Store)),
        }
        self.shared.as_ref()?;
        Some(Write::Mcp {
            policy: index,
            key: id.key,
            entry,
            window_ms: cfg.window_ms,
            at: now,
        })
    }

    /// A loop was acted on (a note added, the call answered; in shadow
    /// mode, would have been): the caller's loop request, the event (once
    /// per window), the loops (or shadow) counter, the access-log record.
    #[allow(clippy::too_many_arguments)]
    fn acted_on(
        &mut self,
        r: &mut Request,
        (index, policy): (usize, &Policy),
        tool: &str,
        v: &McpVerdict,
        key: u64,
        now: u64,
        out: &mut Effects,
    ) {
        let shadow = policy.mode == Mode::Shadow;
        self.note_in_loop(r, index, out);
        // One event line per history, tier and level within a window
        // (across workers too).
        let mut h = crate::request::Fnv(key);
        h.write(b"mcp-event");
        h.write(v.tier.as_str().as_bytes());
        h.write(&v.level.to_le_bytes());
        if self.first_event(event_key(h.0, key), now) {
            let tool = Some(crate::detect::tool_loops::safe_tool_name(tool));
            let caller = usage::caller_tag(r.caller);
            let name = "loop.mcp.detected";
            let event = events::verdict_event(name, &policy.id, v, tool, shadow, Some(&caller));
            self.emit_event(&event, true, now, out);
        }
        let counter = m::loops(&policy.id, shadow, v.tier, v.step);
        out.push(Effect::CountNamed(counter, 1));
        let header = mcp_reply::header_value(tool, v);
        let step = v.step.as_str();
        self.publish_decision(out, (policy, true), step, || [("tool_loop", json!(header))]);
    }

    /// The stream ended: a call that went on and whose result was not read
    /// to its end (the client left, the stream was cut) joins its history
    /// as unread, so it is never a repeat and breaks the run it was in.
    pub(super) fn mcp_done(&mut self, r: &mut Request, out: &mut Effects) {
        if r.mcp.as_ref().is_some_and(|s| s.call.is_some()) {
            let at = r.started_ms;
            self.finish_mcp(r, Seen::Unreadable, at, false, out);
        }
    }

    /// A body too large to judge (`max_body_bytes`): an MCP call passes
    /// unjudged, counted as such.
    pub(super) fn mcp_too_large(&mut self, r: &mut Request, out: &mut Effects) {
        let policy = r.mcp.take().map(|s| s.policy);
        if let Some(p) = policy.and_then(|i| self.config.policies.get(i)) {
            out.push(unjudged(&p.id, McpUnjudged::TooLarge));
        }
    }

    /// The response's content type: a result to read (a JSON body or an
    /// event stream with a 200), or one that cannot be read (recorded as
    /// such: never a repeat).
    pub(super) fn mcp_content_type(
        &mut self,
        r: &mut Request,
        content_type: Option<&str>,
        now: u64,
        out: &mut Effects,
    ) {
        let Some(s) = r.mcp.as_mut() else {
            return;
        };
        let Some(f) = s.call.as_ref() else {
            return;
        };
        let config = Rc::clone(&self.config);
        let Some(cfg) = config.policies.get(s.policy).and_then(|p| p.mcp.as_ref()) else {
            return;
        };
        // Any status: a JSON-RPC error may come with a 4xx or a 429.
        let framing = Framing::of(content_type).filter(|_| s.status.is_some());
        let Some(framing) = framing else {
            self.finish_mcp(r, Seen::Unreadable, now, false, out);
            return;
        };
        let note = f.noted.as_ref().map(|v| NotePlan {
            expected_content: v.evidence.expected.content,
            text: mcp_reply::note_text(cfg, &f.tool, v),
        });
        if note.is_some() {
            // The note changes the body's length.
            out.push(Effect::RemoveResponseHeader("content-length"));
        }
        let reader = ResultReader::new(framing, cfg.result_classes, note);
        s.reader = Some(reader.with_memo(Rc::clone(&self.mcp_memo)));
    }

    /// A chunk of an MCP result.
    pub(super) fn mcp_body(
        &mut self,
        r: &mut Request,
        chunk: &[u8],
        end_of_stream: bool,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let s = r.mcp.as_deref_mut();
        let Some((reader, call)) = s.and_then(|s| Some((s.reader.as_mut()?, &mut s.call))) else {
            return Step::Continue;
        };
        let fed = reader.feed(chunk, end_of_stream);
        if let Some((at, bytes)) = fed.insert {
            let (head, tail) = chunk.split_at_checked(at).unwrap_or((chunk, &[]));
            let body = [head, &bytes, tail].concat();
            out.push(Effect::ReplaceResponseBody {
                old_len: chunk.len(),
                body,
            });
            if let Some(f) = call {
                f.note_added = true;
            }
        }
        match fed.seen {
            Some(seen) => self.finish_mcp(r, seen, now, true, out),
            None => Step::Continue,
        }
    }

    /// The result is read (or cannot be): add the call and what it got to
    /// its history (`hold`: the response's end waits until the shared
    /// store has it); report a note that was added.
    fn finish_mcp(
        &mut self,
        r: &mut Request,
        seen: Seen,
        now: u64,
        hold: bool,
        out: &mut Effects,
    ) -> Step {
        let Some(s) = r.mcp.take() else {
            return Step::Continue;
        };
        let Some(f) = s.call else {
            return Step::Continue;
        };
        let config = Rc::clone(&self.config);
        let Some((policy, cfg)) = policy_with(&config, s.policy, |p| p.mcp.as_ref()) else {
            return Step::Continue;
        };
        // With an HTTP error status only a JSON-RPC error is a result (a
        // `result` there is no answer the client will use).
        let ok = s.status.is_some_and(|st| (200..300).contains(&st));
        let entry = match seen {
            Seen::Result(o) if ok || o.rpc_error => Entry {
                call: f.digest,
                result: o.result,
                content: o.content,
                failed: o.failed,
                ..Entry::default()
            },
            _ => {
                out.push(unjudged(&policy.id, McpUnjudged::ResultUnreadable));
                Entry {
                    call: f.digest,
                    unread: true,
                    ..Entry::default()
                }
            }
        };
        if let (true, Some(v)) = (f.note_added, f.noted.as_ref()) {
            self.acted_on(r, (s.policy, policy), &f.tool, v, f.id.key, now, out);
        }
        let write = self.record_call((s.policy, policy), cfg, f.id, entry, f.snapshot, now, out);
        write.map_or(Step::Continue, |w| self.send_write(r, w, hold, out))
    }
}
