//! Actions written in a reply's text read as tool calls: the tool history
//! ([`Request::tool_history`]), the normalised tail that near mode compares
//! ([`Request::tail`], [`Request::tail_of_steps`]) and the turns a request's
//! own history holds ([`Request::turn_starts`], [`Request::tail_before`]).

use super::*;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn bytes(body: &Value) -> Vec<u8> {
    body.to_string().into_bytes()
}

/// Every item kept.
fn parse_all<'a>(body: &'a [u8], path: &str) -> Request<'a> {
    super::parse(body, path, usize::MAX).expect("recognised")
}

fn text(s: &str) -> Part {
    Part::Text(s.to_string())
}

fn call(name: &str, arguments: &str) -> Part {
    Part::ToolCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn observed(s: &str) -> Part {
    Part::ToolResult {
        content: vec![text(s)],
        is_error: false,
    }
}

/// (name, arguments, turn, the result's text) of every call.
fn calls_of(req: &Request<'_>) -> Vec<(String, String, usize, Option<String>)> {
    req.tool_history(None)
        .calls
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                c.arguments.to_string(),
                c.turn,
                c.result.and_then(|at| req.result_text(at)),
            )
        })
        .collect()
}

fn row(
    name: &str,
    arguments: &str,
    turn: usize,
    result: Option<&str>,
) -> (String, String, usize, Option<String>) {
    (
        name.to_string(),
        arguments.to_string(),
        turn,
        result.map(str::to_string),
    )
}

const ISSUE: &str = "We're currently solving the following issue within our repository: UsernameValidator allows a trailing newline in usernames.";
const FIND: &str =
    "DISCUSSION\nFirst I'll find the validators module.\n\n```\nfind_file \"validators.py\"\n```\n";
const FOUND: &str = "Found 1 matches for \"validators.py\" in /django:\n/django/django/contrib/auth/validators.py\n(Open file: n/a)\n(Current directory: /django)\nbash-$";
const OPEN: &str = "DISCUSSION\nLet's open it and look at the regex.\n\n```\nopen django/contrib/auth/validators.py\n```";
const OPENED: &str = "[File: /django/django/contrib/auth/validators.py (25 lines total)]\n1:import re\n9:    regex = r'^[\\w.@+-]+$'\n(Open file: /django/django/contrib/auth/validators.py)\nbash-$";
/// Code shown inside an answer, with prose after it: no action.
const ANSWER: &str = "The fix is to anchor the pattern with \\A and \\Z:\n\n```python\nregex = r'\\A[\\w.@+-]+\\Z'\n```\n\nThat rejects a trailing newline.";

/// A SWE-agent run over OpenAI Chat: DISCUSSION then a fenced command,
/// each observation a user message.
fn swe_agent(replies: &[(&str, &str)]) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are an autonomous programmer working in a command line."}),
        json!({"role": "user", "content": ISSUE}),
    ];
    for (reply, observation) in replies {
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": observation}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

#[test]
fn chat_text_actions_are_calls_answered_by_the_next_user_message() {
    let body = bytes(&swe_agent(&[(FIND, FOUND), (OPEN, OPENED)]));
    let req = parse_all(&body, CHAT);
    assert_eq!(
        calls_of(&req),
        vec![
            row(
                "find_file",
                "\"validators.py\"",
                0,
                Some(&normalize_text(FOUND))
            ),
            row(
                "open",
                "django/contrib/auth/validators.py",
                1,
                Some(&normalize_text(OPENED))
            ),
        ]
    );
    let h = req.tool_history(None);
    assert_eq!(h.newest_turn, Some(1));
    assert_eq!(
        h.turns.iter().map(|t| t.calls).collect::<Vec<_>>(),
        vec![1, 1]
    );
    // The first turn answered the task; the second answered no user: what
    // came before it was the first command's output, a tool's words.
    let prompts: Vec<Option<String>> = h
        .turns
        .iter()
        .map(|t| t.prompt.and_then(|at| req.result_text(at)))
        .collect();
    assert_eq!(prompts, vec![Some(normalize_text(ISSUE)), None]);
    // The newest observation not sent yet: the call waits for it.
    let mut pending = swe_agent(&[(FIND, FOUND)]);
    pending["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": OPEN}));
    let body = bytes(&pending);
    let req = parse_all(&body, CHAT);
    assert_eq!(
        calls_of(&req)[1],
        row("open", "django/contrib/auth/validators.py", 1, None)
    );
}

