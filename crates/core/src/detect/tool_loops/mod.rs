//! Tool-call loops read from the conversation: identical thrash (the same
//! tool with the same arguments again and again), pattern thrash (the same
//! tool with variations) and cycles (the same two or three calls in turn),
//! judged from the request alone, so the first request that carries the
//! evidence is enough and every replica agrees.
//!
//! A repetition counts only while the tool keeps answering the same:
//! results are compared, so an agent that reruns its tests after an edit
//! (and sees fewer failures), pages through results or fetches one order
//! after another is making progress, not looping. Identical calls and
//! cycles compare results with the policy's volatile classes masked (a
//! latency or a timestamp is noise; a count, a percentage or a size that
//! changed is progress); pattern thrash, whose arguments differ, masks
//! only what changes at random on every call whatever is asked
//! (timestamps, random ids), never a number, so a result that changes with
//! its arguments (another amount, another date, another latency for
//! another window) is progress.

use crate::config::{Classes, ToolLoops, ToolStep};
use crate::detect::progress;
use crate::request::llm::volatile::{self, Class, Context};
use crate::request::llm::{Request, ResultAt, ToolCall, ToolHistory};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Identical,
    Cycle,
    Pattern,
    /// The model's text answers repeat (rephrased), turn after turn.
    Answer,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Identical => "identical",
            Tier::Cycle => "cycle",
            Tier::Pattern => "pattern",
            Tier::Answer => "answer",
        }
    }
}

/// A detected tool loop and the ladder step it has reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolVerdict {
    pub tier: Tier,
    /// The tool (a cycle: its tools in order, joined by `+`).
    pub tool: String,
    /// The repeated arguments (identical thrash).
    pub arguments: Option<String>,
    /// Calls of the tool (identical: with these arguments; a cycle: its
    /// repetitions) among the examined ones.
    pub occurrences: u32,
    /// 1-based position on the ladder.
    pub level: u32,
    pub step: ToolStep,
}

/// Where the judge reads tool results and answers: the request itself, or
/// a stand-in in tests.
pub trait Results {
    /// The text at `at`, normalised; `None` when it cannot be read (the
    /// request's parsing budget ran out).
    fn result_text(&self, at: ResultAt) -> Option<String>;

    /// The bytes in the body of the text at `at` (a cache's key); `None`
    /// when there are none to key on.
    fn result_bytes(&self, _at: ResultAt) -> Option<&[u8]> {
        None
    }

    /// Take from the parsing budget what reading the text at `at` takes
    /// (when it is found in a cache instead); false when it does not fit.
    fn afford_result(&self, _at: ResultAt) -> bool {
        true
    }
}

impl Results for Request<'_> {
    fn result_text(&self, at: ResultAt) -> Option<String> {
        Request::result_text(self, at)
    }

    fn result_bytes(&self, at: ResultAt) -> Option<&[u8]> {
        Request::result_bytes(self, at)
    }

    fn afford_result(&self, at: ResultAt) -> bool {
        Request::afford_result(self, at)
    }
}

/// The classes pattern thrash masks in results: of the policy's, the
/// random ones that change on every call whatever is asked (no numbers: a
/// conversion of another amount answers another number, and a query of
/// another window another latency).
fn noise(classes: Classes) -> Classes {
    [
        Class::Uuid,
        Class::DateTime,
        Class::Epoch,
        Class::Hex,
        Class::PrefixedId,
    ]
    .into_iter()
    .filter(|c| classes.contains(*c))
    .collect()
}

/// An answer with fewer words (markup aside) tells little on its own.
const INFORMATIVE_WORDS: usize = 16;

/// Words with a letter or digit in them, markup (`<output>`, `</x>`) and
/// punctuation aside.
fn word_count(text: &str) -> usize {
    text.split(|c: char| c.is_whitespace() || c == '<' || c == '>')
        .filter(|w| !w.is_empty() && !w.starts_with('/') && w.chars().any(char::is_alphanumeric))
        .filter(|w| !w.contains('=') || w.len() > 24)
        .count()
        .saturating_sub(markup_words(text))
}

/// Words that are only tag names (`<output>` read as `output`).
fn markup_words(text: &str) -> usize {
    let mut n = 0;
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        let after = rest.get(at + 1..).unwrap_or("");
        match after.find('>') {
            Some(end)
                if end <= 32 && !after.get(..end).unwrap_or("").contains(char::is_whitespace) =>
            {
                if !after.starts_with('/') {
                    n += 1;
                }
                rest = after.get(end + 1..).unwrap_or("");
            }
            _ => rest = after,
        }
    }
    n
}

