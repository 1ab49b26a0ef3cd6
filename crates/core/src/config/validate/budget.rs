//! `spec.budget`: spend caps per caller, session or conversation.

use super::{is_token_byte, ConfigError, Ctx, Obj, RawBudget, RawBudgetLimit};
use crate::config::budget::*;
use crate::config::error::show;

/// Label names of loopguard's metrics: a budget named like one would be
/// read as that label by Envoy's tag extraction.
const RESERVED: &[&str] = &[
    "policy",
    "mode",
    "action",
    "tier",
    "step",
    "reason",
    "result",
    "token_type",
    "loop",
    "caller",
    "budget",
    "key",
    "model",
];
/// The largest dollar cap.
const MAX_USD: f64 = 1_000_000.0;

pub(super) fn budget(ctx: &Ctx, b: RawBudget) -> Result<Budget, ConfigError> {
    let ctx = &ctx.within("budget");
    let list = match b.limits {
        None => return Err(ctx.err("limits", "is required (at least one cap)")),
        Some(l) if l.is_empty() => return Err(ctx.err("limits", "must list at least one cap")),
        Some(l) => l,
    };
    ctx.at_most("limits", list.len(), MAX_LIMITS, "caps")?;
    let mut limits: Vec<BudgetLimit> = Vec::with_capacity(list.len());
    for (i, Obj(raw)) in list.into_iter().enumerate() {
        let l = limit(ctx, i, raw)?;
        let name = &l.name;
        if limits.iter().any(|o| o.name == *name) {
            let reason = format!("\"{name}\" is used by more than one cap; names must be unique");
            return Err(ctx.err(&format!("limits[{i}].name"), reason));
        }
        limits.push(l);
    }
    let warn_at_permille = match b.warn_at {
        None => 800,
        Some(v) => {
            let shown = show(&v);
            let Some(f) = v.as_f64().filter(|f| (0.0..1.0).contains(f)) else {
                let reason =
                    format!("must be a number from 0 (no warning) to below 1 (got {shown})");
                return Err(ctx.err("warn_at", reason));
            };
            // Kept in thousandths: a value that rounds to 1 would never
            // warn, one that rounds to 0 always off.
            let permille = (f * 1000.0).round() as u32;
            if permille >= 1000 || (f > 0.0 && permille == 0) {
                let to = if permille == 0 { "0" } else { "1" };
                return Err(ctx.err(
                    "warn_at",
                    format!("{shown} rounds to {to} (warn_at is kept in thousandths), which would switch the warning off; use at most 0.999, and 0 for no warning"),
                ));
            }
            permille
        }
    };
    let session = sources(ctx, "session", b.session, || {
        vec![SessionSource::Header("x-session-id".to_string())]
    })?;
    let user = sources(ctx, "user", b.user, || {
        ["user", "safety_identifier", "metadata.user_id"]
            .iter()
            .map(|p| SessionSource::Body(p.split('.').map(str::to_string).collect()))
            .collect()
    })?;
    if b.unpriced.is_some() && !limits.iter().any(|l| matches!(l.cap, Cap::MicroUsd(_))) {
        return Err(ctx.err(
            "unpriced",
            "applies only to a dollar cap (a limit with usd); remove it or add one",
        ));
    }
    let max_tracked_keys = ctx.int_or(
        "max_tracked_keys",
        &b.max_tracked_keys,
        64..=1_048_576,
        8192,
    )?;
    Ok(Budget {
        limits,
        action: b.action.unwrap_or(BudgetAction::Reject),
        warn_at_permille,
        session,
        user,
        unpriced: b.unpriced.unwrap_or_default(),
        max_tracked_keys,
    })
}

