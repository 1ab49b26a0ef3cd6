use super::*;
use serde_json::{json, Value};

/// Every item kept: the tests' conversations are short.
fn parse<'a>(body: &'a [u8], path: &str) -> Option<Request<'a>> {
    super::parse(body, path, usize::MAX).ok()
}

impl Request<'_> {
    /// The whole conversation's tail.
    pub(super) fn tail(&self, n: usize) -> Option<Vec<Message>> {
        self.tail_before(n, usize::MAX)
    }

    /// The whole conversation's tail of steps.
    pub(super) fn tail_of_steps(&self, n: usize) -> Option<Vec<Message>> {
        self.tail_of_steps_before(n, usize::MAX)
    }
}

fn tail_of(body: &Value, path: &str, n: usize) -> Vec<Message> {
    let bytes = body.to_string().into_bytes();
    let req = parse(&bytes, path).expect("recognised");
    req.tail(n).expect("readable tail")
}

fn text(s: &str) -> Part {
    Part::Text(s.to_string())
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).into()
}

/// An OpenAI Chat Completions agent turn: system, user, then the model's
/// tool call and the tool's answer, `turns` times.
fn openai_agent(turns: usize, call_id: &str, extra: Value) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a release assistant."}),
        json!({"role": "user", "content": "Is the build green?"}),
    ];
    for i in 0..turns {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("{call_id}-{i}"), "type": "function",
            "function": {"name": "get_build_status", "arguments": "{\"branch\": \"main\", \"verbose\": true}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("{call_id}-{i}"), "content": "ERROR: CI API timed out"}));
    }
    let mut body = json!({"model": "gpt-4o-mini", "messages": messages, "tools": [{"type": "function", "function": {"name": "get_build_status", "parameters": {"type": "object"}}}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

#[test]
fn normalize_text_collapses_case_and_space() {
    assert_eq!(normalize_text("  Hello\t\n  WORLD  "), "hello world");
    assert_eq!(normalize_text("ÄPFEL und Öl"), "äpfel und öl");
    assert_eq!(normalize_text(" \n "), "");
    // The ASCII fast path and the Unicode path agree.
    for t in [
        "A\tb\x0bC  d",
        "Ünïcode\u{2003}SPACE  x",
        "MiXeD \r\n case",
        "",
    ] {
        let slow: String = t
            .split_whitespace()
            .map(|w| w.to_lowercase())
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(normalize_text(t), slow, "{t:?}");
    }
}

#[test]
fn canonical_arguments_sort_keys_and_drop_whitespace() {
    assert_eq!(
        normalize::canonical_arguments(&json!("{\"b\": 1,  \"a\": {\"y\":2,\"x\":1}}")),
        "{\"a\":{\"x\":1,\"y\":2},\"b\":1}"
    );
    assert_eq!(
        normalize::canonical_arguments(&json!({"b": 1, "a": 2})),
        "{\"a\":2,\"b\":1}"
    );
    assert_eq!(
        normalize::canonical_arguments(&json!("  not json ")),
        "not json"
    );
}

#[test]
fn openai_chat_tail_with_tool_calls_and_results() {
    let body = openai_agent(2, "call_a", json!({}));
    let req_bytes = body.to_string().into_bytes();
    let req = parse(&req_bytes, "/v1/chat/completions").unwrap();
    assert_eq!(req.format, Format::OpenAiChat);
    assert_eq!(req.model.as_deref(), Some("gpt-4o-mini"));
    assert!(req.offers_tools);
    assert_eq!(req.len(), 6);
    let tail = req.tail(3).unwrap();
    let call = Part::ToolCall {
        name: "get_build_status".into(),
        arguments: "{\"branch\":\"main\",\"verbose\":true}".into(),
    };
    let result = Part::ToolResult {
        content: vec![text("error: ci api timed out")],
        is_error: false,
    };
    assert_eq!(
        tail,
        vec![
            Message {
                role: "tool".into(),
                parts: vec![result.clone()]
            },
            Message {
                role: "assistant".into(),
                parts: vec![call]
            },
            Message {
                role: "tool".into(),
                parts: vec![result]
            },
        ]
    );
}

#[test]
fn call_ids_sampling_fields_and_earlier_history_do_not_matter() {
    let a = openai_agent(
        3,
        "call_a",
        json!({"stream": true, "temperature": 0.2, "max_tokens": 100, "user": "u1"}),
    );
    let mut b = openai_agent(
        5,
        "call_zz",
        json!({"temperature": 0.9, "top_p": 0.5, "seed": 7}),
    );
    // Whitespace and case inside the arguments and texts differ too.
    let last = b["messages"].as_array().unwrap().len() - 1;
    b["messages"][last]["content"] = json!("error:   CI api TIMED out ");
    b["messages"][last - 1]["tool_calls"][0]["function"]["arguments"] =
        json!("{\"verbose\":true,\n \"branch\":\"main\"}");
    assert_eq!(
        tail_of(&a, "/v1/chat/completions", 3),
        tail_of(&b, "/v1/chat/completions", 3)
    );
    // But a changed tail message is a change.
    b["messages"][last]["content"] = json!("build is green");
    assert_ne!(
        tail_of(&a, "/v1/chat/completions", 3),
        tail_of(&b, "/v1/chat/completions", 3)
    );
}

#[test]
fn multimodal_content_is_flattened_with_image_hashes() {
    let body = |url: &str, txt: &str| {
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [
        {"type": "text", "text": txt}, {"type": "image_url", "image_url": {"url": url, "detail": "high"}}]}]})
    };
    let a = tail_of(
        &body("https://x/cat.png", "What is  THIS?"),
        "/v1/chat/completions",
        3,
    );
    assert_eq!(a[0].parts[0], text("what is this?"));
    assert_eq!(a[0].parts[1], Part::Media(sha256(b"https://x/cat.png")));
    assert_eq!(
        a,
        tail_of(
            &body("https://x/cat.png", "what is this?"),
            "/v1/chat/completions",
            3
        )
    );
    assert_ne!(
        a,
        tail_of(
            &body("https://x/dog.png", "what is this?"),
            "/v1/chat/completions",
            3
        )
    );
}

