use super::*;

fn names(text: &str) -> Vec<(String, String)> {
    read(text)
        .into_iter()
        .map(|a| (a.name, a.arguments))
        .collect()
}

fn one(name: &str, args: &str) -> Vec<(String, String)> {
    vec![(name.to_string(), args.to_string())]
}

#[test]
fn swe_agent_discussion_and_command() {
    let reply = "DISCUSSION\nLet's look at the validators first.\n\n```\nopen django/contrib/auth/validators.py\n```\n";
    assert_eq!(
        names(reply),
        one("open", "django/contrib/auth/validators.py")
    );
    let edit =
        "Now fix the regex.\n\n```\nedit 9:9\n    regex = r'\\A[\\w.@+-]+\\Z'\nend_of_edit\n```";
    assert_eq!(
        names(edit),
        one("edit", "9:9\n    regex = r'\\A[\\w.@+-]+\\Z'\nend_of_edit")
    );
}

#[test]
fn mini_swe_agent_bash_block() {
    let reply = "THOUGHT: I need to see the tests.\n\n```bash\ncd /testbed && grep -rn \"separable\" astropy | head\n```";
    assert_eq!(
        names(reply),
        one("cd", "/testbed && grep -rn \"separable\" astropy | head")
    );
}

#[test]
fn code_inside_an_answer_is_not_an_action() {
    // Text after the block: an answer showing a command.
    let answer =
        "Install it like this:\n\n```bash\npip install pyyaml\n```\n\nThat ought to do it.";
    assert!(names(answer).is_empty());
    // A block in another language ending the reply: code, not a command.
    let code = "Here is the fixed function:\n\n```python\ndef f():\n    return 1\n```";
    assert!(names(code).is_empty());
    // No code at all.
    assert!(names("I cannot help with that, sorry.").is_empty());
    assert!(!has_action("The answer is 42 (as computed above)."));
}

#[test]
fn function_tags_with_parameters() {
    let reply = "I'll view the file.\n<function=str_replace_editor>\n<parameter=command>view</parameter>\n<parameter=path>/repo/a.py</parameter>\n</function>";
    assert_eq!(
        names(reply),
        one(
            "str_replace_editor",
            "{\"command\":\"view\",\"path\":\"/repo/a.py\"}"
        )
    );
    // Parameter order does not matter.
    let swapped = "<function=str_replace_editor><parameter=path>/repo/a.py</parameter><parameter=command>view</parameter></function>";
    assert_eq!(names(reply), names(swapped));
    // Cut at the stop sequence: still read.
    let unclosed = "<function=execute_bash>\n<parameter=command>ls -la</parameter>\n";
    assert_eq!(
        names(unclosed),
        one("execute_bash", "{\"command\":\"ls -la\"}")
    );
}

#[test]
fn execute_and_solution_tags() {
    let reply =
        "Assistant:\n<thought> Check the sum. </thought>\n<execute>\nprint(add(2, 3))\n</execute>";
    assert_eq!(names(reply), one("execute", "print(add(2, 3))"));
    let sol = "<thought>Done.</thought>\n<solution>\ndef add(a, b):\n    return a + b\n</solution>";
    assert_eq!(
        names(sol),
        one("solution", "def add(a, b):\n    return a + b")
    );
    // Only indentation differs: another argument.
    let reindented = "<solution>\ndef add(a, b):\n  return a + b\n</solution>";
    assert_ne!(names(sol), names(reindented));
    let oh = "Let me list files.\n<execute_bash>\nls /workspace\n</execute_bash>";
    assert_eq!(names(oh), one("execute_bash", "ls /workspace"));
}

#[test]
fn react_action_and_input() {
    let reply = "Thought: I should look it up.\nAction: search\nAction Input: weather in Paris\n";
    assert_eq!(names(reply), one("search", "weather in Paris"));
    let json = "Thought: call the API\nAction: `get_order`\nAction Input: {\"id\": 7}\nObservation: pending";
    assert_eq!(names(json), one("get_order", "{\"id\": 7}"));
}

#[test]
fn api_calls_on_lines_of_their_own() {
    let reply = "To understand the bug I need:\n\n1. `search_class(\"CompoundModel\")`\n2. `search_method_in_file(\"_separable\", \"astropy/modeling/separable.py\")`\n\nThese show how separability is computed.";
    assert_eq!(
        names(reply),
        vec![
            ("search_class".to_string(), "\"CompoundModel\"".to_string()),
            (
                "search_method_in_file".to_string(),
                "\"_separable\", \"astropy/modeling/separable.py\"".to_string()
            ),
        ]
    );
    // Code in prose or in a fenced block, or with expressions as
    // arguments, is not a call of its own.
    let prose = "The function separability_matrix(cm) returns a matrix.\n```\nresult = compute_it(x + 1)\n```\nmy_func(a + b)";
    assert!(names(prose).is_empty());
}

#[test]
fn long_arguments_are_cut_with_a_digest_of_the_whole() {
    let a = format!("```\ncat <<EOF\n{}\nEOF\n```", "x".repeat(40_000));
    let b = format!("```\ncat <<EOF\n{}y\nEOF\n```", "x".repeat(40_000));
    let (ra, rb) = (read(&a), read(&b));
    assert_eq!(ra.len(), 1);
    assert!(ra[0].arguments.len() <= MAX_ARGUMENT_BYTES + 16);
    assert_ne!(ra, rb, "texts that differ past the cut still differ");
}

#[test]
fn at_most_max_actions() {
    let many: String = (0..40)
        .map(|i| format!("- `search_code(\"x{i}\")`\n"))
        .collect();
    assert_eq!(read(&many).len(), MAX_ACTIONS);
}
