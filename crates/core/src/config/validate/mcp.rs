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
            // In order, both stops would be error then reject.
            let both_stops = list.contains(&McpStep::Error) && list.contains(&McpStep::Reject);
            if both_stops || !list.is_sorted_by(|a, b| a < b) {
                return Err(ctx.err(
                    "ladder",
                    "must list its steps in the order note, block, then error or reject (not both), each at most once",
                ));
            }
            list.to_vec()
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
    let max_s = MAX_WINDOW_SECONDS;
    let window_s: u64 = ctx.int_or("window_seconds", &m.window_seconds, 1..=max_s, 600)?;
    let recheck_s: u64 = ctx.int_or("recheck_seconds", &m.recheck_seconds, 1..=max_s, 60)?;
    // A result's durations and counts of attempts are what a poll watches
    // change ("running, 35 s" then "65 s"): unless the policy lists its
    // classes, they are kept in MCP results.
    let noise = crate::config::volatile::Class::NoiseNumbers;
    let result_classes = volatile.classes.iter();
    let result_classes = result_classes
        .filter(|c| classes_listed || *c != noise)
        .collect();
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
        result_classes,
        arguments_mask: volatile.argument_classes(),
    }))
}
