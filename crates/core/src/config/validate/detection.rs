//! The `loop_detection` block: window, threshold or escalation ladder,
//! throttle and cooldown, and the similarity mode with its settings.

use super::{
    is_token_byte, shorten, ActionName, ConfigError, Ctx, Fraction, Obj, RawDetection, RawStep,
    SimilarityName,
};
use crate::config::{
    scale_steps, Action, Detection, Similarity, Step, DEFAULT_FORGIVEN,
    DEFAULT_NEAR_SIMILARITY_MILLI, MAX_FORGIVEN, MAX_HITS_PER_FINGERPRINT, MAX_THROTTLE_DELAY_MS,
    MAX_WINDOW_SECONDS,
};

fn action(a: ActionName) -> Action {
    match a {
        ActionName::Reject => Action::Reject,
        ActionName::Throttle => Action::Throttle,
        ActionName::Warn => Action::Warn,
    }
}

pub(super) fn detection(ctx: &Ctx, d: RawDetection) -> Result<Option<Detection>, ConfigError> {
    let f = |name: &str| format!("loop_detection.{name}");
    let enabled = d
        .enabled
        .ok_or_else(|| ctx.err(&f("enabled"), "is required"))?;
    let window = ctx.int(
        &f("window_seconds"),
        &d.window_seconds,
        1,
        MAX_WINDOW_SECONDS,
    )?;
    let threshold = ctx.off_or_from_2(
        &f("threshold_identical_requests"),
        &d.threshold_identical_requests,
        u64::from(MAX_HITS_PER_FINGERPRINT),
        "the policy",
    )?;
    let escalation = match d.escalation {
        None => None,
        Some(list) => Some(escalation(ctx, list)?),
    };
    if escalation.is_some() {
        if d.action.is_some() {
            return Err(ctx.err(
                &f("escalation"),
                "replaces \"action\"; give one or the other",
            ));
        }
        if threshold.is_some() {
            return Err(ctx.err(
                &f("escalation"),
                "replaces \"threshold_identical_requests\" (the first step's \"at\" is the threshold); give one or the other",
            ));
        }
    }
    let throttle_step_ms = ctx
        .int(
            &f("throttle_step_ms"),
            &d.throttle_step_ms,
            1,
            MAX_THROTTLE_DELAY_MS,
        )?
        .unwrap_or(100);
    let throttle_max_delay_ms = ctx
        .int(
            &f("throttle_max_delay_ms"),
            &d.throttle_max_delay_ms,
            1,
            MAX_THROTTLE_DELAY_MS,
        )?
        .unwrap_or(10_000);
    let cooldown_seconds = ctx
        .int(
            &f("cooldown_seconds"),
            &d.cooldown_seconds,
            0,
            MAX_WINDOW_SECONDS,
        )?
        .unwrap_or(0);
    let similarity_name = d.similarity.unwrap_or(SimilarityName::Exact);
    let tail_messages = ctx.int(&f("tail_messages"), &d.tail_messages, 1, 64)?;
    let fallback_threshold = ctx.int(
        &f("fallback_threshold"),
        &d.fallback_threshold,
        2,
        u64::from(MAX_HITS_PER_FINGERPRINT),
    )?;
    let near_similarity = match &d.near_similarity {
        None => None,
        Some(Fraction::Number(x)) if *x > 0.0 && *x <= 1.0 => {
            // Thousandths: the decision is made in integers, alike in the
            // filter and in Redis.
            Some(((x * 1000.0).round() as u32).clamp(1, 1000))
        }
        Some(Fraction::Number(x)) => {
            return Err(ctx.err(
                &f("near_similarity"),
                format!("must be above 0 and at most 1 (got {x})"),
            ))
        }
        Some(Fraction::NotNumber(s)) => {
            return Err(ctx.err(
                &f("near_similarity"),
                format!(
                    "must be a number above 0 and at most 1 (got {})",
                    shorten(s)
                ),
            ))
        }
    };
    let forgive_failed_attempts = ctx
        .int(
            &f("forgive_failed_attempts"),
            &d.forgive_failed_attempts,
            0,
            u64::from(MAX_FORGIVEN),
        )?
        .map_or(DEFAULT_FORGIVEN, |n| {
            u32::try_from(n).unwrap_or(MAX_FORGIVEN)
        });
    let near_history = ctx.int(
        &f("near_history"),
        &d.near_history,
        1,
        u64::from(MAX_HITS_PER_FINGERPRINT),
    )?;
    let reads_tail = similarity_name.reads_tail();
    if tail_messages.is_some() && !reads_tail {
        return Err(ctx.err(
            &f("tail_messages"),
            "applies only to similarity \"llm_tail\" or \"near\"",
        ));
    }
    for (name, given) in [
        ("near_similarity", near_similarity.is_some()),
        ("near_history", near_history.is_some()),
    ] {
        if given && similarity_name != SimilarityName::Near {
            return Err(ctx.err(&f(name), "applies only to similarity \"near\""));
        }
    }
    for (name, given) in [
        ("session_header", d.session_header.is_some()),
        ("fallback_threshold", fallback_threshold.is_some()),
    ] {
        if given && similarity_name != SimilarityName::Session {
            return Err(ctx.err(&f(name), "applies only to similarity \"session\""));
        }
    }
    if let Some(h) = &d.session_header {
        if h.is_empty() || !h.bytes().all(is_token_byte) {
            return Err(ctx.err(
                &f("session_header"),
                format!("must be a header name (got \"{h}\")"),
            ));
        }
    }
    if !enabled {
        return Ok(None);
    }
    let window_seconds =
        window.ok_or_else(|| ctx.err(&f("window_seconds"), "is required when enabled"))?;
    let steps = match (escalation, threshold) {
        (Some(steps), _) => steps,
        (None, None) => {
            return Err(ctx.err(
                &f("threshold_identical_requests"),
                "is required when enabled (or give an \"escalation\" ladder)",
            ))
        }
        (None, Some(0)) => return Ok(None),
        (None, Some(t)) => vec![Step {
            at: u32::try_from(t).unwrap_or(MAX_HITS_PER_FINGERPRINT),
            action: d.action.map_or(Action::Reject, action),
        }],
    };
    let threshold = steps.first().map_or(2, |s| s.at);
    let last_step = steps.last().map_or(2, |s| s.at);
    let tail_messages = tail_messages.map_or(3, |n| u32::try_from(n).unwrap_or(64));
    let similarity = match similarity_name {
        SimilarityName::Near => {
            let history = near_history.map_or(64, |n| u32::try_from(n).unwrap_or(1024));
            if history < last_step {
                return Err(ctx.err(
                    &f("near_history"),
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
            let fallback = match fallback_threshold {
                Some(fb) if fb < u64::from(threshold) => {
                    return Err(ctx.err(
                        &f("fallback_threshold"),
                        format!("must be >= the threshold ({fb} < {threshold})"),
                    ))
                }
                Some(fb) => u32::try_from(fb).unwrap_or(MAX_HITS_PER_FINGERPRINT),
                None => (threshold * 5).min(MAX_HITS_PER_FINGERPRINT),
            };
            Similarity::Session {
                header: d
                    .session_header
                    .unwrap_or_else(|| "x-session-id".to_string())
                    .to_ascii_lowercase(),
                fallback_steps: scale_steps(&steps, fallback),
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
    let throttles = detection.steps.iter().any(|s| s.action == Action::Throttle);
    if throttles && detection.throttle_max_delay_ms < detection.throttle_step_ms {
        return Err(ctx.err(
            &f("throttle_max_delay_ms"),
            format!(
                "must be >= throttle_step_ms ({} < {})",
                detection.throttle_max_delay_ms, detection.throttle_step_ms
            ),
        ));
    }
    let last_throttles = detection
        .steps
        .last()
        .is_some_and(|s| s.action == Action::Throttle);
    if last_throttles && detection.throttle_hits_to_cap() > u64::from(MAX_HITS_PER_FINGERPRINT) {
        return Err(ctx.err(
            &f("throttle_max_delay_ms"),
            format!(
                "needs {} identical hits to reach its cap at {} ms per hit, more than the {MAX_HITS_PER_FINGERPRINT} a fingerprint keeps; raise throttle_step_ms or lower the cap",
                detection.throttle_hits_to_cap(),
                detection.throttle_step_ms
            ),
        ));
    }
    if detection.cooldown_seconds > 0 && detection.reject_at().is_none() {
        return Err(ctx.err(
            &f("cooldown_seconds"),
            "needs a reject action (the cooldown starts at the first reject)",
        ));
    }
    Ok(Some(detection))
}

fn escalation(ctx: &Ctx, list: Vec<Obj<RawStep>>) -> Result<Vec<Step>, ConfigError> {
    let field = "loop_detection.escalation";
    if list.is_empty() {
        return Err(ctx.err(
            field,
            "must be a non-empty list of {\"at\": <count>, \"action\": ...} (got [])",
        ));
    }
    if list.len() > 16 {
        return Err(ctx.err(
            field,
            format!("may list at most 16 steps (got {})", list.len()),
        ));
    }
    let mut steps: Vec<Step> = Vec::with_capacity(list.len());
    for (i, Obj(item)) in list.into_iter().enumerate() {
        let at_path = format!("{field}[{i}]");
        let at = ctx
            .int(
                &format!("{at_path}.at"),
                &item.at,
                2,
                u64::from(MAX_HITS_PER_FINGERPRINT),
            )?
            .ok_or_else(|| ctx.err(&format!("{at_path}.at"), "is required"))?;
        let at = u32::try_from(at).unwrap_or(MAX_HITS_PER_FINGERPRINT);
        let Some(a) = item.action else {
            return Err(ctx.err(&format!("{at_path}.action"), "is required"));
        };
        if let Some(prev) = steps.last() {
            if at <= prev.at {
                return Err(ctx.err(
                    &format!("{at_path}.at"),
                    format!(
                        "must be greater than the previous step's ({at} <= {})",
                        prev.at
                    ),
                ));
            }
        }
        steps.push(Step {
            at,
            action: action(a),
        });
    }
    Ok(steps)
}
