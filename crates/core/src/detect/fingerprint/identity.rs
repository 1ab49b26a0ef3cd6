//! The caller's identity as a fingerprint absorbs it: the policy's limit
//! keys, or the API key, framed and never shown in the clear.

use super::canon::{Canon, TAG_ABSENT, TAG_API_KEY, TAG_LIMIT_KEYS, TAG_PRESENT};
use super::show::{show_named, show_secret};
use super::{Buffer, Component};
use crate::config::{Config, Policy};
use crate::request::{self, RequestFacts, RequestHead};

/// Who is calling, framed: the policy's limit keys (sorted by key) or, when
/// it has none, the caller's API key. These bytes only ever enter a
/// SHA-256 (the fingerprint's, or an event key's): the key itself is never
/// stored, logged or returned (a trace shows it redacted), and two keys
/// never share a fingerprint.
pub(super) fn identity<B: Buffer>(
    config: &Config,
    policy: &Policy,
    head: &RequestHead<'_>,
    facts: &dyn RequestFacts,
) -> B {
    let mut c = Canon(B::sized(48));
    if policy.limit_keys.is_empty() {
        c.tag(TAG_API_KEY);
        let key = request::api_key(facts);
        c.note("caller: API key", || {
            key.as_deref()
                .map_or_else(|| "(absent)".to_string(), show_secret)
        });
        c.optional(key.as_deref());
    } else {
        c.tag(TAG_LIMIT_KEYS);
        c.count(policy.limit_keys.len());
        for key in &policy.limit_keys {
            let name = key.name();
            c.field(name.as_bytes());
            let values =
                request::limit_key_values(key, head, facts, &config.jwt_payload_in_metadata);
            c.0.note(|| {
                let shown = if values.is_empty() {
                    "(absent)".to_string()
                } else {
                    values
                        .iter()
                        .map(|v| show_named(&name, v))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                Component::new(format!("caller: {name}"), shown)
            });
            if values.is_empty() {
                c.tag(TAG_ABSENT);
            } else {
                c.tag(TAG_PRESENT);
                c.count(values.len());
                for v in &values {
                    c.field(v);
                }
            }
        }
    }
    c.0
}
