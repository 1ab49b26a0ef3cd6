//! Taking back from an OpenAI Chat Completions stream what
//! `stream_options.include_usage` added to it, when loopguard asked for it
//! (see [`ask_usage`](crate::request::llm::stream_options::ask_usage)) and
//! the client did not: the client then receives the stream it asked for.
//!
//! The option adds two things to a `text/event-stream` body:
//! - a `"usage":null` member in every chunk's JSON, removed here with its
//!   separating comma;
//! - a last, usage-only event (`"choices":[]` and a `"usage"` object),
//!   dropped here whole, its blank line included.
//!
//! Everything else passes byte for byte (`data: [DONE]`, comments, other
//! events, a `usage` that is not the chunk's own member). Events end with a
//! blank line (`\n\n`, or `\r\n\r\n`); lines end with `\n` or `\r\n`. Only
//! an event with a single `data:` line holding a JSON object with a
//! `choices` member is ever edited.
//!
//! [`StripUsage`] is fed the body chunk by chunk. A chunk of whole events
//! that does not mention `"usage"` passes as it is, with no copy; otherwise
//! whole events are rewritten, and an event cut by the chunk's end is held
//! back (at most [`MAX_HELD`] bytes) and sent with the next chunk.

use crate::request::llm::scan::{document, get, members, skip_ws, Span};

/// Bytes of an unfinished event [`StripUsage`] holds back. Beyond that it
/// gives up: what it held and everything after passes as it is.
pub const MAX_HELD: usize = 64 * 1024;

/// Removes what `include_usage` added from a stream, fed chunk by chunk.
#[derive(Debug, Default)]
pub struct StripUsage {
    /// The start of an event cut by the last chunk's end, not yet sent.
    held: Vec<u8>,
    gave_up: bool,
}

impl StripUsage {
    /// Whether an event longer than [`MAX_HELD`] arrived in pieces: the
    /// stream passed as it is from there on.
    #[cfg(test)]
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// Whether it holds back the start of an event not yet sent.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// The bytes to send for `chunk`: `None` to send it unchanged, else
    /// what to send instead (possibly nothing). At `end_of_stream`,
    /// whatever was held is sent (an unfinished last event is read as an
    /// event).
    pub fn feed(&mut self, chunk: &[u8], end_of_stream: bool) -> Option<Vec<u8>> {
        if self.gave_up {
            return None;
        }
        let carried = !self.held.is_empty();
        if !carried && !mentions_usage(chunk) && (end_of_stream || ends_event(chunk)) {
            return None;
        }
        let mut joined = std::mem::take(&mut self.held);
        let input: &[u8] = if carried {
            joined.extend_from_slice(chunk);
            &joined
        } else {
            chunk
        };
        let mut out = Vec::with_capacity(input.len());
        let mut changed = false;
        let mut at = 0;
        while let Some(end) = event_end(input, at) {
            changed |= rewrite_event(input.get(at..end).unwrap_or_default(), &mut out);
            at = end;
        }
        let tail = input.get(at..).unwrap_or_default();
        if end_of_stream {
            changed |= rewrite_event(tail, &mut out);
        } else if tail.len() > MAX_HELD {
            out.extend_from_slice(tail);
            self.gave_up = true;
        } else {
            self.held.extend_from_slice(tail);
        }
        (carried || changed || !self.held.is_empty()).then_some(out)
    }
}

/// Whether `b` holds a `"usage"` key (or a string `"usage"`: inside a JSON
/// string, quotes are escaped, so a mention in text does not count).
fn mentions_usage(b: &[u8]) -> bool {
    memchr::memmem::find(b, b"\"usage\"").is_some()
}

/// Whether a chunk that begins an event ends one (with a blank line).
fn ends_event(chunk: &[u8]) -> bool {
    chunk.is_empty() || chunk.ends_with(b"\n\n") || chunk.ends_with(b"\n\r\n")
}

/// The end of the event starting at `at` (past its blank line), if the
/// blank line is in `b`.
fn event_end(b: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let rest = b.get(at..)?;
        let nl = memchr::memchr(b'\n', rest)?;
        let line = rest.get(..nl)?;
        at += nl + 1;
        if line.is_empty() || line == b"\r" {
            return Some(at);
        }
    }
}

/// What an event needs.
enum Edit {
    /// The usage-only event: dropped.
    Drop,
    /// A `"usage":null` member and its comma: these bytes removed.
    Remove(Span),
}

