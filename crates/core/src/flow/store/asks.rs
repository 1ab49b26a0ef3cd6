//! A request waiting for the shared store, one way for every guard: the
//! engine sends a call of the Lua library, the host reports it sent (its
//! token) or not, the answer comes (or none does), a Redis Cluster node
//! without the script gets the call once more in full; then the guard
//! that asked reads the answer: a loop's hit, a budget check, an MCP
//! history, or a write the response's end waits for.

use crate::flow::store::writes::Write;
use crate::flow::{count, Effect, Effects, Engine, Request, State, Step};
use crate::metrics::CallResult;
use crate::state::redis::Call;
use crate::state::store::{BucketBackend, CallReply, StoreFailure};

/// A request's call to the shared store, and what it is for.
#[derive(Debug)]
pub(in crate::flow) struct Asking {
    /// The call's token, once the host has sent it.
    token: Option<u32>,
    /// Sent again with the whole script after a `NOSCRIPT` (at most once).
    resent: bool,
    call: Call,
    pub(in crate::flow) what: Ask,
}

/// What a request waits for.
#[derive(Debug)]
pub(in crate::flow) enum Ask {
    /// Its loop hit's window state.
    Hit(Box<crate::flow::Waiting>),
    /// Its budget keys' standings.
    Budget(crate::flow::budget::BudgetWait),
    /// An MCP call's history, or the store to have loopguard's answer.
    Mcp(crate::flow::mcp::McpWait),
    /// The store to have a write (the response's end waits).
    Held(Write),
}

/// The answer a request's call got: the reply, or why none came.
pub(in crate::flow) type Answer<'a> = Result<&'a CallReply, StoreFailure>;

impl<B: BucketBackend> Engine<B> {
    /// Send `call` for the request, which waits for its answer
    /// ([`Step::Pause`]; [`Step::Continue`] without a shared store).
    pub(in crate::flow) fn ask(
        &mut self,
        r: &mut Request,
        call: Call,
        what: Ask,
        out: &mut Effects,
    ) -> Step {
        let Some(shared) = self.shared.as_ref() else {
            return Step::Continue;
        };
        out.push(Effect::SendStoreCall(shared.send(&call, false)));
        r.state = State::Asking(Box::new(Asking {
            token: None,
            resent: false,
            call,
            what,
        }));
        Step::Pause
    }

    /// The host sent the store call ([`Effect::SendStoreCall`]) and got
    /// `token`, or could not send it.
    pub fn on_call_sent(
        &mut self,
        r: &mut Request,
        sent: Result<u32, String>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let State::Asking(a) = &mut r.state else {
            return Step::Continue;
        };
        match sent {
            Ok(token) => {
                a.token = Some(token);
                Step::Pause
            }
            Err(why) => self.answered(r, Err(StoreFailure::Unavailable(why)), now, out),
        }
    }

    /// The reply to the store call `token` arrived. [`Step::Continue`]:
    /// resume the request (or the response whose end waited); [`Step::Pause`]:
    /// leave it as it is (held by a throttle, answered by loopguard, or the
    /// reply is not this request's).
    pub fn on_store_reply(
        &mut self,
        r: &mut Request,
        token: u32,
        reply: &CallReply,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let State::Asking(a) = &mut r.state else {
            // The request is gone (its client left), or never asked.
            return Step::Pause;
        };
        if a.token != Some(token) {
            return Step::Pause;
        }
        // A Redis Cluster node without the script (a promoted replica, a
        // restarted node): the call once more with the whole script, which
        // also caches it there.
        if let Some(shared) = self.shared.as_ref() {
            if !a.resent && shared.needs_script(reply.status.as_deref(), &reply.body) {
                out.push(count(self.registry.store_call(CallResult::NoScript), 1));
                out.push(Effect::SendStoreCall(shared.send(&a.call, true)));
                a.resent = true;
                a.token = None;
                return Step::Pause;
            }
        }
        self.answered(r, Ok(reply), now, out)
    }

    /// Count a store call's outcome (`store_calls_total{result}`), read
    /// by the guard that sent it.
    pub(in crate::flow) fn count_call(&self, failure: Option<&StoreFailure>, out: &mut Effects) {
        out.push(count(self.registry.store_call(CallResult::of(failure)), 1));
    }

    /// The request stops asking; the guard that asked reads the answer.
    fn answered(
        &mut self,
        r: &mut Request,
        answer: Answer<'_>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let State::Asking(a) = std::mem::take(&mut r.state) else {
            return Step::Continue;
        };
        match a.what {
            Ask::Hit(w) => self.on_hit_answer(r, *w, answer, now, out),
            Ask::Budget(w) => self.on_budget_answer(r, w, answer, now, out),
            Ask::Mcp(w) => self.on_mcp_answer(r, w, answer, now, out),
            Ask::Held(write) => {
                self.write_done(&write, answer, out);
                Step::Continue
            }
        }
    }
}
