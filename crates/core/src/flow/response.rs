//! The response headers: what the client should see of the decision, and
//! whether the provider failed the attempt (its hit is then taken back: an
//! SDK retrying it is not looping). The shared store is told from the root
//! context at the next tick, so the answer is counted even when the stream
//! is long gone.

use super::*;
use crate::response;
use crate::state::redis;

impl<B: BucketBackend> Engine<B> {
    /// The response headers are on their way to the client (`status`: its
    /// `:status`): add what the decision says the client should see, and
    /// take the request's hit back if the provider failed the attempt.
    pub fn on_response_headers(
        &mut self,
        r: &mut Request,
        status: Option<u32>,
        now: u64,
        out: &mut Effects,
    ) {
        for (name, value) in std::mem::take(&mut r.response_headers) {
            out.push(Effect::AddResponseHeader(name, value));
        }
        self.mcp_response_status(r, status);
        self.budget_status(r, status);
        let Some(counted) = r.counted.take() else {
            return;
        };
        if !status.is_some_and(response::failed_attempt) || counted.take_back.forgiveness.max == 0 {
            return;
        }
        if !counted.shared {
            let forgave = self.local.take_back(&counted.take_back, now).ok();
            count_opt(
                out,
                self.registry.failed_attempt(counted.policy, forgave),
                1,
            );
            return;
        }
        let Some(shared) = &self.shared else {
            return;
        };
        let calls = &mut self.root_calls;
        if calls.take_backs() >= MAX_TAKE_BACKS {
            count_opt(out, self.registry.failed_attempt(counted.policy, None), 1);
            return;
        }
        let call = TakeBackCall {
            policy: counted.policy,
            what: counted.take_back,
            resent: false,
        };
        calls.queued.push_back((
            StoreRootCall::TakeBack(call),
            shared.take_back(&counted.take_back),
        ));
        out.push(Effect::ArmTick);
    }

    /// Queue a response's spending for the shared store, sent from the
    /// root context at the tick (its stream is ending).
    pub(super) fn queue_budget_add(&mut self, add: budget::BudgetAdd, out: &mut Effects) {
        if let Some(call) = self.budget_add_call(&add) {
            self.root_calls
                .queued
                .push_back((StoreRootCall::BudgetAdd(add), call));
            out.push(Effect::ArmTick);
        }
    }

    /// The tick: send the queued store calls (take-backs, budget adds).
    pub(super) fn send_take_backs(&mut self, out: &mut Effects) {
        while let Some((what, call)) = self.root_calls.queued.pop_front() {
            self.root_calls.sent.push_back(RootCall::Store(what));
            out.push(Effect::SendFromRoot(call));
        }
    }

    /// The host sent a call of the last tick ([`Effect::SendFromRoot`], in
    /// order): its token, or why it could not.
    pub fn on_root_call_sent(&mut self, sent: Result<u32, String>, now: u64, out: &mut Effects) {
        match self.root_calls.sent.pop_front() {
            Some(RootCall::Store(call)) => match sent {
                Ok(token)
                    if self.root_calls.awaiting.len()
                        < MAX_TAKE_BACKS + budget::MAX_BUDGET_ADDS =>
                {
                    self.root_calls.awaiting.push_back((token, call));
                }
                _ => self.store_root_call_lost(&call, out),
            },
            Some(RootCall::Alert) | None => self.on_alert_sent(sent.map(|_| ()), now, out),
        }
    }

    /// A store call from the root context that could not be sent.
    fn store_root_call_lost(&self, call: &StoreRootCall, out: &mut Effects) {
        match call {
            StoreRootCall::TakeBack(c) => {
                count_opt(out, self.registry.failed_attempt(c.policy, None), 1)
            }
            StoreRootCall::BudgetAdd(a) => self.budget_add_lost(a, out),
        }
    }

    /// The answer to a call sent from the root context: a take-back's is
    /// counted, any other is an alert's.
    pub fn on_root_reply(
        &mut self,
        token: u32,
        status: Option<&str>,
        body: &[u8],
        now: u64,
        out: &mut Effects,
    ) {
        let awaiting = &mut self.root_calls.awaiting;
        let Some(i) = awaiting.iter().position(|(t, _)| *t == token) else {
            self.on_alert_reply(status, now, out);
            return;
        };
        let Some((_, call)) = awaiting.remove(i) else {
            return;
        };
        let call = match call {
            StoreRootCall::TakeBack(c) => c,
            StoreRootCall::BudgetAdd(a) => {
                if !a.resent {
                    if let Some(again) = self.budget_add_resend(&a, status, body) {
                        let a = budget::BudgetAdd { resent: true, ..a };
                        self.root_calls
                            .queued
                            .push_back((StoreRootCall::BudgetAdd(a), again));
                        out.push(Effect::ArmTick);
                        return;
                    }
                }
                self.on_budget_add_reply(&a, status, body, out);
                return;
            }
        };
        if !call.resent {
            // A node without the script (a promoted replica): once more,
            // with the whole script, at the next tick.
            let resend = self
                .shared
                .as_ref()
                .and_then(|shared| shared.resend_take_back(&call.what, status, body));
            if let Some(again) = resend {
                if self.root_calls.take_backs() < MAX_TAKE_BACKS {
                    let call = TakeBackCall {
                        resent: true,
                        ..call
                    };
                    self.root_calls
                        .queued
                        .push_back((StoreRootCall::TakeBack(call), again));
                    out.push(Effect::ArmTick);
                    return;
                }
            }
        }
        let forgave = status.and_then(|s| redis::parse_take_back(s, body).ok());
        count_opt(out, self.registry.failed_attempt(call.policy, forgave), 1);
    }
}
