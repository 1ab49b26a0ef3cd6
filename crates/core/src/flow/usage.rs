//! The response body's token usage, read as it passes (never held back):
//! added to the request's policy, by token type, model and whether the
//! request was part of a detected loop; priced when `prices` names the
//! model; added to the loop's spending (the ledger), which the loop's
//! events report and which estimates what a rejected request would have
//! spent.

use super::{count, count_opt, to_i64, Effect, Effects, Engine, Level, MetricId, Request, Step};
use crate::metrics::{self, TokenType};
use crate::response::repeats::{RepeatSettings, Repeated};
use crate::response::usage::{Framing, UsageReader};
use crate::state::ledger::Added;
use crate::state::store::BucketBackend;

pub use crate::act::events::{caller_hash, caller_tag};

/// A conversation's ledger key: its caller (the hash of policy and
/// identity) and its first message as sent, hashed cheaply (FNV-1a): the
/// same conversation keeps its first message on every turn.
pub(super) fn conversation_key(caller: u64, first: &[u8]) -> u64 {
    let mut h = crate::request::Fnv(caller ^ 0x9e37_79b9_7f4a_7c15);
    h.write(first);
    h.0
}

impl Request {
    /// Whether the response's usage is read (a policy judged the request
    /// and it went upstream): the host then gives the response's
    /// `content-type` ([`Engine::on_response_content_type`]).
    pub fn reads_usage(&self) -> bool {
        self.usage_for.is_some()
    }

    /// The response headers the host reads for
    /// [`Engine::on_response_head`]: the content type, and under a dollar
    /// cap the cost an upstream may report.
    pub fn response_headers_wanted(&self) -> &'static [&'static str] {
        let all = &crate::response::RESPONSE_HEADERS;
        if self.budget.as_ref().is_some_and(|b| b.dollars) {
            all
        } else {
            all.get(..1).unwrap_or(all)
        }
    }

    /// Whether the host should hand the response body's chunks over
    /// ([`Engine::on_response_body`]).
    pub fn wants_response_body(&self) -> bool {
        self.usage.is_some() || self.reads_mcp_result() || self.response_held()
    }

    /// Note the loop key and model (its price's index, and its name) of
    /// the request's spending (the first key given wins).
    pub(super) fn spend_under(&mut self, key: u64, model: Option<usize>, name: Option<&str>) {
        if let Some(u) = self.usage_for.as_mut() {
            u.loop_key = u.loop_key.or(Some(key));
            u.model = u.model.or(model);
            if self.model.is_none() {
                self.model = name.map(str::to_string);
            }
        }
    }
}

impl<B: BucketBackend> Engine<B> {
    /// The request is part of a detected loop (a count at or past its
    /// detection, a tool-loop verdict): its tokens count as the loop's, and
    /// its caller's loop requests count, once per request.
    pub(super) fn note_in_loop(&mut self, r: &mut Request, policy: usize, out: &mut Effects) {
        if let Some(u) = r.usage_for.as_mut() {
            u.in_loop = true;
        }
        if r.loop_counted {
            return;
        }
        r.loop_counted = true;
        let (Some(p), Some(seen)) = (
            self.config.policies.get(policy),
            self.caller_series.get_mut(policy),
        ) else {
            return;
        };
        let tag = if seen.contains(&r.caller) {
            caller_tag(r.caller)
        } else if seen.len() < metrics::MAX_CALLER_SERIES {
            seen.push(r.caller);
            caller_tag(r.caller)
        } else {
            "other".to_string()
        };
        let name = metrics::caller_loop_requests(&p.id, &tag);
        out.push(Effect::CountNamed(name, 1));
    }

    /// The priced model of a request's `model`.
    pub(super) fn priced(&self, model: Option<&str>) -> Option<usize> {
        model.and_then(|m| self.config.prices.lookup(m))
    }

    /// A request of loop `key` was rejected: what it would have spent is
    /// estimated by the loop's newest response, and counted as avoided.
    pub(super) fn count_avoided(
        &mut self,
        policy: usize,
        key: u64,
        model: Option<usize>,
        now: u64,
        out: &mut Effects,
    ) {
        // This worker's own part first (no host call: a rejection stays
        // cheap); every worker's only when this one served none of it.
        let own = self.ledger.own(&mut self.local.backend, key, now);
        let Some(s) = own.or_else(|| self.ledger.spend(&mut self.local.backend, key, now)) else {
            return;
        };
        let r = &self.registry;
        let (input, output) = (s.last_input, s.last_output);
        for (t, n) in [(TokenType::Input, input), (TokenType::Output, output)] {
            count_opt(out, r.tokens_avoided(policy, t, model), to_i64(n));
        }
        // An unpriced model has no cost counter.
        count_opt(out, r.cost_avoided(policy, model), to_i64(s.last_microusd));
    }

    /// The response's `content-type` (after [`Engine::on_response_headers`]):
    /// a JSON body or an event stream of a request a policy judged is read
    /// for its usage; any other answer reported no usage.
    pub fn on_response_content_type(
        &mut self,
        r: &mut Request,
        content_type: Option<&str>,
        now: u64,
        out: &mut Effects,
    ) {
        let head = crate::response::ResponseHead {
            content_type,
            ..Default::default()
        };
        self.on_response_head(r, &head, now, out);
    }

