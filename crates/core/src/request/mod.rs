//! Reading a request: what the host hands the core about it, and the
//! parsing of the parts the core reads (query string, API keys, JWT
//! claims, downstream address); which policy applies ([`policy`]); the
//! body read as an LLM call ([`llm`]).

pub mod llm;
pub mod mcp;
pub mod policy;

use crate::config::LimitKey;
use serde_json::Value;

/// Facts about the request in flight. The host answers them from Envoy; the
/// core asks only for what the matched policy needs, so a request costs only
/// the host calls its policy requires.
pub trait RequestFacts {
    /// A request header's value (`name` is lower-case). Values need not be
    /// UTF-8.
    fn header(&self, name: &str) -> Option<Vec<u8>>;
    /// The downstream peer address as Envoy reports it (`1.2.3.4:5678`,
    /// `[::1]:5678`).
    fn source_address(&self) -> Option<String>;
    /// A claim of the JWT payload Envoy's jwt_authn filter verified and
    /// stored under `payload_key` in its dynamic metadata.
    fn verified_claim(&self, payload_key: &str, claim: &str) -> Option<Vec<u8>>;
    /// The name of the Envoy route the request matched.
    fn route_name(&self) -> Option<String>;
    /// The policy id the matched route names in its metadata
    /// (`filter_metadata.loopguard.policy`).
    fn route_policy(&self) -> Option<String>;
    /// Whether the request has a header (no copy of its value).
    fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }
}

/// The values a limit key has in a request: none (the key is absent), one,
/// or several (a repeated query parameter, sorted).
pub fn limit_key_values(
    key: &LimitKey,
    head: &RequestHead<'_>,
    facts: &dyn RequestFacts,
    jwt_payload_key: &str,
) -> Vec<Vec<u8>> {
    let one = |v: Option<Vec<u8>>| v.into_iter().collect();
    match key {
        LimitKey::Header(name) => one(facts.header(name)),
        LimitKey::Query(name) => query_values(head.query(), name),
        LimitKey::Jwt(claim) => one(facts
            .header("authorization")
            .and_then(|auth| jwt_claim(&auth, claim))),
        LimitKey::JwtVerified(claim) => one(facts.verified_claim(jwt_payload_key, claim)),
        LimitKey::IpAddress => one(facts
            .source_address()
            .map(|a| address_without_port(&a).as_bytes().to_vec())),
    }
}

/// 64-bit FNV-1a: a cheap, stable hash (the same on every worker and
/// replica) for keys that need no resistance to collisions made on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn write(&mut self, b: &[u8]) {
        for &c in b {
            self.0 = (self.0 ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// Request headers as the host serialises them in one piece (proxy-wasm's
/// map encoding: count, then key and value lengths, then each key and value
/// followed by a NUL). Reading them all at once costs one host call instead
/// of one per header.
#[derive(Debug, Default)]
pub struct HeaderBlock {
    buf: Vec<u8>,
    /// (key start, key len, value start, value len)
    spans: Vec<(usize, usize, usize, usize)>,
}

impl HeaderBlock {
    /// Parse the host's encoding; `None` if it is malformed.
    pub fn parse(buf: Vec<u8>) -> Option<HeaderBlock> {
        if buf.is_empty() {
            return Some(HeaderBlock::default());
        }
        let word = |at: usize| -> Option<usize> {
            let b: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
            Some(u32::from_le_bytes(b) as usize)
        };
        let n = word(0)?;
        let mut data = n.checked_mul(8)?.checked_add(4)?;
        if data > buf.len() {
            return None;
        }
        let mut spans = Vec::with_capacity(n);
        for i in 0..n {
            let klen = word(4 + i * 8)?;
            let vlen = word(8 + i * 8)?;
            let kstart = data;
            let vstart = kstart.checked_add(klen)?.checked_add(1)?;
            data = vstart.checked_add(vlen)?.checked_add(1)?;
            if data > buf.len() {
                return None;
            }
            spans.push((kstart, klen, vstart, vlen));
        }
        Some(HeaderBlock { buf, spans })
    }

    /// A block from headers given one by one (a host that lists them in
    /// place, as Envoy's dynamic modules do): one copy into one buffer.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> HeaderBlock {
        let mut block = HeaderBlock::default();
        for (k, v) in pairs {
            let ks = block.buf.len();
            block.buf.extend_from_slice(k);
            let vs = block.buf.len();
            block.buf.extend_from_slice(v);
            block.spans.push((ks, k.len(), vs, v.len()));
        }
        block
    }

    /// The first value of a header (`name` lower-case, as Envoy keeps
    /// them).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.spans.iter().find_map(|&(ks, kl, vs, vl)| {
            (self.buf.get(ks..ks + kl)? == name.as_bytes()).then(|| self.buf.get(vs..vs + vl))?
        })
    }

    /// A header as text (invalid UTF-8 replaced), empty when absent.
    pub fn text(&self, name: &str) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.get(name).unwrap_or_default())
    }
    /// The request line's pseudo-headers, as text, to lend a
    /// [`RequestHead`] (`line.head()`).
    pub fn request_line(&self) -> RequestLine<'_> {
        RequestLine {
            method: self.text(":method"),
            path: self.text(":path"),
            authority: self.text(":authority"),
        }
    }
}

