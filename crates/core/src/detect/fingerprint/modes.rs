//! Finishing a pending fingerprint with the request body: the canonical
//! form of each mode (exact, llm_tail, near with the earlier turns whose
//! tails are near the newest, session), and the exact fallback for a body
//! an LLM mode cannot read.

use super::canon::{note_message, write_message, Canon, TAG_ABSENT, TAG_PRESENT};
use super::pending::{Pending, PendingMode};
use super::{Fingerprint, Fingerprinted, Hashing};
use crate::detect::similarity;
use crate::request::llm;
use std::collections::HashMap;

impl<S: Hashing> Pending<S> {
    pub(super) fn complete(
        self,
        body: &[u8],
        parsed: Option<&llm::Request<'_>>,
        progress_at: &dyn Fn(usize) -> bool,
    ) -> (Fingerprinted, S::Residue) {
        let progress = matches!(self.mode, PendingMode::Near { .. }) && progress_at(0);
        let parsed = if self.reads_llm_body() { parsed } else { None };
        let Some(req) = parsed else {
            return self.unparsed(body, self.reads_llm_body());
        };
        let mut made = Fingerprinted {
            format: Some(req.format),
            model: req.model.clone(),
            ..Fingerprinted::default()
        };
        let (fingerprint, residue) = match &self.mode {
            PendingMode::LlmTail { tail_messages } => {
                let mut c = Canon::<S>::new(b"lg/llm_tail/2");
                c.named("policy", self.policy_id.as_bytes());
                c.identity(&self.identity);
                c.named_optional("model", req.model.as_deref().map(str::as_bytes));
                let Some(mut tail) = req.tail_before(*tail_messages, usize::MAX) else {
                    return self.unparsed(body, true);
                };
                self.volatile.mask_messages(&mut tail);
                c.note("tail messages", || tail.len().to_string());
                c.count(tail.len());
                for (i, m) in tail.iter().enumerate() {
                    write_message(&mut c, m, i);
                }
                c.finish()
            }
            PendingMode::Near {
                tail_messages,
                threshold,
                back,
                needed,
            } => {
                // The fingerprint names the caller's record; the tail goes
                // into the signature compared inside it, salted with the
                // conversation's task, so only turns of one task (or the
                // same task started again) can be near each other.
                let mut c = Canon::<S>::new(b"lg/near/3");
                c.named("policy", self.policy_id.as_bytes());
                c.identity(&self.identity);
                c.named_optional("model", req.model.as_deref().map(str::as_bytes));
                // The task is digested and dropped before the tail is
                // read: a long first message is held once, not twice.
                let mut task = req.task();
                self.volatile.mask_opening(&mut task);
                let salt = similarity::opening_salt(&task);
                c.note(
                    "opening (its first user message salts the signature)",
                    || task.len().to_string(),
                );
                for (i, m) in task.iter().enumerate() {
                    note_message(&mut c.0, m, "opening", i);
                }
                drop(task);
                let Some(mut tail) = req.tail_of_steps_before(*tail_messages, usize::MAX) else {
                    return self.unparsed(body, true);
                };
                self.volatile.mask_messages(&mut tail);
                let mut h = similarity::of_conversation(salt, &tail, progress);
                // The turns before, back to one that answered a user's
                // message bringing something new (a dialogue going on):
                // each whose tail is near the newest counts as a repeat
                // (every turn of a loop, every round of a cycle).
                made.repeats = 1;
                // Each message is read and masked once, whatever number of
                // earlier tails hold it.
                let mut masked: HashMap<Option<usize>, llm::Message> = HashMap::new();
                let mut later: Option<Vec<llm::Message>> = None;
                let starts = req.turn_starts(*back);
                // What users wrote since the oldest turn compared, read once.
                let mut users: Option<Vec<(usize, llm::Message)>> = None;
                for (j, end) in starts.iter().copied().enumerate() {
                    // The rest cannot reach the first step: stop reading.
                    if (made.repeats as usize) + (starts.len() - j) < *needed {
                        break;
                    }
                    let Some(places) = req.tail_of_steps_at(*tail_messages, end) else {
                        break;
                    };
                    let read: Option<Vec<llm::Message>> = places
                        .into_iter()
                        .map(|at| {
                            if let Some(m) = masked.get(&at) {
                                return Some(m.clone());
                            }
                            let mut m = req.message_at(at)?;
                            self.volatile.mask_messages(std::slice::from_mut(&mut m));
                            masked.insert(at, m.clone());
                            Some(m)
                        })
                        .collect();
                    // A message that cannot be read: no earlier tail to
                    // compare (as when the newest tail cannot be read).
                    let Some(earlier) = read else {
                        break;
                    };
                    // A user's new message since that turn began (in its
                    // exchange or a later one): the conversation went on.
                    let until = starts.get(j.wrapping_sub(1)).copied().unwrap_or(usize::MAX);
                    if similarity::user_brought_news(later.as_deref().unwrap_or(&tail), &earlier)
                        || news_between(req, &mut users, end, until)
                    {
                        break;
                    }
                    // As the filter judged that turn: a turn whose answer
                    // made progress repeats only word for word.
                    let exact = progress_at(j + 1);
                    let e = similarity::of_conversation(salt, &earlier, exact);
                    if h.is_near(&e, *threshold) {
                        made.repeats += 1;
                    }
                    later = Some(earlier);
                }
                drop(masked);
                c.note(
                    "earlier turns near the newest, it included (its history)",
                    || made.repeats.to_string(),
                );
                h.anchor ^= similarity::position_salt(req.len());
                if progress {
                    c.note(
                        "newest turn made progress (an answer that moved on, or calls repeated that read something new)",
                        || "yes: the tail repeats only word for word",
                    );
                }
                c.note("tail messages (in the signature)", || {
                    tail.len().to_string()
                });
                for (i, m) in tail.iter().enumerate() {
                    note_message(&mut c.0, m, "message", i);
                }
                c.note("signature anchor", || format!("{:08x}", h.anchor));
                c.note("signature", || h.hex());
                made.near = Some(h);
                c.finish()
            }
            PendingMode::Session { session } => {
                let mut c = Canon::<S>::new(b"lg/session/2");
                c.named("policy", self.policy_id.as_bytes());
                c.identity(&self.identity);
                match session {
                    Some(id) => {
                        c.tag(TAG_PRESENT);
                        c.named("session", id);
                        c.named_optional("model", req.model.as_deref().map(str::as_bytes));
                        c.note(
                            "offers tools",
                            || if req.offers_tools { "yes" } else { "no" },
                        );
                        c.tag(u8::from(req.offers_tools));
                        made.session =
                            Some(String::from_utf8_lossy(id).chars().take(128).collect());
                    }
                    None => {
                        // One fingerprint per caller, judged by the
                        // fallback threshold.
                        c.note("session", || "(absent: judged by fallback_threshold)");
                        c.tag(TAG_ABSENT);
                        made.fallback = true;
                    }
                }
                c.finish()
            }
            PendingMode::Exact => self.exact_with(body),
        };
        made.fingerprint = fingerprint;
        (made, residue)
    }

