//! The body events: buffering, and the complete body read once and handed
//! to each guard the policy has (MCP, tool loops, budgets, repeats).

use crate::act::events;
use crate::config::{budget::BudgetPer::Conversation, Similarity};
use crate::detect::{progress, tool_loops};
use crate::flow::{count, count_opt, usage, Effect, Effects, Engine, Level, Request, State, Step};
use crate::metrics::SkipReason;
use crate::request::llm::{self, scan::Refusal, NotRead};
use crate::state::store::BucketBackend;
use std::rc::Rc;

impl<B: BucketBackend> Engine<B> {
    /// A body chunk arrived: `size` bytes are buffered in all. With the
    /// end of the stream the host passes the whole body when
    /// [`Request::wants_body`] said so (`None`: it could not be read).
    pub fn on_body(
        &mut self,
        r: &mut Request,
        size: usize,
        end_of_stream: bool,
        body: Option<&[u8]>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        if !self.body_event(r) {
            return Step::Continue;
        }
        r.body_len = size;
        if size as u64 > r.body_limit {
            // Stop buffering; what is held so far flows on.
            let phase = r.phase();
            return self.skip_body(r, size as u64, phase, now, out);
        }
        if !end_of_stream {
            return Step::Pause;
        }
        self.decide_buffered(r, body, now, out)
    }

    /// The request trailers arrived: an HTTP/2 request with trailers never
    /// ends its body with end of stream (and one without data has no body
    /// callback at all). The body as for [`Engine::on_body`]
    /// ([`Request::wants_body_at_trailers`]).
    pub fn on_trailers(
        &mut self,
        r: &mut Request,
        body: Option<&[u8]>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        if !self.body_event(r) {
            return Step::Continue;
        }
        self.decide_buffered(r, body, now, out)
    }

    /// A body the scanner refused (nested too deep, too many values): the
    /// request is fingerprinted exactly and passes on; counted.
    fn count_refusal(&self, refused: Option<Refusal>, out: &mut Effects) {
        let reason = match refused {
            None => return,
            Some(Refusal::TooDeep) => SkipReason::TooDeep,
            Some(Refusal::TooMany) => SkipReason::TooMany,
        };
        out.push(count(self.registry.skipped(reason), 1));
    }

    /// A body (or trailers) callback: whether the request is still waiting
    /// for its body (else there is nothing to do). The first one of a held
    /// request tells the hold probe that Envoy delivers what follows the
    /// headers of held requests (or the probe released this one's headers).
    fn body_event(&mut self, r: &mut Request) -> bool {
        if !matches!(r.state, State::Buffering { .. }) {
            return false;
        }
        if r.headers_held && !r.body_seen {
            r.body_seen = true;
            r.headers_held = self.hold.body_arrived(r.id);
        }
        true
    }

