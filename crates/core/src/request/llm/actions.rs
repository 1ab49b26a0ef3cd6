//! Actions a model writes in its reply's text instead of native tool
//! calls, read as the calls they are: many agents (SWE-agent, mini-swe-
//! agent 1.x, CodeAct and OpenHands without function calling, ReAct
//! prompts, MINT, AutoCodeRover) ask the model for its next command in a
//! format of their own and send its output back as a user message. Read as
//! calls, the tool-loop checks judge these agents' actions and results the
//! way they judge native calls, and an agent's narration around its
//! command is not mistaken for an answer.
//!
//! Recognised, in this order (the first format found in a reply wins):
//! - `<function=NAME><parameter=KEY>VALUE</parameter>...</function>` (the
//!   mock function calls of SWE-agent's XML parser and OpenHands' non-
//!   native mode): the call NAME with its parameters as a JSON object;
//! - `<execute_bash>`, `<execute_ipython>`, `<execute_browse>`,
//!   `<execute>` and `<solution>` blocks (CodeAct, OpenHands, MINT): a call
//!   named by the tag, its body the argument;
//! - ReAct: a line `Action: NAME` and `Action Input: INPUT` after it;
//! - a fenced block that ends the reply (nothing but white space after its
//!   closing fence), untagged or tagged as a shell (`bash`, `sh`, `shell`,
//!   `console`, `zsh`): a command, named by its first word, its argument the
//!   rest (SWE-agent's "DISCUSSION + command", mini-swe-agent's one
//!   ```` ```bash ```` block). Code shown inside an answer, with text after
//!   it or in another language, is not an action;
//! - calls written as lines of their own, `name("arg", ...)` with a
//!   snake_case name and literal arguments only (AutoCodeRover's search
//!   API), outside fenced blocks.
//!
//! A reply is read up to [`MAX_TEXT_BYTES`] and holds at most
//! [`MAX_ACTIONS`] actions; an argument larger than
//! [`MAX_ARGUMENT_BYTES`] is cut there (the rest still tells calls apart by
//! its digest).

/// A reply's text is read for actions up to this size (in the body, JSON
/// escaped); a longer reply is taken as an answer, which keeps what reading
/// costs bounded.
pub const MAX_TEXT_BYTES: usize = 64 << 10;
/// Actions read from one reply at most.
pub const MAX_ACTIONS: usize = 16;
/// An action's argument is kept up to this size, then ends with a digest
/// of the rest.
pub const MAX_ARGUMENT_BYTES: usize = 16 << 10;

/// One action written in a reply's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextAction {
    pub name: String,
    /// The argument as written, trimmed (a JSON object with sorted keys
    /// for `<function=...>` parameters).
    pub arguments: String,
}

/// The actions written in a model's reply, in order; empty when the reply
/// is an answer.
pub fn read(text: &str) -> Vec<TextAction> {
    let formats: [fn(&str) -> Vec<TextAction>; 5] = [
        function_tags,
        execute_tags,
        react,
        |text| closing_fence(text).into_iter().collect(),
        call_lines,
    ];
    let mut out = formats
        .iter()
        .map(|read| read(text))
        .find(|found| !found.is_empty())
        .unwrap_or_default();
    out.truncate(MAX_ACTIONS);
    out
}

/// Whether a reply's text carries an action.
#[cfg(test)]
pub fn has_action(text: &str) -> bool {
    (text.contains("<function=")
        || text.contains("<execute")
        || text.contains("<solution>")
        || text.contains("Action:")
        || text.contains("```")
        || text.contains('('))
        && !read(text).is_empty()
}

/// An argument as written, its ends trimmed and line ends made `\n`: its
/// white space is kept (an edit that only re-indents is another edit).
fn kept(s: &str) -> String {
    let t = s.trim();
    let mut out: String = t.replace("\r\n", "\n");
    if out.len() > MAX_ARGUMENT_BYTES {
        let mut cut = MAX_ARGUMENT_BYTES;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        let digest = crc32fast::hash(t.as_bytes());
        out.push_str(&format!(" …{digest:08x}"));
    }
    out
}

fn action(name: &str, arguments: &str) -> TextAction {
    TextAction {
        name: name.trim().to_string(),
        arguments: kept(arguments),
    }
}

/// The first `<open...>BODY</close>` in `s` (`open` ends with `=`): what
/// stands between `open` and `>` (a name), the body (to the end of `s`
/// when unclosed: the model stopped at the stop sequence), and what follows.
fn tagged<'a>(s: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str, &'a str)> {
    let (name, body) = s.split_once(open)?.1.split_once('>')?;
    let (body, rest) = body.split_once(close).unwrap_or((body, ""));
    Some((name, body, rest))
}

