//! What a response spent, added to its keys: in the local table, in the
//! spend counters, and in the shared store (the response's last chunk
//! waits for it), or estimated from the bytes seen.

use super::{price_of, BudgetAdd};
use crate::act::events::caller_tag;
use crate::config::budget::Spent;
use crate::config::Policy;
use crate::flow::{
    count, count_opt, policy_with, to_i64, Effect, Effects, Engine, MetricId, Request,
};
use crate::metrics::budget as names;
use crate::state::budget::{slice_ms, Add, Added};
use crate::state::redis::budget::BudgetKey;
use crate::state::store::BucketBackend;
use std::rc::Rc;

impl<B: BucketBackend> Engine<B> {
    /// The response headers of a request under a budget: a provider failure
    /// is not a call, unless the gateway gave up waiting on a generation
    /// the provider may still bill (then its spending is estimated); a
    /// cost the upstream reports in a header is kept.
    pub(in crate::flow) fn budget_status(&self, r: &mut Request, status: Option<u32>) {
        if let Some(req) = r.budget.as_deref_mut() {
            let billed = status.is_some_and(crate::response::may_be_billed);
            req.failed = status.is_some_and(crate::response::failed_attempt) && !billed;
            req.timed_out = billed;
            // The provider refused the request itself (a 400 for a context
            // too long, a 401, a 404, a 422): a call, but nothing generated.
            req.refused = status.is_some_and(|s| (400..500).contains(&s)) && !billed && !req.failed;
        }
    }

    /// The response headers' reported cost (LiteLLM's), kept for when the
    /// response is over; and whether the response should be read for the
    /// model that answered (a dollar cap whose request named none that was
    /// read).
    pub(in crate::flow) fn budget_head(
        &self,
        r: &mut Request,
        head: &crate::response::ResponseHead<'_>,
    ) -> bool {
        let Some(req) = r.budget.as_deref_mut() else {
            return false;
        };
        if let Some(v) = head.reported_cost {
            req.reported_cost =
                crate::response::usage::microusd_of(&serde_json::Value::from(v.trim()));
        }
        req.dollars && req.price.is_none() && !req.keys.is_empty()
    }

    /// Add a response's spending to each of its budget keys, here and in
    /// the shared store (reported, or estimated from the bytes seen),
    /// priced by its model (the request's, else the one the response
    /// names), or at the cost the upstream reported.
    pub(in crate::flow) fn budget_spend(
        &mut self,
        r: &mut Request,
        reported: Option<&crate::response::usage::Usage>,
        complete: bool,
        read: crate::response::usage::BytesRead,
        answered_by: Option<&str>,
        out: &mut Effects,
    ) -> Option<BudgetAdd> {
        let req = r.budget.as_deref_mut()?;
        if req.added || req.keys.is_empty() {
            return None;
        }
        let limit = req.output_limit;
        let complete = complete && !req.timed_out;
        let (u, estimated) = match reported {
            None if req.refused => (crate::response::usage::Usage::default(), false),
            _ => spent_of(reported, complete, req.body_bytes, read, limit.unwrap_or(0)),
        };
        let policy = req.policy;
        let config = Rc::clone(&self.config);
        let (p, b) = policy_with(&config, policy, |p| p.budget.as_ref())?;
        let ids = self.registry.budget(policy);
        // A reported cost of nothing for a call that used tokens is a
        // gateway that could not price it (LiteLLM's 0.0 for a model it
        // does not know): the price lists decide then.
        let used = u.input > 0 || u.output > 0;
        let reported_cost = u
            .cost_microusd
            .or(req.reported_cost)
            .filter(|c| *c > 0 || !used);
        let microusd = if !req.dollars {
            0
        } else if let Some(c) = reported_cost {
            count_opt(out, ids.map(|i| i.reported_cost()), 1);
            c
        } else {
            // The request's model, else the one its answer names; an answer
            // with token counts but no model is an unnamed, unpriced one.
            // Neither a model nor usage: not an LLM call (a body-less
            // request, a tunnel), no dollars.
            let price = match (&req.price, answered_by) {
                (Some(p), _) => Some(p.clone()),
                (None, Some(m)) => Some(price_of(&config.prices, b, m)),
                (None, None) if reported.is_some() => Some(price_of(&config.prices, b, "")),
                (None, None) => None,
            };
            price.map_or(0, |price| {
                if let Some(model) = &price.unpriced {
                    count_opt(out, ids.map(|i| i.unpriced()), 1);
                    let (caller, at) = (r.caller, r.started_ms);
                    self.unpriced_event(p, model, &price.charged_as, caller, at, out);
                }
                price.rate.cost(&u.tokens())
            })
        };
        req.added = true;
        if req.failed {
            // The provider failed the attempt: no call, nothing spent.
            return None;
        }
        let spent = Spent {
            input: u.input,
            output: u.output,
            microusd,
            calls: 1,
        };
        if estimated {
            count_opt(out, ids.map(|i| i.estimated()), 1);
        }
        let at = r.started_ms;
        let mut unrecorded = false;
        let mut groups: Vec<(u64, Vec<Add>)> = Vec::with_capacity(1);
        // The same amounts for the shared store, if there is one.
        let mut shared: Vec<BudgetKey> = Vec::new();
        for k in &req.keys {
            let Some(l) = b.limits.get(k.limit) else {
                continue;
            };
            let amount = l.cap.spent(&spent);
            if amount == 0 {
                continue;
            }
            let add = Add {
                key: k.key,
                slice_ms: slice_ms(l.window_ms),
                amount,
                cap: l.cap.amount(),
            };
            if self.shared.is_some() {
                shared.push(BudgetKey {
                    key: add.key,
                    slice_ms: add.slice_ms,
                    add: amount,
                    cap: 0,
                });
            }
            match groups.iter_mut().find(|(g, _)| *g == k.tag) {
                Some((_, adds)) => adds.push(add),
                None => groups.push((k.tag, vec![add])),
            }
            let name = self.budget_spend_name(p, policy, k.limit, k.tag);
            out.push(Effect::CountNamed(name, to_i64(amount)));
        }
        for (group, adds) in &groups {
            let table = &mut self.budget_table;
            match table.add(&mut self.local.backend, *group, adds, at, at) {
                Added::Done {
                    cas_retries,
                    evicted,
                } => {
                    if cas_retries > 0 {
                        out.push(count(MetricId::CAS_RETRIES, i64::from(cas_retries)));
                    }
                    if evicted > 0 {
                        count_opt(out, ids.map(|i| i.evicted()), i64::from(evicted));
                    }
                }
                Added::Failed => unrecorded = true,
            }
        }
        if unrecorded {
            count_opt(out, ids.map(|i| i.unrecorded()), 1);
        }
        // With the shared store, the spending goes there too.
        (!shared.is_empty()).then_some(BudgetAdd {
            policy,
            caller: r.caller,
            keys: shared,
            at,
        })
    }