    /// The response headers a request whose usage is read needs
    /// ([`crate::response::RESPONSE_HEADERS`], after
    /// [`Engine::on_response_headers`]): a JSON body or an event stream is
    /// read for its usage; any other answer reported no usage; a cost the
    /// upstream reports is kept.
    pub fn on_response_head(
        &mut self,
        r: &mut Request,
        head: &crate::response::ResponseHead<'_>,
        now: u64,
        out: &mut Effects,
    ) {
        if r.mcp.is_some() {
            self.mcp_content_type(r, head.content_type, now, out);
            return;
        }
        let Some(target) = r.usage_for else {
            return;
        };
        let needs_model = self.budget_head(r, head);
        match head.content_type.and_then(Framing::of_content_type) {
            Some(f) => {
                let mut reader = UsageReader::new(f).watching(RepeatSettings::default());
                if r.budget.is_some() {
                    reader = reader.counting_events();
                    if needs_model {
                        reader = reader.finding_model();
                    }
                }
                r.usage = Some(Box::new(reader));
            }
            None => {
                r.usage_for = None;
                count_opt(out, self.registry.without_usage(target.policy), 1);
                // A call all the same; its tokens are estimated from the
                // request (added in the shared store from the tick).
                if let Some(add) = self.budget_spend(r, None, true, Default::default(), None, out) {
                    self.send_write(r, super::store::writes::Write::Budget(add), false, out);
                }
            }
        }
    }

    /// A chunk of the response body as it passes (`end_of_stream`: the
    /// last). [`Step::Pause`]: the last chunk waits until the shared store
    /// has the response's spending (the host resumes the response when
    /// [`Engine::on_store_reply`] says so).
    pub fn on_response_body(
        &mut self,
        r: &mut Request,
        chunk: &[u8],
        end_of_stream: bool,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        if r.response_held() {
            // Envoy hands a held response's body over again as more of it
            // comes: it stays held until the store answers.
            return Step::Pause;
        }
        if r.mcp.is_some() {
            return self.mcp_body(r, chunk, end_of_stream, now, out);
        }
        if let Some(reader) = r.usage.as_mut() {
            reader.feed(chunk);
            if let Some(rep) = reader.take_repeated() {
                self.report_degenerate(r, &rep, out);
            }
        }
        self.strip_stream_usage(r, chunk, end_of_stream, out);
        // With a shared store, the chunk that completes the usage waits
        // until the store has the spending: a client that reads the usage
        // (and so the end of its answer) sends its next request only then,
        // and on any replica that request finds it.
        let settled = self.shared.is_some()
            && r.budget.as_ref().is_some_and(|b| b.may_settle())
            && r.usage.as_ref().is_some_and(|u| u.usage_final());
        if end_of_stream || settled {
            if let Some(add) = self.finish_usage(r, true, out) {
                return self.send_write(r, super::store::writes::Write::Budget(add), true, out);
            }
        }
        Step::Continue
    }

    /// A stream found repeating itself: counted, and one
    /// `output.degenerate` event (the stream goes on unchanged).
    fn report_degenerate(&mut self, r: &Request, rep: &Repeated, out: &mut Effects) {
        let Some(target) = r.usage_for else {
            return;
        };
        let Some(p) = self.config.policies.get(target.policy) else {
            return;
        };
        count_opt(out, self.registry.degenerate_output(target.policy), 1);
        let event = serde_json::json!({
            "event": "output.degenerate",
            "policy": p.id,
            "mode": p.mode.as_str(),
            "caller": caller_tag(r.caller),
            "model": r.model,
            "unit_chars": rep.unit_chars,
            "repeats": rep.repeats,
            "covered_chars": rep.covered_chars,
            "in_loop": target.in_loop,
        });
        out.push(Effect::Log(Level::Info, event.to_string()));
    }

    /// The response is over (or the stream ended early): count what it
    /// reported. The loop's ledger dates it by its request's start (no
    /// clock read on the response path).
    pub(super) fn finish_usage(
        &mut self,
        r: &mut Request,
        complete: bool,
        out: &mut Effects,
    ) -> Option<super::budget::BudgetAdd> {
        let reader = r.usage.take()?;
        let target = r.usage_for.take()?;
        let read = reader.bytes_read();
        if reader.compressed && !self.logs.compressed_body {
            self.logs.compressed_body = true;
            let line = "a response body is gzip-compressed, so its token usage cannot be read: put Envoy's decompressor filter after loopguard in http_filters (responses pass the filters in reverse), see docs/observability.md#tokens-and-dollars";
            out.push(Effect::Log(Level::Warn, line.to_string()));
        }
        let answered = reader.model().map(str::to_string);
        let found = reader.finish();
        let add = self.budget_spend(r, found.as_ref(), complete, read, answered.as_deref(), out);
        let Some(u) = found else {
            count_opt(out, self.registry.without_usage(target.policy), 1);
            return add;
        };
        let (p, l, m) = (target.policy, target.in_loop, target.model);
        let reg = &self.registry;
        for (t, n) in [(TokenType::Input, u.input), (TokenType::Output, u.output)] {
            count_opt(out, reg.tokens(p, t, l, m), to_i64(n));
        }
        let cost = m.map_or(0, |m| self.config.prices.cost(m, &u.tokens()));
        count_opt(out, reg.cost(p, l, m), to_i64(cost));
        if let Some(key) = target.loop_key {
            let (ledger, backend) = (&mut self.ledger, &mut self.local.backend);
            match ledger.add(backend, key, u.input, u.output, cost, r.started_ms) {
                Added::Done { cas_retries: 0 } => {}
                Added::Done { cas_retries } => {
                    out.push(count(MetricId::CAS_RETRIES, i64::from(cas_retries)));
                }
                Added::Failed => out.push(count(MetricId::LEDGER_FAILED, 1)),
            }
        }
        add
    }
}
