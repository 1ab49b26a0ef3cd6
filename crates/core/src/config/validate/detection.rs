//! The `loop_detection` block: window, threshold or escalation ladder,
//! throttle and cooldown, and the similarity mode with its settings.

use super::{
    is_token_byte, shorten, ConfigError, Ctx, Fraction, Obj, RawDetection, RawStep, SimilarityName,
};
use crate::config::{
    scale_steps, Action, Detection, Similarity, Step, DEFAULT_FORGIVEN,
    DEFAULT_NEAR_SIMILARITY_MILLI, MAX_FORGIVEN, MAX_HITS_PER_FINGERPRINT, MAX_THROTTLE_DELAY_MS,
    MAX_WINDOW_SECONDS,
};

pub(super) fn detection(ctx: &Ctx, d: RawDetection) -> Result<Option<Detection>, ConfigError> {
    let ctx = &ctx.within("loop_detection");
    let enabled = d.enabled.ok_or_else(|| ctx.err("enabled", "is required"))?;
    let window = ctx.int("window_seconds", &d.window_seconds, 1, MAX_WINDOW_SECONDS)?;
    let threshold = ctx.off_or_from_2(
        "threshold_identical_requests",
        &d.threshold_identical_requests,
        MAX_HITS_PER_FINGERPRINT,
        "the policy",
    )?;
    let escalation = d.escalation.map(|list| escalation(ctx, list)).transpose()?;
    if escalation.is_some() {
        if d.action.is_some() {
            return Err(ctx.err("escalation", "replaces \"action\"; give one or the other"));
        }
        if threshold.is_some() {
            return Err(ctx.err(
                "escalation",
                "replaces \"threshold_identical_requests\" (the first step's \"at\" is the threshold); give one or the other",
            ));
        }
    }
    let max_ms = MAX_THROTTLE_DELAY_MS;
    let throttle_step_ms = ctx.int_or("throttle_step_ms", &d.throttle_step_ms, 1..=max_ms, 100)?;
    let throttle_max_delay_ms = ctx.int_or(
        "throttle_max_delay_ms",
        &d.throttle_max_delay_ms,
        1..=max_ms,
        10_000,
    )?;
    let max_s = MAX_WINDOW_SECONDS;
    let cooldown_seconds = ctx.int_or("cooldown_seconds", &d.cooldown_seconds, 0..=max_s, 0)?;
    let similarity_name = d.similarity.unwrap_or(SimilarityName::Exact);
    let tail_messages: Option<u32> = ctx.int("tail_messages", &d.tail_messages, 1, 64)?;
    let max_hits = u64::from(MAX_HITS_PER_FINGERPRINT);
    let fallback_threshold = ctx.int("fallback_threshold", &d.fallback_threshold, 2, max_hits)?;
    let near_similarity = match &d.near_similarity {
        None => None,
        Some(Fraction::Number(x)) if *x > 0.0 && *x <= 1.0 => {
            // Thousandths: the decision is made in integers, alike in the
            // filter and in Redis.
            Some(((x * 1000.0).round() as u32).clamp(1, 1000))
        }
        Some(wrong) => {
            let reason = match wrong {
                Fraction::Number(x) => format!("must be above 0 and at most 1 (got {x})"),
                Fraction::NotNumber(s) => {
                    let s = shorten(s);
                    format!("must be a number above 0 and at most 1 (got {s})")
                }
            };
            return Err(ctx.err("near_similarity", reason));
        }
    };
    let forgive_failed_attempts = ctx.int_or(
        "forgive_failed_attempts",
        &d.forgive_failed_attempts,
        0..=MAX_FORGIVEN.into(),
        DEFAULT_FORGIVEN,
    )?;
    let near_history: Option<u32> = ctx.int("near_history", &d.near_history, 1, max_hits)?;
    if tail_messages.is_some() && !similarity_name.reads_tail() {
        return Err(ctx.err(
            "tail_messages",
            "applies only to similarity \"llm_tail\" or \"near\"",
        ));
    }
    let (near, session) = (SimilarityName::Near, SimilarityName::Session);
    for (name, given, only) in [
        ("near_similarity", near_similarity.is_some(), near),
        ("near_history", near_history.is_some(), near),
        ("session_header", d.session_header.is_some(), session),
        ("fallback_threshold", fallback_threshold.is_some(), session),
    ] {
        if given && similarity_name != only {
            let only = if only == near { "near" } else { "session" };
            return Err(ctx.err(name, format!("applies only to similarity \"{only}\"")));
        }
    }
    if let Some(h) = &d.session_header {
        if h.is_empty() || !h.bytes().all(is_token_byte) {
            return Err(ctx.err(
                "session_header",
                format!("must be a header name (got \"{h}\")"),
            ));
        }
    }
    if !enabled {
        return Ok(None);
    }
    let window_seconds =
        window.ok_or_else(|| ctx.err("window_seconds", "is required when enabled"))?;
    let steps = match (escalation, threshold) {
        (Some(steps), _) => steps,
        (None, None) => {
            return Err(ctx.err(
                "threshold_identical_requests",
                "is required when enabled (or give an \"escalation\" ladder)",
            ))
        }
        (None, Some(0)) => return Ok(None),
        (None, Some(at)) => vec![Step {
            at,
            action: d.action.unwrap_or(Action::Reject),
        }],
    };
    let threshold = steps.first().map_or(2, |s| s.at);
    let last_step = steps.last().map_or(2, |s| s.at);
    let tail_messages = tail_messages.unwrap_or(3);
    let similarity = match similarity_name {
        SimilarityName::Near => {
            let history = near_history.unwrap_or(64);
            if history < last_step {
                return Err(ctx.err(
                    "near_history",
                    format!(
                        "must be >= the count of the last step ({history} < {last_step}): a caller's history holds at most near_history hits"
                    ),
                ));
            }
            Similarity::Near {
                tail_messages,
                similarity_milli: near_similarity.unwrap_or(DEFAULT_NEAR_SIMILARITY_MILLI),
                history,
            }
        }
        SimilarityName::LlmTail => Similarity::LlmTail { tail_messages },
        SimilarityName::Session => {
            // The default (at most 1024, as the threshold) is never below it.
            let fb = fallback_threshold.unwrap_or((threshold * 5).min(MAX_HITS_PER_FINGERPRINT));
            if fb < threshold {
                let reason = format!("must be >= the threshold ({fb} < {threshold})");
                return Err(ctx.err("fallback_threshold", reason));
            }
            Similarity::Session {
                header: d
                    .session_header
                    .unwrap_or_else(|| "x-session-id".to_string())
                    .to_ascii_lowercase(),
                fallback_steps: scale_steps(&steps, fb),
            }
        }
        SimilarityName::Exact => Similarity::Exact,
    };
    let detection = Detection {
        window_seconds,
        steps,
        throttle_step_ms,
        throttle_max_delay_ms,
        cooldown_seconds,
        similarity,
        forgive_failed_attempts,
    };
    let throttles = |s: &Step| s.action == Action::Throttle;
    if detection.steps.iter().any(throttles) && throttle_max_delay_ms < throttle_step_ms {
        return Err(ctx.err(
            "throttle_max_delay_ms",
            format!("must be >= throttle_step_ms ({throttle_max_delay_ms} < {throttle_step_ms})"),
        ));
    }
    let ladder = detection.ladder(false);
    let to_cap = ladder.throttle_hits_to_cap();
    if detection.steps.last().is_some_and(throttles) && to_cap > max_hits {
        return Err(ctx.err(
            "throttle_max_delay_ms",
            format!(
                "needs {to_cap} identical hits to reach its cap at {throttle_step_ms} ms per hit, more than the {MAX_HITS_PER_FINGERPRINT} a fingerprint keeps; raise throttle_step_ms or lower the cap",
            ),
        ));
    }
    if cooldown_seconds > 0 && ladder.reject_at().is_none() {
        return Err(ctx.err(
            "cooldown_seconds",
            "needs a reject action (the cooldown starts at the first reject)",
        ));
    }
    Ok(Some(detection))
}

/// `ctx` is within `loop_detection`.
fn escalation(ctx: &Ctx, list: Vec<Obj<RawStep>>) -> Result<Vec<Step>, ConfigError> {
    if list.is_empty() {
        return Err(ctx.err(
            "escalation",
            "must be a non-empty list of {\"at\": <count>, \"action\": ...} (got [])",
        ));
    }
    ctx.at_most("escalation", list.len(), 16, "steps")?;
    let mut steps: Vec<Step> = Vec::with_capacity(list.len());
    for (i, Obj(item)) in list.into_iter().enumerate() {
        let ctx = ctx.within(&format!("escalation[{i}]"));
        let max = MAX_HITS_PER_FINGERPRINT.into();
        let at = ctx
            .int("at", &item.at, 2, max)?
            .ok_or_else(|| ctx.err("at", "is required"))?;
        let Some(action) = item.action else {
            return Err(ctx.err("action", "is required"));
        };
        if let Some(prev) = steps.last().map(|p| p.at).filter(|prev| at <= *prev) {
            let reason = format!("must be greater than the previous step's ({at} <= {prev})");
            return Err(ctx.err("at", reason));
        }
        steps.push(Step { at, action });
    }
    Ok(steps)
}
