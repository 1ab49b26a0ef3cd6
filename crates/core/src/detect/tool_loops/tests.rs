use super::calls::trivially_varied;
use super::*;
use crate::config::Config;
use crate::request::llm::{self, Format};
use serde_json::{json, Value};

pub(super) fn cfg(extra: Value) -> ToolLoops {
    let mut tl = json!({"enabled": true});
    for (k, v) in extra.as_object().unwrap() {
        tl[k] = v.clone();
    }
    Config::from_value(
        &json!({"policies": [{"id": "p", "spec": {"selector": {}, "tool_loops": tl}}]}),
    )
    .unwrap()
    .policies[0]
        .tool_loops
        .clone()
        .unwrap()
}

/// An OpenAI chat history: for each turn, the assistant's calls (name,
/// arguments JSON) then one tool result per call.
fn chat(turns: &[&[(&str, &str)]]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Find the Q3 report"})];
    for (t, calls) in turns.iter().enumerate() {
        let tool_calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| json!({"id": format!("call_{t}_{i}"), "type": "function", "function": {"name": name, "arguments": args}}))
            .collect();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
        for i in 0..calls.len() {
            messages.push(json!({"role": "tool", "tool_call_id": format!("call_{t}_{i}"), "content": "not found"}));
        }
    }
    json!({"model": "gpt-4o", "messages": messages, "tools": [{"type": "function", "function": {"name": "read_file"}}]})
}

/// The verdict on `body`, the same read with no text cache, an empty one
/// and one this body filled.
pub(super) fn judge_body(c: &ToolLoops, body: &Value, path: &str) -> Option<ToolVerdict> {
    let bytes = body.to_string().into_bytes();
    let req = llm::parse(&bytes, path, usize::MAX).unwrap();
    let history = req.tool_history(None);
    let verdict = judge(c, &history, &req, None);
    // Read through a cache (empty, then holding every text), the verdict
    // is the same.
    let texts = crate::detect::progress::TextCache::default();
    assert_eq!(judge(c, &history, &req, Some(&texts)), verdict);
    assert_eq!(judge(c, &history, &req, Some(&texts)), verdict);
    verdict
}

const READ: (&str, &str) = ("read_file", "{\"path\": \"/etc/app.conf\"}");

#[test]
fn identical_thrash_climbs_the_ladder() {
    let c = cfg(json!({}));
    assert_eq!(
        judge_body(&c, &chat(&[&[READ], &[READ]]), "/v1/chat/completions"),
        None
    );
    let v = judge_body(
        &c,
        &chat(&[&[READ], &[READ], &[READ]]),
        "/v1/chat/completions",
    )
    .unwrap();
    assert_eq!(
        v,
        ToolVerdict {
            tier: Tier::Identical,
            evidence: crate::detect::tool_loops::Repeated {
                tool: "read_file".into(),
                arguments: Some("{\"path\":\"/etc/app.conf\"}".into()),
            },
            occurrences: 3,
            level: 1,
            step: ToolStep::Nudge
        }
    );
    let steps: Vec<(u32, ToolStep)> = (4..=7)
        .map(|n| {
            let turns: Vec<&[(&str, &str)]> = (0..n).map(|_| &[READ][..]).collect();
            let v = judge_body(&c, &chat(&turns), "/v1/chat/completions").unwrap();
            (v.level, v.step)
        })
        .collect();
    // Directive on the next, reject on the one after, capped there.
    assert_eq!(
        steps,
        vec![
            (2, ToolStep::Directive),
            (3, ToolStep::Reject),
            (3, ToolStep::Reject),
            (3, ToolStep::Reject)
        ]
    );
}

#[test]
fn arguments_compare_canonically() {
    let c = cfg(json!({}));
    let a: (&str, &str) = ("read_file", "{\"path\":\"/etc/app.conf\"}");
    let b: (&str, &str) = ("read_file", "{ \"path\" :  \"/etc/app.conf\" }");
    let v = judge_body(&c, &chat(&[&[a], &[b], &[a]]), "/v1/chat/completions").unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
}

#[test]
fn parallel_calls_count_and_a_custom_ladder_applies() {
    let c = cfg(json!({"ladder": ["reject"]}));
    let v = judge_body(&c, &chat(&[&[READ, READ], &[READ]]), "/v1/chat/completions").unwrap();
    assert_eq!((v.occurrences, v.level, v.step), (3, 1, ToolStep::Reject));
}