#[test]
fn an_answer_showing_code_has_no_calls_and_its_user_message_is_no_result() {
    let body = bytes(&swe_agent(&[
        (FIND, FOUND),
        (ANSWER, "Thanks, but please also add a test."),
    ]));
    let req = parse_all(&body, CHAT);
    let h = req.tool_history(None);
    assert_eq!(h.calls.len(), 1);
    assert_eq!(
        h.turns.iter().map(|t| t.calls).collect::<Vec<_>>(),
        vec![1, 0]
    );
    // Its text is the answer the answer tier reads.
    let answer = h.turns[1].answer.and_then(|at| req.result_text(at));
    assert_eq!(answer, Some(normalize_text(ANSWER)));
    // In the tail the answer keeps its text and the user message after it
    // stays the user's own words.
    let tail = req.tail(2).unwrap();
    assert_eq!(tail[0].parts, vec![text(&normalize_text(ANSWER))]);
    assert_eq!(
        tail[1],
        Message {
            role: "user".into(),
            parts: vec![text("thanks, but please also add a test.")]
        }
    );
    assert!(!tail[1].is_results());
}

/// Realistic replies in each recognised format and the calls they hold.
#[test]
fn each_text_format_becomes_calls_of_its_turn() {
    let cases: [(&str, Vec<(&str, &str)>); 6] = [
        (
            "I'll view the file first.\n<function=str_replace_editor>\n<parameter=command>view</parameter>\n<parameter=path>/testbed/astropy/modeling/separable.py</parameter>\n</function>",
            vec![(
                "str_replace_editor",
                "{\"command\":\"view\",\"path\":\"/testbed/astropy/modeling/separable.py\"}",
            )],
        ),
        (
            "Let me run the tests.\n<execute_bash>\ncd /workspace && python -m pytest -q tests/test_sum.py\n</execute_bash>",
            vec![(
                "execute_bash",
                "cd /workspace && python -m pytest -q tests/test_sum.py",
            )],
        ),
        (
            "<thought>The helper is defined; call it.</thought>\n<execute>\nprint(total([1, 2, 3]))\n</execute>",
            vec![("execute", "print(total([1, 2, 3]))")],
        ),
        (
            "Thought: I need the order's status.\nAction: get_order_status\nAction Input: {\"order_id\": \"W2378156\"}",
            vec![("get_order_status", "{\"order_id\": \"W2378156\"}")],
        ),
        (
            "THOUGHT: Check where separability is computed.\n\n```bash\ngrep -rn \"_separable\" astropy/modeling | head -20\n```",
            vec![("grep", "-rn \"_separable\" astropy/modeling | head -20")],
        ),
        (
            "To locate the bug I need more context:\n\n1. `search_class(\"CompoundModel\")`\n2. `search_method_in_file(\"_cstack\", \"astropy/modeling/separable.py\")`",
            vec![
                ("search_class", "\"CompoundModel\""),
                (
                    "search_method_in_file",
                    "\"_cstack\", \"astropy/modeling/separable.py\"",
                ),
            ],
        ),
    ];
    let output = "Result of the action: 3 lines of output, nothing unexpected.";
    for (reply, want) in cases {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": "Fix the separability bug."},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": output}]});
        let body = bytes(&body);
        let req = parse_all(&body, CHAT);
        let got = calls_of(&req);
        let expected: Vec<_> = want
            .iter()
            .map(|(n, a)| row(n, a, 0, Some(&normalize_text(output))))
            .collect();
        assert_eq!(got, expected, "{reply}");
        assert_eq!(req.tool_history(None).turns[0].calls, want.len(), "{reply}");
        // The tail: the calls alone, then the observation as their result.
        let tail = req.tail(2).unwrap();
        let parts: Vec<Part> = want.iter().map(|(n, a)| call(n, a)).collect();
        assert_eq!(tail[0].parts, parts, "{reply}");
        assert_eq!(tail[1].parts, vec![observed(&normalize_text(output))]);
    }
}

/// A ReAct agent over Anthropic Messages: its reply in text blocks, the
/// observation a user message of text blocks.
fn anthropic_react(action_input: &str, observation: Value) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
        "system": "Answer the question using the tools. Use Thought/Action/Action Input.",
        "messages": [
            {"role": "user", "content": "What's the weather in Paris tomorrow?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Thought: I should look up the forecast."},
                {"type": "text", "text": format!("Action: weather_forecast\nAction Input: {action_input}")}]},
            {"role": "user", "content": observation}]})
}

