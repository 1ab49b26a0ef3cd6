//! Any bytes as a `tools/call` response body, in both framings (JSON and
//! an event stream), split into chunks at any points, with and without a
//! note to place: the reader never panics and reports once; what it sees,
//! and the body the client gets, do not depend on the chunking; a note is
//! placed at most once, never when the content is not the expected one, and
//! never changes what is seen; in a JSON body that parses (or its one event
//! in a stream), the note leaves JSON that parses with exactly one more
//! `content` block, the note's; the same message reads the same in either
//! framing; and a body that never ends is read no further than MAX_SCANNED.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard_core::config::Classes;
use loopguard_core::request::llm::scan;
use loopguard_core::response::mcp::{Framing, NotePlan, ResultReader, Seen, MAX_SCANNED};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicIsize, Ordering};

static BOUND_CHECKS: AtomicIsize = AtomicIsize::new(16);

struct Run {
    out: Vec<u8>,
    seen: Option<Seen>,
    inserts: usize,
}

/// Feed `body` cut at `cuts` (the last chunk has `end`), apply the
/// insertions, and return the body the client gets and what was seen.
fn run(
    framing: Framing,
    classes: Classes,
    body: &[u8],
    cuts: &[usize],
    note: Option<NotePlan>,
) -> Run {
    let mut r = ResultReader::new(framing, classes, note);
    let mut out = Vec::with_capacity(body.len());
    let mut seen = None;
    let mut inserts = 0;
    let mut from = 0;
    let ends = cuts.iter().copied().chain(std::iter::once(body.len()));
    let n = cuts.len() + 1;
    for (i, to) in ends.enumerate() {
        let chunk = &body[from..to];
        from = to;
        let was_reading = r.reading();
        let fed = r.feed(chunk, i + 1 == n);
        if !was_reading {
            assert_eq!(fed, Default::default(), "nothing after the end");
        }
        let mut c = chunk.to_vec();
        if let Some((at, bytes)) = fed.insert {
            assert!(at < chunk.len(), "the note goes before a byte of the chunk");
            assert!(!bytes.is_empty());
            c.splice(at..at, bytes);
            inserts += 1;
        }
        out.extend_from_slice(&c);
        if let Some(s) = fed.seen {
            assert!(seen.is_none(), "seen once");
            assert!(!r.reading());
            seen = Some(s);
        }
    }
    assert!(seen.is_some(), "the end of the body is always seen");
    Run { out, seen, inserts }
}

/// Whether the message's top-level keys and its `result`'s keys are each
/// written once and without escapes. A JSON parser keeps the last of
/// duplicate keys and reads `cont\u0065nt` as `content`; the reader knows
/// `content` as written and places its note in every `content` of the
/// result it expects (each of them closing in another chunk): with such
/// keys the note may land twice, or in a member the client drops (known,
/// left out of the properties below).
fn plain_keys(body: &[u8]) -> bool {
    let plain = |span| {
        let members = scan::members(body, span)?;
        let mut keys: Vec<&[u8]> = members.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        let once =
            keys.windows(2).all(|w| w[0] != w[1]) && !keys.iter().any(|k| k.contains(&b'\\'));
        once.then_some(members)
    };
    let Some(top) = scan::document(body).and_then(plain) else {
        return false;
    };
    top.iter()
        .filter(|(k, _)| *k == b"result")
        .all(|(_, span)| body[span.0] != b'{' || plain(*span).is_some())
}

fn content_len(v: &Value) -> Option<usize> {
    v.get("result")?.get("content")?.as_array().map(Vec::len)
}

/// The JSON of a stream's last data line (the response's event).
fn data_of(sse: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(sse);
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_default()
        .as_bytes()
        .to_vec()
}

