//! Request fingerprints: a canonical, unambiguous encoding of what makes two
//! requests "identical" under a policy, digested to 128 bits.
//!
//! Every component is framed (a tag byte or a length prefix comes first), so
//! the encoding is unambiguous: `a|b` + `c` can never equal `a` + `b|c`. The
//! canonical bytes are streamed into SHA-256 and the digest is truncated to
//! 128 bits, shown as 32 hex characters.
//!
//! The same code can also record what it writes ([`Trace`]): `loopguard
//! explain` shows a request's components in order and its digest, computed
//! by exactly the path the filter takes (the filter's hashing sink ignores
//! the notes, so it pays nothing for them).
//!
//! This file holds the fingerprint and what finishing one learns;
//! `pending.rs` the headers phase, `modes.rs` each mode's reading of the
//! body, `identity.rs` the caller's identity, `canon.rs` the encoding and
//! `show.rs` how `explain` shows a component.

use crate::detect::similarity::Signature;
use crate::request::llm::{self, Format};
use std::fmt;
mod canon;
#[cfg(test)]
mod digest_tests;
mod identity;
#[cfg(test)]
mod llm_tests;
mod modes;
mod pending;
mod show;
#[cfg(test)]
mod tests;
#[cfg(test)]
use canon::truncate;

use canon::{write_message, Canon, TAG_ABSENT, TAG_PRESENT};
pub use canon::{Buffer, Component, Hashing, Sink, Trace};
pub use pending::{explain, Explained, Pending};
use sha2::Sha256;
pub use show::{is_secret_name, redact_query, show_bytes};

/// A 128-bit request fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    /// 32 lower-case hex characters.
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(hex_digit(b >> 4));
            s.push(hex_digit(b & 15));
        }
        s
    }

    /// The key under which a shadow-mode policy counts this fingerprint: a
    /// key space of its own, so shadow counts never touch enforce counts
    /// and a policy switched to enforce starts from zero.
    pub fn shadow_key(&self) -> Fingerprint {
        let mut c = Canon::<Sha256>::new(b"lg/shadow/1");
        c.field(&self.0);
        c.finish().0
    }

    /// 64 well-mixed bits, for choosing a slot-table bucket.
    pub fn spread(&self) -> u64 {
        u64::from_le_bytes(*self.0.first_chunk().unwrap_or(&[0; 8]))
    }
}

/// A nibble (0..=15) as a lower-case hex digit.
fn hex_digit(nibble: u8) -> char {
    char::from_digit(u32::from(nibble), 16).unwrap_or('0')
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// A finished fingerprint and what was learnt making it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fingerprinted {
    pub fingerprint: Fingerprint,
    /// A session-mode request without a session id: judged by the fallback
    /// ladder.
    pub fallback: bool,
    /// An LLM mode could not read the body (not JSON, or not a format it
    /// knows) and used the exact fingerprint instead.
    pub unparsed: bool,
    /// The LLM format and model, when the body was read as one.
    pub format: Option<Format>,
    pub model: Option<String>,
    /// The session id (session mode), for events.
    pub session: Option<String>,
    /// Near mode: the signature of the masked tail (`fingerprint` then
    /// names the caller's record: policy, caller and model), its anchor
    /// salted with the conversation's length, so the record matches a
    /// conversation sent again at the same length (a resend, an agent that
    /// sends no history), never an earlier turn of a growing one.
    pub near: Option<Signature>,
    /// Near mode: the newest turn and the earlier ones (as many as the
    /// ladder needs, back to one a user's new message started) whose tails
    /// are near its tail in the request's own history (1: none is; 0: not
    /// read). A growing conversation's repeats are judged by its turns,
    /// whatever their pace.
    pub repeats: u32,
}

/// The key under which a tool-loop event is remembered, so it is logged
/// once per conversation (the caller and the conversation's opening
/// message) and level within a window, not once per request.
pub fn tool_event_key(
    policy_id: &str,
    identity: &[u8],
    req: &llm::Request<'_>,
    tier: &str,
    tool: &str,
    level: u32,
) -> Fingerprint {
    let mut c = Canon::<Sha256>::new(b"lg/tool-event/2");
    c.field(policy_id.as_bytes());
    c.field(identity);
    match req.first_message() {
        Some(m) => {
            c.tag(TAG_PRESENT);
            write_message(&mut c, &m, 0);
        }
        None => c.tag(TAG_ABSENT),
    }
    c.field(tier.as_bytes());
    c.field(tool.as_bytes());
    c.count(level as usize);
    c.finish().0
}