/// Whether two calls' arguments barely differ: the same numbers in the
/// same order, and at least half of their words shared (case and
/// punctuation aside): `usb c charger` and `USB-C chargers`, not another
/// date, amount or command.
fn trivially_varied(a: &str, b: &str) -> bool {
    let numbers = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    if numbers(a) != numbers(b) {
        return false;
    }
    let words = |s: &str| -> std::collections::BTreeSet<String> {
        s.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty() && !w.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_lowercase)
            .collect()
    };
    let (wa, wb) = (words(a), words(b));
    let shared = wa.intersection(&wb).count();
    let all = wa.union(&wb).count();
    all == 0 || 2 * shared >= all
}

/// What a call was answered, as compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answered {
    /// The request does not hold its result: no evidence of progress.
    Missing,
    /// The result could not be read: never counted as a repeat.
    Unreadable,
    /// A digest of the masked result.
    Digest(u64),
}

/// The examined calls, their arguments as compared (masked once, when the
/// policy opts in) and their results, each read and digested once.
struct Calls<'h, 'r, R: Results> {
    calls: Vec<&'h ToolCall>,
    args: Vec<Cow<'h, str>>,
    results: &'r R,
    /// The policy's masking classes.
    classes: Classes,
    cache: RefCell<HashMap<(usize, bool), Answered>>,
    /// Words in each call's answer, counted once.
    words: RefCell<HashMap<usize, usize>>,
}

impl<R: Results> Calls<'_, '_, R> {
    fn get(&self, i: usize) -> Option<&ToolCall> {
        self.calls.get(i).copied()
    }

    fn arg(&self, i: usize) -> &str {
        self.args.get(i).map_or("", |a| a.as_ref())
    }

    /// Call `i`'s result (`full`: every class masked; else the noise
    /// classes, leaving alone the tokens its own arguments name).
    fn answered(&self, i: usize, full: bool) -> Answered {
        let Some(at) = self.get(i).and_then(|c| c.result) else {
            return Answered::Missing;
        };
        if let Some(a) = self.cache.borrow().get(&(i, full)) {
            return *a;
        }
        let a = match self.results.result_text(at) {
            None => Answered::Unreadable,
            Some(text) if full => Answered::Digest(volatile::masked_digest(
                &text,
                self.classes,
                Context::ToolResult,
                &|_| false,
            )),
            Some(text) => {
                let classes = noise(self.classes);
                // The resource the call asked for, echoed in its result,
                // is what tells two answers apart: the tokens of its
                // arguments as written (even when the policy masks
                // arguments), read as a result is (epochs included: a
                // `"since": 1732370401` echoed back names the window).
                let raw = self.get(i).map_or("", |c| &*c.arguments);
                let named = volatile::tokens(raw, classes, Context::ToolResult);
                Answered::Digest(volatile::masked_digest(
                    &text,
                    classes,
                    Context::ToolResult,
                    &|t| named.iter().any(|n| n.eq_ignore_ascii_case(t)),
                ))
            }
        };
        self.cache.borrow_mut().insert((i, full), a);
        a
    }

    /// Whether calls `i` and `j` got the same answer.
    fn same(&self, i: usize, j: usize, full: bool) -> bool {
        match (self.answered(i, full), self.answered(j, full)) {
            (Answered::Unreadable, _) | (_, Answered::Unreadable) => false,
            (Answered::Missing, _) | (_, Answered::Missing) => true,
            (Answered::Digest(x), Answered::Digest(y)) => x == y,
        }
    }

    /// Whether call `i` is a repeat of an earlier call (the same tool and
    /// arguments, answered the same): nothing new was tried.
    fn repeats_earlier(&self, i: usize) -> bool {
        (0..i).any(|j| self.same_call(j, i) && self.same(j, i, true))
    }

    /// Whether call `i`'s answer tells something: at least
    /// [`INFORMATIVE_WORDS`] words once markup is set aside (not an empty
    /// output, an "ok", a "no results").
    fn informative(&self, i: usize) -> bool {
        let Some(at) = self.get(i).and_then(|c| c.result) else {
            return false;
        };
        if let Some(n) = self.words.borrow().get(&i) {
            return *n >= INFORMATIVE_WORDS;
        }
        let n = self.results.result_text(at).map_or(0, |t| word_count(&t));
        self.words.borrow_mut().insert(i, n);
        n >= INFORMATIVE_WORDS
    }

