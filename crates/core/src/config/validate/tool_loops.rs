//! The `tool_loops` block: how many calls are compared, the ladder and
//! the cycle, answer-loop and same-turn counts.

use super::{ConfigError, Ctx, RawToolLoops, Volatile};
use crate::config::{ToolLoops, ToolStep};

pub(super) fn tool_loops(
    ctx: &Ctx,
    t: RawToolLoops,
    volatile: &Volatile,
) -> Result<Option<ToolLoops>, ConfigError> {
    let ctx = &ctx.within("tool_loops");
    let enabled = t.enabled.ok_or_else(|| ctx.err("enabled", "is required"))?;
    let last_calls = ctx.int_or("last_calls", &t.last_calls, 1..=64, 6)?;
    let identical_min = ctx.int_or("identical_min", &t.identical_min, 2..=64, 3)?;
    let pattern_min = ctx.int_or("pattern_min", &t.pattern_min, 2..=64, 4)?;
    for (name, min) in [
        ("identical_min", identical_min),
        ("pattern_min", pattern_min),
    ] {
        if min as usize > last_calls {
            return Err(ctx.err(
                name,
                format!("must be <= last_calls ({min} > {last_calls})"),
            ));
        }
    }
    let exempt_tools = ctx
        .non_empty("exempt_tools", &t.exempt_tools)?
        .map(<[String]>::to_vec)
        .unwrap_or_default();
    let ladder = match ctx.non_empty("ladder", &t.ladder)? {
        None => vec![ToolStep::Nudge, ToolStep::Directive, ToolStep::Reject],
        Some(list) if list.is_sorted_by(|a, b| a < b) => list.to_vec(),
        Some(_) => {
            return Err(ctx.err(
                "ladder",
                "must list its steps in the order nudge, directive, reject, each at most once",
            ))
        }
    };
    let cycle_min = ctx.off_or_from_2("cycle_min", &t.cycle_min, 16, "cycle detection")?;
    let answer_min = ctx.off_or_from_2("answer_min", &t.answer_min, 16, "answer-loop detection")?;
    let turn_min = ctx.off_or_from_2("turn_min", &t.turn_min, 32, "same-turn detection")?;
    let directive_disables_tools = t.directive_disables_tools.unwrap_or(false);
    if directive_disables_tools && !ladder.contains(&ToolStep::Directive) {
        return Err(ctx.err(
            "directive_disables_tools",
            "needs a \"directive\" step in the ladder",
        ));
    }
    if !enabled {
        return Ok(None);
    }
    Ok(Some(ToolLoops {
        last_calls,
        identical_min,
        pattern_min,
        exempt_tools,
        ladder,
        directive_disables_tools,
        cycle_min: cycle_min.unwrap_or(3),
        answer_min: answer_min.unwrap_or(3),
        turn_min: turn_min.unwrap_or(8),
        arguments_mask: volatile.argument_classes(),
        result_classes: volatile.classes,
    }))
}
