//! A structural JSON scanner: finds where values start and end without
//! building them, so a 16 KB conversation costs one quick pass and only the
//! few values loopguard needs are parsed for real (with serde_json).
//!
//! It checks structure (brackets, strings, escapes), not the full grammar:
//! a body with, say, an invalid number inside a skipped value is accepted
//! here (the provider will refuse it anyway); a body whose structure is
//! broken is refused. It never reads out of bounds and never recurses, so
//! no input can exhaust the stack.

mod bounds;
mod canonical;
mod find;
mod items;

pub use bounds::{count_nodes, refusal};
pub use canonical::canonical;
use find::{find_quote_or_backslash, find_structural};
pub use items::{
    elements_with_members_at, members_split, picked_at, Element, Elements, Picked, Split,
    ITEM_IGNORED, ITEM_KEYS, LEADING,
};

/// A byte range `start..end` in the body.
pub type Span = (usize, usize);

/// How deep the scanner follows nesting. Deeper bodies are refused (a real
/// request nests a few levels; serde's own limit is 128).
pub const MAX_DEPTH: usize = 64;
/// Members of one object the scanner reads.
pub const MAX_KEYS: usize = 4_096;
/// Elements of one array the scanner reads (the conversation included).
pub const MAX_ELEMENTS: usize = 65_536;

/// Why the scanner refused a body it could otherwise read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// An object with more than [`MAX_KEYS`] members, an array with more
    /// than [`MAX_ELEMENTS`] elements, or more values to parse than a
    /// request's budget.
    TooMany,
}

pub fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(c) = b.get(i) {
        if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            break;
        }
        i += 1;
    }
    i
}

/// Past the string starting at `i` (which must be a `"`).
pub fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        j += find_quote_or_backslash(b.get(j..)?)?;
        if b.get(j) == Some(&b'"') {
            return Some(j + 1);
        }
        j += 2; // a backslash and the byte it escapes
    }
}

/// Past the value starting at `i` (after whitespace).
pub fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    let i = skip_ws(b, i);
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => skip_container(b, i),
        _ => {
            // A number or a literal: up to the next delimiter.
            let rest = b.get(i..)?;
            let n = rest
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            (n > 0).then_some(i + n)
        }
    }
}

/// Past the object or array starting at `i`, tracking nesting with a
/// counter (no recursion).
fn skip_container(b: &[u8], i: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut j = i;
    loop {
        j += find_structural(b.get(j..)?)?;
        match b.get(j)? {
            b'"' => j = skip_string(b, j)?,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return None;
                }
                j += 1;
            }
            _ => {
                depth = depth.checked_sub(1)?;
                j += 1;
                if depth == 0 {
                    return Some(j);
                }
            }
        }
    }
}

/// The members of the object spanning `span`: each key's raw bytes (inside
/// the quotes, escapes as written) and its value's span.
pub fn members(b: &[u8], span: Span) -> Option<Vec<(&[u8], Span)>> {
    let mut it = Members::new(b, span)?;
    let mut out = Vec::new();
    for m in &mut it {
        if out.len() >= MAX_KEYS {
            return None;
        }
        out.push(m);
    }
    it.ok.then_some(out)
}

/// The members of an object one at a time, so a caller looking for one key
/// can stop early. After the iterator ends, `ok` says whether the object was
/// well formed up to where it was read.
pub struct Members<'b> {
    b: &'b [u8],
    i: usize,
    done: bool,
    pub ok: bool,
}

impl<'b> Members<'b> {
    pub fn new(b: &'b [u8], span: Span) -> Option<Members<'b>> {
        let b = b.get(..span.1)?;
        let i = skip_ws(b, span.0);
        if b.get(i) != Some(&b'{') {
            return None;
        }
        let i = skip_ws(b, i + 1);
        let empty = b.get(i) == Some(&b'}');
        Some(Members {
            b,
            i,
            done: empty,
            ok: true,
        })
    }

    fn fail(&mut self) -> Option<(&'b [u8], Span)> {
        self.done = true;
        self.ok = false;
        None
    }
}

impl<'b> Iterator for Members<'b> {
    type Item = (&'b [u8], Span);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let b = self.b;
        let Some(key_end) = skip_string(b, self.i) else {
            return self.fail();
        };
        let Some(key) = b.get(self.i + 1..key_end - 1) else {
            return self.fail();
        };
        let colon = skip_ws(b, key_end);
        if b.get(colon) != Some(&b':') {
            return self.fail();
        }
        let v_start = skip_ws(b, colon + 1);
        let Some(v_end) = skip_value(b, v_start) else {
            return self.fail();
        };
        let after = skip_ws(b, v_end);
        match b.get(after) {
            Some(b',') => self.i = skip_ws(b, after + 1),
            Some(b'}') => self.done = true,
            _ => return self.fail(),
        }
        Some((key, (v_start, v_end)))
    }
}

/// The element spans of the array spanning `span`.
pub fn elements(b: &[u8], span: Span) -> Option<Vec<Span>> {
    let b = b.get(..span.1)?;
    elements_at(b, skip_ws(b, span.0)).map(|(els, _)| els)
}

/// The element spans of the array starting at `i`, and the offset past it.
pub fn elements_at(b: &[u8], i: usize) -> Option<(Vec<Span>, usize)> {
    if b.get(i) != Some(&b'[') {
        return None;
    }
    let mut i = skip_ws(b, i + 1);
    let mut out = Vec::new();
    if b.get(i) == Some(&b']') {
        return Some((out, i + 1));
    }
    loop {
        let e = skip_value(b, i)?;
        if out.len() >= MAX_ELEMENTS {
            return None;
        }
        out.push((i, e));
        i = skip_ws(b, e);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b']' => return Some((out, i + 1)),
            _ => return None,
        }
    }
}

/// A member: its key's raw bytes and its value's span.
pub type Member<'b> = (&'b [u8], Span);

/// The span of the whole document (one value, only whitespace around it).
pub fn document(b: &[u8]) -> Option<Span> {
    let start = skip_ws(b, 0);
    let end = skip_value(b, start)?;
    (skip_ws(b, end) == b.len()).then_some((start, end))
}

/// A member's value span by key.
pub fn get(members: &[(&[u8], Span)], key: &str) -> Option<Span> {
    members
        .iter()
        .find(|(k, _)| *k == key.as_bytes())
        .map(|(_, s)| *s)
}

/// A string member's raw contents when it has no escapes (enough for roles
/// and types, which are plain words).
pub fn plain_str(b: &[u8], span: Span) -> Option<&[u8]> {
    let raw = b.get(span.0..span.1)?;
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    // A role or a type is a few bytes: looked over directly, not searched.
    let escaped = if inner.len() <= 16 {
        inner.iter().fold(false, |seen, &c| seen | (c == b'\\'))
    } else {
        memchr::memchr(b'\\', inner).is_some()
    };
    (!escaped).then_some(inner)
}

#[cfg(test)]
mod tests;