/// Writes `event` to `out` as it would have been without the option;
/// whether it changed.
fn rewrite_event(event: &[u8], out: &mut Vec<u8>) -> bool {
    match mentions_usage(event).then(|| edit_of(event)).flatten() {
        None => {
            out.extend_from_slice(event);
            false
        }
        Some(Edit::Drop) => true,
        Some(Edit::Remove((from, to))) => {
            out.extend_from_slice(event.get(..from).unwrap_or_default());
            out.extend_from_slice(event.get(to..).unwrap_or_default());
            true
        }
    }
}

/// The edit an event needs, read from its one `data:` line.
fn edit_of(event: &[u8]) -> Option<Edit> {
    let mut data: Option<Span> = None;
    let mut at = 0;
    while at < event.len() {
        let rest = event.get(at..)?;
        let len = memchr::memchr(b'\n', rest).map_or(rest.len(), |n| n + 1);
        if let Some((s, e)) = data_value(rest.get(..len)?) {
            if data.is_some() {
                // One payload over several lines: not a chunk's JSON.
                return None;
            }
            data = Some((at + s, at + e));
        }
        at += len;
    }
    let (start, end) = data?;
    match edit_of_json(event.get(start..end)?)? {
        Edit::Drop => Some(Edit::Drop),
        Edit::Remove((from, to)) => Some(Edit::Remove((start + from, start + to))),
    }
}

/// The value of a `data:` line: after `data:` and one optional space,
/// before the line's end.
fn data_value(line: &[u8]) -> Option<Span> {
    let rest = line.strip_prefix(b"data:")?;
    let start = line.len() - rest.len() + usize::from(rest.first() == Some(&b' '));
    let text = line.strip_suffix(b"\n").unwrap_or(line);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    (start <= text.len()).then_some((start, text.len()))
}

/// The edit a chunk's JSON needs: its `"usage":null` member removed, or
/// dropped when it is the usage-only chunk.
fn edit_of_json(json: &[u8]) -> Option<Edit> {
    let doc = document(json).filter(|d| json.get(d.0) == Some(&b'{'))?;
    let m = members(json, doc)?;
    let choices = get(&m, "choices")?;
    let at = m.iter().position(|(k, _)| *k == b"usage")?;
    let usage = m.get(at)?.1;
    match json.get(usage.0)? {
        b'{' => return is_empty_array(json, choices).then_some(Edit::Drop),
        b'n' if json.get(usage.0..usage.1)? == b"null" => {}
        _ => return None,
    }
    if let Some(before) = at.checked_sub(1).and_then(|i| m.get(i)) {
        // From the end of the member before: its comma, the key, the value.
        return Some(Edit::Remove((before.1 .1, usage.1)));
    }
    // The first member (`choices` follows): from its key to the next key.
    let key = skip_ws(json, doc.0 + 1);
    let comma = skip_ws(json, usage.1);
    (json.get(comma) == Some(&b',')).then(|| Edit::Remove((key, skip_ws(json, comma + 1))))
}