/// `<function=NAME>` blocks with `<parameter=KEY>VALUE</parameter>`s.
fn function_tags(text: &str) -> Vec<TextAction> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((name, body, next)) = tagged(rest, "<function=", "</function>") {
        rest = next;
        let name = name.trim();
        if name.is_empty() || name.len() > 128 || name.contains(char::is_whitespace) {
            continue;
        }
        let mut params = serde_json::Map::new();
        let mut p = body;
        while let Some((key, value, after)) = tagged(p, "<parameter=", "</parameter>") {
            params.insert(key.trim().to_string(), kept(value).into());
            p = after;
        }
        let args = serde_json::to_string(&serde_json::Value::Object(params)).unwrap_or_default();
        out.push(TextAction {
            name: name.to_string(),
            arguments: args,
        });
        if out.len() >= MAX_ACTIONS {
            break;
        }
    }
    out
}

const TAGS: [&str; 5] = [
    "execute_bash",
    "execute_ipython",
    "execute_browse",
    "execute",
    "solution",
];

/// `<execute_*>`, `<execute>` and `<solution>` blocks.
fn execute_tags(text: &str) -> Vec<TextAction> {
    let mut found: Vec<(usize, TextAction)> = Vec::new();
    for tag in TAGS {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        let mut from = 0;
        while let Some(at) = text.get(from..).and_then(|r| r.find(&open)) {
            let start = from + at + open.len();
            let body = text.get(start..).unwrap_or("");
            let end = body.find(&close).unwrap_or(body.len());
            found.push((from + at, action(tag, body.get(..end).unwrap_or(""))));
            from = start + end;
            if found.len() >= MAX_ACTIONS {
                break;
            }
        }
    }
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, a)| a).collect()
}

/// ReAct: `Action: NAME` then `Action Input: INPUT` (to the next
/// `Observation:` or the end).
fn react(text: &str) -> Vec<TextAction> {
    let mut name = None;
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let l = line.trim_start();
        if let Some(n) = l.strip_prefix("Action:") {
            name = Some(n.trim().trim_matches('`').to_string());
        } else if let Some(first) = l.strip_prefix("Action Input:") {
            let Some(n) = name.take().filter(|n| !n.is_empty() && n.len() <= 128) else {
                continue;
            };
            let mut input = first.to_string();
            while let Some(next) = lines.peek() {
                let t = next.trim_start();
                if t.starts_with("Observation:")
                    || t.starts_with("Thought:")
                    || t.starts_with("Action:")
                {
                    break;
                }
                input.push('\n');
                input.push_str(next);
                lines.next();
            }
            out.push(action(&n, &input));
            if out.len() >= MAX_ACTIONS {
                break;
            }
        }
    }
    out
}

const SHELLS: [&str; 7] = ["", "bash", "sh", "shell", "console", "zsh", "sh-session"];

/// A fenced block that ends the reply, untagged or a shell.
fn closing_fence(text: &str) -> Option<TextAction> {
    let body = text.trim_end().strip_suffix("```")?;
    // The opening fence: the last ``` before the closing one, at a line's
    // start.
    let after_open = body.get(body.rfind("```")? + 3..).unwrap_or("");
    let (lang, code) = after_open
        .split_once('\n')
        .map_or(("", after_open), |(lang, code)| (lang.trim(), code));
    let code = code.trim();
    if !SHELLS.contains(&lang.to_ascii_lowercase().as_str()) || code.is_empty() {
        return None;
    }
    // The rest is trimmed as an argument: the whitespace split at goes too.
    let (name, rest) = code.split_once(char::is_whitespace).unwrap_or((code, ""));
    Some(action(name, rest))
}

/// Lines that are calls of their own: `name("literal", ...)` with a
/// snake_case name (an underscore in it), optionally in backticks or after
/// a list marker, outside fenced blocks.
fn call_lines(text: &str) -> Vec<TextAction> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let l = l
            .trim_start_matches(['-', '*', '+'])
            .trim_start()
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start_matches(['.', ')'])
            .trim();
        let l = l.trim_matches('`');
        let l = l.strip_suffix(':').unwrap_or(l).trim_end_matches('`');
        let call = l.split_once('(');
        let Some((name, args)) = call.and_then(|(n, a)| Some((n, a.strip_suffix(')')?))) else {
            continue;
        };
        let snake = (3..=64).contains(&name.len())
            && name.contains('_')
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if snake && literal_args(args) {
            out.push(action(name, args));
            if out.len() >= MAX_ACTIONS {
                break;
            }
        }
    }
    out
}

/// Arguments made of string literals, numbers and names only.
fn literal_args(args: &str) -> bool {
    let mut in_str: Option<char> = None;
    let mut escaped = false;
    let mut any = false;
    for c in args.chars() {
        if let Some(q) = in_str {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                in_str = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => {
                in_str = Some(c);
                any = true;
            }
            ',' | ' ' | '=' | '.' | '_' | '-' => {}
            c if c.is_ascii_alphanumeric() => any = true,
            _ => return false,
        }
    }
    in_str.is_none() && any
}

#[cfg(test)]
mod tests;
