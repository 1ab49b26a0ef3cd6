//! The response body's token usage, read as it passes (never held back):
//! added to the request's policy, by token type and whether the request
//! was part of a detected loop.

use super::*;
use crate::metrics::TokenType;
use crate::response::usage::{Framing, UsageReader};

impl Request {
    /// Whether the response's usage is read (a policy judged the request
    /// and it went upstream): the host then gives the response's
    /// `content-type` ([`Engine::on_response_content_type`]).
    pub fn reads_usage(&self) -> bool {
        self.usage_for.is_some()
    }

    /// Whether the host should hand the response body's chunks over
    /// ([`Engine::on_response_body`]).
    pub fn wants_response_body(&self) -> bool {
        self.usage.is_some()
    }

    /// The request is part of a detected loop (a count at or past its
    /// detection, a tool-loop verdict).
    pub(super) fn mark_in_loop(&mut self) {
        if let Some(u) = self.usage_for.as_mut() {
            u.in_loop = true;
        }
    }
}

impl<B: BucketBackend> Engine<B> {
    /// The response's `content-type` (after [`Engine::on_response_headers`]):
    /// a JSON body or an event stream of a request a policy judged is read
    /// for its usage; any other answer reported no usage.
    pub fn on_response_content_type(
        &mut self,
        r: &mut Request,
        content_type: Option<&str>,
        out: &mut Effects,
    ) {
        let Some(target) = r.usage_for else {
            return;
        };
        match content_type.and_then(Framing::of_content_type) {
            Some(f) => r.usage = Some(Box::new(UsageReader::new(f))),
            None => {
                r.usage_for = None;
                count_opt(out, self.registry.without_usage(target.policy), 1);
            }
        }
    }

    /// A chunk of the response body as it passes (`end_of_stream`: the
    /// last).
    pub fn on_response_body(
        &mut self,
        r: &mut Request,
        chunk: &[u8],
        end_of_stream: bool,
        out: &mut Effects,
    ) {
        if let Some(reader) = r.usage.as_mut() {
            reader.feed(chunk);
        }
        if end_of_stream {
            self.finish_usage(r, out);
        }
    }

    /// The response is over (or the stream ended early): count what it
    /// reported.
    pub(super) fn finish_usage(&mut self, r: &mut Request, out: &mut Effects) {
        let Some(reader) = r.usage.take() else {
            return;
        };
        let Some(target) = r.usage_for.take() else {
            return;
        };
        match reader.finish() {
            Some(u) => {
                let (p, l) = (target.policy, target.in_loop);
                count_opt(
                    out,
                    self.registry.tokens(p, TokenType::Input, l),
                    u.input as i64,
                );
                count_opt(
                    out,
                    self.registry.tokens(p, TokenType::Output, l),
                    u.output as i64,
                );
            }
            None => count_opt(out, self.registry.without_usage(target.policy), 1),
        }
    }
}