#[test]
fn responses_api_items_and_instructions() {
    let body = json!({
        "model": "gpt-4.1", "instructions": "Be brief.", "tools": [{"type": "function", "name": "search"}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Find the  Q3 report"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "search", "arguments": "{\"q\":\"q3 report\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "No results"},
        ]
    });
    let bytes = body.to_string().into_bytes();
    let req = parse(&bytes, "/v1/responses").unwrap();
    assert_eq!(req.format, Format::OpenAiResponses);
    assert!(req.offers_tools);
    assert_eq!(req.len(), 5);
    let tail = req.tail(2).unwrap();
    assert_eq!(
        tail[0].parts,
        vec![Part::ToolCall {
            name: "search".into(),
            arguments: "{\"q\":\"q3 report\"}".into()
        }]
    );
    assert_eq!(
        tail[1].parts,
        vec![Part::ToolResult {
            content: vec![text("no results")],
            is_error: false
        }]
    );
    // The instructions count as the first message once the tail reaches them.
    let all = req.tail(10).unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(
        all[0],
        Message {
            role: "system".into(),
            parts: vec![text("be brief.")]
        }
    );
    assert_eq!(all[1].parts, vec![text("find the q3 report")]);
    assert!(all[2].parts.is_empty()); // reasoning
}

#[test]
fn responses_api_string_input_and_previous_response_id() {
    let body = json!({"model": "gpt-4.1", "input": "  Tell me a JOKE ", "previous_response_id": "resp_123"});
    let bytes = body.to_string().into_bytes();
    let req = parse(&bytes, "/v1/responses").unwrap();
    assert!(!req.offers_tools);
    // A continuation carries no history: its tail is what it sends.
    assert_eq!(
        req.tail(3).unwrap(),
        vec![Message {
            role: "user".into(),
            parts: vec![text("tell me a joke")]
        }]
    );
}

#[test]
fn anthropic_messages_with_blocks_tool_use_and_results() {
    let body = |use_id: &str, input: Value| {
        json!({
            "model": "claude-sonnet-5-5", "max_tokens": 1024, "system": "You manage builds.",
            "tools": [{"name": "get_build_status", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "Is the build green?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Let me check.", "signature": format!("sig-{use_id}")},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": use_id, "name": "get_build_status", "input": input}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id, "is_error": true,
                    "content": [{"type": "text", "text": "CI API timed out"}]}]},
            ]
        })
    };
    let a = body("toolu_01", json!({"branch": "main", "verbose": true}));
    let bytes = a.to_string().into_bytes();
    let req = parse(&bytes, "/v1/messages").unwrap();
    assert_eq!(req.format, Format::Anthropic);
    assert_eq!(req.len(), 4);
    let tail = req.tail(2).unwrap();
    assert_eq!(
        tail[0].parts,
        vec![
            text("checking."),
            Part::ToolCall {
                name: "get_build_status".into(),
                arguments: "{\"branch\":\"main\",\"verbose\":true}".into()
            },
        ]
    );
    assert_eq!(
        tail[1].parts,
        vec![Part::ToolResult {
            content: vec![text("ci api timed out")],
            is_error: true
        }]
    );
    // New tool_use id, new thinking signature, keys in another order: same.
    let b = body("toolu_99", json!({"verbose": true, "branch": "main"}));
    assert_eq!(tail, tail_of(&b, "/v1/messages", 2));
    assert_eq!(
        req.tail(4).unwrap()[0],
        Message {
            role: "system".into(),
            parts: vec![text("you manage builds.")]
        }
    );
}

