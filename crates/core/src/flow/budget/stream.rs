//! Asking the provider for a stream's usage under a budget: a streamed
//! OpenAI Chat Completions request that did not ask for its usage goes
//! upstream with `stream_options.include_usage` set, so its spending is
//! read, not guessed; what the option adds to the answer is taken out
//! again as it passes, so the client receives the stream it asked for.

use crate::flow::{Effect, Effects, Engine, Level, Request};
use crate::request::llm;
use crate::request::llm::stream_options::{ask_usage, AskUsage};
use crate::response::stream_usage::StripUsage;
use crate::state::store::BucketBackend;

/// Whether requests to `path` may stream without their usage (OpenAI Chat
/// Completions and Completions; the Responses and Anthropic APIs always
/// report it).
pub(in crate::flow) fn asks_stream_usage(path: &str) -> bool {
    path.ends_with("/chat/completions") || path.ends_with("/completions")
}

impl<B: BucketBackend> Engine<B> {
    /// The body of a request under a token or dollar cap (`model`: as
    /// parsed, if it was): a stream that does not ask for its usage is made
    /// to (the body as it goes upstream, a tool-loop note included, gets
    /// the option).
    pub(in crate::flow) fn ask_stream_usage(
        &mut self,
        r: &mut Request,
        path: &str,
        body: &[u8],
        model: Option<&str>,
        out: &mut Effects,
    ) {
        if !asks_stream_usage(path) || r.budget.as_ref().is_none_or(|b| b.keys.is_empty()) {
            return;
        }
        // Most bodies name no `stream` (an unescaped quote is a key or a
        // whole string): one search spares them the scan.
        if memchr::memmem::find(body, b"\"stream\"").is_none() {
            return;
        }
        // Upstreams that refuse the option: Azure OpenAI before its
        // 2024-09 API versions (400 "Unknown parameter"), and Mistral's API
        // (422; its streams report their usage unasked).
        // The model as parsed, else found without parsing (exact mode).
        let found = model.is_none().then(|| llm::model_of(body)).flatten();
        let model = model.or(found.as_deref());
        if path.contains("/openai/deployments/")
            || model.is_some_and(|m| crate::config::prices::provider_of(m) == Some("mistral"))
        {
            return;
        }
        if super::check::budget_of(&self.config, r).is_none_or(|b| !b.reads_usage()) {
            return;
        }
        // A note added to the body earlier in this event: the option goes
        // into the body as rewritten.
        let rewritten = out.iter_mut().rev().find_map(|e| match e {
            Effect::ReplaceBody { body, .. } => Some(body),
            _ => None,
        });
        let asked = ask_usage(rewritten.as_deref().map_or(body, Vec::as_slice));
        let AskUsage::Asked(new) = asked else {
            return;
        };
        match rewritten {
            Some(b) => *b = new,
            None if r.headers_held || r.length_dropped => out.push(Effect::ReplaceBody {
                old_len: r.body_len,
                body: new,
                set_length: r.headers_held,
            }),
            None => {
                let line = "stream usage not asked for: the request headers already went upstream with their content-length; its spending is estimated";
                out.push(Effect::Log(Level::Debug, line.to_string()));
                return;
            }
        }
        if let Some(req) = r.budget.as_deref_mut() {
            req.strip = Some(Box::new(StripUsage::default()));
        }
    }

    /// A chunk of a stream whose usage loopguard asked for: what the
    /// option added is taken out before the client sees it.
    pub(in crate::flow) fn strip_stream_usage(
        &mut self,
        r: &mut Request,
        chunk: &[u8],
        end_of_stream: bool,
        out: &mut Effects,
    ) {
        let Some(strip) = r.budget.as_deref_mut().and_then(|b| b.strip.as_deref_mut()) else {
            return;
        };
        if let Some(body) = strip.feed(chunk, end_of_stream) {
            out.push(Effect::ReplaceResponseBody {
                old_len: chunk.len(),
                body,
            });
        }
    }
}
