//! Shared-store writes whose answer decides nothing for the request: a
//! failed attempt's hit taken back, a response's spending added to its
//! budget keys, an MCP call and its result added to its history. One path
//! for all of them: a write is sent held (the response's end waits for
//! it, so the client's next request finds it on any replica) or from the
//! root context at the tick (its stream is gone, or nothing may wait); a
//! `NOSCRIPT` answer sends it once more with the whole script; a write
//! lost or failed is counted as what it was for (the local table has it).

use crate::detect::mcp::Entry;
use crate::flow::store::asks::{Answer, Ask};
use crate::flow::{budget, count, count_opt, Effect, Effects, Engine, Request, Step};
use crate::metrics::mcp::McpUnjudged;
use crate::metrics::CallResult;
use crate::state::redis::{self, Call};
use crate::state::store::{BucketBackend, TakeBack};

/// What a write is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::flow) enum Write {
    /// Take back a failed attempt's hit.
    TakeBack { policy: usize, what: TakeBack },
    /// Add a response's spending to its budget keys.
    Budget(budget::BudgetAdd),
    /// Add an MCP call (and what it got) to its history.
    Mcp {
        policy: usize,
        key: u64,
        entry: Entry,
        window_ms: u64,
        at: u64,
    },
}

/// A write on its way: sent once more with the whole script after a
/// `NOSCRIPT` (at most once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::flow) struct Sending {
    pub(in crate::flow) write: Write,
    pub(in crate::flow) resent: bool,
}

/// Writes waiting for the tick or for their answers, at most (more are
/// counted as lost).
pub(in crate::flow) const MAX_ROOT_WRITES: usize = 2048;

impl<B: BucketBackend> Engine<B> {
    /// The library call of a write (`None`: no shared store).
    pub(in crate::flow) fn write_call(&self, w: &Write) -> Option<Call> {
        let shared = self.shared.as_ref()?;
        Some(match w {
            Write::TakeBack { what, .. } => shared.take_back_of(what),
            Write::Budget(a) => shared.budget_of(a.caller, &a.keys, a.at),
            Write::Mcp {
                key,
                entry,
                window_ms,
                at,
                ..
            } => shared.mcp_of(*key, *window_ms, *at, Some(entry)),
        })
    }

    /// Send `write` for this request: held (`Step::Pause`: the response
    /// goes on when the store answered, or the call failed, within
    /// `store.timeout_ms`), or from the root context at the tick.
    pub(in crate::flow) fn send_write(
        &mut self,
        r: &mut Request,
        write: Write,
        hold: bool,
        out: &mut Effects,
    ) -> Step {
        if !hold {
            self.queue_write(write, false, out);
            return Step::Continue;
        }
        match self.write_call(&write) {
            Some(call) => self.ask(r, call, Ask::Held(write), out),
            None => Step::Continue,
        }
    }

    /// Queue a write for the root context (sent at the tick; `resent`:
    /// with the whole script).
    fn queue_write(&mut self, write: Write, resent: bool, out: &mut Effects) {
        let calls = &self.root_calls;
        if calls.queued.len() + calls.awaiting.len() >= MAX_ROOT_WRITES {
            self.write_lost(&write, out);
            return;
        }
        if let (Some(call), Some(shared)) = (self.write_call(&write), self.shared.as_ref()) {
            let call = shared.send(&call, resent);
            let sending = Sending { write, resent };
            self.root_calls.queued.push_back((sending, call));
            out.push(Effect::ArmTick);
        }
    }

    /// A held write's answer (or why none came).
    pub(in crate::flow) fn write_done(&mut self, w: &Write, answer: Answer<'_>, out: &mut Effects) {
        match answer {
            Ok(reply) => self.write_answered(w, reply.status.as_deref(), &reply.body, out),
            Err(f) => {
                self.count_call(Some(&f), out);
                self.write_lost(w, out);
            }
        }
    }

    /// A root write was sent (`token`) or could not be.
    pub(in crate::flow) fn on_root_write_sent(
        &mut self,
        sending: Sending,
        sent: Result<u32, String>,
        out: &mut Effects,
    ) {
        match sent {
            Ok(token) if self.root_calls.awaiting.len() < MAX_ROOT_WRITES => {
                self.root_calls.awaiting.push_back((token, sending));
            }
            _ => self.write_lost(&sending.write, out),
        }
    }

    /// The answer to a root write (`false`: `token` is no write's).
    pub(in crate::flow) fn on_root_write_reply(
        &mut self,
        token: u32,
        status: Option<&str>,
        body: &[u8],
        out: &mut Effects,
    ) -> bool {
        let awaiting = &mut self.root_calls.awaiting;
        let Some(i) = awaiting.iter().position(|(t, _)| *t == token) else {
            return false;
        };
        let Some((_, sending)) = awaiting.remove(i) else {
            return true;
        };
        // The node had not cached the script: the write again with it.
        if !sending.resent
            && self
                .shared
                .as_ref()
                .is_some_and(|sh| sh.needs_script(status, body))
        {
            out.push(count(self.registry.store_call(CallResult::NoScript), 1));
            self.queue_write(sending.write, true, out);
            return true;
        }
        self.write_answered(&sending.write, status, body, out);
        true
    }

    /// A write's answer: counted, and a failure as what it was for.
    fn write_answered(&mut self, w: &Write, status: Option<&str>, body: &[u8], out: &mut Effects) {
        let failure = match w {
            Write::TakeBack { policy, .. } => {
                let answer = status
                    .ok_or_else(redis::no_answer)
                    .and_then(|s| redis::parse_take_back(s, body));
                self.count_call(answer.as_ref().err(), out);
                count_opt(out, self.registry.failed_attempt(*policy, answer.ok()), 1);
                return;
            }
            Write::Budget(a) => redis::budget::budget_answer(status, body, a.keys.len()).err(),
            Write::Mcp { .. } => redis::mcp::parse_added(status, body).err(),
        };
        self.count_call(failure.as_ref(), out);
        if failure.is_some() {
            self.write_lost(w, out);
        }
    }

    /// A write that could not be sent or answered (the local table has
    /// it): counted as what it was for.
    pub(in crate::flow) fn write_lost(&self, w: &Write, out: &mut Effects) {
        match w {
            Write::TakeBack { policy, .. } => {
                count_opt(out, self.registry.failed_attempt(*policy, None), 1)
            }
            Write::Budget(a) => {
                let ids = self.registry.budget(a.policy);
                count_opt(out, ids.map(|i| i.unrecorded()), 1);
            }
            Write::Mcp { policy, .. } => {
                if let Some(p) = self.config.policies.get(*policy) {
                    out.push(crate::flow::mcp::unjudged(&p.id, McpUnjudged::Store));
                }
            }
        }
    }
}
