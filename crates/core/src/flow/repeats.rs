//! Counting a hit and acting on the window state: the local table answers
//! at once; a shared store answers after a call, and when it fails the
//! request is counted locally or passes, as `store.on_error` says.

use super::store::asks::{Answer, Ask};
use super::{
    count, count_opt, policy_with, Counted, Effect, Effects, Engine, Level, LogLimits, MetricId,
    Phase, Request, State, Step, Waiting,
};
use crate::act::decision::{self, Verdict};
use crate::act::{events, reply};
use crate::config::{OnStoreError, StoreConfig};
use crate::detect::fingerprint::Fingerprinted;
use crate::metrics::{SkipReason, WouldBe};
use crate::state::store::{BucketBackend, Hit, StoreAnswer, StoreFailure};
use serde_json::json;
use std::rc::Rc;

impl<B: BucketBackend> Engine<B> {
    /// Record the hit of a finished fingerprint and act on the answer, at
    /// once (the local table) or once the shared store's call returns.
    pub(super) fn count_hit(
        &mut self,
        r: &mut Request,
        policy: usize,
        made: Fingerprinted,
        phase: Phase,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let config = Rc::clone(&self.config);
        let Some((p, detection)) = policy_with(&config, policy, |p| p.detection.as_ref()) else {
            return Step::Continue;
        };
        if made.unparsed {
            out.push(count(self.registry.skipped(SkipReason::Unparsed), 1));
        }
        self.hits = self.hits.wrapping_add(1);
        let hit = decision::hit(p, detection, &made, now, self.hits);
        // A budget reached stops the request before its hit is counted.
        let after = super::budget::After { policy, made, hit };
        match self.budget_gate(r, phase, Some(after), now, out) {
            Ok(Some(after)) => self.record_hit(r, after, phase, now, out),
            Ok(None) => Step::Continue,
            Err(step) => step,
        }
    }

    /// Record a request's hit and act on the answer, at once (the local
    /// table) or once the shared store's call returns.
    pub(super) fn record_hit(
        &mut self,
        r: &mut Request,
        after: super::budget::After,
        phase: Phase,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let super::budget::After { policy, made, hit } = after;
        if policy_with(&self.config, policy, |p| p.detection.as_ref()).is_none() {
            return Step::Continue;
        }
        if let Some(shared) = self.shared.as_ref() {
            let call = shared.hit_of(&hit);
            let waiting = Waiting {
                policy,
                made,
                phase,
                hit,
                since_ms: now,
            };
            return self.ask(r, call, Ask::Hit(Box::new(waiting)), out);
        }
        let answer = self.local.record(&hit);
        r.counted = self.counted_at(policy, &hit, false);
        self.act(r, policy, &made, phase, answer, now, now, out)
    }