#[test]
fn a_short_answer_to_other_questions_is_not_pattern_thrash() {
    // "not found" for other dates, or for other words altogether: an
    // agent looking in other places, not retrying one search.
    let c = cfg(json!({}));
    let q = |s: &'static str| -> (&'static str, &'static str) { ("search_flights", s) };
    let dates = chat(&[
        &[q("{\"date\":\"2024-05-20\",\"to\":\"SEA\"}")],
        &[q("{\"date\":\"2024-05-21\",\"to\":\"SEA\"}")],
        &[q("{\"date\":\"2024-05-22\",\"to\":\"SEA\"}")],
        &[q("{\"date\":\"2024-05-23\",\"to\":\"SEA\"}")],
    ]);
    assert_eq!(judge_body(&c, &dates, "/v1/chat/completions"), None);
    let places = chat(&[
        &[q("{\"q\":\"quarterly revenue\"}")],
        &[q("{\"q\":\"board minutes\"}")],
        &[q("{\"q\":\"hiring plan\"}")],
        &[q("{\"q\":\"office lease\"}")],
    ]);
    assert_eq!(judge_body(&c, &places, "/v1/chat/completions"), None);
    assert!(trivially_varied(
        "{\"q\":\"USB-C charger\"}",
        "{\"q\":\"usb c charger cable\"}"
    ));
    assert!(trivially_varied(
        "{\"q\":\"q3 report\"}",
        "{\"q\":\"Q3 report (PDF)\"}"
    ));
    assert!(!trivially_varied(
        "{\"date\":\"2024-05-20\"}",
        "{\"date\":\"2024-05-21\"}"
    ));
    assert!(!trivially_varied(
        "sed -i '27a x' f.py",
        "sed -i '259,262c y' f.py"
    ));
}

#[test]
fn pattern_thrash_and_identical_wins() {
    let c = cfg(json!({}));
    let q = |s: &'static str| -> (&'static str, &'static str) { ("search", s) };
    let body = chat(&[
        &[q("{\"q\":\"q3\"}")],
        &[q("{\"q\":\"q3 report\"}")],
        &[q("{\"q\":\"report q3\"}")],
        &[q("{\"q\":\"Q3 report (PDF)\"}")],
    ]);
    let v = judge_body(&c, &body, "/v1/chat/completions").unwrap();
    assert_eq!(
        (
            v.tier,
            v.evidence.tool.as_str(),
            v.occurrences,
            v.level,
            v.evidence.arguments.clone()
        ),
        (Tier::Pattern, "search", 4, 1, None)
    );
    // Three identical among five calls of the same tool: identical wins.
    let body = chat(&[
        &[q("{\"q\":\"a\"}")],
        &[q("{\"q\":\"b\"}")],
        &[q("{\"q\":\"c\"}")],
        &[q("{\"q\":\"c\"}")],
        &[q("{\"q\":\"c\"}")],
    ]);
    let v = judge_body(&c, &body, "/v1/chat/completions").unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
}

#[test]
fn only_the_last_calls_are_examined_and_exempt_tools_are_dropped_first() {
    let c = cfg(json!({"exempt_tools": ["poll_job_status"]}));
    const POLL: (&str, &str) = ("poll_job_status", "{\"job\":1}");
    let poll = POLL;
    // Six polls in a row are never a loop.
    let polls: Vec<&[(&str, &str)]> = (0..6).map(|_| &[POLL][..]).collect();
    assert_eq!(judge_body(&c, &chat(&polls), "/v1/chat/completions"), None);
    // Polls between the reads do not push them out of the window.
    let body = chat(&[
        &[READ],
        &[poll],
        &[poll],
        &[READ],
        &[poll],
        &[poll],
        &[poll],
        &[READ],
    ]);
    assert_eq!(
        judge_body(&c, &body, "/v1/chat/completions")
            .unwrap()
            .occurrences,
        3
    );
    // Without the exemption the first read falls out of the last 6 calls.
    assert_eq!(
        judge_body(&cfg(json!({})), &body, "/v1/chat/completions"),
        None
    );
}

#[test]
fn an_agent_that_moved_on_is_left_alone() {
    let c = cfg(json!({}));
    let other: (&str, &str) = ("list_dir", "{\"path\":\"/etc\"}");
    assert_eq!(
        judge_body(
            &c,
            &chat(&[&[READ], &[READ], &[READ], &[other]]),
            "/v1/chat/completions"
        ),
        None
    );
    // A final text answer: also moved on.
    let mut body = chat(&[&[READ], &[READ], &[READ]]);
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "I could not read it."}));
    assert_eq!(judge_body(&c, &body, "/v1/chat/completions"), None);
    // Interleaved user turns do not break the repetition.
    let mut body = chat(&[&[READ], &[READ]]);
    let msgs = body["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "user", "content": "try again"}));
    msgs.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/etc/app.conf\"}"}}]}));
    msgs.push(json!({"role": "tool", "tool_call_id": "x", "content": "not found"}));
    assert_eq!(
        judge_body(&c, &body, "/v1/chat/completions")
            .unwrap()
            .occurrences,
        3
    );
}

