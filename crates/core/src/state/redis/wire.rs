//! webdis's side of a call: the command in the POST body, and the JSON it
//! answers.

use super::{script::Script, Call};
use crate::state::store::StoreFailure;
use crate::state::window::{Forgave, WindowState};
use serde_json::Value;

/// The library's entry points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Hit,
    Near,
    Forgive,
    /// Budgets: add to and check a request's budget keys
    /// ([`super::budget`]).
    Budget,
    /// MCP call histories ([`super::mcp`]).
    Mcp,
}

impl Entry {
    pub fn name(self) -> &'static str {
        match self {
            Entry::Hit => "loopguard_hit",
            Entry::Near => "loopguard_near",
            Entry::Forgive => "loopguard_forgive",
            Entry::Budget => "loopguard_budget",
            Entry::Mcp => "loopguard_mcp",
        }
    }
}

/// How a call names the Lua it runs.
#[derive(Debug, Clone, Copy)]
pub enum Invoke<'a> {
    /// `FCALL <entry>`: the library is loaded as a Redis Function (one node).
    Function,
    /// `EVALSHA <sha1> ... <entry>`: the script, as the node caches it.
    Cached(&'a Script),
    /// `EVAL <script> ... <entry>`: the whole script, for a node that
    /// answered `NOSCRIPT` (a promoted replica, a restarted node).
    Full(&'a Script),
}

impl Call {
    /// The webdis request body of this call:
    /// `FCALL/<entry>/<n>/<keys>/<args>`, or for a script
    /// `EVALSHA/<sha1>/<n>/<keys>/<entry>/<args>` (`EVAL/<script>/...`),
    /// each part encoded.
    pub fn body(&self, invoke: Invoke) -> String {
        let (entry, n) = (self.entry.name(), self.keys.len());
        let mut out = match invoke {
            Invoke::Function => format!("FCALL/{entry}/{n}"),
            Invoke::Cached(s) => format!("EVALSHA/{}/{n}", s.sha1),
            Invoke::Full(s) => format!("EVAL/{}/{n}", encode_arg(&s.source)),
        };
        for key in &self.keys {
            out.push('/');
            out.push_str(&encode_arg(key));
        }
        // A script's entry point is an argument after the keys (a plain
        // name, written as it is).
        if !matches!(invoke, Invoke::Function) {
            out.push('/');
            out.push_str(entry);
        }
        for arg in &self.args {
            out.push('/');
            out.push_str(&encode_arg(arg));
        }
        out
    }
}

/// Percent-encode an argument for webdis: `/` separates arguments, `?`
/// starts a query, `.` can start an output-format extension and `+` may
/// read as a space; anything but unreserved characters and `:{}` is
/// encoded.
pub fn encode_arg(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    for b in arg.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~' | b':' | b'{' | b'}') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The command's result in webdis's answer `{"<COMMAND>": <result>}`
/// (`FCALL`, `EVALSHA` or `EVAL`).
pub(super) fn result(body: &[u8]) -> Result<Value, StoreFailure> {
    let v: Value = serde_json::from_slice(body).map_err(|_| reply("the answer is not JSON"))?;
    let Value::Object(map) = v else {
        return Err(reply("the answer is not an object"));
    };
    map.into_iter()
        .find(|(k, _)| matches!(k.as_str(), "FCALL" | "EVALSHA" | "EVAL"))
        .map(|(_, v)| v)
        .ok_or_else(|| reply("the answer has no FCALL or EVAL result"))
}

/// An unusable answer, saying why.
pub(super) fn reply(why: &str) -> StoreFailure {
    StoreFailure::Reply(why.to_string())
}

/// Redis's error text when the result is one (`[false, "<text>"]`).
pub(super) fn error_text(result: &Value) -> Option<&str> {
    let items = result.as_array()?;
    (items.first() == Some(&Value::Bool(false)))
        .then(|| items.get(1).and_then(Value::as_str).unwrap_or("error"))
}

/// Whether webdis's answer is Redis's `NOSCRIPT`: the node has not cached
/// the script (`EVALSHA` only).
pub fn is_noscript(status: Option<&str>, body: &[u8]) -> bool {
    status.is_some_and(|s| s.starts_with('2'))
        && memchr::memmem::find(body, b"NOSCRIPT").is_some()
        && result(body).is_ok_and(|r| error_text(&r).is_some_and(|t| t.starts_with("NOSCRIPT")))
}

/// Read webdis's answer to a hit: `[count, until_allowed_ms,
/// cooldown_remaining_ms, event]`.
pub fn parse_reply(status: &str, body: &[u8]) -> Result<WindowState, StoreFailure> {
    let items = result_list(status, body)?;
    let num = |i: usize| -> Result<i64, StoreFailure> {
        items.get(i).and_then(Value::as_i64).ok_or_else(|| {
            StoreFailure::Reply(format!("element {i} of the result is not a number"))
        })
    };
    // Read in order: the first element that is not a number is named.
    Ok(WindowState {
        count: u32::try_from(num(0)?.max(0)).unwrap_or(u32::MAX),
        until_allowed_ms: u64::try_from(num(1)?.max(0)).unwrap_or(0),
        cooldown_remaining_ms: u64::try_from(num(2)?.max(0)).unwrap_or(0),
        event: u32::try_from(num(3)?).ok(),
    })
}

/// What a call of the library answered, or why there is nothing: an
/// unavailable store (Envoy's own 502-504 answers on a connect failure or
/// a timeout, or webdis without its Redis: as with no answer at all),
/// another status, or an error reply.
pub(super) fn result_value(status: &str, body: &[u8]) -> Result<Value, StoreFailure> {
    if matches!(status, "502" | "503" | "504") {
        return Err(StoreFailure::Unavailable(format!(
            "HTTP {status} (webdis unreachable or too slow, or its Redis is down)"
        )));
    }
    if !status.starts_with('2') {
        return Err(StoreFailure::Status(status.to_string()));
    }
    let reply = result(body)?;
    if let Some(msg) = error_text(&reply) {
        return Err(StoreFailure::Reply(msg.chars().take(200).collect()));
    }
    Ok(reply)
}

/// The list a call of the library answered (a hit's, a budget's), or why
/// there is none ([`result_value`]), or it is not a list.
pub(super) fn result_list(status: &str, body: &[u8]) -> Result<Vec<Value>, StoreFailure> {
    match result_value(status, body)? {
        Value::Array(items) => Ok(items),
        _ => Err(reply("the result is not a list")),
    }
}

/// Read the answer to a take-back: 1 forgiven, 0 the window's forgiveness
/// used up, -1 the hit is gone.
pub fn parse_take_back(status: &str, body: &[u8]) -> Result<Forgave, StoreFailure> {
    if !status.starts_with('2') {
        return Err(StoreFailure::Status(status.to_string()));
    }
    match result(body)?.as_i64() {
        Some(1) => Ok(Forgave::Forgiven),
        Some(0) => Ok(Forgave::OverBudget),
        Some(-1) => Ok(Forgave::NotFound),
        _ => Err(reply("the take-back's result is not 1, 0 or -1")),
    }
}