#[test]
fn anthropic_recognised_by_path_without_system() {
    let body = json!({"model": "claude-haiku-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "text", "text": "Describe"}]}]});
    let bytes = body.to_string().into_bytes();
    let req = parse(&bytes, "/anthropic/v1/messages").unwrap();
    assert_eq!(req.format, Format::Anthropic);
    assert_eq!(
        req.tail(1).unwrap()[0].parts,
        vec![Part::Media(sha256(b"iVBORw0KGgo=")), text("describe")]
    );
    assert_eq!(
        parse(&bytes, "/v1/chat/completions").unwrap().format,
        Format::OpenAiChat
    );
}

#[test]
fn unrecognised_bodies() {
    for body in [
        &b"not json"[..],
        b"",
        b"[1,2]",
        b"{\"prompt\": \"hi\"}",
        b"{\"input\": 5}",
        b"{\"messages\": 3}",
        b"\xff\xfe",
    ] {
        assert!(
            parse(body, "/v1/chat/completions").is_none(),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    // A bad message inside a recognised envelope is kept as an opaque marker.
    let req = parse(
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
        "/",
    )
    .unwrap();
    assert_eq!(req.model, None);
    assert!(!req.offers_tools);
}

#[test]
fn legacy_function_calls_and_refusals() {
    let body = json!({"model": "gpt-3.5-turbo", "functions": [{"name": "f"}], "messages": [
        {"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{\"a\": 1}"}},
        {"role": "function", "name": "f", "content": "done"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't"}]}]});
    let bytes = body.to_string().into_bytes();
    let req = parse(&bytes, "/v1/chat/completions").unwrap();
    assert!(req.offers_tools);
    let t = req.tail(3).unwrap();
    assert_eq!(
        t[0].parts,
        vec![Part::ToolCall {
            name: "f".into(),
            arguments: "{\"a\":1}".into()
        }]
    );
    assert_eq!(
        t[1].parts,
        vec![Part::ToolResult {
            content: vec![text("done")],
            is_error: false
        }]
    );
    assert_eq!(t[2].parts, vec![text("i can't")]);
}

#[test]
fn plain_message_fast_path_agrees_with_the_full_parser() {
    let cases = [
        json!({"role": "user", "content": "  Hello\tWORLD \u{e9}t\u{c9} "}),
        json!({"role": "Tool", "tool_call_id": "c1", "content": "Result \"quoted\" \\ back"}),
        json!({"role": "assistant", "content": null, "refusal": null, "annotations": []}),
        json!({"role": "function", "name": "f", "content": ""}),
        json!({"content": "no role first", "role": "system"}),
    ];
    for v in cases {
        let body = json!({"model": "m", "messages": [v.clone()]})
            .to_string()
            .into_bytes();
        let req = parse(&body, "/v1/chat/completions").unwrap();
        let fast = req.plain_item(0).expect("fast path taken");
        assert_eq!(fast, normalize::message(&v), "{v}");
    }
    // Richer messages take the full parser.
    let body = json!({"model": "m", "messages": [{"role": "assistant", "content": "x", "tool_calls": []}]}).to_string().into_bytes();
    let req = parse(&body, "/").unwrap();
    assert!(req.plain_item(0).is_none());
}

#[test]
fn an_unreadable_tail_message_makes_the_body_unreadable() {
    // Structure is fine, but the last message holds invalid UTF-8.
    let mut body = br#"{"model": "m", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "bad "#.to_vec();
    body.extend_from_slice(b"\xff\xfe\"}]}");
    let req = parse(&body, "/v1/chat/completions").unwrap();
    assert_eq!(req.tail(1), None);
    // Earlier, unread messages are not checked.
    assert!(req.first_message().is_some());
}

/// Every character as `\uXXXX` (surrogate pairs beyond the BMP): the way
/// an ASCII-only JSON encoder writes a string.
fn ascii_json(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
            out.push_str(&format!("\\u{u:04x}"));
        }
    }
    out.push('"');
    out
}

proptest::proptest! {
    #[test]
    fn json_strings_normalise_as_their_text(s in "\\PC*|[\\x00-\\x7f\u{e9}\u{1f600}\\s]*") {
        let expected = normalize_text(&s);
        let plain = serde_json::to_string(&s).unwrap();
        proptest::prop_assert_eq!(normalize::normalize_json_str(plain.as_bytes()), Some(expected.clone()));
        proptest::prop_assert_eq!(normalize::normalize_json_str(ascii_json(&s).as_bytes()), Some(expected));
    }
}

#[test]
fn broken_json_strings_are_refused_like_serde_refuses_them() {
    for bad in [
        &b"\"a\x01b\""[..],
        b"\"\\q\"",
        b"\"\\ud800\"",
        b"\"\\ud800\\u0041\"",
        b"\"\\u12\"",
        b"\"\\",
        b"x",
        b"\"\xff\"",
    ] {
        assert_eq!(
            normalize::normalize_json_str(bad),
            None,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
        assert!(serde_json::from_slice::<String>(bad).is_err());
    }
    assert_eq!(
        normalize::normalize_json_str(br#""A\tB\u00C9 \ud83d\ude00""#).as_deref(),
        Some("a b\u{e9} \u{1f600}")
    );
}

/// The task near mode salts with: the first user message (the prompts only
/// when there is none), whatever comes before it.
#[test]
fn task_is_the_first_user_message_or_else_the_prompts() {
    let task = |body: Value, path: &str| {
        let bytes = body.to_string().into_bytes();
        let req = parse(&bytes, path).expect("recognised");
        req.task()
            .into_iter()
            .map(|m| (m.role, m.parts))
            .collect::<Vec<_>>()
    };
    let user = |s: &str| ("user".to_string(), vec![text(s)]);
    let system = |s: &str| ("system".to_string(), vec![text(s)]);
    let chat = "/v1/chat/completions";
    assert_eq!(
        task(
            json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ship It"}]}),
            chat
        ),
        vec![user("ship it")]
    );
    // The model's opening turn is passed over.
    assert_eq!(
        task(
            json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "ship it"}]}),
            chat
        ),
        vec![user("ship it")]
    );
    // No user message among the leading items: the prompts stand in.
    assert_eq!(
        task(
            json!({"messages": [{"role": "system", "content": "Summarise ticket 1."}, {"role": "developer", "content": "JSON only."}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}),
            chat
        ),
        vec![
            system("summarise ticket 1."),
            ("developer".to_string(), vec![text("json only.")])
        ]
    );
    // Anthropic: the system prompt is out of band; a user message of tool
    // results is not the task.
    let anthropic = json!({"system": "Be brief.", "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        {"role": "user", "content": "Fix the build"}]});
    assert_eq!(task(anthropic, "/v1/messages"), vec![user("fix the build")]);
    let anthropic = json!({"system": "Summarise ticket 2.", "messages": [{"role": "assistant", "content": "x"}]});
    assert_eq!(
        task(anthropic, "/v1/messages"),
        vec![system("summarise ticket 2.")]
    );
    // Responses with a string input: that is the user's message.
    assert_eq!(
        task(json!({"input": "Find the bug"}), "/v1/responses"),
        vec![user("find the bug")]
    );
}

#[test]
fn model_of_finds_the_model_key_without_parsing() {
    assert_eq!(
        model_of(br#"{"model": "gpt-4o-2024-08-06", "messages": []}"#).as_deref(),
        Some("gpt-4o-2024-08-06")
    );
    // Not a key inside a string, not a non-string value.
    assert_eq!(
        model_of(br#"{"messages":[{"content":"\"model\": \"x\""}],"model":"m1"}"#).as_deref(),
        Some("m1")
    );
    assert_eq!(
        model_of(br#"{"model": null, "x": {"model": "m2"}}"#).as_deref(),
        Some("m2")
    );
    assert_eq!(model_of(br#"{"model": "a\"b"}"#), None);
    assert_eq!(model_of(b"{}"), None);
    assert_eq!(model_of(br#"{"model": ""}"#), None);
}

/// `normalize_text` as it was, a character at a time.
fn normalize_text_reference(s: &str) -> String {
    let mut out = String::new();
    let mut pending_space = false;
    for c in s.chars() {
        let space = if c.is_ascii() {
            c.is_ascii_whitespace() || c == '\u{b}'
        } else {
            c.is_whitespace()
        };
        if space {
            pending_space = !out.is_empty();
        } else {
            if pending_space {
                out.push(' ');
                pending_space = false;
            }
            if s.is_ascii() {
                out.push(c.to_ascii_lowercase());
            } else {
                out.extend(c.to_lowercase());
            }
        }
    }
    out
}

proptest::proptest! {
    /// Copying the runs between whitespace whole normalises as a character
    /// at a time did.
    #[test]
    fn ascii_text_normalises_as_before(
        s in "[ \\t\\n\\r\\x0b\\x0c\\x01a-zA-Z0-9.]{0,40}|( |  |[a-zA-Z]{1,9}|\\t|\\n|\\x01|\\x7f){0,40}"
    ) {
        proptest::prop_assert_eq!(normalize_text(&s), normalize_text_reference(&s));
    }

    #[test]
    fn any_text_normalises_as_before(s in "\\PC*|[\\x00-\\x7f\u{e9}\u{1f600}\\s]*") {
        proptest::prop_assert_eq!(normalize_text(&s), normalize_text_reference(&s));
    }
}

#[test]
fn a_correction_sent_again_with_no_reply_between_is_a_reask() {
    let reasked = |body: Value, path: &str| {
        let bytes = body.to_string().into_bytes();
        parse(&bytes, path).expect("recognised").reasked()
    };
    let fix = "Format error: reply with exactly one bash tool call.";
    let chat = |extra: usize| {
        let mut m = vec![
            json!({"role": "user", "content": "Fix the build."}),
            json!({"role": "assistant", "content": "Looking."}),
        ];
        m.extend((0..extra).map(|_| json!({"role": "user", "content": fix})));
        json!({"model": "gpt-4o", "messages": m})
    };
    assert_eq!(reasked(chat(1), "/v1/chat/completions"), 0);
    assert_eq!(reasked(chat(3), "/v1/chat/completions"), 2);
    // Other messages between them, or a different last message: no re-ask.
    let mut other = chat(2);
    other["messages"][3]["content"] = json!("Format error: reply with one call.");
    assert_eq!(reasked(other, "/v1/chat/completions"), 0);
    // Anthropic blocks and Responses items alike.
    let blocks = json!([{"type": "text", "text": fix}]);
    let anthropic = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [
        {"role": "user", "content": "Fix the build."},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]},
        {"role": "user", "content": blocks}, {"role": "user", "content": blocks}]});
    assert_eq!(reasked(anthropic, "/v1/messages"), 1);
    let responses = json!({"model": "gpt-5", "input": [
        {"role": "user", "content": "Fix the build."},
        {"role": "user", "content": fix}, {"role": "user", "content": fix}, {"role": "user", "content": fix}]});
    assert_eq!(reasked(responses, "/v1/responses"), 2);
}