fn responses_body(n: usize) -> Value {
    let mut input = vec![json!({"role": "user", "content": "Find the Q3 report"})];
    for i in 0..n {
        input.push(json!({"type": "reasoning", "id": format!("rs_{i}"), "summary": []}));
        input.push(json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": format!("c{i}"), "name": "read_file", "arguments": "{\"path\":\"/etc/app.conf\"}"}));
        input.push(json!({"type": "function_call_output", "call_id": format!("c{i}"), "output": "not found"}));
    }
    json!({"model": "gpt-4.1", "input": input, "tool_choice": "auto"})
}

fn anthropic_body(n: usize, last_content_as_string: bool) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Find the Q3 report"})];
    for i in 0..n {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "read_file", "input": {"path": "/etc/app.conf"}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": "not found"}]}));
    }
    if last_content_as_string {
        messages.push(json!({"role": "assistant", "content": "Let me think."}));
        messages.push(json!({"role": "user", "content": "Go on."}));
    }
    json!({"model": "claude-sonnet-5-5", "max_tokens": 512, "system": "You read files.", "messages": messages})
}

#[test]
fn responses_and_anthropic_histories() {
    let c = cfg(json!({}));
    let v = judge_body(&c, &responses_body(3), "/v1/responses").unwrap();
    assert_eq!(
        (v.tier, v.occurrences, v.step),
        (Tier::Identical, 3, ToolStep::Nudge)
    );
    let v = judge_body(&c, &anthropic_body(4, false), "/v1/messages").unwrap();
    assert_eq!(
        (v.tier, v.occurrences, v.step),
        (Tier::Identical, 4, ToolStep::Directive)
    );
    // A history without tool calls, or a continuation, judges nothing.
    assert_eq!(
        judge_body(
            &c,
            &json!({"model": "m", "input": "hi", "previous_response_id": "resp_1"}),
            "/v1/responses"
        ),
        None
    );
}

fn rewritten(c: &ToolLoops, body: &Value, path: &str) -> (Vec<u8>, Vec<u8>, Value) {
    let original = body.to_string().into_bytes();
    let req = llm::parse(&original, path, usize::MAX).unwrap();
    let v = judge(c, &req.tool_history(None), &req, None).unwrap();
    let out = rewrite(c, &req, &v).unwrap();
    let parsed: Value = serde_json::from_slice(&out).unwrap();
    (original, out, parsed)
}

/// The longest common prefix of two byte strings.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn nudges_append_at_the_end_and_keep_every_earlier_byte() {
    let c = cfg(json!({}));
    // OpenAI chat: a system message after the last tool result.
    let body = chat(&[&[READ], &[READ], &[READ]]);
    let (orig, out, v) = rewritten(&c, &body, "/v1/chat/completions");
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), body["messages"].as_array().unwrap().len() + 1);
    assert_eq!(msgs.last().unwrap()["role"], "system");
    assert!(msgs.last().unwrap()["content"]
        .as_str()
        .unwrap()
        .contains("called the tool `read_file` 3 times with the same arguments"));
    assert_pure_insertion(&orig, &out, b",{\"role\":\"system\"");

    // Responses: a developer item.
    let (_, _, v) = rewritten(&c, &responses_body(3), "/v1/responses");
    let last = v["input"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "developer");

    // Anthropic: a text block at the end of the final user turn (tool
    // results stay first, roles keep alternating).
    let body = anthropic_body(3, false);
    let (orig, out, v) = rewritten(&c, &body, "/v1/messages");
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), body["messages"].as_array().unwrap().len());
    let last = msgs.last().unwrap();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"][0]["type"], "tool_result");
    assert_eq!(last["content"][1]["type"], "text");
    assert_pure_insertion(&orig, &out, b",{\"type\":\"text\"");
}

/// `out` is `orig` with bytes starting with `starts` inserted at one place:
/// every byte before and after the insertion is unchanged.
fn assert_pure_insertion(orig: &[u8], out: &[u8], starts: &[u8]) {
    let at = common_prefix(orig, out);
    let added = out.len() - orig.len();
    assert!(
        out[at..].starts_with(starts),
        "insertion at {at}: {}",
        String::from_utf8_lossy(&out[at..])
    );
    assert_eq!(&out[at + added..], &orig[at..]);
}