fn is_empty_array(json: &[u8], span: Span) -> bool {
    json.get(span.0) == Some(&b'[') && skip_ws(json, span.0 + 1) + 1 == span.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk(delta: &str, finish: &str, usage: bool) -> String {
        format!(
            r#"{{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1720000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]{}}}"#,
            if usage { r#","usage":null"# } else { "" }
        )
    }

    /// A Chat Completions stream as OpenAI sends it, with or without
    /// `include_usage`, its lines ending with `nl`.
    fn openai_stream(include_usage: bool, nl: &str) -> String {
        let u = include_usage;
        let mut events = vec![
            format!(
                "data: {}",
                chunk(r#"{"role":"assistant","content":""}"#, "null", u)
            ),
            ": keep-alive".to_string(),
            format!(
                "data: {}",
                chunk(
                    r#"{"content":"The \"usage\":null field, and \"usage\":{}"}"#,
                    "null",
                    u
                )
            ),
            format!(
                "data: {}",
                chunk(
                    r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"usage\": null, \"choices\": []}"}}]}"#,
                    "null",
                    u
                )
            ),
            format!("data: {}", chunk("{}", r#""stop""#, u)),
        ];
        if include_usage {
            events.push(r#"data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1720000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}"#.to_string());
        }
        events.push("data: [DONE]".to_string());
        events.iter().map(|e| format!("{e}{nl}{nl}")).collect()
    }

    /// What the filter sends for `body` fed in pieces cut at `cuts`.
    fn strip(body: &[u8], cuts: &[usize]) -> (Vec<u8>, StripUsage) {
        let mut s = StripUsage::default();
        let mut out = Vec::new();
        let mut at = 0;
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(body.len())).collect();
        bounds.sort_unstable();
        bounds.push(body.len());
        let last = bounds.len() - 1;
        for (i, c) in bounds.into_iter().enumerate() {
            let piece = &body[at..c];
            match s.feed(piece, i == last) {
                Some(b) => out.extend_from_slice(&b),
                None => out.extend_from_slice(piece),
            }
            assert!(s.held.len() <= MAX_HELD);
            at = c;
        }
        assert!(s.held.is_empty(), "flushed at the end");
        (out, s)
    }

    fn show(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    #[test]
    fn stream_split_anywhere_in_two_loses_what_the_option_added() {
        for nl in ["\n", "\r\n"] {
            let with = openai_stream(true, nl);
            let without = openai_stream(false, nl);
            assert_ne!(with, without);
            for cut in 0..=with.len() {
                let (out, s) = strip(with.as_bytes(), &[cut]);
                assert_eq!(show(&out), without, "cut at {cut}");
                assert!(!s.gave_up());
            }
        }
    }

    #[test]
    fn stream_fed_whole_or_event_by_event_loses_what_the_option_added() {
        let with = openai_stream(true, "\n");
        let without = openai_stream(false, "\n");
        assert_eq!(show(&strip(with.as_bytes(), &[]).0), without);
        // Event by event, then an empty end of stream (as Envoy sends it).
        let mut s = StripUsage::default();
        let mut out = Vec::new();
        for event in with.split_inclusive("\n\n") {
            let b = s.feed(event.as_bytes(), false);
            assert!(s.held.is_empty());
            out.extend(b.unwrap_or_else(|| event.as_bytes().to_vec()));
        }
        assert_eq!(s.feed(b"", true), None);
        assert_eq!(show(&out), without);
    }

    #[test]
    fn stream_without_the_option_passes_untouched() {
        for nl in ["\n", "\r\n"] {
            let without = openai_stream(false, nl);
            let events: Vec<&str> = without.split_inclusive(&format!("{nl}{nl}")).collect();
            let mut s = StripUsage::default();
            for event in &events {
                assert_eq!(s.feed(event.as_bytes(), false), None, "{event}");
            }
            assert_eq!(s.feed(b"", true), None);
            // Two events to a chunk, and the whole body at once.
            let mut s = StripUsage::default();
            for pair in events.chunks(2) {
                assert_eq!(s.feed(pair.concat().as_bytes(), false), None);
            }
            assert_eq!(StripUsage::default().feed(without.as_bytes(), true), None);
            // Cut anywhere: held pieces come back whole.
            for cut in 0..=without.len() {
                assert_eq!(show(&strip(without.as_bytes(), &[cut]).0), without);
            }
        }
    }

    #[test]
    fn stream_of_other_apis_with_usage_objects_passes_untouched() {
        let anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n";
        let responses = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":7}},\"usage\":null}\n\n";
        for body in [anthropic, responses] {
            let mut s = StripUsage::default();
            for event in body.split_inclusive("\n\n") {
                assert_eq!(s.feed(event.as_bytes(), false), None, "{event}");
            }
            assert_eq!(s.feed(b"", true), None);
        }
    }

    #[test]
    fn stream_usage_null_is_removed_wherever_it_stands() {
        let cases = [
            (
                r#"{"id":"a","choices":[],"usage":null}"#,
                r#"{"id":"a","choices":[]}"#,
            ),
            (
                r#"{"usage":null,"id":"a","choices":[{"delta":{}}]}"#,
                r#"{"id":"a","choices":[{"delta":{}}]}"#,
            ),
            (
                r#"{"id":"a", "usage" : null , "choices":[]}"#,
                r#"{"id":"a" , "choices":[]}"#,
            ),
            (
                r#"{ "usage" : null , "choices": [] }"#,
                r#"{ "choices": [] }"#,
            ),
            (r#"{"choices":[] ,"usage":null }"#, r#"{"choices":[] }"#),
        ];
        for (chunk, want) in cases {
            let body = format!("data: {chunk}\n\n");
            let got = StripUsage::default().feed(body.as_bytes(), true).unwrap();
            assert_eq!(show(&got), format!("data: {want}\n\n"), "{chunk}");
        }
    }

    #[test]
    fn stream_events_left_as_they_are() {
        for event in [
            // Usage not the chunk's own member, or not null, or no choices.
            "data: {\"choices\":[{\"delta\":{\"usage\":null}}]}\n\n",
            "data: {\"choices\":[{\"x\":1}],\"usage\":{\"total_tokens\":3}}\n\n",
            "data: {\"choices\":[],\"usage\":0}\n\n",
            "data: {\"id\":\"x\",\"usage\":null}\n\n",
            // One payload over two lines, a broken one, not an object.
            "data: {\"choices\":[],\ndata: \"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":null\n\n",
            "data: [\"usage\"]\n\n",
            "event: usage\ndata: \"usage\"\n\n",
            ": \"usage\":null\n\n",
            // `data :` is not a data line.
            "data :{\"choices\":[],\"usage\":null}\n\n",
        ] {
            assert_eq!(
                StripUsage::default().feed(event.as_bytes(), false),
                None,
                "{event}"
            );
        }
    }

    #[test]
    fn stream_usage_only_event_is_dropped_whole() {
        let usage = r#"{"id":"a","choices":[ ],"usage":{"prompt_tokens":1}}"#;
        for (body, want) in [
            (
                format!("event: chunk\nid: 7\ndata: {usage}\n\ndata: [DONE]\n\n"),
                "data: [DONE]\n\n",
            ),
            (
                format!("data:{usage}\r\n\r\ndata: [DONE]\r\n\r\n"),
                "data: [DONE]\r\n\r\n",
            ),
            // Unfinished at the end of the stream: read as an event.
            (
                format!("data: [DONE]\n\ndata: {usage}\n"),
                "data: [DONE]\n\n",
            ),
            (format!("data: {usage}"), ""),
        ] {
            let got = StripUsage::default().feed(body.as_bytes(), true).unwrap();
            assert_eq!(show(&got), want, "{body}");
            for cut in 0..=body.len() {
                assert_eq!(
                    show(&strip(body.as_bytes(), &[cut]).0),
                    want,
                    "{body} at {cut}"
                );
            }
        }
    }

    #[test]
    fn stream_held_piece_is_sent_with_the_next_chunk() {
        let mut s = StripUsage::default();
        let first = r#"data: {"choices":[],"usage":null}"#;
        assert_eq!(
            s.feed(b"data: [DONE]\n\ndata: {\"cho", false).unwrap(),
            b"data: [DONE]\n\n"
        );
        assert_eq!(s.feed(&first.as_bytes()[11..], false).unwrap(), b"");
        assert_eq!(
            show(&s.feed(b"\n\n", false).unwrap()),
            "data: {\"choices\":[]}\n\n"
        );
        assert_eq!(s.feed(b": ping\n\n", false), None);
    }

    #[test]
    fn stream_gives_up_on_an_event_longer_than_the_bound() {
        let small = "data: {\"choices\":[],\"usage\":null}\n\n";
        let big = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}],\"usage\":null}}\n\n",
            "x".repeat(MAX_HELD + 5000)
        );
        let end = "data: {\"choices\":[],\"usage\":{\"total_tokens\":1}}\n\ndata: [DONE]\n\n";
        let body = format!("{small}{big}{end}");
        // In small pieces: the big event is held until the bound, then
        // everything passes as it is.
        let cuts: Vec<usize> = (1..body.len() / 1000 + 1).map(|i| i * 1000).collect();
        let (out, s) = strip(body.as_bytes(), &cuts);
        assert!(s.gave_up());
        assert_eq!(
            show(&out),
            format!("data: {{\"choices\":[]}}\n\n{big}{end}")
        );
        assert_eq!(s.held.len(), 0);
        // In one chunk, nothing is held: the big event is rewritten.
        let (out, s) = strip(body.as_bytes(), &[]);
        assert!(!s.gave_up());
        assert_eq!(
            show(&out),
            format!(
                "data: {{\"choices\":[]}}\n\n{}data: [DONE]\n\n",
                big.replace(r#","usage":null"#, "")
            )
        );
    }

    proptest! {
        /// Cut into three to five pieces anywhere, with either line end:
        /// the stream without the option.
        #[test]
        fn stream_split_in_three_to_five(
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 2..=4),
            crlf in any::<bool>(),
        ) {
            let nl = if crlf { "\r\n" } else { "\n" };
            let with = openai_stream(true, nl);
            let cuts: Vec<usize> = cuts.iter().map(|i| i.index(with.len() + 1)).collect();
            let (out, s) = strip(with.as_bytes(), &cuts);
            prop_assert_eq!(show(&out), openai_stream(false, nl));
            prop_assert!(!s.gave_up());
        }

        /// Arbitrary bytes, cut anywhere, never panic.
        #[test]
        fn stream_never_panics(
            bytes in prop::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'"'), Just(b'{'), any::<u8>()], 0..200),
            cut in any::<prop::sample::Index>(),
        ) {
            let _ = strip(&bytes, &[cut.index(bytes.len() + 1)]);
        }
    }
}
