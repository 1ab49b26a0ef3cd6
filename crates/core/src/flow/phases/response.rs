//! The response headers: what the client should see of the decision, and
//! whether the provider failed the attempt (its hit is then taken back: an
//! SDK retrying it is not looping). The shared store is told from the root
//! context at the next tick, so the answer is counted even when the stream
//! is long gone.

use crate::flow::store::writes;
use crate::flow::{count, count_opt, Effect, Effects, Engine, Request, RootCall};
use crate::metrics::WebhookResult;
use crate::response;
use crate::state::store::BucketBackend;

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
        if let Some(s) = r.mcp.as_mut() {
            s.status = status;
        }
        self.budget_status(r, status);
        let Some(counted) = r.counted.take() else {
            return;
        };
        if !status.is_some_and(response::failed_attempt) || counted.take_back.forgiveness.max == 0 {
            return;
        }
        if !counted.shared {
            let forgave = self.local.take_back(&counted.take_back, now).ok();
            let id = self.registry.failed_attempt(counted.policy, forgave);
            return count_opt(out, id, 1);
        }
        let write = writes::Write::TakeBack {
            policy: counted.policy,
            what: counted.take_back,
        };
        self.send_write(r, write, false, out);
    }

    /// The host sent the root call `id` ([`Effect::SendFromRoot`]): its
    /// token, or why it could not.
    pub fn on_root_call_sent(
        &mut self,
        id: u32,
        sent: Result<u32, String>,
        now: u64,
        out: &mut Effects,
    ) {
        match (self.root_calls.reported(id), sent) {
            (Some(RootCall::Write(w)), sent) => self.on_root_write_sent(w, sent, out),
            // The host could not send an alert.
            (Some(RootCall::Alert), Err(why)) => {
                let webhook = self.alerts.webhook.as_ref();
                let cluster = webhook.map_or("", |w| w.cluster.as_str());
                let why = format!("cannot call cluster \"{cluster}\" ({why})");
                self.webhook_failed(&why, now, out);
            }
            _ => {}
        }
    }

    /// The answer to a call sent from the root context: a write's is
    /// counted, any other is an alert's (its `:status`, or `None` when
    /// none came).
    pub fn on_root_reply(
        &mut self,
        token: u32,
        status: Option<&str>,
        body: &[u8],
        now: u64,
        out: &mut Effects,
    ) {
        if self.on_root_write_reply(token, status, body, out) {
            return;
        }
        match status {
            None => {
                self.webhook_failed("no response (timeout, reset or no healthy host)", now, out)
            }
            Some(s) if s.starts_with('2') => {
                out.push(count(self.registry.webhook(WebhookResult::Sent), 1));
            }
            Some(s) => self.webhook_failed(&format!("receiver answered {s}"), now, out),
        }
    }
}