fuzz_target!(|data: &[u8]| {
    // Byte 0: flags (bits 0-1: the masked classes; 2-3: the body's shape);
    // byte 1: how many cuts; then a u16 per cut; then the
    // note's length and text; the rest is the body.
    let [flags, ncuts, rest @ ..] = data else {
        return;
    };
    let ncuts = usize::from(ncuts % 16);
    if rest.len() < 2 * ncuts + 1 {
        return;
    }
    let (cut_bytes, rest) = rest.split_at(2 * ncuts);
    let (&note_len, rest) = rest.split_first().unwrap();
    let note_len = usize::from(note_len % 32).min(rest.len());
    let (note_text, raw) = rest.split_at(note_len);
    // Bits 2-3: the bytes as the body, or written into a result's content
    // (a JSON-RPC response, in an event after a notification in a stream),
    // into a JSON-RPC error, or as a result's structured content.
    let owned;
    let body: &[u8] = match (flags >> 2) & 3 {
        0 => raw,
        mode => {
            let raw = String::from_utf8_lossy(raw);
            owned = match mode {
                1 => format!(
                    r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{raw}],"isError":false}}}}"#
                ),
                2 => format!(r#"{{"jsonrpc":"2.0","id":7,"error":{raw}}}"#),
                _ => format!(
                    r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"type":"text","text":"x"}}],"structuredContent":{raw}}}}}"#
                ),
            };
            owned.as_bytes()
        }
    };
    let text = String::from_utf8_lossy(note_text).into_owned();
    let mut cuts: Vec<usize> = cut_bytes
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (body.len() + 1))
        .collect();
    cuts.sort_unstable();
    let classes = match flags & 3 {
        0 => Classes::NONE,
        1 => Classes::defaults(),
        _ => Classes::all(),
    };
    let block = json!({"type": "text", "text": text});
    let parsed = serde_json::from_slice::<Value>(body).ok();

    let mut outcomes = Vec::new();
    for framing in [Framing::Json, Framing::Sse] {
        let whole = run(framing, classes, body, &[], None);
        let split = run(framing, classes, body, &cuts, None);
        assert_eq!(whole.out, body);
        assert_eq!(split.out, body);
        assert_eq!(split.seen, whole.seen, "the chunking changed what was seen");
        outcomes.push(whole.seen);
        let Some(Seen::Result(o)) = whole.seen else {
            continue;
        };

        // A note for another content is never placed.
        let other = NotePlan {
            expected_content: o.content ^ 1,
            text: text.clone(),
        };
        let r = run(framing, classes, body, &cuts, Some(other));
        assert_eq!((r.out.as_slice(), r.seen, r.inserts), (body, whole.seen, 0));

        // The expected content: the same body, whatever the chunking.
        let plan = NotePlan {
            expected_content: o.content,
            text: text.clone(),
        };
        let a = run(framing, classes, body, &[], Some(plan.clone()));
        let b = run(framing, classes, body, &cuts, Some(plan.clone()));
        assert_eq!(
            (a.seen, b.seen),
            (whole.seen, whole.seen),
            "the note changed what was seen"
        );
        // A byte at a time, every place the note goes is in a chunk of its
        // own: more than one is a duplicate `content` (see plain_keys).
        let bytes: Vec<usize> = (1..body.len()).collect();
        let places = run(framing, classes, body, &bytes, Some(plan)).inserts;
        if places <= 1 {
            assert_eq!(a.out, b.out, "the chunking changed the body");
            assert!(a.inserts == places && b.inserts == places);
        }
        if a.inserts == 1 {
            // The block, after a comma when other blocks precede it.
            let added = a.out.len() - body.len();
            let len = block.to_string().len();
            assert!(
                added == len || added == len + 1,
                "{added} bytes for a block of {len}"
            );
        }
        if framing == Framing::Json {
            if let Some(v) = parsed.as_ref().filter(|_| plain_keys(body)) {
                if let Some(n) = content_len(v) {
                    assert_eq!(a.inserts, 1, "the expected content gets its note");
                    let w: Value = serde_json::from_slice(&a.out).expect("a note broke valid JSON");
                    let content = w["result"]["content"].as_array().expect("content");
                    assert_eq!(content.len(), n + 1, "exactly one block more");
                    assert_eq!(content[n], block);
                    assert_eq!(
                        &content[..n],
                        &v["result"]["content"].as_array().unwrap()[..]
                    );
                }
            }
        }
    }
    // The same message reads the same in either framing (in one event).
    if let Some(v) = &parsed {
        if !body.contains(&b'\n') && !body.contains(&b'\r') {
            // After a notification, as servers send progress first.
            let mut sse = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n".to_vec();
            sse.extend_from_slice(b"event: message\r\nid: 1\r\ndata: ");
            sse.extend_from_slice(body);
            sse.extend_from_slice(b"\n\n");
            let in_stream = run(Framing::Sse, classes, &sse, &[], None).seen;
            assert_eq!(in_stream, outcomes[0], "framings disagree");
            let n = content_len(v).filter(|_| plain_keys(body));
            if let (Some(Seen::Result(o)), Some(n)) = (in_stream, n) {
                let plan = NotePlan {
                    expected_content: o.content,
                    text: text.clone(),
                };
                let cuts: Vec<usize> = cuts.iter().map(|c| c % (sse.len() + 1)).collect();
                let r = run(Framing::Sse, classes, &sse, &cuts, Some(plan));
                assert_eq!(r.inserts, 1);
                let w: Value = serde_json::from_slice(&data_of(&r.out))
                    .expect("a note broke the event's JSON");
                assert_eq!(content_len(&w), Some(n + 1));
                assert_eq!(w["result"]["content"][n], block);
            }
        }
    }

    // Bounded: the body sent over and over, never ending, is given up after
    // MAX_SCANNED bytes at the latest. It reads 16 MiB in each framing, so
    // it is checked for inputs that start with two 0xff bytes, and only for
    // the first BOUND_CHECKS of them in a process (an input that fails
    // fails alone too, when it is run again).
    if data[..2] == [0xff, 0xff]
        && !body.is_empty()
        && BOUND_CHECKS.fetch_sub(1, Ordering::Relaxed) > 0
    {
        let chunk = body.repeat((64 * 1024 / body.len()).max(1));
        for framing in [Framing::Json, Framing::Sse] {
            let mut r = ResultReader::new(framing, classes, None);
            let mut fed = 0;
            let mut seen = None;
            while seen.is_none() {
                assert!(fed <= MAX_SCANNED, "read past MAX_SCANNED");
                seen = r.feed(&chunk, false).seen;
                fed += chunk.len();
            }
            assert!(!r.reading());
            assert_eq!(r.feed(&chunk, true), Default::default());
        }
    }
});
