//! Near mode's signature of a conversation tail: an estimate of how many
//! words two tails share, and an anchor of what must not differ at all.
//!
//! **The similarity** is the Jaccard similarity of the tails' word sets
//! (each word salted with its message's place in the tail): 0.5 means half
//! of the words the two tails hold between them are in both. It is
//! estimated from a b-bit one-permutation MinHash (Li & König 2010; Li,
//! Owen & Zhang 2012): every word is hashed into 4 of [`BINS`] bins, each
//! bin keeps its smallest hash, empty bins borrow from the next full one
//! (rotation densification, Shrivastava & Li 2014), and the signature
//! keeps 2 bits of each bin. Two tails' bins agree with probability
//! `J + (1 - J) / 4`, so the fraction of agreeing bins gives `J` back with
//! a standard error of about 0.04 to 0.055 (20 to 150 words). A word
//! costs four hashes and comparisons, however many bins there are.
//!
//! **The anchor** is a digest of what a near repeat must have exactly: the
//! roles in order, every tool call (its name and the words of its
//! arguments, case and punctuation aside), and
//! the numbers left in tool results and the model's text once noise numbers
//! are masked (counts, percentages, amounts, sizes). A coding agent whose
//! test results differ only in their counts, an agent paging with another
//! cursor, or fetching another order, is never a near repeat, however
//! alike the words are. A tail of fewer than [`SHORT_TAIL_WORDS`] words
//! (a one-line tool result a threaded conversation sends alone, a short
//! prompt) anchors all its words: too few to estimate a similarity from,
//! it is near only to the same words.
//!
//! **The payload** is a digest of what the model's text in the tail
//! presents verbatim (its longest piece of code, fenced or inline, or with
//! no code its longest quoted phrase; its words as a set): a model
//! rewording its prose around the same fix (`pip install pyyaml`, a config
//! block with its lines reordered, the same "Cancel subscription" button)
//! repeats its payload, and two tails with the same anchor and payload are
//! near whatever their prose shares.
//!
//! A signature is 4 bytes of anchor, 4 of payload and [`BINS`] × 2 bits
//! (48 bytes): 56 bytes; a hit in the near record is 60 with its time.

use crate::request::llm::{Message, Part};

/// Bins of the MinHash.
pub const BINS: usize = 192;
/// 64-bit words holding the bins' 2-bit values.
const WORDS: usize = BINS / 32;
/// A signature's encoded size: anchor, payload, bins.
pub const SIGNATURE_BYTES: usize = 4 + 4 + 8 * WORDS;
/// A tail with fewer words is near only to a tail with the same words.
pub const SHORT_TAIL_WORDS: u32 = 24;
/// Places each word takes in the MinHash.
const COPIES: usize = 4;
const USER_COPIES: usize = 1;

/// A tail's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Signature {
    pub anchor: u32,
    /// A digest of the code the model's text in the tail carries (its
    /// words, as a set); 0 for none.
    pub payload: u32,
    /// 2 bits per bin, 32 bins to a word.
    pub bins: [u64; WORDS],
}

/// The least similarity that makes two tails near, as the number of bins
/// that must agree (the same decision in the filter and in Redis, in
/// integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NearThreshold {
    pub min_matches: u32,
}

impl NearThreshold {
    /// The threshold for `near_similarity` in thousandths (1..=1000): bins
    /// agree with probability `(1 + 3J) / 4`, so `J >= s` reads `matches >=
    /// BINS * (1 + 3s) / 4`, in integers only.
    pub fn from_milli(milli: u32) -> NearThreshold {
        let milli = milli.min(1000);
        let need = (BINS as u32 * (1000 + 3 * milli)).div_ceil(4000);
        NearThreshold {
            min_matches: need.min(BINS as u32),
        }
    }
}

impl Signature {
    /// Bins whose values agree.
    pub fn matches(&self, other: &Signature) -> u32 {
        self.bins
            .iter()
            .zip(other.bins.iter())
            .map(|(a, b)| {
                let x = a ^ b;
                // A bin differs when either of its bits does.
                let differ = (x | (x >> 1)) & 0x5555_5555_5555_5555;
                32 - differ.count_ones()
            })
            .sum()
    }

