//! Configuration errors: which policy, which field, what is wrong, in the
//! same words whether serde found it (an unknown field, a wrong type) or
//! the validation step did (a range, a cross-field rule).

use serde_json::Value;
use std::fmt;

/// A configuration error: which policy, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The policy id, when the error is inside a policy with a usable id.
    pub policy: Option<String>,
    /// Dotted path of the field, relative to the policy's `spec` inside a
    /// policy, or to the top-level object outside one.
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(policy) = &self.policy {
            write!(f, "policy \"{policy}\": ")?;
        }
        write!(f, "{} {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// A value as it appears in JSON, shortened for error messages.
pub fn show(v: &Value) -> String {
    shorten(&v.to_string())
}

pub(super) fn shorten(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((cut, _)) => format!("{}...", s.get(..cut).unwrap_or(s)),
        None => s.to_string(),
    }
}

/// One step of a path into the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn segments(path: &serde_path_to_error::Path) -> Vec<Seg> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|s| match s {
            Segment::Map { key } => Some(Seg::Key(key.clone())),
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Enum { variant } => Some(Seg::Key(variant.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

/// The dotted path, or `empty` for none.
fn render(segs: &[Seg], empty: &str) -> String {
    if segs.is_empty() {
        return empty.to_string();
    }
    let mut out = String::new();
    for s in segs {
        match s {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => out.push_str(&format!(".{k}")),
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn lookup<'v>(root: &'v Value, segs: &[Seg]) -> Option<&'v Value> {
    segs.iter().try_fold(root, |v, s| match s {
        Seg::Key(k) => v.get(k),
        Seg::Index(i) => v.get(i),
    })
}

/// Whether `id` is a usable policy id (`[A-Za-z0-9_-]{1,64}`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Where a path points, as errors name it: inside `policies[i].spec` with
/// a usable id, relative to the spec under that policy; elsewhere, from
/// the top.
fn place(root: &Value, segs: &[Seg]) -> (Option<String>, String) {
    if let [Seg::Key(p), Seg::Index(i), Seg::Key(spec), rest @ ..] = segs {
        if p == "policies" && spec == "spec" {
            let id = root.pointer(&format!("/policies/{i}/id"));
            let id = id.and_then(Value::as_str).filter(|id| valid_id(id));
            if let Some(id) = id {
                return (Some(id.to_string()), render(rest, "spec"));
            }
        }
    }
    (None, render(segs, "configuration"))
}

/// What a list field must hold, in the words of its errors.
fn list_of(field: &str) -> &'static str {
    match field {
        "escalation" => "a non-empty list of {\"at\": <count>, \"action\": ...}",
        "exempt" => "a list of {\"key\": ..., \"present\" | \"values\": ...}",
        "policies" => "a list",
        _ => "a list of strings",
    }
}

/// A serde error found reading `root` as the configuration, in the
/// configuration's own words.
pub fn from_serde(e: serde_path_to_error::Error<serde_json::Error>, root: &Value) -> ConfigError {
    let mut segs = segments(e.path());
    let mut message = e.inner().to_string();
    // serde_json appends " at line x column y" to some messages; the path
    // says where.
    if let Some(at) = message.find(" at line ") {
        message.truncate(at);
    }
    let reason = if let Some(rest) = message.strip_prefix("unknown field `") {
        // The path already ends at the unknown key.
        let (key, expected) = rest.split_once('`').unwrap_or((rest, ""));
        match REPLACED.iter().find(|(old, _)| *old == key) {
            Some((_, replaced)) => (*replaced).to_string(),
            None => match nearest(key, &backticked(expected)) {
                Some(near) => format!("is not a known field (did you mean \"{near}\"?)"),
                None => "is not a known field".to_string(),
            },
        }
    } else if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (given, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let names = one_of(&backticked(expected));
        format!("must be {names} (got \"{given}\")")
    } else if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or(rest);
        segs.push(Seg::Key(name.to_string()));
        "is required".to_string()
    } else if let Some(rest) = message.strip_prefix("invalid type: ") {
        let expected = rest.split(", expected ").nth(1).unwrap_or("");
        let field = match segs.last() {
            Some(Seg::Key(k)) => k.as_str(),
            _ => "",
        };
        let wanted = match expected {
            "a boolean" => "true or false",
            "a sequence" => list_of(field),
            "string or map" => "a string",
            other => other,
        };
        let got = lookup(root, &segs).map(show).unwrap_or_default();
        format!("must be {wanted} (got {got})")
    } else {
        message
    };
    let (policy, field) = place(root, &segs);
    ConfigError {
        policy,
        field,
        reason,
    }
}

/// Fields that were replaced, and what to write instead.
const REPLACED: &[(&str, &str)] = &[(
    "near_distance",
    "was replaced by \"near_similarity\": the fraction of their words two tails must share, above 0 and at most 1 (default 0.35); a SimHash distance of 3 or 4 bits joined only tails about 98% alike (see docs/detection/near.md)",
)];

/// The names between backticks in serde's "expected one of `a`, `b`".
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

/// `"a"`, `"a" or "b"`, `"a", "b" or "c"`.
pub fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The known field closest to a misspelt one, if any is close enough.
pub fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let lower = key.to_lowercase();
    if let Some(k) = known
        .iter()
        .find(|k| lower.len() >= 4 && (k.starts_with(&lower) || lower.starts_with(**k)))
    {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 3.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, case-insensitive, one row at a time.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.to_lowercase().chars().enumerate() {
        let mut cur = Vec::with_capacity(b.len() + 1);
        cur.push(i + 1);
        for ((cb, diagonal), up) in b.iter().zip(&prev).zip(prev.iter().skip(1)) {
            let left = cur.last().map_or(usize::MAX, |l| l + 1);
            cur.push((diagonal + usize::from(ca != *cb)).min(up + 1).min(left));
        }
        prev = cur;
    }
    prev.last().copied().unwrap_or(0)
}
