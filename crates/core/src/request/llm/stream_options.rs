//! Asking the provider for a stream's token usage: an OpenAI Chat
//! Completions request with `"stream": true` reports usage (in a last,
//! usage-only chunk) only when it carries
//! `"stream_options": {"include_usage": true}`. [`ask_usage`] adds that to
//! the body by editing its bytes in one place (an insertion, or a `false` or
//! `null` replaced): the rest of the body stays byte for byte as sent (key
//! order, whitespace, number formatting). What the option adds to the
//! answer is taken out again by
//! [`StripUsage`](crate::response::stream_usage::StripUsage).
//!
//! The body is read with the structural [`scan`](super::scan)ner: only the
//! top-level object's members count (a `"stream": true` inside a message or
//! a nested object does not), and of a key written twice the last one
//! counts, as serde_json and Python's `json` read it.

use super::scan::{document, skip_ws, Members, Span};

/// What asking for a stream's usage did to a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskUsage {
    /// Not a JSON object with `"stream": true`: nothing to ask.
    NotAStream,
    /// The request already asks for usage (`include_usage` is `true`).
    AlreadyAsked,
    /// The new body, asking for usage.
    Asked(Vec<u8>),
    /// Begins like an object but is broken, or its `stream_options` (or
    /// `include_usage`) is of a type the provider would refuse: left alone.
    Unreadable,
}

const OPTIONS: &[u8] = br#""stream_options":{"include_usage":true}"#;
const INCLUDE: &[u8] = br#""include_usage":true"#;

/// Asks for the usage of a streamed request: `body` with
/// `stream_options.include_usage` set to `true`, when it is a JSON object
/// whose `stream` is `true`.
pub fn ask_usage(body: &[u8]) -> AskUsage {
    if body.get(skip_ws(body, 0)) != Some(&b'{') {
        return AskUsage::NotAStream;
    }
    let top = document(body).and_then(|doc| read_members(body, doc, "stream", "stream_options"));
    let Some(top) = top else {
        return AskUsage::Unreadable;
    };
    if top.first.and_then(|s| body.get(s.0..s.1)) != Some(b"true") {
        return AskUsage::NotAStream;
    }
    let Some(options) = top.second else {
        // `stream` is there, so the object has a last member.
        return top.last_end.map_or(AskUsage::Unreadable, |at| {
            AskUsage::Asked(splice(body, (at, at), &[b",", OPTIONS].concat()))
        });
    };
    match body.get(options.0) {
        Some(b'n') if is(body, options, b"null") => {
            AskUsage::Asked(splice(body, options, &[b"{", INCLUDE, b"}"].concat()))
        }
        Some(b'{') => ask_in_options(body, options),
        _ => AskUsage::Unreadable,
    }
}

/// Sets `include_usage` in the `stream_options` object spanning `options`.
fn ask_in_options(body: &[u8], options: Span) -> AskUsage {
    let Some(found) = read_members(body, options, "include_usage", "") else {
        return AskUsage::Unreadable;
    };
    match (found.first, found.last_end) {
        (Some(v), _) if is(body, v, b"true") => AskUsage::AlreadyAsked,
        (Some(v), _) if is(body, v, b"false") || is(body, v, b"null") => {
            AskUsage::Asked(splice(body, v, b"true"))
        }
        (Some(_), _) => AskUsage::Unreadable,
        (None, Some(at)) => AskUsage::Asked(splice(body, (at, at), &[b",", INCLUDE].concat())),
        (None, None) => {
            // An empty object: the member goes right after its `{`.
            let at = skip_ws(body, options.0) + 1;
            AskUsage::Asked(splice(body, (at, at), INCLUDE))
        }
    }
}

/// What [`read_members`] found in an object.
#[derive(Default)]
struct Found {
    /// The value of the last member named `first`, and of `second`.
    first: Option<Span>,
    second: Option<Span>,
    /// Where the object's last value ends (`None` when it is empty).
    last_end: Option<usize>,
}

/// The members named `first` and `second` of the object spanning `span`;
/// `None` if the object is broken.
fn read_members(body: &[u8], span: Span, first: &str, second: &str) -> Option<Found> {
    let mut it = Members::new(body, span)?;
    let mut found = Found::default();
    for (key, value) in &mut it {
        if key_is(key, first) {
            found.first = Some(value);
        } else if key_is(key, second) {
            found.second = Some(value);
        }
        found.last_end = Some(value.1);
    }
    it.ok.then_some(found)
}

