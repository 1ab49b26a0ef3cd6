//! The `mcp` block: thresholds, the ladder, the error code and the key.

use super::{ConfigError, Ctx, Volatile};
use crate::config::mcp::{Mcp, McpKey, McpStep, DEFAULT_ERROR_CODE};
use crate::config::raw::RawMcp;
use crate::config::MAX_WINDOW_SECONDS;

/// `classes_listed`: the policy lists its volatile classes itself.
pub(super) fn mcp(
    ctx: &Ctx,
    m: RawMcp,
    volatile: &Volatile,
    classes_listed: bool,
) -> Result<Option<Mcp>, ConfigError> {
    let ctx = &ctx.within("mcp");
    let enabled = m.enabled.ok_or_else(|| ctx.err("enabled", "is required"))?;
    let same_result_min = ctx.int("same_result_min", &m.same_result_min, 2, 16)?;
    let same_error_min = ctx.int("same_error_min", &m.same_error_min, 2, 16)?;
    let cycle_min = ctx.off_or_from_2("cycle_min", &m.cycle_min, 5, "cycle detection")?;
    let exempt_tools = ctx
        .non_empty("exempt_tools", &m.exempt_tools)?
        .map(<[String]>::to_vec)
        .unwrap_or_default();
    if let Some(empty) = exempt_tools.iter().position(String::is_empty) {
        return Err(ctx.err(
            &format!("exempt_tools[{empty}]"),
            "must name a tool (got \"\")",
        ));
    }
    let ladder = match ctx.non_empty("ladder", &m.ladder)? {
        None => vec![McpStep::Note, McpStep::Block],
        Some(list) => {
            let mut steps: Vec<McpStep> = Vec::with_capacity(list.len());
            for &step in list {
                let out_of_order = steps.last().is_some_and(|prev| *prev >= step);
                let both_stops = step == McpStep::Reject && steps.contains(&McpStep::Error);
                if out_of_order || both_stops {
                    return Err(ctx.err(
                        "ladder",
                        "must list its steps in the order note, block, then error or reject (not both), each at most once",
                    ));
                }
                steps.push(step);
            }
            steps
        }
    };
    let error_code = m.error_code.unwrap_or(DEFAULT_ERROR_CODE);
    if (-32_768..=-32_000).contains(&error_code) {
        return Err(ctx.err(
            "error_code",
            format!(
                "must be outside -32768..-32000, the range JSON-RPC reserves (got {error_code})"
            ),
        ));
    }
    if m.error_code.is_some() && !ladder.contains(&McpStep::Error) {
        return Err(ctx.err("error_code", "needs an \"error\" step in the ladder"));
    }
    let key = m.key.unwrap_or(McpKey::Session);
    let window_s: u64 = ctx
        .int("window_seconds", &m.window_seconds, 1, MAX_WINDOW_SECONDS)?
        .unwrap_or(600);
    let recheck_s: u64 = ctx
        .int("recheck_seconds", &m.recheck_seconds, 1, MAX_WINDOW_SECONDS)?
        .unwrap_or(60);
    if !enabled {
        return Ok(None);
    }
    Ok(Some(Mcp {
        same_result_min: same_result_min.unwrap_or(3),
        same_error_min: same_error_min.unwrap_or(3),
        cycle_min: cycle_min.unwrap_or(3),
        exempt_tools,
        ladder,
        error_code,
        key,
        window_ms: window_s * 1000,
        recheck_ms: recheck_s * 1000,
        // A result's durations and counts of attempts are what a poll
        // watches change ("running, 35 s" then "65 s"): unless the policy
        // lists its classes, they are kept in MCP results.
        result_classes: if classes_listed {
            volatile.classes
        } else {
            volatile
                .classes
                .iter()
                .filter(|c| *c != crate::config::volatile::Class::NoiseNumbers)
                .collect()
        },
        arguments_mask: volatile.argument_classes(),
    }))
}