    /// The same tool, the same arguments.
    fn same_call(&self, i: usize, j: usize) -> bool {
        match (self.get(i), self.get(j)) {
            (Some(a), Some(b)) => a.name == b.name && self.arg(i) == self.arg(j),
            _ => false,
        }
    }
}

/// Judge the conversation's tool calls. Exempt tools are dropped first.
/// The last `last_calls` calls are examined for identical and pattern
/// thrash, the end of the history for cycles. Identical thrash and cycles
/// win over pattern thrash; between the two the higher ladder level wins
/// (identical on a tie), so an alternating loop keeps climbing. The newest
/// assistant turn must be part of the repetition: an agent that has moved
/// on is left alone.
pub fn judge(
    cfg: &ToolLoops,
    history: &ToolHistory,
    results: &impl Results,
    texts: Option<&progress::TextCache>,
) -> Option<ToolVerdict> {
    let newest = history.newest_turn?;
    let calls: Vec<&ToolCall> = history
        .calls
        .iter()
        .filter(|c| !cfg.exempt_tools.iter().any(|t| **t == *c.name))
        .collect();
    let args = calls
        .iter()
        .map(|c| volatile::mask(&c.arguments, cfg.arguments_mask, Context::Arguments))
        .collect();
    let calls = Calls {
        calls,
        args,
        results,
        classes: cfg.result_classes,
        cache: RefCell::new(HashMap::new()),
        words: RefCell::new(HashMap::new()),
    };
    let n = calls.calls.len();
    let recent: Vec<usize> = (n.saturating_sub(cfg.last_calls)..n).collect();
    let repeated = [
        identical(cfg, &calls, &recent, newest, &|turn| {
            news_before(history, results, texts, turn)
        }),
        cycle(cfg, &calls, newest),
        answer(cfg, history, results, texts),
    ];
    repeated
        .into_iter()
        .flatten()
        .reduce(|best, v| if v.level > best.level { v } else { best })
        .or_else(|| pattern(cfg, &calls, &recent, newest))
}

/// Whether the model's newest turn calls tools and every one of them is
/// exempt (a polling step).
pub fn only_exempt_calls(cfg: &ToolLoops, history: &ToolHistory) -> bool {
    let Some(newest) = history.newest_turn else {
        return false;
    };
    let mut newest_calls = history.calls.iter().filter(|c| c.turn == newest).peekable();
    newest_calls.peek().is_some()
        && newest_calls.all(|c| cfg.exempt_tools.iter().any(|t| **t == *c.name))
}

/// The calls among `recent` made in turn `turn`.
fn of_turn<'a, R: Results>(
    calls: &'a Calls<'_, '_, R>,
    recent: &'a [usize],
    turn: usize,
) -> impl Iterator<Item = usize> + 'a {
    recent
        .iter()
        .copied()
        .filter(move |&i| calls.get(i).is_some_and(|c| c.turn == turn))
}

/// The most repeated (tool, arguments) of the newest turn, counting the
/// calls answered as the newest one was, back from the newest as long as
/// nothing new was tried in between: an agent that reruns its test after
/// each of several different fixes, and sees the same failure, is trying
/// things, not looping; one that reruns it after nothing but repeats is.
fn identical<R: Results>(
    cfg: &ToolLoops,
    calls: &Calls<'_, '_, R>,
    recent: &[usize],
    newest: usize,
    news: &dyn Fn(usize) -> bool,
) -> Option<ToolVerdict> {
    let mut best: Option<(u32, usize)> = None;
    for c in of_turn(calls, recent, newest) {
        let same: Vec<usize> = recent
            .iter()
            .copied()
            .filter(|&o| o < c && calls.same_call(o, c) && calls.same(o, c, true))
            .collect();
        let mut n = 1u32;
        let mut later = c;
        for &o in same.iter().rev() {
            if !(o + 1..later).all(|i| calls.repeats_earlier(i)) {
                break;
            }
            // A user told the agent something new in between (a support
            // agent checking a line again after the user changed a
            // setting): a new question, not the same one again.
            let (from, to) = (
                calls.get(o).map_or(0, |x| x.turn),
                calls.get(later).map_or(0, |x| x.turn),
            );
            if (from + 1..=to).any(news) {
                break;
            }
            n += 1;
            later = o;
        }
        if n >= cfg.identical_min && best.is_none_or(|(m, _)| n > m) {
            best = Some((n, c));
        }
    }
    let (n, c) = best?;
    let name = calls.get(c).map_or("", |c| &c.name);
    verdict(
        cfg,
        Tier::Identical,
        name,
        Some(calls.arg(c)),
        n,
        cfg.identical_min,
    )
}

