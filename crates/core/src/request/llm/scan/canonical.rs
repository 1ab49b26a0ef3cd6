//! Canonical JSON straight from the bytes: members sorted by key, no
//! insignificant whitespace.

use super::{elements, members, skip_value, skip_ws, Span};

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