    /// A key's spend counter: its tag's own for the first
    /// [`crate::metrics::MAX_CALLER_SERIES`] keys of a budget on this
    /// worker, `other` after (names kept, so a response formats none).
    fn budget_spend_name(&mut self, p: &Policy, policy: usize, limit: usize, tag: u64) -> String {
        let series = grown(&mut self.budget_memo.series, policy);
        let Some(seen) = series.and_then(|per_limit| grown(per_limit, limit)) else {
            return String::new();
        };
        if let Some((_, name)) = seen.iter().find(|(t, _)| *t == tag) {
            return name.clone();
        }
        let l = p.budget.as_ref().and_then(|b| b.limits.get(limit));
        let budget = l.map_or("", |l| l.name.as_str());
        if seen.len() < crate::metrics::MAX_CALLER_SERIES {
            let name = names::spend(&p.id, budget, &caller_tag(tag));
            seen.push((tag, name.clone()));
            return name;
        }
        names::spend(&p.id, budget, "other")
    }
}

/// Item `i` of `v`, which grows to have it.
fn grown<T: Default>(v: &mut Vec<T>, i: usize) -> Option<&mut T> {
    if v.len() <= i {
        v.resize_with(i + 1, T::default);
    }
    v.get_mut(i)
}

/// The output an estimate charges a generation that set no output limit.
pub(super) const DEFAULT_OUTPUT_ESTIMATE: u64 = 4096;

/// What a response spent, from the usage it reported, or estimated when it
/// reported none or was cut off (`complete`: its body ended; a stream
/// whose closing event passed is whole too): input from the request body
/// (4 bytes a token); output from a JSON body's length (4 bytes a token)
/// or a stream's events (one token each), and at least `output_limit`
/// (the request's `max_tokens`, or [`DEFAULT_OUTPUT_ESTIMATE`] for a
/// generation that set none: what a limited call may bill; a reasoning
/// model without a limit may bill more).
pub(super) fn spent_of(
    reported: Option<&crate::response::usage::Usage>,
    complete: bool,
    body_bytes: u64,
    read: crate::response::usage::BytesRead,
    output_limit: u64,
) -> (crate::response::usage::Usage, bool) {
    let mut u = reported.copied().unwrap_or_default();
    // A stream whose closing event passed reported all it will (an SDK may
    // hang up right after it).
    let whole = (complete || read.closed) && reported.is_some_and(|r| r.input > 0 || r.output > 0);
    if whole {
        return (u, false);
    }
    if u.input == 0 {
        u.input = body_bytes / 4;
    }
    let output = if read.events > 0 {
        read.events
    } else {
        read.bytes / 4
    };
    u.output = u.output.max(output).max(output_limit);
    (u, true)
}
