//! A conversation read in one pass: each item's picked keys, and of a
//! long array its opening and last elements only.

use super::{
    each_item, member_at, member_with, skip_value, skip_ws, Member, Span, MAX_ELEMENTS, MAX_KEYS,
};

/// The keys of a conversation item that loopguard reads.
pub const ITEM_KEYS: [&str; 9] = [
    "role",
    "type",
    "content",
    "tool_calls",
    "function_call",
    "name",
    "arguments",
    "input",
    "output",
];
/// Keys an item may carry that change nothing loopguard reads.
pub const ITEM_IGNORED: [&str; 5] = ["tool_call_id", "refusal", "annotations", "audio", "id"];

/// An object element's picked keys (in [`ITEM_KEYS`] order), and whether it
/// has keys beyond those and [`ITEM_IGNORED`]. Fixed size: reading a long
/// conversation allocates nothing per item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Picked {
    pub spans: [Option<Span>; 9],
    pub others: bool,
}

impl Picked {
    pub fn get(&self, key: &str) -> Option<Span> {
        let i = ITEM_KEYS.iter().position(|k| *k == key)?;
        self.spans.get(i).copied().flatten()
    }

    /// The picked members as a list (for code written against
    /// [`members`](super::members)).
    pub fn members(&self) -> Vec<Member<'static>> {
        ITEM_KEYS
            .iter()
            .zip(self.spans.iter())
            .filter_map(|(k, s)| s.map(|s| (k.as_bytes(), s)))
            .collect()
    }
}

/// One element of a read array: its span and, for an object, its picked
/// keys.
pub type Element = (Span, Option<Picked>);

/// Leading elements an [`Elements`] keeps: a conversation's opening (a
/// system prompt, a developer message, the first user message).
pub const LEADING: usize = 3;

/// An array read for its elements, keeping what a reader needs of a long
/// one: the first [`LEADING`] elements (a conversation's opening), the last
/// `keep` (a ring), and how many there are. Memory is proportional to
/// `keep`, however long the array.
#[derive(Debug, Clone, Default)]
pub struct Elements {
    lead: [Option<Element>; LEADING],
    /// The last elements, oldest first.
    ring: std::collections::VecDeque<Element>,
    keep: usize,
    total: usize,
}

impl Elements {
    fn push(&mut self, e: Element) {
        if let Some(slot) = self.lead.get_mut(self.total) {
            *slot = Some(e);
        }
        if self.keep > 0 {
            if self.ring.len() == self.keep {
                self.ring.pop_front();
            }
            self.ring.push_back(e);
        }
        self.total += 1;
    }

    /// Elements in the array.
    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Index of the oldest element in the ring.
    fn ring_start(&self) -> usize {
        self.total - self.ring.len()
    }

    /// The element at `index`, if it was kept (one of the first
    /// [`LEADING`], or of the last `keep`).
    pub fn get(&self, index: usize) -> Option<&Element> {
        if let Some(Some(e)) = self.lead.get(index) {
            return Some(e);
        }
        self.ring.get(index.checked_sub(self.ring_start())?)
    }

    /// The last element's span.
    pub fn last(&self) -> Option<Span> {
        let first = self.lead.first().and_then(Option::as_ref);
        self.ring.back().or(first).map(|e| e.0)
    }

    /// The kept last elements, oldest first, with their indices.
    pub fn kept(&self) -> impl DoubleEndedIterator<Item = (usize, &Element)> {
        let start = self.ring_start();
        self.ring
            .iter()
            .enumerate()
            .map(move |(i, e)| (start + i, e))
    }
}

/// The object starting at `i` read for [`ITEM_KEYS`], and the offset past
/// it.
fn picked_at(b: &[u8], i: usize) -> Option<(Picked, usize)> {
    let mut out = Picked::default();
    let mut keys = 0usize;
    let end = each_item(b, i, *b"{}", |i| {
        keys += 1;
        if keys > MAX_KEYS {
            return None;
        }
        let (key, span) = member_at(b, i)?;
        match ITEM_KEYS.iter().position(|k| k.as_bytes() == key) {
            Some(at) => {
                if let Some(slot) = out.spans.get_mut(at) {
                    slot.get_or_insert(span);
                }
            }
            None => out.others |= !ITEM_IGNORED.iter().any(|k| k.as_bytes() == key),
        }
        Some(span.1)
    })?;
    Some((out, end))
}

/// The array starting at `i`, each object element read for its picked keys
/// on the way (the first and last `keep` kept), and the offset past it.
pub fn elements_with_members_at(b: &[u8], i: usize, keep: usize) -> Option<(Elements, usize)> {
    let mut out = Elements {
        keep,
        ..Elements::default()
    };
    let end = each_item(b, i, *b"[]", |i| {
        let (picked, e) = match b.get(i)? {
            b'{' => {
                let (p, e) = picked_at(b, i)?;
                (Some(p), e)
            }
            _ => (None, skip_value(b, i)?),
        };
        if out.len() >= MAX_ELEMENTS {
            return None;
        }
        out.push(((i, e), picked));
        Some(e)
    })?;
    Some((out, end))
}

/// An object's members, as [`members`](super::members), reading the arrays
/// of the keys in `split` into their elements (and those elements' members)
/// on the way: one pass over a large conversation.
pub type Split<'b> = Vec<(&'b [u8], Elements)>;

pub fn members_split<'b>(
    b: &'b [u8],
    span: Span,
    split: &[&str],
    keep: usize,
) -> Option<(Vec<Member<'b>>, Split<'b>)> {
    let b = b.get(..span.1)?;
    let mut out = Vec::new();
    let mut arrays = Vec::new();
    each_item(b, skip_ws(b, span.0), *b"{}", |i| {
        let member = member_with(b, i, |key, v_start| {
            if b.get(v_start) == Some(&b'[') && split.iter().any(|k| k.as_bytes() == key) {
                let (els, end) = elements_with_members_at(b, v_start, keep)?;
                arrays.push((key, els));
                Some(end)
            } else {
                skip_value(b, v_start)
            }
        })?;
        if out.len() >= MAX_KEYS {
            return None;
        }
        out.push(member);
        Some(member.1 .1)
    })?;
    Some((out, arrays))
}
