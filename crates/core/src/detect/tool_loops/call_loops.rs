//! Repeated tool calls: identical thrash, pattern thrash and cycles, each
//! judged on the examined calls and counted onto the ladder.

use super::calls::{trivially_varied, Calls};
use super::ladder::{safe_tool_name, verdict};
use super::{Results, Tier, ToolVerdict};
use crate::config::ToolLoops;
use crate::detect::repetition;

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

/// The most repeated (tool, arguments) of the newest turn, counting back
/// from the newest the calls whose result repeats the one before (the
/// same, or nothing new: see [`crate::detect::news`]), as long as nothing new was tried
/// in between: an agent that reruns its test after each of several
/// different fixes, and sees the same failure, is trying things, not
/// looping; one that reruns it after nothing but repeats is.
pub(super) fn identical<R: Results>(
    cfg: &ToolLoops,
    calls: &Calls<'_, '_, R>,
    recent: &[usize],
    newest: usize,
    news: &dyn Fn(usize) -> bool,
) -> Option<ToolVerdict> {
    let first = recent.first().copied().unwrap_or(0);
    let turn_of = |i: usize| calls.get(i).map_or(0, |x| x.turn);
    let mut best: Option<(u32, usize)> = None;
    for c in of_turn(calls, recent, newest) {
        let mut n = 1u32;
        let mut later = c;
        while let Some(o) = calls.previous_since(later, first) {
            if !calls.repeats_previous(later) || !(o + 1..later).all(|i| calls.repeats_earlier(i)) {
                break;
            }
            // A user told the agent something new in between (a support
            // agent checking a line again after the user changed a
            // setting): a new question, not the same one again.
            if (turn_of(o) + 1..=turn_of(later)).any(news) {
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
    verdict(cfg, Tier::Identical, name, Some(calls.arg(c)), n)
}

/// A tool of the newest turn called often (in as many turns) with
/// differing arguments and answered the same each time: a telling answer
/// (see [`Calls::informative`]), or a short one to arguments that barely
/// differ.
pub(super) fn pattern<R: Results>(
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
    verdict(cfg, Tier::Pattern, name, None, n)
}

/// The same 2 or 3 calls (tool, arguments, answer) in turn at the end of
/// the history, repeated at least `cycle_min` times; the newest call ends
/// it.
pub(super) fn cycle<R: Results>(
    cfg: &ToolLoops,
    calls: &Calls<'_, '_, R>,
    newest: usize,
) -> Option<ToolVerdict> {
    let n = calls.calls.len();
    if cfg.cycle_min == 0 || calls.get(n.checked_sub(1)?)?.turn != newest {
        return None;
    }
    // Call `j` repeats call `i` (the same call made last before it), its
    // result the same or nothing new.
    let equal = |i: usize, j: usize| {
        calls.same_call(i, j)
            && (calls.same(i, j, true)
                || (calls.previous(j) == Some(i) && calls.repeats_previous(j)))
    };
    let mut best: Option<(u32, usize)> = None;
    for period in [2usize, 3] {
        if n < period * cfg.cycle_min as usize {
            continue;
        }
        // A cycle of one call repeated is identical thrash, not a cycle.
        if repetition::one_call(n, period, equal) {
            continue;
        }
        // The longest end of the history with this period.
        let len = repetition::periodic_end(n, period, equal);
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
    verdict(cfg, Tier::Cycle, &names.join("+"), None, reps)
}

/// The same turn again: the model's newest turns each wrote the reply of
/// the turn before word for word (its reasoning, long enough to tell) and
/// made the same calls, whatever those returned but progress reported in
/// numbers, `turn_min` turns in a row: a model writing the same thought
/// again and again is not reading what it gets (a file scrolled page after
/// page for a function it never finds), while a job run a batch at a time
/// ("drain the next batch", 140 left, then 0) says the same by design.
pub(super) fn same_turns<R: Results>(
    cfg: &ToolLoops,
    calls: &Calls<'_, '_, R>,
    newest: usize,
) -> Option<ToolVerdict> {
    if cfg.turn_min == 0 {
        return None;
    }
    // A turn's calls are a run of the examined calls: where the run of
    // turn `t` that ends at `end` starts.
    let start_of = |t: usize, end: usize| {
        (0..end)
            .rev()
            .take_while(|&i| calls.get(i).is_some_and(|c| c.turn == t))
            .last()
            .unwrap_or(end)
    };
    // A turn that also called exempt tools (a poll) is waiting, not
    // repeating: its examined calls are fewer than it made.
    let waits =
        |t: usize, from: usize, to: usize| calls.turns.get(t).is_some_and(|m| m.calls != to - from);
    let n = calls.calls.len();
    let (mut from, mut to) = (start_of(newest, n), n);
    let made = to - from;
    if made == 0 || waits(newest, from, to) {
        return None;
    }
    // A turn whose calls report progress in numbers (the next batch of a
    // queue drained, the next chunk indexed) is a step of a job written
    // the same way each time, not the model ignoring what it gets.
    let progress = |from: usize, to: usize| (from..to).any(|i| calls.reports_progress(i));
    let mut count = 1u32;
    let mut later = newest;
    while let Some(earlier) = later.checked_sub(1) {
        let before = start_of(earlier, from);
        let same_calls =
            from - before == made && (0..made).all(|k| calls.same_call(before + k, from + k));
        if !same_calls
            || waits(earlier, before, from)
            || !calls.same_turn_reply(earlier, later)
            || progress(from, to)
        {
            break;
        }
        count += 1;
        later = earlier;
        (from, to) = (before, from);
    }
    if count < cfg.turn_min {
        return None;
    }
    let name = calls.get(from).map_or("", |c| &c.name);
    verdict(cfg, Tier::Turn, name, Some(calls.arg(from)), count)
}
