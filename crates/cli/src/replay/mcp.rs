//! What replay records about MCP traffic: a request's part of a verdict
//! under an MCP policy, the history a call joins, and loopguard's own note
//! taken out of a result recorded in front of it.

use serde_json::Value;
use std::borrow::Cow;

/// An MCP request's part of a verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpVerdict {
    /// A `tools/call` judged against its history
    /// (`loopguard_mcp_calls_total`).
    pub judged: bool,
    /// The loop acted on (or, in shadow mode, that would have been), as
    /// `x-loopguard-mcp-loop` shows it: `tier=..; tool=..; count=..;
    /// step=..`.
    pub loop_header: Option<String>,
    /// A note was inserted into the server's result.
    pub note_added: bool,
    /// Why the request or its result passed unjudged
    /// (`loopguard_mcp_unjudged_total`'s reason).
    pub unjudged: Option<String>,
    /// The forwarded call's result could not be fed as Envoy read it:
    /// `not_recorded` (no content type and no body, or no body),
    /// `incomplete` (the recorded body ends before the result),
    /// `answered_by_loopguard` (the recording holds loopguard's own answer,
    /// not the server's). The call then does not join its history.
    pub result_missing: Option<&'static str>,
    /// The recorded result held loopguard's own note (it was recorded in
    /// front of loopguard): taken out before it was read.
    pub own_note_removed: bool,
}

impl McpVerdict {
    /// The loop's fields (`tier`, `tool`, `count`, `step`), from the
    /// header's value.
    pub fn loop_fields(&self) -> Option<Vec<(&str, &str)>> {
        let h = self.loop_header.as_deref()?;
        Some(
            h.split(';')
                .filter_map(|f| f.trim().split_once('='))
                .collect(),
        )
    }

    pub fn field(&self, name: &str) -> Option<&str> {
        self.loop_fields()?
            .into_iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

/// An MCP history beyond its caller's identity (see
/// [`Simulation::mcp_history`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpHistory {
    pub address: Option<String>,
    pub session: Option<String>,
}

impl McpHistory {
    /// Both, as shown: `address A; mcp session #S`.
    pub fn shown(&self) -> Option<String> {
        let parts: Vec<&str> = [&self.address, &self.session]
            .into_iter()
            .filter_map(|p| p.as_deref())
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The start of the content block loopguard inserts as its note: serde
/// writes an object's keys sorted (or, built with `preserve_order`, as
/// written).
const OWN_NOTE: [&[u8]; 2] = [
    br#"{"text":"[loopguard] Note: "#,
    br#"{"type":"text","text":"[loopguard] Note: "#,
];

/// A result recorded in front of loopguard carries loopguard's own note as
/// the last block of its `content`: that block (and the comma before it)
/// taken out, so the result read is the server's.
pub(super) fn without_own_note(body: &[u8]) -> (Cow<'_, [u8]>, bool) {
    let Some(at) = OWN_NOTE
        .iter()
        .find_map(|note| body.windows(note.len()).position(|w| w == *note))
    else {
        return (Cow::Borrowed(body), false);
    };
    let rest = body.get(at..).unwrap_or(&[]);
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<Value>();
    let Some(Ok(block)) = values.next() else {
        return (Cow::Borrowed(body), false);
    };
    let end = at + values.byte_offset();
    let closes = body
        .get(end..)
        .and_then(|after| after.iter().find(|b| !b.is_ascii_whitespace()))
        == Some(&b']');
    let is_note = block.get("type").and_then(Value::as_str) == Some("text")
        && block.as_object().is_some_and(|o| o.len() == 2);
    if !closes || !is_note {
        return (Cow::Borrowed(body), false);
    }
    let from = if at > 0 && body.get(at - 1) == Some(&b',') {
        at - 1
    } else {
        at
    };
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(body.get(..from).unwrap_or(&[]));
    out.extend_from_slice(body.get(end..).unwrap_or(&[]));
    (Cow::Owned(out), true)
}
