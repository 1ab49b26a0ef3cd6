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
    elements_with_members_at, members_split, Element, Elements, Picked, Split, ITEM_IGNORED,
    ITEM_KEYS, LEADING,
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

/// The character a JSON string's escape `\e` stands for, but for `\u`.
pub fn short_escape(e: u8) -> Option<char> {
    Some(match e {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        _ => return None,
    })
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
            let n = literal_len(b.get(i..)?);
            (n > 0).then_some(i + n)
        }
    }
}

/// The length of the number or literal `rest` starts with: up to the next
/// delimiter.
fn literal_len(rest: &[u8]) -> usize {
    let delimiter = |c: &u8| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r');
    rest.iter().position(delimiter).unwrap_or(rest.len())
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
pub fn members(b: &[u8], span: Span) -> Option<Vec<Member<'_>>> {
    Some(members_split(b, span, &[], 0)?.0)
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
        let Some((key, (v_start, v_end))) = member_at(b, self.i) else {
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

/// The member at `i`: its key's raw bytes and the span of its value (read
/// by `value(key, start)`, which returns its end).
#[inline(always)]
fn member_with<'b>(
    b: &'b [u8],
    i: usize,
    value: impl FnOnce(&'b [u8], usize) -> Option<usize>,
) -> Option<Member<'b>> {
    let key_end = skip_string(b, i)?;
    let key = b.get(i + 1..key_end - 1)?;
    let colon = skip_ws(b, key_end);
    if b.get(colon) != Some(&b':') {
        return None;
    }
    let v_start = skip_ws(b, colon + 1);
    Some((key, (v_start, value(key, v_start)?)))
}

/// The member at `i`, its value skipped.
#[inline(always)]
fn member_at(b: &[u8], i: usize) -> Option<Member<'_>> {
    member_with(b, i, |_, v| skip_value(b, v))
}

/// The object or array starting at `i` (its `open`ing byte), read member
/// by member or element by element: `item` reads the one starting at its
/// argument and returns where it ends. The offset past the container;
/// `None` if it is broken or `item` gave up.
#[inline(always)]
fn each_item(
    b: &[u8],
    i: usize,
    [open, close]: [u8; 2],
    mut item: impl FnMut(usize) -> Option<usize>,
) -> Option<usize> {
    if b.get(i) != Some(&open) {
        return None;
    }
    let mut i = skip_ws(b, i + 1);
    if b.get(i) == Some(&close) {
        return Some(i + 1);
    }
    loop {
        i = skip_ws(b, item(i)?);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            &c if c == close => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The element spans of the array spanning `span`.
pub fn elements(b: &[u8], span: Span) -> Option<Vec<Span>> {
    let b = b.get(..span.1)?;
    let mut out = Vec::new();
    each_item(b, skip_ws(b, span.0), *b"[]", |i| {
        let e = skip_value(b, i)?;
        if out.len() >= MAX_ELEMENTS {
            return None;
        }
        out.push((i, e));
        Some(e)
    })?;
    Some(out)
}

/// A member: its key's raw bytes and its value's span.
pub type Member<'b> = (&'b [u8], Span);

/// The span of the whole document (one value, only whitespace around it).
pub fn document(b: &[u8]) -> Option<Span> {
    let start = skip_ws(b, 0);
    let end = skip_value(b, start)?;
    (skip_ws(b, end) == b.len()).then_some((start, end))
}

/// Where the value of a key ending at `at` starts, found by searching
/// rather than scanning: past white space (any [`u8::is_ascii_whitespace`]),
/// a `:` and white space again; `None` when no `:` follows. (A quote inside
/// a JSON string is escaped, so an unescaped `"key"` then `:` is a key.)
pub fn after_colon(b: &[u8], at: usize) -> Option<usize> {
    let ws = |i: usize| {
        b.get(i..).map_or(i, |r| {
            i + r.iter().take_while(|c| c.is_ascii_whitespace()).count()
        })
    };
    let colon = ws(at);
    (b.get(colon) == Some(&b':')).then(|| ws(colon + 1))
}

/// A member's value span by key.
pub fn get(members: &[(&[u8], Span)], key: &str) -> Option<Span> {
    members
        .iter()
        .find(|(k, _)| *k == key.as_bytes())
        .map(|(_, s)| *s)
}

/// The string spanning `span`, escapes resolved; `None` if it is not one.
pub fn string(b: &[u8], span: Span) -> Option<String> {
    serde_json::from_slice(b.get(span.0..span.1)?).ok()
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
