//! What every trace form shares: messages, headers, bodies, fields by proto or JSON name.

use crate::replay::input::base64;
use serde_json::Value;

/// A request or response as the trace recorded it.
#[derive(Default)]
pub(super) struct Message {
    pub(super) headers: Vec<(String, Vec<u8>)>,
    pub(super) body: Body,
}

#[derive(Default)]
pub(super) struct Body {
    pub(super) bytes: Vec<u8>,
    pub(super) truncated: bool,
    /// Read from `as_string` (JSON_BODY_AS_STRING), where Envoy writes
    /// bytes that are not UTF-8 as spaces.
    pub(super) as_string: bool,
}

impl Body {
    pub(super) fn append(&mut self, more: Body) {
        self.bytes.extend(more.bytes);
        self.truncated |= more.truncated;
        self.as_string |= more.as_string;
    }
}

/// A list of HeaderValue: `key`, and `value` (text) or `raw_value`
/// (base64 bytes).
pub(super) fn headers(list: &Value, at: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let items = match list {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => return Err(format!("{at}: not a list (got {other})")),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, h) in items.iter().enumerate() {
        if !h.is_object() {
            return Err(format!("{at}[{i}]: not an object with key and value"));
        }
        let key = match field(h, "key") {
            Some(Value::String(k)) if !k.is_empty() => k.to_ascii_lowercase(),
            Some(Value::String(_)) | None => return Err(format!("{at}[{i}]: key is missing")),
            Some(_) => return Err(format!("{at}[{i}]: key is not a string")),
        };
        let value = match field(h, "value") {
            Some(Value::String(s)) => s.as_bytes().to_vec(),
            None => Vec::new(),
            Some(_) => return Err(format!("{at}[{i}]: value is not a string")),
        };
        let value = match field(h, "raw_value") {
            Some(Value::String(raw)) if value.is_empty() && !raw.is_empty() => {
                base64(raw).map_err(|e| format!("{at}[{i}]: raw_value: {e}"))?
            }
            Some(Value::String(_)) | None => value,
            Some(_) => return Err(format!("{at}[{i}]: raw_value is not a string")),
        };
        out.push((key, value));
    }
    Ok(out)
}

/// A Body: `as_bytes` (base64) or `as_string`, and `truncated`.
pub(super) fn body(v: &Value, at: &str) -> Result<Body, String> {
    if !v.is_object() {
        return Err(format!("{at}: not an object"));
    }
    let truncated = match field(v, "truncated") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("{at}.truncated: not true or false (got {other})")),
    };
    let (bytes, as_string) = match (field(v, "as_bytes"), field(v, "as_string")) {
        (Some(Value::String(b)), _) => {
            (base64(b).map_err(|e| format!("{at}.as_bytes: {e}"))?, false)
        }
        (Some(_), _) => return Err(format!("{at}.as_bytes: not a string")),
        (None, Some(Value::String(s))) => (s.as_bytes().to_vec(), true),
        (None, Some(_)) => return Err(format!("{at}.as_string: not a string")),
        (None, None) => (Vec::new(), false),
    };
    Ok(Body {
        bytes,
        truncated,
        as_string,
    })
}

/// A field by its proto name (`as_bytes`) or its JSON name (`asBytes`);
/// `null` counts as absent.
pub(super) fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    let obj = v.as_object()?;
    let found = obj.get(name).or_else(|| {
        let mut camel = String::with_capacity(name.len());
        let mut upper = false;
        for c in name.chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                camel.push(c.to_ascii_uppercase());
                upper = false;
            } else {
                camel.push(c);
            }
        }
        obj.get(&camel)
    })?;
    (!found.is_null()).then_some(found)
}

pub(super) fn lossy(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}