/// A tool of the newest turn called often (in as many turns) with
/// differing arguments and answered the same each time: a telling answer
/// (see [`Calls::informative`]), or a short one to arguments that barely
/// differ.
fn pattern<R: Results>(
    cfg: &ToolLoops,
    calls: &Calls<'_, '_, R>,
    recent: &[usize],
    newest: usize,
) -> Option<ToolVerdict> {
    let mut best: Option<(u32, usize)> = None;
    for c in of_turn(calls, recent, newest) {
        let name = calls.get(c).map(|c| &c.name);
        let same: Vec<usize> = recent
            .iter()
            .copied()
            .filter(|&o| calls.get(o).map(|o| &o.name) == name && calls.same(o, c, false))
            .collect();
        // Calls made at once (parallel calls of one turn) are an agent
        // fanning out over many resources, not retrying: one occurrence
        // per turn.
        let mut turns: Vec<usize> = same
            .iter()
            .filter_map(|&o| calls.get(o).map(|c| c.turn))
            .collect();
        turns.dedup();
        let n = turns.len() as u32;
        let varied = same.iter().any(|&o| calls.arg(o) != calls.arg(c));
        // A short answer (nothing found, an empty output, an ok) says
        // little: the same one to other arguments is a loop only when the
        // arguments barely differ (a search retried in other words), not
        // when they ask for other things (another date, another command).
        let telling = calls.informative(c)
            || same
                .iter()
                .all(|&o| trivially_varied(calls.arg(o), calls.arg(c)));
        if varied && telling && n >= cfg.pattern_min && best.is_none_or(|(m, _)| n > m) {
            best = Some((n, c));
        }
    }
    let (n, c) = best?;
    let name = calls.get(c).map_or("", |c| &c.name);
    verdict(cfg, Tier::Pattern, name, None, n, cfg.pattern_min)
}

/// The same 2 or 3 calls (tool, arguments, answer) in turn at the end of
/// the history, repeated at least `cycle_min` times; the newest call ends
/// it.
fn cycle<R: Results>(
    cfg: &ToolLoops,
    calls: &Calls<'_, '_, R>,
    newest: usize,
) -> Option<ToolVerdict> {
    let n = calls.calls.len();
    if cfg.cycle_min == 0 || calls.get(n.checked_sub(1)?)?.turn != newest {
        return None;
    }
    let equal = |i: usize, j: usize| calls.same_call(i, j) && calls.same(i, j, true);
    let mut best: Option<(u32, usize)> = None;
    for period in [2usize, 3] {
        if n < period * cfg.cycle_min as usize {
            continue;
        }
        // A cycle of one call repeated is identical thrash, not a cycle.
        let start = n - period;
        if (start + 1..n).all(|i| equal(start, i)) {
            continue;
        }
        // The longest end of the history with this period.
        let mut len = period;
        while len < n && equal(n - 1 - len, n - 1 - len + period) {
            len += 1;
        }
        let reps = (len / period) as u32;
        if reps >= cfg.cycle_min && best.is_none_or(|(r, _)| reps > r) {
            best = Some((reps, period));
        }
    }
    let (reps, period) = best?;
    let names: Vec<String> = (n - period..n)
        .filter_map(|i| calls.get(i))
        .map(|c| safe_tool_name(&c.name))
        .collect();
    verdict(
        cfg,
        Tier::Cycle,
        &names.join("+"),
        None,
        reps,
        cfg.cycle_min,
    )
}