    /// The exact fingerprint of a body an LLM mode could not read (`llm`:
    /// the mode reads LLM bodies; a body-less request, a GET, is simply not
    /// an LLM call).
    fn unparsed(&self, body: &[u8], llm: bool) -> (Fingerprinted, S::Residue) {
        let (fingerprint, residue) = self.exact_with(body);
        (
            Fingerprinted {
                fingerprint,
                unparsed: llm && !body.is_empty(),
                ..Fingerprinted::default()
            },
            residue,
        )
    }

    fn exact_with(&self, body: &[u8]) -> (Fingerprint, S::Residue) {
        let mut c = self.exact.clone();
        let crc = crc32fast::hash(body);
        c.note("body crc32", || format!("{crc:08x} ({} bytes)", body.len()));
        c.0.put(&crc.to_le_bytes());
        c.finish()
    }
}

/// Whether a user's message among the items `from..to` brought news over
/// the user's message before it ([`similarity::user_brought_news`]); the
/// kept user messages are read once, on the first call.
fn news_between(
    req: &llm::Request<'_>,
    users: &mut Option<Vec<(usize, llm::Message)>>,
    from: usize,
    to: usize,
) -> bool {
    let all = users.get_or_insert_with(|| {
        let first = req
            .turn_starts(crate::config::MAX_NEAR_TURNS_BACK + 1)
            .last()
            .copied()
            .unwrap_or(0);
        req.user_messages_between(first.saturating_sub(1), usize::MAX)
    });
    all.iter().enumerate().any(|(k, (i, m))| {
        *i >= from
            && *i < to
            && similarity::user_brought_news(
                std::slice::from_ref(m),
                k.checked_sub(1)
                    .and_then(|p| all.get(p))
                    .map_or(&[][..], |(_, b)| std::slice::from_ref(b)),
            )
    })
}