#[test]
fn anthropic_text_blocks_carry_actions_too() {
    let obs = json!([{"type": "text", "text": "Observation: Paris, tomorrow: 18°C, light rain in the afternoon."}]);
    let body = bytes(&anthropic_react("Paris, tomorrow", obs.clone()));
    let req = parse_all(&body, MESSAGES);
    assert_eq!(req.format, Format::Anthropic);
    assert_eq!(
        calls_of(&req),
        vec![row(
            "weather_forecast",
            "Paris, tomorrow",
            0,
            Some("observation: paris, tomorrow: 18°c, light rain in the afternoon.")
        )]
    );
    assert_eq!(req.tool_history(None).turns[0].calls, 1);
    // Tail: the out-of-band system prompt, the task, the call alone (the
    // thought block dropped), the observation as its result.
    let tail = req.tail(4).unwrap();
    assert_eq!(tail[0].role, "system");
    assert_eq!(
        tail[1].parts,
        vec![text("what's the weather in paris tomorrow?")]
    );
    assert_eq!(
        tail[2],
        Message {
            role: "assistant".into(),
            parts: vec![call("weather_forecast", "Paris, tomorrow")]
        }
    );
    assert_eq!(tail[3].role, "user");
    assert!(tail[3].is_results());
    assert_eq!(
        tail[3].parts,
        vec![observed(
            "observation: paris, tomorrow: 18°c, light rain in the afternoon."
        )]
    );
    // An observation sent as a plain string reads the same.
    let plain = bytes(&anthropic_react(
        "Paris, tomorrow",
        json!("Observation: Paris, tomorrow: 18°C, light rain in the afternoon."),
    ));
    assert_eq!(parse_all(&plain, MESSAGES).tail(4).unwrap(), tail);
    // Another argument is another call.
    let other = bytes(&anthropic_react("Lyon, tomorrow", obs));
    assert_ne!(parse_all(&other, MESSAGES).tail(4).unwrap(), tail);
}