/// The model's newest turn is a text answer and the answers before it
/// (consecutive turns without tool calls) say the same thing in other
/// words: at least half of the shorter one's 4-character shingles appear
/// in the newest (`answer_min` answers in a row, the newest included).
///
/// The run stops at an answer that made progress over the one before it
/// ([`progress::progressed`]): how revising a text turn by turn (nearly
/// the same answer every time, but each one doing what was asked) is told
/// from a loop; and at an answer to a user message that brought something
/// new ([`brought_news`]): a support dialogue whose user reports another
/// status each turn is going on, however alike the agent's replies are.
fn answer<R: Results>(
    cfg: &ToolLoops,
    history: &ToolHistory,
    results: &R,
    texts: Option<&progress::TextCache>,
) -> Option<ToolVerdict> {
    if cfg.answer_min == 0 {
        return None;
    }
    let read = |at: ResultAt, min: usize| {
        progress::read_cached(texts, results, at, cfg.result_classes, min)
    };
    // The newest answers, newest first, as far as the ladder can need
    // (and one more, to see what the oldest of them introduced).
    let wanted = cfg.answer_min as usize + cfg.ladder.len() + 1;
    // (answer, the user's message it answered)
    let mut answers: Vec<(Rc<progress::Text>, Option<Rc<progress::Text>>)> = Vec::new();
    for t in history.turns.iter().rev().take(wanted) {
        if t.calls > 0 {
            break;
        }
        let Some(text) = t.answer.and_then(|at| read(at, progress::ANSWER_MIN_CHARS)) else {
            break;
        };
        // What the user wrote is never masked.
        let prompt = t
            .prompt
            .and_then(|at| progress::read_cached(texts, results, at, Classes::NONE, 4));
        answers.push((text, prompt));
    }
    let turn = |k: usize| {
        answers.get(k).map(|(answer, prompt)| progress::Turn {
            answer,
            prompt: prompt.as_deref(),
        })
    };
    let newest = turn(0)?;
    let mut occurrences = 1u32;
    for k in 1..answers.len() {
        let (Some(later), Some(earlier)) = (turn(k - 1), turn(k)) else {
            break;
        };
        // The later answer replied to a message that brought something
        // new (a status, an output, a detailed report): answering it alike
        // is a dialogue going on, not an answer repeated.
        if brought_news(later.prompt, earlier.prompt) {
            break;
        }
        if !progress::similar(newest.answer, earlier.answer) {
            break;
        }
        if progress::progressed(later, earlier, turn(k + 1)) {
            break;
        }
        occurrences += 1;
    }
    if occurrences < cfg.answer_min {
        return None;
    }
    verdict(cfg, Tier::Answer, "", None, occurrences, cfg.answer_min)
}

/// A user message longer than this many words, unlike the one before it,
/// brings something new to answer.
const NEWS_WORDS: usize = 24;

/// Whether the user's message `prompt` (what an answer replied to) brought
/// something new: a long message (a pasted output, a report of what the
/// user did) that is not the one before it again. A complaint ("still
/// broken", "you keep saying the same thing") brings nothing.
fn brought_news(prompt: Option<&progress::Text>, before: Option<&progress::Text>) -> bool {
    let Some(p) = prompt else {
        return false;
    };
    if p.text.split_whitespace().count() <= NEWS_WORDS {
        return false;
    }
    !before.is_some_and(|b| progress::similar(p, b))
}

/// Whether the user's message before model turn `turn` brought news (see
/// [`brought_news`]) over the user's message before it.
fn news_before<R: Results>(
    history: &ToolHistory,
    results: &R,
    texts: Option<&progress::TextCache>,
    turn: usize,
) -> bool {
    let prompt_of = |t: usize| {
        history
            .turns
            .get(t)
            .and_then(|m| m.prompt)
            .and_then(|at| progress::read_cached(texts, results, at, Classes::NONE, 4))
    };
    let Some(p) = prompt_of(turn) else {
        return false;
    };
    let before = (0..turn).rev().find_map(prompt_of);
    brought_news(Some(&p), before.as_deref())
}

/// step = occurrences - threshold + 1, capped at the ladder's last step.
fn verdict(
    cfg: &ToolLoops,
    tier: Tier,
    tool: &str,
    arguments: Option<&str>,
    occurrences: u32,
    threshold: u32,
) -> Option<ToolVerdict> {
    let last = cfg.ladder.len().checked_sub(1)?;
    let index = ((occurrences - threshold) as usize).min(last);
    let step = *cfg.ladder.get(index)?;
    Some(ToolVerdict {
        tier,
        tool: tool.to_string(),
        arguments: arguments.map(str::to_string),
        occurrences,
        level: index as u32 + 1,
        step,
    })
}