/// Whether a key's raw bytes (escapes as written) name `name`.
fn key_is(raw: &[u8], name: &str) -> bool {
    let unescaped = || {
        let quoted = [b"\"", raw, b"\""].concat();
        serde_json::from_slice::<String>(&quoted).is_ok_and(|k| k == name)
    };
    !name.is_empty() && (raw == name.as_bytes() || raw.contains(&b'\\') && unescaped())
}

fn is(body: &[u8], span: Span, literal: &[u8]) -> bool {
    body.get(span.0..span.1) == Some(literal)
}

/// `body` with the bytes of `span` replaced by `with`.
fn splice(body: &[u8], span: Span, with: &[u8]) -> Vec<u8> {
    let (before, after) = (body.get(..span.0), body.get(span.1..));
    [before.unwrap_or_default(), with, after.unwrap_or_default()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn asked(body: &str) -> String {
        match ask_usage(body.as_bytes()) {
            AskUsage::Asked(b) => String::from_utf8(b).unwrap(),
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn stream_options_are_added_when_absent() {
        assert_eq!(
            asked(r#"{"model":"m","stream":true}"#),
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#
        );
        // After the last member, whatever it is; whitespace, numbers and
        // trailing bytes as they were.
        assert_eq!(
            asked("\n { \"stream\" : true ,\n  \"temperature\": 1.0e0, \"n\": [1, {\"a\": {}}] }\n\t "),
            "\n { \"stream\" : true ,\n  \"temperature\": 1.0e0, \"n\": [1, {\"a\": {}}],\"stream_options\":{\"include_usage\":true} }\n\t "
        );
    }

    #[test]
    fn stream_options_are_completed_in_place() {
        let cases = [
            (
                r#"{"stream":true,"stream_options":{}}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            ),
            (
                r#"{"stream":true,"stream_options":{ }}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true }}"#,
            ),
            (
                r#"{"stream_options": {"foo": 1}, "stream": true}"#,
                r#"{"stream_options": {"foo": 1,"include_usage":true}, "stream": true}"#,
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage":false,"x":2}}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true,"x":2}}"#,
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage" : null}}"#,
                r#"{"stream":true,"stream_options":{"include_usage" : true}}"#,
            ),
            (
                r#"{"stream":true,"stream_options":null,"n":1}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true},"n":1}"#,
            ),
            // An escaped key names the same member.
            (
                r#"{"str\u0065am":true,"stream_\u006fptions":{"include_usage":false}}"#,
                r#"{"str\u0065am":true,"stream_\u006fptions":{"include_usage":true}}"#,
            ),
            // Of a key written twice, the last counts.
            (
                r#"{"stream":true,"stream_options":{"include_usage":true,"include_usage":false}}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true,"include_usage":true}}"#,
            ),
        ];
        for (body, want) in cases {
            assert_eq!(asked(body), want, "{body}");
        }
    }

    #[test]
    fn a_request_already_asking_is_left_alone() {
        for body in [
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{ "stream_options" : { "x": [], "include_usage" : true } , "stream" : true }"#,
        ] {
            assert_eq!(ask_usage(body.as_bytes()), AskUsage::AlreadyAsked, "{body}");
        }
    }

    #[test]
    fn only_a_top_level_stream_true_counts() {
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":"say \"stream\": true, please"}]}"#,
            r#"{"metadata":{"stream":true},"stream_options":{}}"#,
            r#"{"stream":false,"stream_options":{"include_usage":false}}"#,
            r#"{"stream":"true"}"#,
            r#"{"stream":1}"#,
            r#"{"stream":true,"stream":false}"#,
            "{}",
            "[{\"stream\":true}]",
            "\"stream\"",
            "true",
            "",
            "  \n",
            "not json",
        ] {
            assert_eq!(ask_usage(body.as_bytes()), AskUsage::NotAStream, "{body}");
        }
    }

    #[test]
    fn broken_bodies_and_odd_options_are_unreadable() {
        for body in [
            r#"{"stream":true"#,
            r#"{"stream":true,}"#,
            r#"{"stream":true} x"#,
            r#"{"stream":true,"messages":["open]}"#,
            r#"{"stream" true}"#,
            r#"{"stream":true,"stream_options":"yes"}"#,
            r#"{"stream":true,"stream_options":[]}"#,
            r#"{"stream":true,"stream_options":1}"#,
            r#"{"stream":true,"stream_options":{"include_usage":"yes"}}"#,
            r#"{"stream":true,"stream_options":{"include_usage":1}}"#,
        ] {
            assert_eq!(ask_usage(body.as_bytes()), AskUsage::Unreadable, "{body}");
        }
    }

    /// `asked` parses to `original` with `stream_options.include_usage`
    /// set, and is `original` with one contiguous edit of at most the
    /// added option (replacing nothing, a `false` or a `null`).
    fn check_asked(original: &[u8], asked: &[u8]) {
        let mut want: Value = serde_json::from_slice(original).unwrap();
        let obj = want.as_object_mut().unwrap();
        match obj.get_mut("stream_options") {
            Some(Value::Object(o)) => {
                o.insert("include_usage".into(), Value::Bool(true));
            }
            _ => {
                obj.insert("stream_options".into(), json!({"include_usage": true}));
            }
        }
        let got: Value = serde_json::from_slice(asked).unwrap();
        assert_eq!(got, want, "{}", String::from_utf8_lossy(asked));
        let prefix = original
            .iter()
            .zip(asked)
            .take_while(|(a, b)| a == b)
            .count();
        let suffix = original[prefix..]
            .iter()
            .rev()
            .zip(asked[prefix..].iter().rev())
            .take_while(|(a, b)| a == b)
            .count();
        let removed = &original[prefix..original.len() - suffix];
        let added = &asked[prefix..asked.len() - suffix];
        assert!(
            removed.len() <= 5 && added.len() <= OPTIONS.len() + 1,
            "{:?} -> {:?}",
            String::from_utf8_lossy(removed),
            String::from_utf8_lossy(added)
        );
    }

    #[test]
    fn edits_keep_everything_else() {
        let bodies = [
            r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi \"}\" {"}]}"#,
            r#"{"stream":true,"max_tokens":1e3,"temperature":0.70,"stream_options":{"other":{"include_usage":false}}}"#,
            "{\n  \"stream\": true,\n  \"stream_options\": {\n    \"include_usage\": false\n  }\n}\n",
            r#"{"stream_options":null,"stream":true,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}"#,
            r#"{"messages":[],"stream":true,"stream_options":{}}   "#,
        ];
        for body in bodies {
            check_asked(body.as_bytes(), asked(body).as_bytes());
        }
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(Value::from),
            r#"[ -~\n"\\{}\x{e9}]{0,10}"#.prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_options() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            Just(Some(json!({}))),
            Just(Some(json!({"include_usage": false}))),
            Just(Some(json!({"include_usage": null, "x": [1]}))),
            Just(Some(json!({"x": {"include_usage": false}}))),
        ]
    }

    proptest! {
        /// Any object with `"stream": true`, compact or pretty, with or
        /// without options: the answer is the same object asking for
        /// usage, edited in one place.
        #[test]
        fn asks_for_usage_in_any_object(
            members in prop::collection::btree_map("[a-z_]{1,8}", arb_value(), 0..6),
            options in arb_options(),
            stream_at in 0usize..7,
            pretty in any::<bool>(),
        ) {
            let mut pairs: Vec<(String, Value)> = members
                .into_iter()
                .filter(|(k, _)| k != "stream" && k != "stream_options")
                .collect();
            pairs.insert(stream_at.min(pairs.len()), ("stream".into(), Value::Bool(true)));
            if let Some(o) = options {
                pairs.push(("stream_options".into(), o));
            }
            // Written by hand to keep the chosen member order.
            let sep = if pretty { ",\n  " } else { "," };
            let text = format!(
                "{{{}}}",
                pairs
                    .iter()
                    .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), v))
                    .collect::<Vec<_>>()
                    .join(sep)
            );
            match ask_usage(text.as_bytes()) {
                AskUsage::Asked(b) => check_asked(text.as_bytes(), &b),
                other => prop_assert!(false, "{text}: {other:?}"),
            }
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn never_panics(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
            let _ = ask_usage(&bytes);
        }
    }
}