/// The request line read from a [`HeaderBlock`].
pub struct RequestLine<'a> {
    method: std::borrow::Cow<'a, str>,
    path: std::borrow::Cow<'a, str>,
    authority: std::borrow::Cow<'a, str>,
}

impl RequestLine<'_> {
    pub fn head(&self) -> RequestHead<'_> {
        RequestHead {
            method: &self.method,
            path: &self.path,
            authority: &self.authority,
        }
    }
}

/// A request that opens a tunnel (an HTTP/1.1 `Upgrade`, e.g. a WebSocket,
/// or a `CONNECT`) sends no body until it is answered, so it is judged on
/// its headers alone.
pub fn is_tunnel(method: &str, upgrade: Option<&[u8]>) -> bool {
    method.eq_ignore_ascii_case("CONNECT") || upgrade.is_some_and(|u| !u.trim_ascii().is_empty())
}

/// The request line as seen in the headers phase.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    /// The `:path` pseudo-header, query string included.
    pub path: &'a str,
    /// The `:authority` (or `host`) pseudo-header.
    pub authority: &'a str,
}

impl<'a> RequestHead<'a> {
    /// The path without query string or fragment.
    pub fn path_only(&self) -> &'a str {
        split_path(self.path).0
    }

    /// The raw query string (without `?`), empty when there is none.
    pub fn query(&self) -> &'a str {
        split_path(self.path).1
    }
}

fn split_path(full: &str) -> (&str, &str) {
    let without_fragment = full.split('#').next().unwrap_or("");
    without_fragment
        .split_once('?')
        .unwrap_or((without_fragment, ""))
}

/// A query's parameters as written, (key, value): `a` and `a=` both mean
/// an empty value; empty segments are skipped.
fn query_segments(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|seg| !seg.is_empty())
        .map(|seg| seg.split_once('=').unwrap_or((seg, "")))
}

/// Query parameters as decoded (key, value) byte pairs, sorted by key then
/// value ([`query_segments`]); `+` means a space and `%XX` is decoded, as
/// form-encoded query strings are read by servers.
pub fn sorted_query_pairs(query: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = query_segments(query)
        .map(|(k, v)| (percent_decode(k), percent_decode(v)))
        .collect();
    pairs.sort();
    pairs
}

/// Every value of one query parameter, decoded as [`sorted_query_pairs`]
/// decodes them, sorted.
pub fn query_values(query: &str, name: &str) -> Vec<Vec<u8>> {
    // Only the named parameter's values are decoded (and sorted).
    let named = query_segments(query).filter(|(k, _)| percent_decode(k) == name.as_bytes());
    let mut values: Vec<Vec<u8>> = named.map(|(_, v)| percent_decode(v)).collect();
    values.sort();
    values
}

fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = bytes.get(i + 1).and_then(|c| hex_val(*c));
                let lo = bytes.get(i + 2).and_then(|c| hex_val(*c));
                if let (Some(hi), Some(lo)) = (hi, lo) {
                    out.push(hi << 4 | lo);
                    i += 2;
                } else {
                    out.push(b'%');
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    out
}

fn hex_val(c: u8) -> Option<u8> {
    u8::try_from(char::from(c).to_digit(16)?).ok()
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer_token(authorization: &[u8]) -> Option<&[u8]> {
    let trimmed = authorization.trim_ascii();
    trimmed
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case(b"bearer "))?;
    let token = trimmed.get(7..)?.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The caller's API key, as the bytes to hash: the Bearer token, else the
/// whole `Authorization` value (other schemes), else `x-api-key`, else
/// `api-key` (Azure OpenAI).
pub fn api_key(facts: &dyn RequestFacts) -> Option<Vec<u8>> {
    if let Some(auth) = facts.header("authorization") {
        let key = bearer_token(&auth).unwrap_or_else(|| auth.trim_ascii());
        if !key.is_empty() {
            return Some(key.to_vec());
        }
    }
    ["x-api-key", "api-key"].iter().find_map(|name| {
        facts
            .header(name)
            .map(|v| v.trim_ascii().to_vec())
            .filter(|v| !v.is_empty())
    })
}

/// A claim from the payload of a Bearer JWT, decoded WITHOUT verifying the
/// signature. Strings give their text, other JSON values their compact
/// JSON. `None` when there is no Bearer JWT or no such claim.
pub fn jwt_claim(authorization: &[u8], claim: &str) -> Option<Vec<u8>> {
    let token = bearer_token(authorization)?;
    let mut parts = token.split(|&b| b == b'.');
    let _header = parts.next()?;
    let payload = parts.next()?;
    parts.next()?; // a JWS has exactly three parts
    let decoded = base64url_decode(payload)?;
    let json: Value = serde_json::from_slice(&decoded).ok()?;
    match json.get(claim)? {
        Value::String(s) => Some(s.as_bytes().to_vec()),
        other => Some(other.to_string().into_bytes()),
    }
}

/// Base64url without padding (padding tolerated), as used by JWTs.
pub fn base64url_decode(input: &[u8]) -> Option<Vec<u8>> {
    let input = input.split(|&b| b == b'=').next().unwrap_or(input);
    let mut out = Vec::with_capacity(input.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &c in input {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 {
        return None; // a lone trailing character encodes no whole byte
    }
    Some(out)
}

/// The address part of `ip:port` / `[v6]:port` (a bare address is returned
/// as is).
pub fn address_without_port(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => addr,
    }
}

#[cfg(test)]
pub(crate) mod tests;