/// The note a nudge appends to the conversation.
pub fn nudge_text(v: &ToolVerdict) -> String {
    match v.tier {
        Tier::Identical => format!(
            "Note from the API gateway: you have called the tool `{}` {} times with the same arguments in your recent steps, and repeating it will not give a different result. Try a different approach or a different tool.",
            v.tool, v.occurrences
        ),
        Tier::Pattern => format!(
            "Note from the API gateway: you have called the tool `{}` {} times in your recent steps with varying arguments without making progress. Try a different approach or a different tool.",
            v.tool, v.occurrences
        ),
        Tier::Cycle => format!(
            "Note from the API gateway: you have repeated the same sequence of tool calls ({}) {} times, with the same results each time. Try a different approach or a different tool.",
            cycle_names(&v.tool), v.occurrences
        ),
        Tier::Answer => format!(
            "Note from the API gateway: your last {} answers say essentially the same thing, and the conversation has not moved on. Do not repeat that answer: try a fundamentally different approach, or say plainly what you cannot do.",
            v.occurrences
        ),
    }
}

/// The firmer message of a directive.
pub fn directive_text(v: &ToolVerdict) -> String {
    let what = match &v.arguments {
        Some(args) => {
            let shown: String = args.chars().take(200).collect();
            let cut = if args.chars().count() > 200 {
                "..."
            } else {
                ""
            };
            format!("with the same arguments {shown}{cut}")
        }
        None => "with varying arguments".to_string(),
    };
    if v.tier == Tier::Answer {
        return format!(
            "Instruction from the API gateway: stop repeating your answer. You have given essentially the same answer {} times in a row without resolving the problem. Do not give it again. Take a different approach, ask the user a clarifying question, or explain what you cannot do.",
            v.occurrences
        );
    }
    if v.tier == Tier::Cycle {
        return format!(
            "Instruction from the API gateway: stop repeating the tool calls {}. You have gone through them {} times with the same results. Do not call them again in this order. Answer with the information you already have, or ask the user for what you need.",
            cycle_names(&v.tool),
            v.occurrences
        );
    }
    format!(
        "Instruction from the API gateway: stop calling the tool `{}`. You have called it {} times {what} without progress. Do not call it again. Answer with the information you already have, or ask the user for what you need.",
        v.tool, v.occurrences
    )
}

/// The request body a nudge or directive forwards (`None` for a reject, or
/// when the body has no conversation to append to).
pub fn rewrite(cfg: &ToolLoops, req: &Request<'_>, v: &ToolVerdict) -> Option<Vec<u8>> {
    match v.step {
        ToolStep::Nudge => req.with_note(&nudge_text(v)),
        ToolStep::Directive if cfg.directive_disables_tools => {
            req.with_note_and_no_tools(&directive_text(v))
        }
        ToolStep::Directive => req.with_note(&directive_text(v)),
        ToolStep::Reject => None,
    }
}

/// A cycle's tools for a message: `a` → `b` → `c`.
fn cycle_names(joined: &str) -> String {
    joined
        .split('+')
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(" → ")
}

/// A tool name reduced to a safe token for headers and logs: at most 64 of
/// `[A-Za-z0-9_.-]`, anything else replaced by `_`.
pub fn safe_tool_name(name: &str) -> String {
    let s: String = name
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "_".to_string()
    } else {
        s
    }
}

/// The verdict's tool as headers, logs and 429s show it: a safe token (a
/// cycle's tools joined by `+`), or none for an answer loop.
pub fn shown_tool(v: &ToolVerdict) -> Option<String> {
    match v.tier {
        Tier::Answer => None,
        // Its tools are safe tokens already (see `cycle`).
        Tier::Cycle => Some(v.tool.clone()),
        _ => Some(safe_tool_name(&v.tool)),
    }
}

/// `x-loopguard-tool-loop: <tier>;tool=<name>;level=<n>` (a cycle's
/// tools joined by `+`; an answer loop names none).
pub fn header_value(v: &ToolVerdict) -> String {
    match shown_tool(v) {
        Some(tool) => format!("{};tool={};level={}", v.tier.as_str(), tool, v.level),
        None => format!("{};level={}", v.tier.as_str(), v.level),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod drift_tests;
#[cfg(test)]
mod trying_tests;
