//! HAR 1.2 files (browser devtools, mitmproxy, Charles, many proxies): each
//! entry's `startedDateTime`, request and response. A HAR file is one
//! JSON document, so it is read whole.

use super::{base64, time};
use crate::replay::record::{usage_in_body, Answer, Entry, Recorded, Skipped, MCP_LOOP_HEADER};
use crate::request_file::RequestFile;
use serde_json::Value;

/// The entries of one HAR file (a whole-file problem is one skipped entry
/// naming the file).
pub fn read(file: &str, bytes: &[u8]) -> Vec<Entry> {
    let whole = |reason: String| {
        vec![Err(Skipped {
            place: file.to_string(),
            reason,
        })]
    };
    let v: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return whole(format!("not JSON: {e}")),
    };
    let Some(entries) = v.pointer("/log/entries").and_then(Value::as_array) else {
        return whole("log.entries is missing: not a HAR file".to_string());
    };
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let place = format!("{file} entry {}", i + 1);
            entry(&place, e).map_err(|reason| Skipped { place, reason })
        })
        .collect()
}

fn entry(place: &str, e: &Value) -> Result<Recorded, String> {
    let at_ms = match e.get("startedDateTime") {
        Some(t) => time::from_json(t).map_err(|m| format!("startedDateTime: {m}"))?,
        None => return Err("startedDateTime is required".to_string()),
    };
    let req = e.get("request").ok_or("request is required")?;
    let text = |v: &Value, name: &str| -> Result<String, String> {
        v.get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("request.{name} must be a string"))
    };
    let method = text(req, "method")?.to_ascii_uppercase();
    let url = text(req, "url")?;
    let (authority, path) =
        split_url(&url).ok_or_else(|| format!("request.url: {url:?} is not an http(s) URL"))?;
    let mut r = RequestFile {
        method,
        path,
        authority,
        ..RequestFile::default()
    };
    if let Some(headers) = req.get("headers") {
        let list = headers.as_array().ok_or("request.headers must be a list")?;
        for (i, h) in list.iter().enumerate() {
            let (Some(name), Some(value)) = (
                h.get("name").and_then(Value::as_str),
                h.get("value").and_then(Value::as_str),
            ) else {
                return Err(format!("request.headers[{i}] must have a name and a value"));
            };
            // HTTP/2 pseudo-headers (devtools list them) are the request
            // line, already read from method and url.
            if !name.starts_with(':') {
                r.headers
                    .push((name.to_ascii_lowercase(), value.as_bytes().to_vec()));
            }
        }
    }
    if let Some(post) = req.get("postData") {
        r.body = content(post, "request.postData")?;
    }
    let response = e.get("response").map(response);
    Ok(Recorded {
        at_ms,
        request: r,
        response,
        place: place.to_string(),
    })
}

/// A response: its status, and its content (`mimeType`, or the
/// `content-type` header when listed, and `text`; a `size` above the
/// text's length says the recorder cut it).
fn response(resp: &Value) -> Answer {
    let status = resp
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        // HAR writes 0 for a request that got no answer.
        .filter(|s| *s >= 100);
    let mut answer = Answer {
        status,
        ..Answer::default()
    };
    for h in resp
        .get("headers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(name), Some(value)) = (
            h.get("name").and_then(Value::as_str),
            h.get("value").and_then(Value::as_str),
        ) else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-type") && answer.content_type.is_none() {
            answer.content_type = Some(value.to_string());
        }
        answer.by_loopguard |= name.eq_ignore_ascii_case(MCP_LOOP_HEADER);
    }
    let Some(c) = resp.get("content") else {
        return answer;
    };
    if answer.content_type.is_none() {
        answer.content_type = c
            .get("mimeType")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_string);
    }
    let has_text = matches!(c.get("text"), Some(Value::String(_)));
    if let (true, Ok(bytes)) = (has_text, content(c, "response.content")) {
        answer.usage = usage_in_body(&bytes);
        let cut = c
            .get("size")
            .and_then(Value::as_u64)
            .is_some_and(|size| size > bytes.len() as u64);
        answer.keep_body(bytes, cut);
    }
    answer
}

/// A postData or content object's bytes: `text`, base64 when `encoding`
/// says so.
fn content(v: &Value, field: &str) -> Result<Vec<u8>, String> {
    let text = match v.get("text") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => s,
        Some(_) => return Err(format!("{field}.text must be a string")),
    };
    match v.get("encoding").and_then(Value::as_str) {
        Some("base64") => base64(text).map_err(|e| format!("{field}.text: {e}")),
        _ => Ok(text.as_bytes().to_vec()),
    }
}