    /// The estimated similarity of two tails (0 when their anchors differ).
    pub fn similarity(&self, other: &Signature) -> f64 {
        if self.anchor != other.anchor {
            return 0.0;
        }
        let p = f64::from(self.matches(other)) / BINS as f64;
        ((4.0 * p - 1.0) / 3.0).clamp(0.0, 1.0)
    }

    /// Whether `other` is a near repeat of this tail: the same anchor, and
    /// at least the threshold's agreeing bins or the same code in the
    /// model's text (a model rewording its prose around the same fix).
    pub fn is_near(&self, other: &Signature, t: NearThreshold) -> bool {
        self.anchor == other.anchor
            && ((self.payload != 0 && self.payload == other.payload)
                || self.matches(other) >= t.min_matches)
    }

    pub fn to_bytes(&self) -> [u8; SIGNATURE_BYTES] {
        let mut out = [0u8; SIGNATURE_BYTES];
        let head = u64::from(self.anchor) | u64::from(self.payload) << 32;
        for (dst, w) in out.chunks_exact_mut(8).zip([head].iter().chain(&self.bins)) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(b: &[u8]) -> Option<Signature> {
        if b.len() != SIGNATURE_BYTES {
            return None;
        }
        let (head, rest) = b.split_at(8);
        let (anchor, payload) = head.split_at(4);
        let mut s = Signature {
            anchor: u32::from_le_bytes(anchor.try_into().ok()?),
            payload: u32::from_le_bytes(payload.try_into().ok()?),
            bins: [0; WORDS],
        };
        for (w, src) in s.bins.iter_mut().zip(rest.chunks_exact(8)) {
            *w = u64::from_le_bytes(src.try_into().ok()?);
        }
        Some(s)
    }

    /// 112 hex digits: the anchor (8), the payload (8), then the bins'
    /// words (16 each), as the Redis function reads them.
    pub fn hex(&self) -> String {
        let mut s = format!("{:08x}{:08x}", self.anchor, self.payload);
        for w in &self.bins {
            s.push_str(&format!("{w:016x}"));
        }
        s
    }

    #[cfg(test)]
    pub fn from_hex(h: &str) -> Option<Signature> {
        if h.len() != 2 * SIGNATURE_BYTES || !h.is_ascii() {
            return None;
        }
        let mut s = Signature {
            anchor: u32::from_str_radix(h.get(..8)?, 16).ok()?,
            payload: u32::from_str_radix(h.get(8..16)?, 16).ok()?,
            bins: [0; WORDS],
        };
        for (i, w) in s.bins.iter_mut().enumerate() {
            *w = u64::from_str_radix(h.get(16 + 16 * i..16 + 16 * (i + 1))?, 16).ok()?;
        }
        Some(s)
    }
}

/// The salt of a conversation's tail: a digest of its task, the first
/// message a user wrote (as written). Salted with it, turns of one task (or
/// the same task started again) compare by their tails, while two tasks
/// that merely look alike (a batch job's runs through the same tools) get
/// unrelated signatures. The system prompt is left out: agents rewrite it
/// between turns (the current time, a scratchpad, a token budget), and a
/// loop must stay one loop. With no user message, the prompts stand in.
pub fn opening_salt(opening: &[Message]) -> u64 {
    let task = opening
        .iter()
        .find(|m| !m.is_prompt())
        .map_or(opening, std::slice::from_ref);
    let mut d = fnv1a(b"opening");
    for m in task {
        d = mix(d ^ fnv1a(m.role.as_bytes()));
        for p in &m.parts {
            match p {
                Part::Text(t) => d = mix(d ^ fnv1a(t.as_bytes())),
                Part::Media(h) => d = mix(d ^ fnv1a(h)),
                _ => {}
            }
        }
    }
    d
}

/// A user's message longer than this many words brings something new to
/// answer, unless it repeats the one before it.
pub const NEWS_WORDS: usize = 24;

/// Whether the newest message a user wrote in `later` (not a tool's
/// result, not an observation) brought something new over the one in
/// `earlier`: a long message (a report, a question, a pasted output) that
/// is not the earlier one again. A dialogue whose user says new things is
/// going on, however alike the replies are; a user (or a harness) saying
/// "still broken" again brings nothing.
pub fn user_brought_news(later: &[Message], earlier: &[Message]) -> bool {
    let last_written = |tail: &[Message]| -> Option<Vec<String>> {
        let m = tail
            .iter()
            .rev()
            .find(|m| m.role == "user" && !m.is_results())?;
        let words = m.parts.iter().filter_map(|p| match p {
            Part::Text(t) => Some(t.split_whitespace().map(str::to_string)),
            _ => None,
        });
        Some(words.flatten().collect())
    };
    let Some(news) = last_written(later).filter(|n| n.len() > NEWS_WORDS) else {
        return false;
    };
    let Some(before) = last_written(earlier) else {
        return true;
    };
    let a: std::collections::BTreeSet<&String> = news.iter().collect();
    let b: std::collections::BTreeSet<&String> = before.iter().collect();
    let shared = a.intersection(&b).count();
    // Not the same message again (at least 4 in 5 of their words shared).
    5 * shared < 4 * a.union(&b).count()
}

/// What a signature's anchor is salted with before it is recorded: the
/// conversation's length (its messages), so the caller's record matches
/// only a conversation sent again as long as before (a client resending a
/// turn, an agent that sends no history), while the turns of a growing
/// conversation are compared within the request ([`crate::detect::fingerprint`]'s
/// repeats).
pub fn position_salt(messages: usize) -> u32 {
    let d = mix(fnv1a(b"position") ^ messages as u64);
    (d ^ (d >> 32)) as u32
}

/// The signature of a conversation's tail, salted with [`opening_salt`]:
/// each message's role, then its parts (text words; a tool call's name and
/// argument words; a tool result's words; a media digest; another block's
/// type), each message's words salted with its place in the tail too.
/// `exact`: the tail is near only to the same words (its newest answer
/// made progress: the next edit of a text is not a repeat of the last).
pub fn of_conversation(salt: u64, tail: &[Message], exact: bool) -> Signature {
    let mut s = Sketcher {
        exact,
        ..Sketcher::default()
    };
    for (i, m) in tail.iter().enumerate() {
        let authored = m.is_authored();
        s.salt(salt ^ (i as u64 + 1));
        s.machine_text = false;
        s.authored = authored;
        s.marker(m.role.as_bytes());
        s.machine_text = !authored;
        parts(&mut s, &m.parts);
        if !authored {
            for p in &m.parts {
                if let Part::Text(t) = p {
                    s.payload(t);
                }
            }
        }
    }
    s.finish()
}

fn parts(s: &mut Sketcher, parts: &[Part]) {
    for p in parts {
        match p {
            Part::Text(t) => s.text(t),
            Part::Media(hash) => {
                s.marker(b"<media>");
                // A digest's bytes: part of the anchor, never folded.
                s.marker(hash);
            }
            Part::ToolCall { name, arguments } => {
                s.marker(b"<call>");
                let machine = std::mem::replace(&mut s.machine_text, false);
                s.marker(name.as_bytes());
                // Every word of the arguments is anchored (another order,
                // another cursor, is another action); case, spacing and
                // punctuation are not (`"USB-C  charger"` is `"usb c
                // charger"`).
                s.anchor_words = true;
                s.text(arguments);
                s.anchor_words = false;
                s.machine_text = machine;
            }
            Part::ToolResult { content, is_error } => {
                s.marker(if *is_error { b"<error>" } else { b"<result>" });
                // A tool's words, even inside a user message (Anthropic).
                let machine = std::mem::replace(&mut s.machine_text, true);
                let authored = std::mem::replace(&mut s.authored, false);
                self::parts(s, content);
                s.machine_text = machine;
                s.authored = authored;
            }
            Part::Other(kind) => {
                s.marker(b"<other>");
                s.word(kind.as_bytes());
            }
        }
    }
}

mod sketch;
mod words;

pub use sketch::Sketcher;
pub use words::{fnv1a, looks_random, mix, quoted, telling, unsegmented, words};

#[cfg(test)]
mod tests;
