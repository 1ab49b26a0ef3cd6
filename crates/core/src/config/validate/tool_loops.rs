//! The `tool_loops` block: how many calls are compared, the ladder and
//! the cycle, answer-loop and same-turn counts.

use super::{ConfigError, Ctx, RawToolLoops, ToolStepName, Volatile};
use crate::config::{ToolLoops, ToolStep};

pub(super) fn tool_loops(
    ctx: &Ctx,
    t: RawToolLoops,
    volatile: &Volatile,
) -> Result<Option<ToolLoops>, ConfigError> {
    let f = |name: &str| format!("tool_loops.{name}");
    let enabled = t
        .enabled
        .ok_or_else(|| ctx.err(&f("enabled"), "is required"))?;
    let last_calls = ctx
        .int(&f("last_calls"), &t.last_calls, 1, 64)?
        .unwrap_or(6);
    let identical_min = ctx
        .int(&f("identical_min"), &t.identical_min, 2, 64)?
        .unwrap_or(3);
    let pattern_min = ctx
        .int(&f("pattern_min"), &t.pattern_min, 2, 64)?
        .unwrap_or(4);
    for (name, min) in [
        ("identical_min", identical_min),
        ("pattern_min", pattern_min),
    ] {
        if min > last_calls {
            return Err(ctx.err(
                &f(name),
                format!("must be <= last_calls ({min} > {last_calls})"),
            ));
        }
    }
    let exempt_tools = ctx
        .non_empty(&f("exempt_tools"), &t.exempt_tools)?
        .map(<[String]>::to_vec)
        .unwrap_or_default();
    let ladder = match ctx.non_empty(&f("ladder"), &t.ladder)? {
        None => vec![ToolStep::Nudge, ToolStep::Directive, ToolStep::Reject],
        Some(list) => {
            let mut steps: Vec<ToolStep> = Vec::with_capacity(list.len());
            for name in list {
                let step = match name {
                    ToolStepName::Nudge => ToolStep::Nudge,
                    ToolStepName::Directive => ToolStep::Directive,
                    ToolStepName::Reject => ToolStep::Reject,
                };
                if steps.last().is_some_and(|prev| *prev >= step) {
                    return Err(ctx.err(
                        &f("ladder"),
                        "must list its steps in the order nudge, directive, reject, each at most once",
                    ));
                }
                steps.push(step);
            }
            steps
        }
    };
    let min = |name: &str, value, what| {
        ctx.off_or_from_2(&f(name), value, 16, what)
            .map(|n| n.map_or(3, |n| u32::try_from(n).unwrap_or(16)))
    };
    let cycle_min = min("cycle_min", &t.cycle_min, "cycle detection")?;
    let answer_min = min("answer_min", &t.answer_min, "answer-loop detection")?;
    let turn_min = ctx
        .off_or_from_2(&f("turn_min"), &t.turn_min, 32, "same-turn detection")?
        .map_or(8, |n| u32::try_from(n).unwrap_or(32));
    let directive_disables_tools = t.directive_disables_tools.unwrap_or(false);
    if directive_disables_tools && !ladder.contains(&ToolStep::Directive) {
        return Err(ctx.err(
            &f("directive_disables_tools"),
            "needs a \"directive\" step in the ladder",
        ));
    }
    if !enabled {
        return Ok(None);
    }
    Ok(Some(ToolLoops {
        last_calls: usize::try_from(last_calls).unwrap_or(64),
        identical_min: u32::try_from(identical_min).unwrap_or(64),
        pattern_min: u32::try_from(pattern_min).unwrap_or(64),
        exempt_tools,
        ladder,
        directive_disables_tools,
        cycle_min,
        answer_min,
        turn_min,
        arguments_mask: volatile.argument_classes(),
        result_classes: volatile.classes,
    }))
}
