//! Tool loops in the request flow: acting on the verdict the conversation's
//! history gave (a 429, or the request forwarded with the
//! `x-loopguard-tool-loop` header and a note or hint added to its body;
//! in shadow mode, what would have been done logged), and its event once
//! per conversation and level within a window.

use super::{count_opt, Effect, Effects, Engine, Level, Request, Step};
use crate::act::{events, reply};
use crate::config::{Mode, Policy, StepName, ToolStep};
use crate::detect::fingerprint::{self, Pending};
use crate::detect::tool_loops::{self, ToolVerdict};
use crate::metrics::WouldBe;
use crate::request::llm;
use crate::state::store::BucketBackend;
use serde_json::json;

impl<B: BucketBackend> Engine<B> {
    /// Act on a tool-loop verdict. `Some` ends the request's processing (a
    /// 429); `None` lets it go on (to loop detection, if the policy has it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tool_loop(
        &mut self,
        r: &mut Request,
        (index, policy): (usize, &Policy),
        pending: &Pending,
        req: &llm::Request<'_>,
        v: &ToolVerdict,
        now: u64,
        out: &mut Effects,
    ) -> Option<Step> {
        count_opt(out, self.registry.tool_loop(index, v.tier, v.step), 1);
        self.note_in_loop(r, index, out);
        // The conversation's spending (a tool-loop-only policy reading the
        // response's usage; a policy that counts hits keeps it under the
        // fingerprint, set when the hit is counted).
        let (key, model) = match r.usage_for {
            Some(u) if policy.detection.is_none() => (u.loop_key, u.model),
            _ => (None, None),
        };
        let shadow = policy.mode == Mode::Shadow;
        // One event line per conversation and level within a window, however
        // fast the loop runs (remembered in the shared table, so across
        // workers too).
        let identity = pending.identity();
        let tier = v.tier.as_str();
        let event_key =
            fingerprint::tool_event_key(&policy.id, identity, req, tier, &v.evidence.tool, v.level);
        if self.first_event(event_key, now) {
            let (name, tool) = ("loop.tool.detected", tool_loops::shown_tool(v));
            let mut event = events::verdict_event(name, &policy.id, v, tool, shadow, None);
            self.add_spend(&mut event, r.caller, key, now);
            self.emit_event(&event, true, now, out);
        }
        let header = tool_loops::header_value(v);
        let step = v.step.as_str();
        self.publish_decision(out, (policy, true), step, || [("tool_loop", json!(header))]);
        if shadow {
            let (tool, level) = (tool_loops::shown_tool(v), ("level", v.level));
            let line = crate::act::shadow::verdict_line("tool loop", &policy.id, v, tool, level);
            self.shadow(line, out);
            count_opt(out, self.registry.shadow(index, WouldBe::from(v.step)), 1);
            return None;
        }
        let cfg = policy.tool_loops.as_ref()?;
        if v.step == ToolStep::Reject {
            if let Some(key) = key {
                self.count_avoided(index, key, model, now, out);
            }
            let reply = reply::tool_loop_rejection(&policy.id, v, r.api);
            let detail = "loopguard_tool_loop_detected";
            return Some(self.answer(r, Some(index), reply, detail, out));
        }
        let phase = r.phase();
        self.carry(r, phase, ("x-loopguard-tool-loop", header), true, out);
        // A note changes the body's length: only possible while the headers
        // can still say so (held), or when they carry no length.
        if !r.headers_held && !r.length_dropped {
            let line = format!("tool-loop {step} not added: the request headers already went upstream with their content-length");
            out.push(Effect::Log(Level::Warn, line));
            return None;
        }
        match tool_loops::rewrite(cfg, req, v) {
            Some(body) => out.push(Effect::ReplaceBody {
                old_len: r.body_len,
                body,
                set_length: r.headers_held,
            }),
            None => {
                let line = format!("no conversation to add the tool-loop {step} to");
                out.push(Effect::Log(Level::Debug, line));
            }
        }
        None
    }
}
