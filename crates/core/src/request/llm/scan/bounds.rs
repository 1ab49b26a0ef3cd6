//! The scanner's bounds: counting the values a parse would build, and
//! telling why a body the scanner could not read was refused.

use super::{literal_len, skip_string, skip_ws, Refusal, Span, MAX_DEPTH, MAX_ELEMENTS, MAX_KEYS};

/// The values in `span` (every object, array, string, number and literal,
/// keys included), if at most `limit`: what parsing it into a value tree
/// would build. `None` over the limit or on broken structure.
pub fn count_nodes(b: &[u8], span: Span, limit: usize) -> Option<usize> {
    let b = b.get(..span.1)?;
    let mut i = span.0;
    let mut n = 0usize;
    while i < b.len() {
        // Past the value starting at `i`, or past a byte that starts none.
        i = match *b.get(i)? {
            b'"' => skip_string(b, i)?,
            b'{' | b'[' => i + 1,
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => i + literal_len(b.get(i..)?),
            _ => {
                i += 1;
                continue;
            }
        };
        n += 1;
        if n > limit {
            return None;
        }
    }
    Some(n)
}

/// Why a body the scanner could not read was refused: nested too deep or
/// too large a container (see [`MAX_DEPTH`], [`MAX_KEYS`] and
/// [`MAX_ELEMENTS`]); `None` when neither (the body is simply not what the
/// reader expects). One pass, no allocation; run only when reading failed.
pub fn refusal(b: &[u8]) -> Option<Refusal> {
    // Per open container: members or elements seen so far.
    let mut counts = [0usize; MAX_DEPTH + 1];
    let mut depth = 0usize;
    let mut i = 0usize;
    while i < b.len() {
        match *b.get(i)? {
            b'"' => i = skip_string(b, i)?,
            b'{' | b'[' => {
                if depth >= MAX_DEPTH {
                    return Some(Refusal::TooDeep);
                }
                depth += 1;
                i += 1;
                // An empty container counts no member.
                let empty = matches!(b.get(skip_ws(b, i)), Some(b'}' | b']'));
                if let Some(c) = counts.get_mut(depth) {
                    *c = usize::from(!empty);
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