    fn decide_buffered(
        &mut self,
        r: &mut Request,
        body: Option<&[u8]>,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        let State::Buffering { policy, pending } = std::mem::take(&mut r.state) else {
            return Step::Continue;
        };
        let phase = r.phase();
        let Some(body) = body else {
            out.push(count(self.registry.skipped(SkipReason::Unreadable), 1));
            let line = "body unreadable; request passed".to_string();
            out.push(Effect::Log(Level::Debug, line));
            if let Some(b) = r.budget.as_deref_mut() {
                b.set_body_bytes(r.body_len as u64);
            }
            return self.budget_gate_only(r, phase, now, out);
        };
        let config = Rc::clone(&self.config);
        let Some(p) = config.policies.get(policy) else {
            return Step::Continue;
        };
        if let Some(cfg) = &p.mcp {
            return self.decide_mcp(r, p, cfg, body, now, out);
        }
        // Parse the body once, for the fingerprint and the tool-loop judge,
        // keeping only the conversation items the policy reads.
        let conversation_budget = p.budget.as_ref().is_some_and(|b| b.has_per(Conversation));
        let parsed = (pending.reads_llm_body() || p.tool_loops.is_some() || conversation_budget)
            .then(|| llm::parse(body, pending.path(), pending.keep()));
        let mut refused = match parsed {
            Some(Err(NotRead::Refused(why))) => Some(why),
            _ => None,
        };
        let parsed = parsed.and_then(Result::ok);
        let mut polling = false;
        let similarity = p.detection.as_ref().map(|d| &d.similarity);
        let compares_content = similarity.is_some_and(Similarity::compares_content);
        let near = similarity.is_some_and(|s| matches!(s, Similarity::Near { .. }));
        // The conversation's calls and turns, read once for the tool-loop
        // judge and near mode's progress check.
        let history = parsed
            .as_ref()
            .filter(|_| p.tool_loops.is_some() || near)
            .map(|req| req.tool_history(Some(&mut self.call_cache)));
        // A tool-loop-only policy keeps each conversation's spending (a
        // policy that counts hits keeps it under the fingerprint).
        if let (true, None, Some(req)) = (r.reads_usage(), &p.detection, &parsed) {
            if p.tool_loops.is_some() {
                let key = usage::conversation_key(r.caller, req.first_raw().unwrap_or_default());
                let model = self.priced(req.model.as_deref());
                r.spend_under(key, model, req.model.as_deref());
            }
        }
        // A harness asking the model again with the same correction (its
        // unusable answers left out): the harness's retry, not the agent's
        // loop. Like an SDK's retries, it is counted and left to a budget's
        // caps: loop detection that compares content does not count it.
        // The model's history is unchanged, so a tool-loop verdict on it
        // stands (a correction appended cannot lift a 429).
        let reasked = parsed.as_ref().map_or(0, llm::Request::reasked);
        if reasked > 0 {
            count_opt(out, self.registry.harness_retries(policy), 1);
        }
        if let (Some(cfg), Some(req), Some(history)) = (&p.tool_loops, &parsed, &history) {
            if req.over_budget() {
                // Reading the history or its results ran out of budget:
                // no verdict is trusted from a partly read body.
                refused = Some(Refusal::TooMany);
            } else if let Some(v) = tool_loops::judge(cfg, history, req, Some(&self.text_cache)) {
                if let Some(step) = self.tool_loop(r, (policy, p), &pending, req, &v, now, out) {
                    return step;
                }
            }
            // A polling turn is a repeat by design: the content-comparing
            // modes do not count it (exact and session modes do).
            polling = compares_content && tool_loops::only_exempt_calls(cfg, history);
        }
        if p.budget.is_some() {
            self.budget_keys(r, p, body, parsed.as_ref());
            if parsed.as_ref().is_none_or(|q| q.stream) {
                let model = parsed.as_ref().and_then(|q| q.model.as_deref());
                self.ask_stream_usage(r, pending.path(), body, model, out);
            }
        }
        let harness_retry = reasked > 0 && compares_content;
        if p.detection.is_none() || polling || harness_retry {
            // No loop detection; or the model's newest turn only calls
            // exempt tools (polling): repeating it is what it is for, so
            // loop detection does not count it either; nor a harness's
            // retry.
            self.count_refusal(refused, out);
            if harness_retry {
                self.publish_decision(out, (p, true), "harness_retry", || events::NO_REPEAT);
            } else if polling {
                count_opt(out, self.registry.exempted(policy), 1);
                self.publish_decision(out, (p, true), "exempt", || events::NO_REPEAT);
            }
            return self
                .budget_gate(r, phase, None, now, out)
                .map_or_else(|s| s, |_| Step::Continue);
        }
        // Near mode: a request whose newest answer made progress repeats
        // only word for word (a resend is still a loop; the next edit of a
        // text is not a repeat of the last).
        // So for each earlier turn near mode compares the newest with.
        let cache = Some(&self.text_cache);
        let progress = |back: usize| match (near, &parsed, &history) {
            (true, Some(req), Some(h)) if !req.over_budget() => {
                progress::turn_progressed_at(h, req, p.volatile.classes, cache, back)
            }
            _ => false,
        };
        let mut made = pending.finish_parsed(body, parsed.as_ref(), &progress);
        // An exact-mode LLM call: its model, found without parsing, prices
        // its response.
        if made.model.is_none() && r.reads_usage() && !config.prices.models.is_empty() {
            made.model = llm::model_of(body);
        }
        if parsed.as_ref().is_some_and(llm::Request::over_budget) {
            refused = Some(Refusal::TooMany);
        }
        if refused.is_some() {
            // Fingerprinted exactly, counted once: as refused, not unparsed.
            made.unparsed = false;
        }
        self.count_refusal(refused, out);
        self.count_hit(r, policy, made, phase, now, out)
    }
}