/// `https://api.example.com:443/v1/x?y=1` -> (`api.example.com:443`,
/// `/v1/x?y=1`).
fn split_url(url: &str) -> Option<(String, String)> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (rest.get(..i)?, rest.get(i..)?),
        None => (rest, "/"),
    };
    let path = match path.find('#') {
        Some(i) => path.get(..i)?,
        None => path,
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Some((authority.to_string(), path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::record::Usage;
    use serde_json::json;

    fn har(entries: Value) -> Vec<u8> {
        json!({"log": {"version": "1.2", "creator": {"name": "t", "version": "1"}, "entries": entries}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn reads_entries_with_bodies_and_usage() {
        let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"héllo"}]}"#;
        let bytes = har(json!([
            {"startedDateTime": "2026-11-25T18:33:44.123Z",
             "request": {"method": "post", "url": "https://api.openai.com/v1/chat/completions?x=1#frag",
                         "headers": [{"name": ":authority", "value": "api.openai.com"},
                                     {"name": "Authorization", "value": "Bearer sk-1"}],
                         "postData": {"mimeType": "application/json", "text": body}},
             "response": {"status": 200, "content": {"mimeType": "application/json",
                          "text": "eyJ1c2FnZSI6eyJwcm9tcHRfdG9rZW5zIjo1LCJjb21wbGV0aW9uX3Rva2VucyI6Mn19", "encoding": "base64"}}},
            {"startedDateTime": "2026-11-25T18:33:45Z",
             "request": {"method": "GET", "url": "http://localhost:8080", "headers": []},
             "response": {"status": 0, "content": {}}}
        ]));
        let got = read("t.har", &bytes);
        let first = got[0].as_ref().unwrap();
        assert_eq!(first.at_ms, 1_795_631_624_123);
        assert_eq!(first.request.method, "POST");
        assert_eq!(first.request.authority, "api.openai.com");
        assert_eq!(first.request.path, "/v1/chat/completions?x=1");
        assert_eq!(
            first.request.headers,
            vec![("authorization".to_string(), b"Bearer sk-1".to_vec())]
        );
        assert_eq!(first.request.body, body.as_bytes());
        assert_eq!(first.place, "t.har entry 1");
        let answer = first.response.as_ref().unwrap();
        assert_eq!(answer.status, Some(200));
        assert_eq!(
            answer.usage,
            Some(Usage {
                input: 5,
                output: 2,
                ..Usage::default()
            })
        );
        let second = got[1].as_ref().unwrap();
        assert_eq!(
            (
                second.request.path.as_str(),
                second.request.authority.as_str()
            ),
            ("/", "localhost:8080")
        );
        assert_eq!(second.response.as_ref().unwrap().status, None);
    }

    #[test]
    fn a_response_keeps_its_content_type_and_body() {
        let sse = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n";
        let bytes = har(json!([
            {"startedDateTime": "2026-11-25T18:33:44Z",
             "request": {"method": "POST", "url": "http://a/mcp"},
             "response": {"status": 200, "headers": [{"name": "Content-Type", "value": "text/event-stream; charset=utf-8"}],
                          "content": {"mimeType": "text/event-stream", "size": sse.len(), "text": sse}}},
            {"startedDateTime": "2026-11-25T18:33:45Z",
             "request": {"method": "POST", "url": "http://a/mcp"},
             "response": {"status": 200, "headers": [{"name": "x-loopguard-mcp-loop", "value": "tier=identical"}],
                          "content": {"mimeType": "application/json", "size": 9000, "text": "{\"jsonrpc\""}}},
            {"startedDateTime": "2026-11-25T18:33:46Z",
             "request": {"method": "POST", "url": "http://a/mcp"},
             "response": {"status": 200, "content": {"mimeType": "application/json"}}}
        ]));
        let got = read("t.har", &bytes);
        let a = got[0].as_ref().unwrap().response.clone().unwrap();
        assert_eq!(
            a.content_type.as_deref(),
            Some("text/event-stream; charset=utf-8")
        );
        assert_eq!(a.body.as_deref(), Some(sse.as_bytes()));
        assert!(!a.body_cut && !a.by_loopguard);
        let a = got[1].as_ref().unwrap().response.clone().unwrap();
        assert_eq!(a.content_type.as_deref(), Some("application/json"));
        assert!(a.body_cut && a.by_loopguard, "{a:?}");
        let a = got[2].as_ref().unwrap().response.clone().unwrap();
        assert_eq!(
            (a.content_type.as_deref(), a.body),
            (Some("application/json"), None)
        );
    }

    #[test]
    fn bad_entries_are_named_and_the_rest_is_read() {
        let bytes = har(json!([
            {"request": {"method": "GET", "url": "http://a/"}},
            {"startedDateTime": "yesterday", "request": {"method": "GET", "url": "http://a/"}},
            {"startedDateTime": "2026-11-25T18:33:44Z", "request": {"method": "GET", "url": "ftp://a/"}},
            {"startedDateTime": "2026-11-25T18:33:44Z", "request": {"method": "GET", "url": "http://a/", "headers": [{"name": "x"}]}},
            {"startedDateTime": "2026-11-25T18:33:44Z", "request": {"method": "POST", "url": "http://a/", "postData": {"text": "***", "encoding": "base64"}}},
            {"startedDateTime": "2026-11-25T18:33:44Z", "request": {"method": "GET", "url": "http://a/ok"}}
        ]));
        let got = read("t.har", &bytes);
        let reasons: Vec<String> = got
            .iter()
            .filter_map(|e| {
                e.as_ref()
                    .err()
                    .map(|s| format!("{}: {}", s.place, s.reason))
            })
            .collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert_eq!(reasons[0], "t.har entry 1: startedDateTime is required");
        assert!(reasons[1]
            .starts_with("t.har entry 2: startedDateTime: \"yesterday\" is not an RFC 3339 time"));
        assert!(reasons[2].contains("entry 3: request.url: \"ftp://a/\" is not an http(s) URL"));
        assert_eq!(
            reasons[3],
            "t.har entry 4: request.headers[0] must have a name and a value"
        );
        assert!(
            reasons[4].starts_with("t.har entry 5: request.postData.text: "),
            "{}",
            reasons[4]
        );
        assert_eq!(got[5].as_ref().unwrap().request.path, "/ok");
        assert_eq!(
            read("x.har", b"{\"log\": {}}")[0]
                .as_ref()
                .unwrap_err()
                .reason,
            "log.entries is missing: not a HAR file"
        );
        assert!(read("x.har", b"nope")[0]
            .as_ref()
            .unwrap_err()
            .reason
            .starts_with("not JSON"));
    }
}