    /// The shared store's answer to a request's hit (or why none came):
    /// acted on, or on a failure counted locally or passed, as
    /// `store.on_error` says.
    pub(super) fn on_hit_answer(
        &mut self,
        r: &mut Request,
        w: Waiting,
        answer: Answer<'_>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let answer = match (answer, self.shared.as_mut()) {
            (Ok(reply), Some(shared)) => shared.complete(reply),
            (Ok(_), None) => StoreAnswer::Failed(StoreFailure::Backend),
            (Err(f), _) => StoreAnswer::Failed(f),
        };
        let failure = match &answer {
            StoreAnswer::Ready(_) => None,
            StoreAnswer::Failed(f) => Some(f),
        };
        self.count_call(failure, out);
        // The shared store failed: the hit counted in the local table, or
        // the request passes, as `store.on_error` says.
        let (answer, shared) = match answer {
            StoreAnswer::Failed(f) if f.is_remote() => {
                let local = "requests are counted locally";
                match self.store_fallback(&f, local, "requests are", now, out) {
                    OnStoreError::Local => (self.local.record(&w.hit), false),
                    OnStoreError::Allow => return Step::Continue,
                }
            }
            a => (a, true),
        };
        r.counted = self.counted_at(w.policy, &w.hit, shared);
        self.act(r, w.policy, &w.made, w.phase, answer, w.since_ms, now, out)
    }

    /// What a forwarded request's hit needs to be taken back (`shared`:
    /// recorded in the shared store).
    fn counted_at(&self, policy: usize, hit: &Hit, shared: bool) -> Option<Counted> {
        let (_, detection) = policy_with(&self.config, policy, |p| p.detection.as_ref())?;
        Some(Counted {
            policy,
            take_back: hit.take_back(detection.forgive_failed_attempts),
            shared,
        })
    }

    /// What `store.on_error` says to do when the shared store failed a
    /// call: counted, and logged at most every 10 s as `redis store
    /// <failure>; <local>` or `...; <allow_what> passed unchecked`.
    pub(super) fn store_fallback(
        &mut self,
        failure: &StoreFailure,
        local: &str,
        allow_what: &str,
        now: u64,
        out: &mut Effects,
    ) -> OnStoreError {
        let on_error = match &self.config.store {
            StoreConfig::RedisWebdis(r) => r.on_error,
            StoreConfig::Local => OnStoreError::Allow,
        };
        out.push(count(self.registry.fallback(on_error), 1));
        if LogLimits::allow(&mut self.logs.store_error, now) {
            let fallback = match on_error {
                OnStoreError::Local => local.to_string(),
                OnStoreError::Allow => format!("{allow_what} passed unchecked"),
            };
            let line = format!("redis store {failure}; {fallback}");
            out.push(Effect::Log(Level::Warn, line));
        }
        on_error
    }

    /// Act on the store's answer for a hit (`since`: when the request
    /// started waiting for the store; a throttle's delay counts from
    /// there).
    #[allow(clippy::too_many_arguments)]
    fn act(
        &mut self,
        r: &mut Request,
        index: usize,
        made: &Fingerprinted,
        phase: Phase,
        answer: StoreAnswer,
        since: u64,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let config = Rc::clone(&self.config);
        let Some((policy, detection)) = policy_with(&config, index, |p| p.detection.as_ref())
        else {
            return Step::Continue;
        };
        let receipt = match answer {
            StoreAnswer::Ready(receipt) => receipt,
            StoreAnswer::Failed(failure) => {
                // Nothing recorded: nothing to take back.
                r.counted = None;
                out.push(count(MetricId::FAIL_OPEN, 1));
                if LogLimits::allow(&mut self.logs.fail_open, now) {
                    let id = &policy.id;
                    let line = format!(
                        "store {failure} for policy \"{id}\"; request passed unchecked (fail-open)"
                    );
                    out.push(Effect::Log(Level::Warn, line));
                }
                return Step::Continue;
            }
        };
        if receipt.cas_retries > 0 {
            out.push(count(MetricId::CAS_RETRIES, i64::from(receipt.cas_retries)));
        }
        if receipt.evicted {
            out.push(count(MetricId::EVICTED, 1));
        }
        if receipt.added {
            out.push(count(MetricId::TABLE_ENTRIES, 1));
        }
        let fp = made.fingerprint;
        // The loop's ledger key.
        let key = fp.spread();
        let model = self.priced(made.model.as_deref());
        r.spend_under(key, model, made.model.as_deref());
        let state = &receipt.state;
        let decided = decision::decide(policy, detection, &fp, made.fallback, state, made.repeats);
        let notice = decided.verdict.notice();
        // One event per fingerprint and window (the store counts the rest);
        // a conversation's repeated turns report once, when they first
        // reach the threshold.
        let turns_event = notice.is_some_and(|n| n.turns) && made.repeats == detection.threshold();
        let event = state.event.or(turns_event.then_some(0));
        if let Some(mut event) = event.and_then(|s| events::loop_detected(&decided, made, s)) {
            self.add_spend(&mut event, r.caller, Some(key), now);
            self.emit_event(&event, true, now, out);
            count_opt(out, self.registry.detected(index, decided.shadow), 1);
        }
        if notice.is_some() {
            self.note_in_loop(r, index, out);
        }
        let action = decided.verdict.action();
        let hits = notice.map_or(state.count, |n| n.count);
        let shown = action.map_or("allow", |a| a.as_str());
        self.publish_decision(out, (policy, action.is_some()), shown, || {
            [("fingerprint", json!(fp.hex())), ("count", json!(hits))]
        });
        if decided.shadow {
            if let Some(line) = reply::shadow_line(&decided) {
                self.shadow(line, out);
            }
            if let Some(action) = action {
                count_opt(out, self.registry.shadow(index, WouldBe::from(action)), 1);
            }
            return Step::Continue;
        }
        // A warning goes upstream and to the client; a throttle's headers
        // to the client.
        let upstream = reply::headers_go_upstream(&decided);
        for header in reply::response_headers(&decided) {
            if upstream {
                self.carry(r, phase, header, true, out);
            } else {
                r.response_headers.push(header);
            }
        }
        match decided.verdict {
            Verdict::Allow => Step::Continue,
            Verdict::Warn(_) => {
                count_opt(out, self.registry.warned(index), 1);
                Step::Continue
            }
            Verdict::Throttle { delay_ms, .. } => {
                count_opt(out, self.registry.throttled(index), 1);
                if let Some(id) = self.registry.throttle_delay(index) {
                    out.push(Effect::Record(id, delay_ms));
                }
                self.throttled.push(r.id, since.saturating_add(delay_ms));
                out.push(count(MetricId::THROTTLE_PENDING, 1));
                out.push(Effect::ArmTick);
                r.state = State::Held;
                Step::Pause
            }
            Verdict::Reject(rejection) => {
                self.count_avoided(index, key, model, now, out);
                let reply = reply::rejection(&rejection, r.api);
                self.answer(r, Some(index), reply, "loopguard_loop_detected", out)
            }
        }
    }
}
