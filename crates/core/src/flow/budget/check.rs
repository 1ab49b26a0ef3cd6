//! The check before a request goes upstream: its keys' standings from the
//! local table at once, or from the shared store's call (and what its
//! failure means), and acting on the verdict: the 429, the warning, shadow
//! mode, events.

use super::{After, BudgetWait};
use crate::act::budget::{self as verdict, BudgetVerdict, Standing};
use crate::config::budget::Budget;
use crate::config::{Config, Mode, OnStoreError, Policy};
use crate::flow::enact::event_key;
use crate::flow::store::asks::{Answer, Ask};
use crate::flow::{count, count_opt, policy_with, Effects, Engine, MetricId, Phase, Request, Step};
use crate::state::budget::slice_ms;
use crate::state::redis::budget::{budget_answer, BudgetKey};
use crate::state::store::BucketBackend;
use serde_json::json;
use std::rc::Rc;

/// The budget of a request under one.
pub(super) fn budget_of<'c>(config: &'c Config, r: &Request) -> Option<&'c Budget> {
    let req = r.budget.as_deref()?;
    config.policies.get(req.policy)?.budget.as_ref()
}

/// A budget event's key: its own hash, apart from other guards' events.
const BUDGET_EVENT: u64 = 0x6275_6467_6574_6576;

impl<B: BucketBackend> Engine<B> {
    /// Check the request's budget keys before it goes on. `Ok`: it goes on
    /// (to `after`, if given); `Err`: the step to return (a 429, or waiting
    /// for the shared store's answer).
    pub(in crate::flow) fn budget_gate(
        &mut self,
        r: &mut Request,
        phase: Phase,
        after: Option<After>,
        now: u64,
        out: &mut Effects,
    ) -> Result<Option<After>, Step> {
        if r.budget.as_ref().is_none_or(|b| b.keys.is_empty()) {
            return Ok(after);
        }
        let Some(shared) = self.shared.as_ref() else {
            let standings = self.local_standings(r, now, out);
            let acted = self.act_on_budget(r, &standings, phase, now, out);
            return acted.map(|()| after);
        };
        let call = shared.budget_of(r.caller, &self.budget_call_keys(r), now);
        let wait = BudgetWait { after, phase };
        Err(self.ask(r, call, Ask::Budget(wait), out))
    }

    /// Check the keys known so far (a request with no body, or one whose
    /// body is not read: those its headers name) before it goes on.
    pub(in crate::flow) fn budget_gate_only(
        &mut self,
        r: &mut Request,
        phase: Phase,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        self.budget_header_keys(r);
        self.budget_gate(r, phase, None, now, out)
            .map_or_else(|s| s, |_| Step::Continue)
    }

    /// The request's keys as the shared store checks them.
    fn budget_call_keys(&self, r: &Request) -> Vec<BudgetKey> {
        let (Some(req), Some(b)) = (r.budget.as_deref(), budget_of(&self.config, r)) else {
            return Vec::new();
        };
        req.keys
            .iter()
            .filter_map(|k| {
                let l = b.limits.get(k.limit)?;
                Some(BudgetKey {
                    key: k.key,
                    slice_ms: slice_ms(l.window_ms),
                    add: 0,
                    cap: l.cap.amount(),
                })
            })
            .collect()
    }