#[test]
fn anthropic_string_content_becomes_blocks() {
    let bytes = anthropic_body(3, true).to_string().into_bytes();
    let req = llm::parse(&bytes, "/v1/messages", usize::MAX).unwrap();
    let v: Value = serde_json::from_slice(&req.with_note("careful").unwrap()).unwrap();
    let last = v["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["content"],
        json!([{"type": "text", "text": "Go on."}, {"type": "text", "text": "careful"}])
    );
    // A conversation that ends with the assistant gets a new user turn.
    let body = json!({"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]});
    let bytes = body.to_string().into_bytes();
    let req = llm::parse(&bytes, "/v1/messages", usize::MAX).unwrap();
    let v: Value = serde_json::from_slice(&req.with_note("careful").unwrap()).unwrap();
    assert_eq!(
        v["messages"][2],
        json!({"role": "user", "content": [{"type": "text", "text": "careful"}]})
    );
    // An empty conversation too.
    let bytes = br#"{"model": "claude", "messages": [ ], "system": "s"}"#;
    let req = llm::parse(bytes, "/v1/messages", usize::MAX).unwrap();
    let v: Value = serde_json::from_slice(&req.with_note("n").unwrap()).unwrap();
    assert_eq!(
        v["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "n"}]}])
    );
}

#[test]
fn directives_name_the_tool_and_may_disable_tools() {
    let c = cfg(json!({"directive_disables_tools": true}));
    let four: Vec<&[(&str, &str)]> = (0..4).map(|_| &[READ][..]).collect();
    let (_, _, v) = rewritten(&c, &chat(&four), "/v1/chat/completions");
    let note = v["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(note.contains("stop calling the tool `read_file`"));
    assert!(note.contains("{\"path\":\"/etc/app.conf\"}"));
    assert_eq!(v["tool_choice"], "none");
    // An existing tool_choice is replaced (Responses), Anthropic gets its own shape.
    let (_, _, v) = rewritten(&c, &responses_body(4), "/v1/responses");
    assert_eq!(v["tool_choice"], "none");
    let (_, _, v) = rewritten(&c, &anthropic_body(4, false), "/v1/messages");
    assert_eq!(v["tool_choice"], json!({"type": "none"}));
    // Without the switch, tool_choice is left alone.
    let (_, _, v) = rewritten(&cfg(json!({})), &responses_body(4), "/v1/responses");
    assert_eq!(v["tool_choice"], "auto");
}

#[test]
fn odd_json_layouts_are_edited_correctly() {
    let c = cfg(json!({}));
    // Pretty-printed with trailing whitespace, escapes in strings.
    let pretty =
        serde_json::to_string_pretty(&chat(&[&[READ], &[READ], &[READ]])).unwrap() + "\n\n";
    let req = llm::parse(pretty.as_bytes(), "/v1/chat/completions", usize::MAX).unwrap();
    assert_eq!(req.format, Format::OpenAiChat);
    let v = judge(&c, &req.tool_history(None), &req, None).unwrap();
    let out = rewrite(&c, &req, &v).unwrap();
    let parsed: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        parsed["messages"].as_array().unwrap().last().unwrap()["role"],
        "system"
    );
}

#[test]
fn header_values_are_safe_tokens() {
    let v = ToolVerdict {
        tier: Tier::Pattern,
        evidence: crate::detect::tool_loops::Repeated {
            tool: "weird tool\r\nX: y;=".into(),
            arguments: None,
        },
        occurrences: 4,
        level: 2,
        step: ToolStep::Directive,
    };
    assert_eq!(header_value(&v), "pattern;tool=weird_tool__X__y__;level=2");
    assert_eq!(safe_tool_name(&"a".repeat(100)).len(), 64);
    assert_eq!(safe_tool_name(""), "_");
}

#[test]
fn the_call_cache_gives_the_same_history_and_is_reused() {
    let mut cache = llm::CallCache::default();
    let first = chat(&[&[READ], &[("search", "{\"q\": 1}")]])
        .to_string()
        .into_bytes();
    let second = chat(&[&[READ], &[("search", "{\"q\": 1}")], &[READ, READ]])
        .to_string()
        .into_bytes();
    for body in [&first, &second, &second] {
        let req = llm::parse(body, "/v1/chat/completions", usize::MAX).unwrap();
        assert_eq!(req.tool_history(Some(&mut cache)), req.tool_history(None));
    }
    // Two model items, then one more (the repeated request added nothing).
    assert_eq!(cache.len(), 3);
    // Anthropic and Responses items too.
    for (body, path) in [
        (anthropic_body(3, false), "/v1/messages"),
        (responses_body(3), "/v1/responses"),
    ] {
        let bytes = body.to_string().into_bytes();
        let req = llm::parse(&bytes, path, usize::MAX).unwrap();
        let cold = req.tool_history(Some(&mut cache));
        assert_eq!(cold, req.tool_history(Some(&mut cache)));
        assert_eq!(cold, req.tool_history(None));
        assert_eq!(cold.calls.len(), 3);
    }
}
