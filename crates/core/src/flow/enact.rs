//! Enacting a verdict, one way for every guard (repeats, tool loops, MCP,
//! budgets). What differs per guard is its reply's words and its header
//! (built in `act/`); how each is carried out is here:
//!
//! - **forwarded with the guard's header**: the upstream sees it (as the
//!   request header while loopguard holds the request headers, and through
//!   filter state for a later `header_mutation`), and so does the client;
//! - **answered** instead of the upstream: the request never goes up, so
//!   nothing is taken back or charged to it;
//! - **shadow mode**: the line of what would have been done;
//! - **the event**: logged, and alerted, once per key within
//!   [`EVENT_WINDOW_MS`] across the Envoy's workers, a loop's with what it
//!   has spent;
//! - **the access-log record**: published in filter state as the
//!   configuration's `access_log` says.

use super::{
    count, count_opt, usage, Effect, Effects, Engine, Level, Phase, Request, Step,
    MAX_QUEUED_ALERTS,
};
use crate::act::events;
use crate::act::reply::{self, LocalReply};
use crate::config::Policy;
use crate::detect::fingerprint::Fingerprint;
use crate::metrics::WebhookResult;
use crate::state::store::{BucketBackend, Hit, StoreAnswer};
use crate::state::window::WindowQuery;
use serde_json::Value;

/// A verdict's event is logged once per key within this window.
pub(super) const EVENT_WINDOW_MS: u64 = 60_000;

/// An event's key from two numbers (a guard's own hash and the key it
/// judged under).
pub(super) fn event_key(a: u64, b: u64) -> Fingerprint {
    // `a`'s little-endian bytes, then `b`'s.
    Fingerprint((u128::from(a) | (u128::from(b) << 64)).to_le_bytes())
}

impl<B: BucketBackend> Engine<B> {
    /// Whether the event under `key` is the first within
    /// [`EVENT_WINDOW_MS`]: remembered in the shared table, so across
    /// workers too (a table that cannot answer lets it through).
    pub(super) fn first_event(&mut self, key: Fingerprint, now: u64) -> bool {
        let once = WindowQuery {
            window_ms: EVENT_WINDOW_MS,
            capacity: 1,
            trip_at: 2,
            cooldown_ms: 0,
            detect_at: 1,
            event_every_ms: EVENT_WINDOW_MS,
        };
        match self.local.record(&Hit::exact(key, now, once)) {
            StoreAnswer::Ready(r) => r.state.event.is_some(),
            StoreAnswer::Failed(_) => true,
        }
    }

    /// A loop event's caller and, under `key`, what the loop has spent so
    /// far (its tokens, and dollars when `prices` are set).
    pub(super) fn add_spend(&mut self, event: &mut Value, caller: u64, key: Option<u64>, now: u64) {
        // Loop `key`'s spending so far in this process.
        let spend = key.and_then(|k| self.ledger.spend(&mut self.local.backend, k, now));
        let priced = !self.config.prices.models.is_empty();
        events::add_spend(event, &usage::caller_tag(caller), spend.as_ref(), priced);
    }

    /// Log a verdict's event; with `alert` (and a webhook configured),
    /// queue it for the webhook too: the tick sends it, as a finished
    /// stream cannot wait for the call's answer.
    pub(super) fn emit_event(&mut self, event: &Value, alert: bool, now: u64, out: &mut Effects) {
        out.push(Effect::Log(Level::Info, event.to_string()));
        if !alert || self.alerts.webhook.is_none() {
            return;
        }
        if self.alerts.queue.len() >= MAX_QUEUED_ALERTS {
            out.push(count(self.registry.webhook(WebhookResult::Dropped), 1));
            return;
        }
        let alert = events::alert(event, now, self.alerts.secret.as_deref());
        self.alerts.queue.push_back(alert);
        out.push(Effect::ArmTick);
    }

    /// Forward the request carrying a guard's header: to the upstream (the
    /// header itself while the request headers can be changed; with `state`,
    /// also in filter state, which a later `header_mutation` copies into
    /// the request) and to the client, with the response.
    pub(super) fn carry(
        &self,
        r: &mut Request,
        phase: Phase,
        (name, value): (&'static str, String),
        state: bool,
        out: &mut Effects,
    ) {
        if state {
            let state_name = reply::filter_state_name(name);
            out.push(Effect::SetFilterState(state_name, value.clone()));
        }
        if phase == Phase::HeadersHeld {
            out.push(Effect::AddRequestHeader(name, value.clone()));
        }
        r.response_headers.push((name, value));
    }

    /// Answer instead of the upstream. The request never goes up: no hit
    /// of it is taken back and no response of it is charged. `rejected`:
    /// the policy whose rejections it counts.
    pub(super) fn answer(
        &self,
        r: &mut Request,
        rejected: Option<usize>,
        reply: LocalReply,
        detail: &'static str,
        out: &mut Effects,
    ) -> Step {
        r.counted = None;
        r.usage_for = None;
        if let Some(index) = rejected {
            count_opt(out, self.registry.rejected(index), 1);
        }
        out.push(Effect::LocalReply(reply, detail));
        Step::Pause
    }

    /// Shadow mode: the line of what would have been done.
    pub(super) fn shadow(&self, line: String, out: &mut Effects) {
        out.push(Effect::Log(Level::Info, line));
    }

    /// The decision's access-log record in filter state (`loopguard`):
    /// every request's with `access_log: all`, those acted on with
    /// `actions`. `action` and the guard's `fields` (built only when the
    /// record is published) go into [`events::access_log`].
    pub(super) fn publish_decision<const N: usize>(
        &self,
        out: &mut Effects,
        (policy, acted): (&Policy, bool),
        action: &str,
        fields: impl FnOnce() -> [(&'static str, Value); N],
    ) {
        use crate::config::AccessLog;
        let publish = match self.config.access_log {
            AccessLog::All => true,
            AccessLog::Actions => acted,
            AccessLog::Off => false,
        };
        if publish {
            let record = events::access_log(&policy.id, policy.mode, action, fields());
            out.push(Effect::SetFilterState("loopguard".to_string(), record));
        }
    }
}
