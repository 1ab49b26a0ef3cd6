//! How `explain` shows a component: text quoted, other bytes in hex,
//! credentials redacted.

use sha2::{Digest, Sha256};

/// Bytes as `explain` shows them: quoted text if printable UTF-8, else
/// hex; long values shortened.
pub fn show_bytes(b: &[u8]) -> String {
    const MAX: usize = 160;
    let (shown, cut) = match std::str::from_utf8(b) {
        Ok(s) if !s.chars().any(char::is_control) => {
            let end = s.char_indices().nth(MAX).map_or(s.len(), |(i, _)| i);
            (quoted(s.get(..end).unwrap_or(s)), end < s.len())
        }
        _ => {
            let hex: String = b.iter().take(MAX / 2).map(|x| format!("{x:02x}")).collect();
            (format!("0x{hex}"), b.len() > MAX / 2)
        }
    };
    if cut {
        format!("{shown}... ({} bytes)", b.len())
    } else {
        shown
    }
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Whether a header, query parameter or limit key by this name carries a
/// credential (`explain` never shows its value).
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let n = n.rsplit(':').next().unwrap_or(&n);
    matches!(
        n,
        "authorization" | "proxy-authorization" | "cookie" | "key" | "sig" | "signature" | "code"
    ) || [
        "token",
        "secret",
        "password",
        "passwd",
        "api-key",
        "api_key",
        "apikey",
        "credential",
        "session",
    ]
    .iter()
    .any(|s| n.contains(s))
}

/// A path with the values of credential-like query parameters redacted
/// (`?key=AIza...` becomes `?key=<redacted>`), for `explain`.
pub fn redact_query(path: &str) -> String {
    let Some((p, q)) = path.split_once('?') else {
        return path.to_string();
    };
    let parts: Vec<String> = q
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !v.is_empty() && is_secret_name(k) => format!("{k}=<redacted>"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{p}?{}", parts.join("&"))
}

/// A value as `explain` shows it: redacted when its name says it is a
/// credential.
pub(super) fn show_named(name: &str, b: &[u8]) -> String {
    if is_secret_name(name) {
        show_secret(b)
    } else {
        show_bytes(b)
    }
}

/// A secret (an API key) as `explain` shows it: never the value.
pub(super) fn show_secret(b: &[u8]) -> String {
    let h = <Sha256 as Digest>::digest(b);
    let prefix: String = h.iter().take(4).map(|x| format!("{x:02x}")).collect();
    format!("<redacted: {} bytes, sha256 {prefix}...>", b.len())
}
