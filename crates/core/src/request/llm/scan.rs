//! A structural JSON scanner: finds where values start and end without
//! building them, so a 16 KB conversation costs one quick pass and only the
//! few values loopguard needs are parsed for real (with serde_json).
//!
//! It checks structure (brackets, strings, escapes), not the full grammar:
//! a body with, say, an invalid number inside a skipped value is accepted
//! here (the provider will refuse it anyway); a body whose structure is
//! broken is refused. It never reads out of bounds and never recurses, so
//! no input can exhaust the stack.

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

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
const ONES: u64 = 0x0101_0101_0101_0101;
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The first `"` or `\` in `s`, sixteen bytes at a time with WebAssembly
/// SIMD (strings are most of an LLM body).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    use core::arch::wasm32::{u8x16_bitmask, u8x16_eq, u8x16_splat, v128, v128_load, v128_or};
    let (q, bs) = (u8x16_splat(b'"'), u8x16_splat(b'\\'));
    let mut at = 0;
    while at + 16 <= s.len() {
        // SAFETY: `at + 16 <= s.len()`, so the 16 bytes read are in `s`;
        // wasm loads need no alignment.
        let v = unsafe { v128_load(s.as_ptr().add(at).cast::<v128>()) };
        let hits = u8x16_bitmask(v128_or(u8x16_eq(v, q), u8x16_eq(v, bs)));
        if hits != 0 {
            return Some(at + hits.trailing_zeros() as usize);
        }
        at += 16;
    }
    s.get(at..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| at + k)
}

/// The first `"` or `\` in `s`, eight bytes at a time (SWAR: where wasm
/// SIMD is not available, and natively).
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    let mut at = 0;
    let mut chunks = s.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        let q = v ^ (ONES * u64::from(b'"'));
        let bs = v ^ (ONES * u64::from(b'\\'));
        // A byte of `x` is zero exactly where the lowest set high bit of
        // (x - 0x01..) & !x & 0x80.. says (higher ones may be borrow noise).
        let hit = (q.wrapping_sub(ONES) & !q | bs.wrapping_sub(ONES) & !bs) & HIGHS;
        if hit != 0 {
            return Some(at + (hit.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| at + k)
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

/// The bytes that matter between strings inside a container.
fn is_structural(c: u8) -> bool {
    matches!(c, b'"' | b'{' | b'[' | b'}' | b']')
}

/// The first structural byte (`"`, `{`, `[`, `}`, `]`) in `s`.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn find_structural(s: &[u8]) -> Option<usize> {
    use core::arch::wasm32::{u8x16_bitmask, u8x16_eq, u8x16_splat, v128, v128_load, v128_or};
    let marks = [b'"', b'{', b'[', b'}', b']'].map(|c| u8x16_splat(c));
    let mut at = 0;
    while at + 16 <= s.len() {
        // SAFETY: as in `find_quote_or_backslash`.
        let v = unsafe { v128_load(s.as_ptr().add(at).cast::<v128>()) };
        let hit = marks.iter().fold(u8x16_eq(v, marks[0]), |acc, m| {
            v128_or(acc, u8x16_eq(v, *m))
        });
        let hits = u8x16_bitmask(hit);
        if hits != 0 {
            return Some(at + hits.trailing_zeros() as usize);
        }
        at += 16;
    }
    s.get(at..)?
        .iter()
        .position(|&c| is_structural(c))
        .map(|k| at + k)
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
fn find_structural(s: &[u8]) -> Option<usize> {
    s.iter().position(|&c| is_structural(c))
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

    /// The picked members as a list (for code written against [`members`]).
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
    pub fn new(keep: usize) -> Elements {
        Elements {
            keep,
            ..Elements::default()
        }
    }

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
    pub fn kept(&self) -> impl Iterator<Item = (usize, &Element)> {
        let start = self.ring_start();
        self.ring
            .iter()
            .enumerate()
            .map(move |(i, e)| (start + i, e))
    }
}

/// The object starting at `i` read for [`ITEM_KEYS`], and the offset past
/// it.
pub fn picked_at(b: &[u8], i: usize) -> Option<(Picked, usize)> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let mut i = skip_ws(b, i + 1);
    let mut out = Picked::default();
    if b.get(i) == Some(&b'}') {
        return Some((out, i + 1));
    }
    let mut keys = 0usize;
    loop {
        keys += 1;
        if keys > MAX_KEYS {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = b.get(i + 1..key_end - 1)?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let v_start = skip_ws(b, i + 1);
        let v_end = skip_value(b, v_start)?;
        match ITEM_KEYS.iter().position(|k| k.as_bytes() == key) {
            Some(at) => {
                if let Some(slot) = out.spans.get_mut(at) {
                    slot.get_or_insert((v_start, v_end));
                }
            }
            None => out.others |= !ITEM_IGNORED.iter().any(|k| k.as_bytes() == key),
        }
        i = skip_ws(b, v_end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some((out, i + 1)),
            _ => return None,
        }
    }
}

/// The array starting at `i`, each object element read for its picked keys
/// on the way (the first and last `keep` kept), and the offset past it.
pub fn elements_with_members_at(b: &[u8], i: usize, keep: usize) -> Option<(Elements, usize)> {
    if b.get(i) != Some(&b'[') {
        return None;
    }
    let mut i = skip_ws(b, i + 1);
    let mut out = Elements::new(keep);
    if b.get(i) == Some(&b']') {
        return Some((out, i + 1));
    }
    loop {
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
        i = skip_ws(b, e);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b']' => return Some((out, i + 1)),
            _ => return None,
        }
    }
}

/// An object's members, as [`members`], reading the arrays of the keys in
/// `split` into their elements (and those elements' members) on the way:
/// one pass over a large conversation.
pub type Split<'b> = Vec<(&'b [u8], Elements)>;

