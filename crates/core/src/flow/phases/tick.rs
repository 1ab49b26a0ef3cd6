//! Time and endings: the tick that resumes throttled requests, releases
//! held ones the probe gave up on and sends alerts; a client that left.

use crate::act::events;
use crate::act::hold::{HOLD_PROBE_MS, MISSES_TO_STOP, REPROBE_MS};
use crate::flow::store::writes;
use crate::flow::{
    count, Effect, Effects, Engine, Level, LogLimits, MetricId, Request, RootCall, State,
    ALERTS_PER_TICK,
};
use crate::metrics::WebhookResult;
use crate::state::store::{BucketBackend, StoreCall};

impl<B: BucketBackend> Engine<B> {
    /// The stream ended (answered, or its client left): forget it wherever
    /// it waits.
    pub fn on_done(&mut self, r: &mut Request, out: &mut Effects) {
        // A throttled request still waiting never went upstream; one the
        // tick resumed did (it stays Held).
        let waiting = matches!(r.state, State::Held) && self.throttled.remove(r.id);
        if waiting {
            out.push(count(MetricId::THROTTLE_PENDING, -1));
        }
        // A response cut short still reported what it had read; one
        // forwarded, but gone before its answer's headers (no usage read;
        // `usage_for` left), may be billed all the same (estimated). Its
        // spending goes to the shared store from the tick.
        let forwarded =
            matches!(r.state, State::Pass) || (matches!(r.state, State::Held) && !waiting);
        let mut add = self.finish_usage(r, false, out);
        if forwarded && r.usage_for.take().is_some() {
            add = self.budget_spend(r, None, false, Default::default(), None, out);
        }
        if let Some(add) = add {
            self.send_write(r, writes::Write::Budget(add), false, out);
        }
        self.mcp_done(r, out);
        if r.headers_held {
            self.hold.forget(r.id);
        }
        r.state = State::Done;
    }

    /// The tick: send queued alerts, release held requests the probe gave
    /// up on, resume throttled requests whose time has come; stop the tick
    /// when nothing waits.
    pub fn on_tick(&mut self, now: u64, out: &mut Effects) {
        let sent = self.alerts.queue.len().min(ALERTS_PER_TICK);
        if let Some(webhook) = &self.alerts.webhook {
            for alert in self.alerts.queue.drain(..sent) {
                let call = StoreCall {
                    cluster: webhook.cluster.clone(),
                    headers: events::alert_headers(webhook, &alert),
                    body: alert.body.into_bytes(),
                    timeout_ms: webhook.timeout_ms,
                };
                out.push(self.root_calls.send(RootCall::Alert, call));
            }
        }
        while let Some((what, call)) = self.root_calls.queued.pop_front() {
            out.push(self.root_calls.send(RootCall::Write(what), call));
        }
        let released = self.hold.due(now);
        if released.turned_off {
            let secs = REPROBE_MS / 1000;
            let line = format!("hold_request_headers is set, but Envoy delivered no body to {MISSES_TO_STOP} requests held in the headers phase within {HOLD_PROBE_MS} ms each: set allow_on_headers_stop_iteration: true in the Wasm filter's config (Envoy 1.35+), or remove hold_request_headers and place the buffer filter after loopguard. For the next {secs} s requests are judged after their headers went upstream; then holding is tried again.");
            out.push(Effect::Log(Level::Error, line));
        }
        for stream in released.streams {
            out.push(count(MetricId::HOLD_RELEASED, 1));
            out.push(Effect::Resume(stream));
        }
        let due = self.throttled.take_due(now);
        if !due.is_empty() {
            let n = i64::try_from(due.len()).unwrap_or(i64::MAX);
            out.push(count(MetricId::THROTTLE_PENDING, -n));
        }
        out.extend(due.into_iter().map(Effect::Resume));
        if self.throttled.is_empty()
            && self.alerts.queue.is_empty()
            && self.root_calls.queued.is_empty()
            && !self.hold.watching()
        {
            out.push(Effect::StopTick);
        }
    }

    pub(in crate::flow) fn webhook_failed(&mut self, why: &str, now: u64, out: &mut Effects) {
        out.push(count(self.registry.webhook(WebhookResult::Failed), 1));
        if LogLimits::allow(&mut self.logs.webhook, now) {
            let line = format!("webhook alert failed: {why}");
            out.push(Effect::Log(Level::Warn, line));
        }
    }
}
