//! MCP call histories in the shared store: one call of `loopguard_mcp`
//! reads a history (before its call is judged) or adds a call to it (once
//! its result is read, or loopguard answered it), so an agent whose calls
//! land on different replicas is one history.
//!
//! ```text
//! FCALL loopguard_mcp 2 <history key> <last-real key> <window_ms> <now_ms> [<entry> <flags>]
//! -> {last_real_ms, entry 1, .., entry n}   (a read)
//! -> 1                                       (an add)
//! ```
//!
//! An entry is `<call>:<result>:<content>:<flags>` in hex digits: digests
//! only, as in the local table ([`crate::state::mcp_sessions`]).

use super::{wire::reply, Call, Entry as Lua, RedisStore};
use crate::detect::mcp::Entry;
use crate::state::mcp_sessions::{entry, flags, Recent, MAX_ENTRIES};
use crate::state::store::StoreFailure;
use serde_json::Value;

/// The store keys of a history: its calls and when the newest call the
/// server answered was added, under one hash tag (one Redis Cluster
/// shard). They hold digests and the plugin name only.
pub fn mcp_keys(namespace: &str, key: u64) -> [String; 2] {
    ["h", "r"].map(|name| format!("lg:{namespace}:{{m{key:016x}}}:{name}"))
}

/// An entry as the store keeps it.
pub fn encode_entry(e: &Entry) -> String {
    format!("{:x}:{:x}:{:x}:{:x}", e.call, e.result, e.content, flags(e))
}

/// An entry the store kept (`None`: not one loopguard wrote).
pub fn decode_entry(s: &str) -> Option<Entry> {
    let mut parts = s.split(':').map(|p| u64::from_str_radix(p, 16).ok());
    let mut next = || parts.next().flatten();
    let (call, result, content, flags) = (next()?, next()?, next()?, next()?);
    let flags = u8::try_from(flags).ok().filter(|&f| f <= 7)?;
    let whole = parts.next().is_none();
    whole.then(|| entry(call, result, content, flags))
}

/// The call reading history `key` (`entry: None`), or adding `entry` to
/// it.
pub fn mcp_call(
    namespace: &str,
    key: u64,
    window_ms: u64,
    now_ms: u64,
    entry: Option<&Entry>,
) -> Call {
    let mut args = vec![
        window_ms.to_string(),
        now_ms.min(super::budget::MAX_AMOUNT).to_string(),
    ];
    if let Some(e) = entry {
        args.extend([encode_entry(e), flags(e).to_string()]);
    }
    Call {
        entry: Lua::Mcp,
        keys: mcp_keys(namespace, key).to_vec(),
        args,
    }
}

impl RedisStore {
    /// The library call reading a history (`entry: None`), or adding a
    /// call to it.
    pub fn mcp_of(&self, key: u64, window_ms: u64, now_ms: u64, entry: Option<&Entry>) -> Call {
        mcp_call(&self.namespace, key, window_ms, now_ms, entry)
    }
}

/// Read the answer to a history read (`status`: `None` when none came):
/// its calls, oldest first (at most [`MAX_ENTRIES`]), and when the newest
/// call the server answered was added.
pub fn parse_history(status: Option<&str>, body: &[u8]) -> Result<Recent, StoreFailure> {
    let items = super::wire::result_list(status.ok_or_else(super::no_answer)?, body)?;
    let mut items = items.iter();
    let first = items.next().and_then(Value::as_u64);
    let last_real_ms = first.ok_or_else(|| reply("the history's first element is not a time"))?;
    let mut entries = items
        .map(|v| {
            let e = v.as_str().and_then(decode_entry);
            e.ok_or_else(|| reply("a history entry is not one loopguard wrote"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let extra = entries.len().saturating_sub(MAX_ENTRIES);
    entries.drain(..extra);
    Ok(Recent {
        entries,
        last_real_ms,
        snapshot: None,
    })
}

/// Read the answer to an add.
pub fn parse_added(status: Option<&str>, body: &[u8]) -> Result<(), StoreFailure> {
    let status = status.ok_or_else(super::no_answer)?;
    match super::wire::result_value(status, body)?.as_i64() {
        Some(1) => Ok(()),
        _ => Err(reply("the add's result is not 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(call: u64, result: u64, flags: u8) -> Entry {
        Entry {
            call,
            result,
            content: result ^ 7,
            failed: flags & 1 != 0,
            unread: flags & 2 != 0,
            answered: flags & 4 != 0,
        }
    }

    #[test]
    fn entries_round_trip_and_odd_ones_are_refused() {
        for f in 0..8 {
            let x = e(u64::MAX, 0, f);
            assert_eq!(decode_entry(&encode_entry(&x)), Some(x));
        }
        for bad in ["", "1:2:3", "1:2:3:8", "1:2:3:4:5", "x:2:3:4", "1:2:3:"] {
            assert_eq!(decode_entry(bad), None, "{bad}");
        }
    }

    #[test]
    fn calls_name_their_keys_under_one_tag() {
        let c = mcp_call("lg", 0xab, 60_000, 5, Some(&e(1, 2, 4)));
        assert_eq!(
            c.keys,
            vec!["lg:lg:{m00000000000000ab}:h", "lg:lg:{m00000000000000ab}:r"]
        );
        assert_eq!(c.args, vec!["60000", "5", "1:2:5:4", "4"]);
        assert_eq!(mcp_call("lg", 1, 10, 5, None).args, vec!["10", "5"]);
    }

    #[test]
    fn answers_are_read_or_refused() {
        let r = parse_history(Some("200"), br#"{"FCALL":[42,"1:2:5:0","3:4:3:1"]}"#).unwrap();
        assert_eq!(r.last_real_ms, 42);
        assert_eq!(r.entries, vec![e(1, 2, 0), e(3, 4, 1)]);
        assert!(parse_history(Some("200"), br#"{"FCALL":[42,"zz"]}"#).is_err());
        assert!(parse_history(Some("200"), br#"{"FCALL":[]}"#).is_err());
        assert!(matches!(
            parse_history(None, b""),
            Err(StoreFailure::Unavailable(_))
        ));
        assert!(matches!(
            parse_history(Some("503"), b""),
            Err(StoreFailure::Unavailable(_))
        ));
        assert_eq!(parse_added(Some("200"), br#"{"EVALSHA":1}"#), Ok(()));
        assert!(parse_added(Some("200"), br#"{"FCALL":[false,"ERR x"]}"#).is_err());
        assert!(parse_added(Some("500"), b"").is_err());
    }
}