pub fn members_split<'b>(
    b: &'b [u8],
    span: Span,
    split: &[&str],
    keep: usize,
) -> Option<(Vec<Member<'b>>, Split<'b>)> {
    let b = b.get(..span.1)?;
    let mut i = skip_ws(b, span.0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    let mut out = Vec::new();
    let mut arrays = Vec::new();
    if b.get(i) == Some(&b'}') {
        return Some((out, arrays));
    }
    loop {
        let key_end = skip_string(b, i)?;
        let key = b.get(i + 1..key_end - 1)?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let v_start = skip_ws(b, i + 1);
        let splits = b.get(v_start) == Some(&b'[') && split.iter().any(|k| k.as_bytes() == key);
        let v_end = if splits {
            let (els, end) = elements_with_members_at(b, v_start, keep)?;
            arrays.push((key, els));
            end
        } else {
            skip_value(b, v_start)?
        };
        if out.len() >= MAX_KEYS {
            return None;
        }
        out.push((key, (v_start, v_end)));
        i = skip_ws(b, v_end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some((out, arrays)),
            _ => return None,
        }
    }
}

/// The values in `span` (every object, array, string, number and literal,
/// keys included), if at most `limit`: what parsing it into a value tree
/// would build. `None` over the limit or on broken structure.
pub fn count_nodes(b: &[u8], span: Span, limit: usize) -> Option<usize> {
    let b = b.get(..span.1)?;
    let mut i = span.0;
    let mut n = 0usize;
    while i < b.len() {
        match *b.get(i)? {
            b'"' => {
                n += 1;
                i = skip_string(b, i)?;
            }
            b'{' | b'[' => {
                n += 1;
                i += 1;
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                n += 1;
                let rest = b.get(i..)?;
                i += rest
                    .iter()
                    .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                    .unwrap_or(rest.len());
            }
            _ => i += 1,
        }
        if n > limit {
            return None;
        }
    }
    Some(n)
}

/// Why a body the scanner could not read was refused: nested too deep or
/// too large a container (see the limits above); `None` when neither (the
/// body is simply not what the reader expects). One pass, no allocation;
/// run only when reading failed.
pub fn refusal(b: &[u8]) -> Option<Refusal> {
    // Per open container: members or elements seen so far.
    let mut counts = [0usize; MAX_DEPTH + 1];
    let mut depth = 0usize;
    let mut i = 0usize;
    // Whether the next value starts a new member or element.
    while i < b.len() {
        match *b.get(i)? {
            b'"' => i = skip_string(b, i)?,
            b'{' | b'[' => {
                if depth >= MAX_DEPTH {
                    return Some(Refusal::TooDeep);
                }
                depth += 1;
                if let Some(c) = counts.get_mut(depth) {
                    *c = 1;
                }
                i += 1;
                // An empty container counts no member.
                let j = skip_ws(b, i);
                if matches!(b.get(j), Some(b'}') | Some(b']')) {
                    if let Some(c) = counts.get_mut(depth) {
                        *c = 0;
                    }
                }
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b',' => {
                if let Some(c) = counts.get_mut(depth) {
                    *c += 1;
                    let limit = MAX_KEYS.min(MAX_ELEMENTS);
                    if *c > MAX_ELEMENTS || (*c > limit && is_object_at(b, i)) {
                        return Some(Refusal::TooMany);
                    }
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// Whether the `,` at `i` separates object members (the next token is a
/// key followed by `:`).
fn is_object_at(b: &[u8], i: usize) -> bool {
    let j = skip_ws(b, i + 1);
    skip_string(b, j).is_some_and(|end| b.get(skip_ws(b, end)) == Some(&b':'))
}

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

/// Canonical JSON of the value spanning `span`: object members sorted by
/// key, no insignificant whitespace, strings and numbers as written. Built
/// straight from the bytes (no value tree); `None` if the value is not well
/// formed or nests deeper than 64.
pub fn canonical(b: &[u8], span: Span) -> Option<String> {
    let mut out = String::with_capacity(span.1.saturating_sub(span.0));
    write_canonical(b, span, &mut out, 0)?;
    Some(out)
}

fn write_canonical(b: &[u8], span: Span, out: &mut String, depth: usize) -> Option<()> {
    if depth > 64 {
        return None;
    }
    let start = skip_ws(b, span.0);
    match *b.get(start)? {
        b'{' => {
            let mut m = members(b, span)?;
            m.sort_by(|x, y| x.0.cmp(y.0));
            out.push('{');
            for (n, (k, v)) in m.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push('"');
                out.push_str(std::str::from_utf8(k).ok()?);
                out.push_str("\":");
                write_canonical(b, *v, out, depth + 1)?;
            }
            out.push('}');
        }
        b'[' => {
            out.push('[');
            for (n, e) in elements(b, span)?.into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_canonical(b, e, out, depth + 1)?;
            }
            out.push(']');
        }
        _ => {
            let end = skip_value(b, start)?;
            out.push_str(std::str::from_utf8(b.get(start..end)?).ok()?);
        }
    }
    Some(())
}

/// A string member's raw contents when it has no escapes (enough for roles
/// and types, which are plain words).
pub fn plain_str(b: &[u8], span: Span) -> Option<&[u8]> {
    let raw = b.get(span.0..span.1)?;
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    (!inner.contains(&b'\\')).then_some(inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    #[test]
    fn skips_values_of_every_kind() {
        let b = br#"{"a": [1, {"b": "x\"]}"}, true], "c" : null , "d":-1.5e3}"#;
        let doc = document(b).unwrap();
        let m = members(b, doc).unwrap();
        let keys: Vec<&[u8]> = m.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, vec![&b"a"[..], b"c", b"d"]);
        let a = get(&m, "a").unwrap();
        assert_eq!(&b[a.0..a.1], br#"[1, {"b": "x\"]}"}, true]"#);
        let els = elements(b, a).unwrap();
        assert_eq!(els.len(), 3);
        assert_eq!(&b[els[1].0..els[1].1], br#"{"b": "x\"]}"}"#);
        assert_eq!(
            &b[get(&m, "d").unwrap().0..get(&m, "d").unwrap().1],
            b"-1.5e3"
        );
        assert_eq!(
            plain_str(b, get(&members(b, els[1]).unwrap(), "b").unwrap()),
            None
        );
    }

    #[test]
    fn finds_quotes_and_backslashes_at_every_offset() {
        for len in 0..40 {
            for pos in 0..len {
                for c in [b'"', b'\\'] {
                    let mut s = vec![b'a'; len];
                    s[pos] = c;
                    if pos + 3 < len {
                        s[pos + 3] = b'"';
                    }
                    assert_eq!(
                        find_quote_or_backslash(&s),
                        Some(pos),
                        "len {len} pos {pos}"
                    );
                }
            }
            assert_eq!(find_quote_or_backslash(&vec![0x80u8; len]), None);
            // Bytes one off a quote or backslash are not matches.
            assert_eq!(find_quote_or_backslash(&vec![b'"' + 1; len]), None);
            assert_eq!(find_quote_or_backslash(&vec![b'\\' - 1; len]), None);
        }
    }

    #[test]
    fn refuses_broken_structure_without_panicking() {
        for bad in [
            &b"{"[..],
            b"[1,",
            b"{\"a\" 1}",
            b"{\"a\":1,}",
            b"\"open",
            b"[1 2]",
            b"}",
            b"",
            b"{} x",
            br#"["\"] "#,
        ] {
            let ok = document(bad).and_then(|d| match bad.first() {
                Some(b'{') => members(bad, d).map(|_| ()),
                Some(b'[') => elements(bad, d).map(|_| ()),
                _ => Some(()),
            });
            assert!(ok.is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
        // Nesting is counted, not recursed, up to MAX_DEPTH; deeper is
        // refused, and the refusal says why.
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(document(ok.as_bytes()), Some((0, ok.len())));
        assert_eq!(refusal(ok.as_bytes()), None);
        let deep = format!("{}{}", "[".repeat(500_000), "]".repeat(500_000));
        assert_eq!(document(deep.as_bytes()), None);
        assert_eq!(refusal(deep.as_bytes()), Some(Refusal::TooDeep));
    }

    #[test]
    fn containers_are_read_up_to_their_limits() {
        let many = |n: usize, open: &str, item: &str, close: &str| {
            let items: Vec<String> = (0..n)
                .map(|i| item.replace("{i}", &i.to_string()))
                .collect();
            format!("{open}{}{close}", items.join(","))
        };
        let keys_ok = many(MAX_KEYS, "{", r#""k{i}":0"#, "}");
        let d = document(keys_ok.as_bytes()).unwrap();
        assert_eq!(members(keys_ok.as_bytes(), d).unwrap().len(), MAX_KEYS);
        assert_eq!(refusal(keys_ok.as_bytes()), None);
        let keys_over = many(MAX_KEYS + 1, "{", r#""k{i}":0"#, "}");
        let d = document(keys_over.as_bytes()).unwrap();
        assert_eq!(members(keys_over.as_bytes(), d), None);
        assert_eq!(refusal(keys_over.as_bytes()), Some(Refusal::TooMany));
        let els_over = many(MAX_ELEMENTS + 1, "[", "{}", "]");
        let d = document(els_over.as_bytes()).unwrap();
        assert_eq!(elements(els_over.as_bytes(), d), None);
        assert_eq!(refusal(els_over.as_bytes()), Some(Refusal::TooMany));
        // Many elements are fine in an array, many keys are not in an
        // object: the limits differ.
        let els_ok = many(MAX_KEYS + 1, "[", "1", "]");
        assert_eq!(refusal(els_ok.as_bytes()), None);
    }

    #[test]
    fn long_arrays_keep_the_leading_and_the_last_elements() {
        let body = format!(
            "[{}]",
            (0..1000)
                .map(|i| format!("{{\"n\":{i}}}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let (els, end) = elements_with_members_at(body.as_bytes(), 0, 3).unwrap();
        assert_eq!(end, body.len());
        assert_eq!(els.len(), 1000);
        let at = |i: usize| els.get(i).map(|e| &body[e.0 .0..e.0 .1]);
        assert_eq!(at(0), Some(r#"{"n":0}"#));
        assert_eq!(at(1), Some(r#"{"n":1}"#));
        assert_eq!(at(2), Some(r#"{"n":2}"#));
        assert_eq!(at(3), None, "not kept");
        assert_eq!(at(996), None);
        assert_eq!(at(997), Some(r#"{"n":997}"#));
        assert_eq!(at(999), Some(r#"{"n":999}"#));
        assert_eq!(
            els.kept().map(|(i, _)| i).collect::<Vec<_>>(),
            vec![997, 998, 999]
        );
        assert_eq!(els.last().map(|s| &body[s.0..s.1]), Some(r#"{"n":999}"#));
    }

    #[test]
    fn nodes_are_counted_up_to_a_limit() {
        let b = br#"{"a": [1, true, null, "x"], "b": {"c": -2.5}}"#;
        // {, "a", [, 1, true, null, "x", "b", {, "c", -2.5
        assert_eq!(count_nodes(b, (0, b.len()), 100), Some(11));
        assert_eq!(count_nodes(b, (0, b.len()), 10), None);
    }

    #[test]
    fn canonical_sorts_keys_and_drops_whitespace() {
        let b = br#" { "b" : [ 1 , {"z": "x y", "a": null} ], "a": "\"q\"" } "#;
        assert_eq!(
            canonical(b, (0, b.len())).unwrap(),
            r#"{"a":"\"q\"","b":[1,{"a":null,"z":"x y"}]}"#
        );
        let deep = format!("{}{}", "[".repeat(70), "]".repeat(70));
        assert_eq!(canonical(deep.as_bytes(), (0, deep.len())), None);
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            r"[ -~\n\x{e9}\x{1F600}]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(r#"[a-z"\\]{0,6}"#, inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Re-read a value with the scanner alone, parsing only leaves.
    fn rebuild(b: &[u8], span: Span) -> Value {
        match b[span.0] {
            b'{' => Value::Object(
                members(b, span)
                    .unwrap()
                    .into_iter()
                    .map(|(k, s)| {
                        let key: String =
                            serde_json::from_slice(&[b"\"", k, b"\""].concat()).unwrap();
                        (key, rebuild(b, s))
                    })
                    .collect(),
            ),
            b'[' => Value::Array(
                elements(b, span)
                    .unwrap()
                    .into_iter()
                    .map(|s| rebuild(b, s))
                    .collect(),
            ),
            _ => serde_json::from_slice(&b[span.0..span.1]).unwrap(),
        }
    }

    proptest! {
        /// On any valid JSON (compact or pretty), the scanner finds exactly
        /// the structure serde_json finds.
        #[test]
        fn agrees_with_serde_json(v in arb_json(), pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
            let b = text.as_bytes();
            let doc = document(b).unwrap();
            prop_assert_eq!(rebuild(b, doc), v);
        }

        /// The canonical form is serde_json's sorted compact form (for keys
        /// and strings without escapes, which both render the same way).
        #[test]
        fn canonical_matches_serde_on_plain_values(v in arb_json()) {
            let text = serde_json::to_string_pretty(&v).unwrap();
            if !text.contains('\\') {
                prop_assert_eq!(canonical(text.as_bytes(), (0, text.len())).unwrap(), v.to_string());
            }
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Some(d) = document(&bytes) {
                let _ = members(&bytes, d);
                let _ = elements(&bytes, d);
            }
        }
    }
}