fn limit(ctx: &Ctx, i: usize, raw: RawBudgetLimit) -> Result<BudgetLimit, ConfigError> {
    let at = &ctx.within(&format!("limits[{i}]"));
    let name = raw.name.ok_or_else(|| at.err("name", "is required"))?;
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_';
    if name.is_empty() || name.len() > 32 || !name.bytes().all(ok) {
        let got = serde_json::Value::from(name);
        return Err(at.err("name", format!("must match [a-z0-9_-]{{1,32}} (got {got})")));
    }
    if RESERVED.contains(&name.as_str()) {
        return Err(at.err(
            "name",
            format!(
                "\"{name}\" is a metric label name (its series would be misread); choose another"
            ),
        ));
    }
    let Some(per) = raw.per else {
        return Err(at.err("per", "is required: caller, session, conversation or user"));
    };
    let window: u64 = at
        .int(
            "window_seconds",
            &raw.window_seconds,
            60,
            MAX_BUDGET_WINDOW_SECONDS,
        )?
        .ok_or_else(|| {
            at.err(
                "window_seconds",
                format!("is required (60 to {MAX_BUDGET_WINDOW_SECONDS}, 31 days)"),
            )
        })?;
    let given = [raw.usd.is_some(), raw.tokens.is_some(), raw.calls.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ctx.err(
            &format!("limits[{i}]"),
            "must give exactly one cap: usd, tokens or calls",
        ));
    }
    if raw.tokens_of.is_some() && raw.tokens.is_none() {
        return Err(at.err("tokens_of", "applies only to a tokens cap"));
    }
    let cap = if let Some(v) = raw.usd {
        // Kept in micro-dollars: a cap that rounds to nothing would
        // refuse every request.
        let micro = v
            .as_f64()
            .filter(|f| *f > 0.0 && *f <= MAX_USD)
            .map(|f| (f * 1e6).round());
        let shown = show(&v);
        match micro {
            Some(m) if m >= 1.0 => Cap::MicroUsd(m as u64),
            Some(_) => {
                return Err(at.err(
                    "usd",
                    format!("{shown} rounds to $0 (caps are kept in micro-dollars): the smallest cap is 0.000001"),
                ))
            }
            None => {
                return Err(at.err(
                    "usd",
                    format!("must be a number of dollars above 0, at most 1000000 (got {shown})"),
                ))
            }
        }
    } else if raw.tokens.is_some() {
        let n = at.int_or("tokens", &raw.tokens, 1..=1_000_000_000_000, 1)?;
        Cap::Tokens(n, raw.tokens_of.unwrap_or(TokensOf::All))
    } else {
        Cap::Calls(at.int_or("calls", &raw.calls, 1..=1_000_000_000, 1)?)
    };
    Ok(BudgetLimit {
        name,
        per,
        window_ms: window * 1000,
        cap,
    })
}

/// A list of id sources (`budget.session`, `budget.user`), or its default.
fn sources(
    ctx: &Ctx,
    name: &str,
    given: Option<Vec<String>>,
    default: impl FnOnce() -> Vec<SessionSource>,
) -> Result<Vec<SessionSource>, ConfigError> {
    let Some(list) = given else {
        return Ok(default());
    };
    if list.is_empty() {
        return Err(ctx.err(
            name,
            "must not be empty (leave it out for the default sources)",
        ));
    }
    ctx.at_most(name, list.len(), MAX_SESSION_SOURCES, "sources")?;
    list.iter()
        .enumerate()
        .map(|(i, s)| session_source(ctx, &format!("{name}[{i}]"), s))
        .collect()
}

fn session_source(ctx: &Ctx, field: &str, s: &str) -> Result<SessionSource, ConfigError> {
    if let Some(h) = s.strip_prefix("header:") {
        if h.is_empty() || !h.bytes().all(is_token_byte) {
            return Err(ctx.err(field, format!("names no valid header (got \"{s}\")")));
        }
        return Ok(SessionSource::Header(h.to_ascii_lowercase()));
    }
    if let Some(path) = s.strip_prefix("body:") {
        let parts: Vec<String> = path.split('.').map(str::to_string).collect();
        if parts.len() > 2 || parts.iter().any(String::is_empty) {
            return Err(ctx.err(
                field,
                format!("must name a body field or a field of one, body:<field> or body:<field>.<field> (got \"{s}\")"),
            ));
        }
        return Ok(SessionSource::Body(parts));
    }
    let claim = |c: &str| {
        !c.is_empty()
            && c.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    };
    if let Some(c) = s.strip_prefix("jwt_verified:").filter(|c| claim(c)) {
        return Ok(SessionSource::JwtVerified(c.to_string()));
    }
    if let Some(c) = s.strip_prefix("jwt:").filter(|c| claim(c)) {
        return Ok(SessionSource::Jwt(c.to_string()));
    }
    Err(ctx.err(
        field,
        format!(
            "must be header:<name>, body:<field>, jwt:<claim> or jwt_verified:<claim> (got \"{s}\")"
        ),
    ))
}