#[test]
fn native_calls_win_over_text_that_looks_like_an_action() {
    // A reply with a native call whose narration shows a command: the
    // native call only, its text kept.
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "Running:\n```bash\nls -la\n```", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_shell", "arguments": "{\"cmd\":\"ls -la\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "total 0"}]});
    let body = bytes(&body);
    let req = parse_all(&body, CHAT);
    assert_eq!(
        calls_of(&req),
        vec![row("run_shell", "{\"cmd\":\"ls -la\"}", 0, Some("total 0"))]
    );
    let tail = req.tail(2).unwrap();
    assert_eq!(
        tail[0].parts,
        vec![
            text("running: ```bash ls -la ```"),
            call("run_shell", "{\"cmd\":\"ls -la\"}")
        ]
    );
    // Anthropic: a tool_use block beside a text block with a fence.
    let body = json!({"model": "m", "max_tokens": 9, "messages": [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": [
            {"type": "text", "text": "```\nls\n```"},
            {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls -la"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "total 0"}]}]});
    let body = bytes(&body);
    let req = parse_all(&body, MESSAGES);
    assert_eq!(
        calls_of(&req),
        vec![row("bash", "{\"command\":\"ls -la\"}", 0, Some("total 0"))]
    );
}

#[test]
fn the_call_cache_reads_text_actions_the_same() {
    let body = bytes(&swe_agent(&[(FIND, FOUND), (OPEN, OPENED), (FIND, FOUND)]));
    let req = parse_all(&body, CHAT);
    let fresh = req.tool_history(None);
    let mut cache = CallCache::default();
    assert_eq!(req.tool_history(Some(&mut cache)), fresh);
    // Two distinct replies cached; read again from the cache, the same.
    assert_eq!(cache.len(), 2);
    assert_eq!(req.tool_history(Some(&mut cache)), fresh);
    assert_eq!(fresh.calls[0].name, fresh.calls[2].name);
    assert_eq!(fresh.calls[2].turn, 2);
}

#[test]
fn the_tail_of_steps_holds_the_text_actions_it_ends_with() {
    let body = bytes(&swe_agent(&[(FIND, FOUND), (OPEN, OPENED)]));
    let req = parse_all(&body, CHAT);
    // [observation, open, observation], reaching back to the command the
    // first observation answers: the narration is not compared.
    let tail = req.tail_of_steps(3).unwrap();
    assert_eq!(
        tail,
        vec![
            Message {
                role: "assistant".into(),
                parts: vec![call("find_file", "\"validators.py\"")]
            },
            Message {
                role: "user".into(),
                parts: vec![observed(&normalize_text(FOUND))]
            },
            Message {
                role: "assistant".into(),
                parts: vec![call("open", "django/contrib/auth/validators.py")]
            },
            Message {
                role: "user".into(),
                parts: vec![observed(&normalize_text(OPENED))]
            },
        ]
    );
    // The plain tail holds no more than asked.
    assert_eq!(req.tail(3).unwrap(), tail[1..].to_vec());
    // Starting on a result, the tail reaches back to the call it answers.
    let steps = req.tail_of_steps(1).unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        steps[0].parts,
        vec![call("open", "django/contrib/auth/validators.py")]
    );
    // Another narration around the same command: the same tail.
    let reworded = OPEN.replace(
        "Let's open it and look at the regex.",
        "Now I will open the file to inspect how the username regex is written.",
    );
    let other = bytes(&swe_agent(&[(FIND, FOUND), (&reworded, OPENED)]));
    assert_eq!(parse_all(&other, CHAT).tail_of_steps(3).unwrap(), tail);
}

#[test]
fn turn_starts_are_the_newest_model_turns_first() {
    let body = bytes(&swe_agent(&[(FIND, FOUND), (OPEN, OPENED), (FIND, FOUND)]));
    let req = parse_all(&body, CHAT);
    // system 0, task 1, then a reply and its observation each turn.
    assert_eq!(req.turn_starts(10), vec![6, 4, 2]);
    assert_eq!(req.turn_starts(2), vec![6, 4]);
    assert!(req.turn_starts(0).is_empty());
    // Chat: two assistant messages in a row are two turns, as the tool
    // history counts them.
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "One moment."},
        {"role": "assistant", "content": "```\nls\n```"},
        {"role": "user", "content": "a.py"}]});
    let body = bytes(&body);
    let req = parse_all(&body, CHAT);
    assert_eq!(req.turn_starts(5), vec![2, 1]);
    assert_eq!(req.tool_history(None).turns.len(), 2);
    // Responses: a run of model items (reasoning, calls) is one turn.
    let body = json!({"model": "gpt-4.1", "input": [
        {"role": "user", "content": "Find the Q3 report"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "a", "name": "search", "arguments": "{\"q\":\"q3\"}"},
        {"type": "function_call_output", "call_id": "a", "output": "none"},
        {"type": "reasoning", "id": "rs_2", "summary": []},
        {"type": "function_call", "call_id": "b", "name": "search", "arguments": "{\"q\":\"q3 report\"}"},
        {"type": "function_call", "call_id": "c", "name": "list", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": "none"},
        {"type": "function_call_output", "call_id": "c", "output": "none"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Nothing found."}]}]});
    let body = bytes(&body);
    let req = parse(&body, "/v1/responses", usize::MAX).unwrap();
    assert_eq!(req.turn_starts(9), vec![9, 4, 1]);
    assert_eq!(req.tool_history(None).turns.len(), 3);
    // Only kept items are read: the last 4 (items 4 to 7) hold two turn
    // starts, the last 3 one.
    let body = bytes(&swe_agent(&[(FIND, FOUND), (OPEN, OPENED), (FIND, FOUND)]));
    let req = parse(&body, CHAT, 4).unwrap();
    assert_eq!(req.turn_starts(10), vec![6, 4]);
    let req = parse(&body, CHAT, 3).unwrap();
    assert_eq!(req.turn_starts(10), vec![6]);
    // A Responses string input has no items.
    let body = bytes(&json!({"model": "m", "input": "hello"}));
    assert!(parse(&body, "/v1/responses", usize::MAX)
        .unwrap()
        .turn_starts(3)
        .is_empty());
}

#[test]
fn the_conversation_before_a_turn_is_what_was_sent_then() {
    let replies = [(FIND, FOUND), (OPEN, OPENED), (FIND, FOUND)];
    let body = bytes(&swe_agent(&replies));
    let req = parse_all(&body, CHAT);
    // Before each turn began, the request sent then: its own tail.
    for (k, end) in req.turn_starts(3).into_iter().enumerate() {
        let then = bytes(&swe_agent(&replies[..2 - k]));
        let earlier = parse_all(&then, CHAT);
        assert_eq!(earlier.len(), end);
        for n in [1, 2, 3, 5] {
            assert_eq!(req.tail_before(n, end), earlier.tail(n), "{n} before {end}");
            assert_eq!(
                req.tail_of_steps_before(n, end),
                earlier.tail_of_steps(n),
                "{n} steps before {end}"
            );
        }
    }
    // Past the end: the whole conversation.
    assert_eq!(req.tail_before(3, usize::MAX), req.tail(3));
    assert_eq!(req.tail_before(3, 999), req.tail(3));
    // Before item 1: the system message alone, however many are asked for.
    let first = req.tail_before(4, 1).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].role, "system");
    // Anthropic: the out-of-band system prompt counts once the tail reaches
    // the first item.
    let obs = json!("Observation: 18°C.");
    let body = bytes(&anthropic_react("Paris", obs));
    let req = parse_all(&body, MESSAGES);
    assert_eq!(req.turn_starts(3), vec![1]);
    let before = req.tail_before(3, 1).unwrap();
    assert_eq!(
        before.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(),
        vec!["system", "user"]
    );
    assert_eq!(req.tail_before(1, 1).unwrap().len(), 1);
}

/// A mini-swe-agent turn whose reply and observation are content arrays.
const MINI_REPLY: &str = "THOUGHT: I need to see the package layout first.\n\n```bash\nls /testbed/astropy/modeling\n```";
const MINI_OUTPUT: &str =
    "<returncode>0</returncode>\n<output>\nseparable.py core.py models.py\n</output>";

#[test]
fn chat_content_arrays_carry_actions_too() {
    let chat = json!({"model": "m", "messages": [
        {"role": "user", "content": "Fix the separability bug."},
        {"role": "assistant", "content": [{"type": "text", "text": MINI_REPLY}]},
        {"role": "user", "content": [{"type": "text", "text": MINI_OUTPUT}]}]});
    let chat = bytes(&chat);
    let req = parse_all(&chat, CHAT);
    assert_eq!(
        calls_of(&req),
        vec![row(
            "ls",
            "/testbed/astropy/modeling",
            0,
            Some(&normalize_text(MINI_OUTPUT))
        )]
    );
    let tail = req.tail(2).unwrap();
    assert_eq!(tail[0].parts, vec![call("ls", "/testbed/astropy/modeling")]);
    assert_eq!(tail[1].parts, vec![observed(&normalize_text(MINI_OUTPUT))]);
}

/// A regression test (this was a bug): a Responses API reply's text is in
/// `output_text` blocks, which `text_actions::text_blocks` (and so
/// `Request::text_actions_of` and the tool history's `text_actions`) once
/// did not read, so the same mini-swe-agent turn read as calls over Chat
/// was read as a text answer over Responses.
#[test]
fn responses_output_text_carries_actions_too() {
    let body = json!({"model": "gpt-4.1", "input": [
        {"role": "user", "content": "Fix the separability bug."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": MINI_REPLY}]},
        {"role": "user", "content": [{"type": "input_text", "text": MINI_OUTPUT}]}]});
    let body = bytes(&body);
    let req = parse(&body, "/v1/responses", usize::MAX).unwrap();
    assert_eq!(
        calls_of(&req),
        vec![row(
            "ls",
            "/testbed/astropy/modeling",
            0,
            Some(&normalize_text(MINI_OUTPUT))
        )]
    );
    let tail = req.tail(2).unwrap();
    assert_eq!(tail[0].parts, vec![call("ls", "/testbed/astropy/modeling")]);
    assert_eq!(tail[1].parts, vec![observed(&normalize_text(MINI_OUTPUT))]);
}

/// A regression test (this was a bug): the tool history once took
/// whatever item followed a text-action reply as its observation (any
/// non-model item with a `content`), while the tail
/// (`Request::read_text_actions`) takes the next *user* message. A harness
/// reminder sent as a system message between the reply and the output
/// became the command's result in the tool history, and the two readings
/// disagreed.
#[test]
fn only_a_user_message_observes_a_text_action() {
    let chat = json!({"model": "m", "messages": [
        {"role": "user", "content": "Fix the separability bug."},
        {"role": "assistant", "content": MINI_REPLY},
        {"role": "system", "content": "Reminder: you have 3 steps left."},
        {"role": "user", "content": MINI_OUTPUT}]});
    let chat = bytes(&chat);
    let req = parse_all(&chat, CHAT);
    let tail = req.tail(3).unwrap();
    assert_eq!(tail[2].parts, vec![observed(&normalize_text(MINI_OUTPUT))]);
    assert_eq!(
        calls_of(&req),
        vec![row(
            "ls",
            "/testbed/astropy/modeling",
            0,
            Some(&normalize_text(MINI_OUTPUT))
        )]
    );
}
