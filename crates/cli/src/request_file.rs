//! A request as the CLI reads it (`explain --request`, each entry that
//! `replay` reads): the facts the filter would have of it.

use super::documents::{self, Document};
use loopguard_core::request::RequestFacts;
use serde_json::Value;
use std::collections::BTreeMap;

/// A request as given to `explain` or `replay`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFile {
    pub method: String,
    /// With the query string.
    pub path: String,
    pub authority: String,
    /// Lower-case names, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// The Envoy route the request matched (`xds.route_name`).
    pub route: Option<String>,
    /// The policy the route names in its metadata.
    pub route_policy: Option<String>,
    pub source_address: Option<String>,
    /// Claims jwt_authn verified (`jwt_verified:` limit keys).
    pub verified_claims: BTreeMap<String, String>,
    /// Notes about how the file was read, shown to the user.
    pub notes: Vec<String>,
}

impl RequestFacts for RequestFile {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
    fn source_address(&self) -> Option<String> {
        self.source_address.clone()
    }
    fn verified_claim(&self, _payload_key: &str, claim: &str) -> Option<Vec<u8>> {
        self.verified_claims
            .get(claim)
            .map(|v| v.as_bytes().to_vec())
    }
    fn route_name(&self) -> Option<String> {
        self.route.clone()
    }
    fn route_policy(&self) -> Option<String> {
        self.route_policy.clone()
    }
}

/// Read a request file: raw HTTP/1.1 (`POST /path HTTP/1.1`, headers, a
/// blank line, the body bytes as they are), or JSON/YAML with `method`,
/// `path`, `headers`, and `body` (a string, sent as its bytes) or
/// `body_json` (any JSON, sent compactly), plus optional `route`,
/// `route_policy`, `source_address` and `verified_claims`.
pub fn read_request(file: &str, bytes: &[u8]) -> Result<RequestFile, String> {
    if let Some(r) = raw_http(bytes) {
        return r;
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("{file}: not UTF-8 (give raw HTTP or JSON/YAML)"))?;
    let docs = documents::parse(file, text).map_err(|e| e.to_string())?;
    let Some(Document { value, .. }) = docs.into_iter().next() else {
        return Err(format!("{file}: holds no request"));
    };
    from_value(file, &value)
}

pub const KNOWN: [&str; 10] = [
    "method",
    "path",
    "authority",
    "headers",
    "body",
    "body_json",
    "route",
    "route_policy",
    "source_address",
    "verified_claims",
];

pub fn from_value(file: &str, v: &Value) -> Result<RequestFile, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{file}: must be an object with method, path, headers and body"))?;
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!(
            "{file}: {k} is not a known field ({})",
            KNOWN.join(", ")
        ));
    }
    let text = |name: &str| -> Result<Option<String>, String> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("{file}: {name} must be a string (got {other})")),
        }
    };
    let mut r = RequestFile {
        path: text("path")?.ok_or_else(|| format!("{file}: path is required"))?,
        route: text("route")?,
        route_policy: text("route_policy")?,
        source_address: text("source_address")?,
        ..RequestFile::default()
    };
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(h)) => {
            for (k, v) in h {
                let values: Vec<&Value> = match v {
                    Value::Array(a) => a.iter().collect(),
                    one => vec![one],
                };
                for value in values {
                    let shown = match value {
                        Value::String(s) => s.clone(),
                        Value::Number(_) | Value::Bool(_) => value.to_string(),
                        other => {
                            return Err(format!(
                                "{file}: headers.{k} must be a string (got {other})"
                            ))
                        }
                    };
                    r.headers.push((k.to_ascii_lowercase(), shown.into_bytes()));
                }
            }
        }
        Some(other) => {
            return Err(format!(
                "{file}: headers must be a map of names to values (got {other})"
            ))
        }
    }
    match (obj.get("body"), obj.get("body_json")) {
        (Some(_), Some(_)) => return Err(format!("{file}: give body or body_json, not both")),
        (Some(Value::String(s)), None) => r.body = s.clone().into_bytes(),
        (Some(other), None) if !other.is_null() => {
            return Err(format!(
            "{file}: body must be a string, the exact bytes sent (use body_json for a JSON value)"
        ))
        }
        (None, Some(v)) => {
            r.body = serde_json::to_vec(v).map_err(|e| e.to_string())?;
            r.notes.push("body_json was sent as compact JSON with its keys sorted; for exact mode, give the exact bytes as body".to_string());
        }
        _ => {}
    }
    r.method = text("method")?
        .unwrap_or_else(|| if r.body.is_empty() { "GET" } else { "POST" }.to_string())
        .to_ascii_uppercase();
    r.authority = match text("authority")? {
        Some(a) => a,
        None => r
            .header("host")
            .map(|h| String::from_utf8_lossy(&h).into_owned())
            .unwrap_or_default(),
    };
    if let Some(claims) = obj.get("verified_claims") {
        let map = claims
            .as_object()
            .ok_or_else(|| format!("{file}: verified_claims must be a map"))?;
        for (k, v) in map {
            let shown = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            r.verified_claims.insert(k.clone(), shown);
        }
    }
    Ok(r)
}

/// `METHOD /path HTTP/x` on the first line: a raw HTTP/1 request.
fn raw_http(bytes: &[u8]) -> Option<Result<RequestFile, String>> {
    let line_end = bytes.iter().position(|&b| b == b'\n')?;
    let first = std::str::from_utf8(bytes.get(..line_end)?)
        .ok()?
        .trim_end_matches('\r');
    let mut parts = first.split(' ');
    let (method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/")
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
    {
        return None;
    }
    let mut r = RequestFile {
        method: method.to_string(),
        path: path.to_string(),
        ..RequestFile::default()
    };
    let mut at = line_end + 1;
    loop {
        let rest = bytes.get(at..).unwrap_or(&[]);
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            return Some(Err(
                "raw HTTP request: the headers must end with a blank line".to_string(),
            ));
        };
        let line = rest.get(..end).unwrap_or(&[]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at += end + 1;
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Some(Err(format!(
                "raw HTTP request: header line without a colon: {}",
                String::from_utf8_lossy(line)
            )));
        };
        let name = String::from_utf8_lossy(line.get(..colon).unwrap_or(&[]))
            .trim()
            .to_ascii_lowercase();
        let value = line.get(colon + 1..).unwrap_or(&[]);
        let value = value.trim_ascii();
        r.headers.push((name, value.to_vec()));
    }
    r.body = bytes.get(at..).unwrap_or(&[]).to_vec();
    if let Some(len) = r
        .header("content-length")
        .and_then(|v| String::from_utf8_lossy(&v).trim().parse::<usize>().ok())
    {
        if len < r.body.len() {
            r.body.truncate(len);
        }
    }
    r.authority = r
        .header("host")
        .map(|h| String::from_utf8_lossy(&h).into_owned())
        .unwrap_or_default();
    Some(Ok(r))
}