    /// The request's standings in this process's table: one read per
    /// group of keys (a caller's, a session's, a conversation's; the keys
    /// are kept group by group).
    /// A group the table cannot read is not checked (counted as a
    /// fail-open).
    fn local_standings(&mut self, r: &Request, now: u64, out: &mut Effects) -> Vec<Standing> {
        let config = Rc::clone(&self.config);
        let (Some(req), Some(b)) = (r.budget.as_deref(), budget_of(&config, r)) else {
            return Vec::new();
        };
        let mut standings = Vec::with_capacity(req.keys.len());
        for run in req.keys.chunk_by(|a, b| a.tag == b.tag) {
            let group = run.first().map_or(0, |k| k.tag);
            let ids: Vec<u64> = run.iter().map(|k| k.key).collect();
            let read = self.budget_table.read(&mut self.local.backend, group, &ids);
            let read = read.unwrap_or_else(|| {
                out.push(count(MetricId::FAIL_OPEN, 1));
                Vec::new()
            });
            for (k, slices) in run.iter().zip(read) {
                let Some(l) = b.limits.get(k.limit) else {
                    continue;
                };
                let (slice, cap) = (slice_ms(l.window_ms), l.cap.amount());
                standings.push(Standing {
                    limit: k.limit,
                    spent: slices.total(now, slice),
                    until_below_ms: slices.until_below(cap, now, slice),
                    tag: k.tag,
                });
            }
        }
        standings
    }

    /// The shared store's answer to the budget check (or why none came):
    /// the standings acted on, this process's own sums on a failure (or
    /// the request passes), as `store.on_error` says.
    pub(in crate::flow) fn on_budget_answer(
        &mut self,
        r: &mut Request,
        w: BudgetWait,
        answer: Answer<'_>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let n = r.budget.as_ref().map_or(0, |b| b.keys.len());
        let answer =
            answer.and_then(|reply| budget_answer(reply.status.as_deref(), &reply.body, n));
        self.count_call(answer.as_ref().err(), out);
        let standings = match answer {
            Ok(totals) => r.budget.as_ref().map(|b| {
                b.keys
                    .iter()
                    .zip(totals)
                    .map(|(k, (spent, until_below_ms))| Standing {
                        limit: k.limit,
                        spent,
                        until_below_ms,
                        tag: k.tag,
                    })
                    .collect()
            }),
            // This process's own sums answer, or the request passes
            // unchecked (counted, logged at most every 10 s).
            Err(failure) => {
                let local = "budgets are checked against this Envoy's own spending";
                match self.store_fallback(&failure, local, "budgets are", now, out) {
                    OnStoreError::Local => Some(self.local_standings(r, now, out)),
                    OnStoreError::Allow => None,
                }
            }
        };
        if let Some(Err(step)) = standings.map(|s| self.act_on_budget(r, &s, w.phase, now, out)) {
            return step;
        }
        // It goes on: its hit is counted next, or it is resumed.
        match w.after {
            Some(a) => self.record_hit(r, a, w.phase, now, out),
            None => Step::Continue,
        }
    }

