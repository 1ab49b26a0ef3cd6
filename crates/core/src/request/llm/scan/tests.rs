//! The scanner against serde_json: every kind of value, broken structure,
//! the limits, the kept elements, canonical JSON, and property tests.

use super::*;
use proptest::prelude::*;
use serde_json::Value;

#[test]
fn skips_values_of_every_kind() {
    let b = br#"{"a": [1, {"b": "x\"]}"}, true], "c" : null , "d":-1.5e3}"#;
    let doc = document(b).unwrap();
    let m = members(b, doc).unwrap();
    let keys: Vec<&[u8]> = m.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, vec![&b"a"[..], b"c", b"d"]);
    let a = get(&m, "a").unwrap();
    assert_eq!(&b[a.0..a.1], br#"[1, {"b": "x\"]}"}, true]"#);
    let els = elements(b, a).unwrap();
    assert_eq!(els.len(), 3);
    assert_eq!(&b[els[1].0..els[1].1], br#"{"b": "x\"]}"}"#);
    assert_eq!(
        &b[get(&m, "d").unwrap().0..get(&m, "d").unwrap().1],
        b"-1.5e3"
    );
    assert_eq!(
        plain_str(b, get(&members(b, els[1]).unwrap(), "b").unwrap()),
        None
    );
}

#[test]
fn finds_quotes_and_backslashes_at_every_offset() {
    for len in 0..40 {
        for pos in 0..len {
            for c in [b'"', b'\\'] {
                let mut s = vec![b'a'; len];
                s[pos] = c;
                if pos + 3 < len {
                    s[pos + 3] = b'"';
                }
                assert_eq!(
                    find_quote_or_backslash(&s),
                    Some(pos),
                    "len {len} pos {pos}"
                );
            }
        }
        assert_eq!(find_quote_or_backslash(&vec![0x80u8; len]), None);
        // Bytes one off a quote or backslash are not matches.
        assert_eq!(find_quote_or_backslash(&vec![b'"' + 1; len]), None);
        assert_eq!(find_quote_or_backslash(&vec![b'\\' - 1; len]), None);
    }
}

#[test]
fn refuses_broken_structure_without_panicking() {
    for bad in [
        &b"{"[..],
        b"[1,",
        b"{\"a\" 1}",
        b"{\"a\":1,}",
        b"\"open",
        b"[1 2]",
        b"}",
        b"",
        b"{} x",
        br#"["\"] "#,
    ] {
        let ok = document(bad).and_then(|d| match bad.first() {
            Some(b'{') => members(bad, d).map(|_| ()),
            Some(b'[') => elements(bad, d).map(|_| ()),
            _ => Some(()),
        });
        assert!(ok.is_none(), "{:?}", String::from_utf8_lossy(bad));
    }
    // Nesting is counted, not recursed, up to MAX_DEPTH; deeper is
    // refused, and the refusal says why.
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert_eq!(document(ok.as_bytes()), Some((0, ok.len())));
    assert_eq!(refusal(ok.as_bytes()), None);
    let deep = format!("{}{}", "[".repeat(500_000), "]".repeat(500_000));
    assert_eq!(document(deep.as_bytes()), None);
    assert_eq!(refusal(deep.as_bytes()), Some(Refusal::TooDeep));
}

#[test]
fn containers_are_read_up_to_their_limits() {
    let many = |n: usize, open: &str, item: &str, close: &str| {
        let items: Vec<String> = (0..n)
            .map(|i| item.replace("{i}", &i.to_string()))
            .collect();
        format!("{open}{}{close}", items.join(","))
    };
    let keys_ok = many(MAX_KEYS, "{", r#""k{i}":0"#, "}");
    let d = document(keys_ok.as_bytes()).unwrap();
    assert_eq!(members(keys_ok.as_bytes(), d).unwrap().len(), MAX_KEYS);
    assert_eq!(refusal(keys_ok.as_bytes()), None);
    let keys_over = many(MAX_KEYS + 1, "{", r#""k{i}":0"#, "}");
    let d = document(keys_over.as_bytes()).unwrap();
    assert_eq!(members(keys_over.as_bytes(), d), None);
    assert_eq!(refusal(keys_over.as_bytes()), Some(Refusal::TooMany));
    let els_over = many(MAX_ELEMENTS + 1, "[", "{}", "]");
    let d = document(els_over.as_bytes()).unwrap();
    assert_eq!(elements(els_over.as_bytes(), d), None);
    assert_eq!(refusal(els_over.as_bytes()), Some(Refusal::TooMany));
    // Many elements are fine in an array, many keys are not in an
    // object: the limits differ.
    let els_ok = many(MAX_KEYS + 1, "[", "1", "]");
    assert_eq!(refusal(els_ok.as_bytes()), None);
}

#[test]
fn long_arrays_keep_the_leading_and_the_last_elements() {
    let body = format!(
        "[{}]",
        (0..1000)
            .map(|i| format!("{{\"n\":{i}}}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let (els, end) = elements_with_members_at(body.as_bytes(), 0, 3).unwrap();
    assert_eq!(end, body.len());
    assert_eq!(els.len(), 1000);
    let at = |i: usize| els.get(i).map(|e| &body[e.0 .0..e.0 .1]);
    assert_eq!(at(0), Some(r#"{"n":0}"#));
    assert_eq!(at(1), Some(r#"{"n":1}"#));
    assert_eq!(at(2), Some(r#"{"n":2}"#));
    assert_eq!(at(3), None, "not kept");
    assert_eq!(at(996), None);
    assert_eq!(at(997), Some(r#"{"n":997}"#));
    assert_eq!(at(999), Some(r#"{"n":999}"#));
    assert_eq!(
        els.kept().map(|(i, _)| i).collect::<Vec<_>>(),
        vec![997, 998, 999]
    );
    assert_eq!(els.last().map(|s| &body[s.0..s.1]), Some(r#"{"n":999}"#));
}

#[test]
fn nodes_are_counted_up_to_a_limit() {
    let b = br#"{"a": [1, true, null, "x"], "b": {"c": -2.5}}"#;
    // {, "a", [, 1, true, null, "x", "b", {, "c", -2.5
    assert_eq!(count_nodes(b, (0, b.len()), 100), Some(11));
    assert_eq!(count_nodes(b, (0, b.len()), 10), None);
}

#[test]
fn canonical_sorts_keys_and_drops_whitespace() {
    let b = br#" { "b" : [ 1 , {"z": "x y", "a": null} ], "a": "\"q\"" } "#;
    assert_eq!(
        canonical(b, (0, b.len())).unwrap(),
        r#"{"a":"\"q\"","b":[1,{"a":null,"z":"x y"}]}"#
    );
    let deep = format!("{}{}", "[".repeat(70), "]".repeat(70));
    assert_eq!(canonical(deep.as_bytes(), (0, deep.len())), None);
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        r"[ -~\n\x{e9}\x{1F600}]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(r#"[a-z"\\]{0,6}"#, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Re-read a value with the scanner alone, parsing only leaves.
fn rebuild(b: &[u8], span: Span) -> Value {
    match b[span.0] {
        b'{' => Value::Object(
            members(b, span)
                .unwrap()
                .into_iter()
                .map(|(k, s)| {
                    let key: String = serde_json::from_slice(&[b"\"", k, b"\""].concat()).unwrap();
                    (key, rebuild(b, s))
                })
                .collect(),
        ),
        b'[' => Value::Array(
            elements(b, span)
                .unwrap()
                .into_iter()
                .map(|s| rebuild(b, s))
                .collect(),
        ),
        _ => serde_json::from_slice(&b[span.0..span.1]).unwrap(),
    }
}

proptest! {
    /// On any valid JSON (compact or pretty), the scanner finds exactly
    /// the structure serde_json finds.
    #[test]
    fn agrees_with_serde_json(v in arb_json(), pretty in any::<bool>()) {
        let text = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
        let b = text.as_bytes();
        let doc = document(b).unwrap();
        prop_assert_eq!(rebuild(b, doc), v);
    }

    /// The canonical form is serde_json's sorted compact form (for keys
    /// and strings without escapes, which both render the same way).
    #[test]
    fn canonical_matches_serde_on_plain_values(v in arb_json()) {
        let text = serde_json::to_string_pretty(&v).unwrap();
        if !text.contains('\\') {
            prop_assert_eq!(canonical(text.as_bytes(), (0, text.len())).unwrap(), v.to_string());
        }
    }

    /// Arbitrary bytes never panic.
    #[test]
    fn never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Some(d) = document(&bytes) {
            let _ = members(&bytes, d);
            let _ = elements(&bytes, d);
        }
    }
}