    /// Act on a request's standings: `Err` ends it (a 429).
    fn act_on_budget(
        &mut self,
        r: &mut Request,
        standings: &[Standing],
        phase: Phase,
        now: u64,
        out: &mut Effects,
    ) -> Result<(), Step> {
        let Some(req) = r.budget.as_deref() else {
            return Ok(());
        };
        let (index, price) = (req.policy, req.price.as_ref());
        let config = Rc::clone(&self.config);
        let Some((p, b)) = policy_with(&config, index, |p| p.budget.as_ref()) else {
            return Ok(());
        };
        // A call whose model no price names: refused under `unpriced:
        // reject` (enforced; shadow mode logs what it would do), else it
        // goes on carrying the warning that names the model and what it is
        // charged as.
        let unpriced = price.and_then(|q| Some((q.unpriced.clone()?, q.charged_as.clone())));
        if let Some((model, charged_as)) = unpriced {
            let reject = b.unpriced == crate::config::budget::Unpriced::Reject;
            if reject && p.mode == Mode::Shadow {
                let what = [("unpriced model", format!("\"{model}\""))];
                let line = crate::act::shadow::line("reject", Some("budget"), &p.id, &what);
                self.shadow(line, out);
            } else if reject {
                count_opt(out, self.registry.budget(index).map(|i| i.unpriced()), 1);
                self.unpriced_event(p, &model, "refused (reject)", r.caller, now, out);
                r.budget = None;
                self.publish_decision(out, (p, true), "reject", || [("budget", json!("unpriced"))]);
                let reply = verdict::unpriced_rejection(&p.id, &model, r.api);
                let detail = "loopguard_budget_unpriced";
                return Err(self.answer(r, Some(index), reply, detail, out));
            }
            let h = verdict::unpriced_header(&model, &charged_as);
            self.carry(r, phase, ("x-loopguard-budget", h), false, out);
        }
        let v = verdict::judge(b, standings);
        if v == BudgetVerdict::default() {
            return Ok(());
        }
        let ids = self.registry.budget(index);
        for &l in &v.near_cap {
            count_opt(out, ids.and_then(|i| i.near_cap(l)), 1);
        }
        let action = match (p.mode, b.action) {
            (Mode::Shadow, _) => "shadow",
            (_, crate::config::budget::BudgetAction::Reject) => "reject",
            (_, crate::config::budget::BudgetAction::Warn) => "warn",
        };
        for s in &v.exceeded {
            self.budget_event("budget.exceeded", p, b, s, action, now, out);
        }
        for s in &v.warned {
            self.budget_event("budget.warning", p, b, s, "warn", now, out);
        }
        if p.mode == Mode::Shadow {
            for s in &v.exceeded {
                if let Some(line) = verdict::shadow_line(&p.id, b, s) {
                    self.shadow(line, out);
                }
                count_opt(out, ids.and_then(|i| i.shadow(s.limit)), 1);
            }
            return Ok(());
        }
        if v.rejects(b, p.mode) {
            let Some(top) = v.exceeded.first() else {
                return Ok(());
            };
            let Some(reply) = verdict::rejection(&p.id, b, top, r.api) else {
                return Ok(());
            };
            // Never upstream: nothing to charge.
            r.budget = None;
            let name = b.limits.get(top.limit).map_or("", |l| l.name.as_str());
            self.publish_decision(out, (p, true), "reject", || [("budget", json!(name))]);
            count_opt(out, ids.and_then(|i| i.rejected(top.limit)), 1);
            return Err(self.answer(r, Some(index), reply, "loopguard_budget_exceeded", out));
        }
        // Warned (before a cap, or at one with `action: warn`): the client
        // sees the header; the upstream too while the headers are held.
        for s in v.exceeded.iter().chain(&v.warned) {
            count_opt(out, ids.and_then(|i| i.warned(s.limit)), 1);
        }
        if let Some(h) = verdict::header(b, &v) {
            self.carry(r, phase, ("x-loopguard-budget", h), false, out);
        }
        Ok(())
    }

    /// Log a budget event, once per key, cap and kind within a window
    /// across workers; a reached cap's is alerted too.
    #[allow(clippy::too_many_arguments)]
    fn budget_event(
        &mut self,
        name: &str,
        p: &Policy,
        b: &Budget,
        s: &Standing,
        action: &str,
        now: u64,
        out: &mut Effects,
    ) {
        let kind: u64 = if name == "budget.exceeded" { 1 } else { 2 };
        let key = s.tag
            ^ (s.limit as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ kind.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        if !self.first_event(event_key(BUDGET_EVENT, key), now) {
            return;
        }
        if let Some(event) = verdict::event(name, &p.id, p.mode, b, s, action) {
            self.emit_event(&event, name == "budget.exceeded", now, out);
        }
    }

    /// A call under a dollar cap whose model no price names: one
    /// `budget.unpriced` event per policy and model within a window.
    pub(super) fn unpriced_event(
        &mut self,
        p: &Policy,
        model: &str,
        charged_as: &str,
        caller: u64,
        now: u64,
        out: &mut Effects,
    ) {
        let mut h = crate::request::Fnv(0x756e_7072_6963_6564);
        h.write(p.id.as_bytes());
        h.write(model.as_bytes());
        if !self.first_event(event_key(BUDGET_EVENT, h.0), now) {
            return;
        }
        let Some(b) = p.budget.as_ref() else {
            return;
        };
        let event = verdict::unpriced_event(&p.id, p.mode, b, model, charged_as, caller);
        self.emit_event(&event, false, now, out);
    }
}
