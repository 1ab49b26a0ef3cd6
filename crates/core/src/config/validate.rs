//! From the configuration as written ([`super::raw`]) to the model the
//! filter runs ([`super::Config`]): ranges, defaults and the rules that
//! tie fields together. Every error names the policy and the field.

use super::error::{shorten, valid_id, ConfigError};
use super::raw::*;
use super::*;

/// Error construction within one policy (or the top level).
struct Ctx {
    policy: Option<String>,
}

impl Ctx {
    fn err(&self, field: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            policy: self.policy.clone(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    /// A whole number within `min..=max`, if given.
    fn int(
        &self,
        field: &str,
        v: &Option<Int>,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, ConfigError> {
        match v {
            None => Ok(None),
            Some(Int::Whole(n)) if *n < min => {
                Err(self.err(field, format!("must be >= {min} (got {n})")))
            }
            Some(Int::Whole(n)) if *n > max => {
                Err(self.err(field, format!("must be <= {max} (got {n})")))
            }
            Some(Int::Whole(n)) => Ok(Some(*n)),
            Some(Int::OutOfRange(s)) => Err(self.err(field, format!("must be <= {max} (got {s})"))),
            Some(Int::Fraction(s)) => Err(self.err(
                field,
                format!("must be a whole number from {min} to {max} (got {s})"),
            )),
            Some(Int::NotNumber(s)) => Err(self.err(
                field,
                format!(
                    "must be an integer from {min} to {max} (got {})",
                    shorten(s)
                ),
            )),
        }
    }

    /// A count from 2 to `max` where 0 switches `what` off (1 would make
    /// every occurrence a repeat).
    fn off_or_from_2(
        &self,
        field: &str,
        v: &Option<Int>,
        max: u64,
        what: &str,
    ) -> Result<Option<u64>, ConfigError> {
        match self.int(field, v, 0, max)? {
            Some(1) => Err(self.err(
                field,
                format!("must be >= 2 (got 1); use 0 to switch {what} off"),
            )),
            n => Ok(n),
        }
    }

    /// A list that, when given, must not be empty.
    fn non_empty<'v, T>(
        &self,
        field: &str,
        v: &'v Option<Vec<T>>,
    ) -> Result<Option<&'v [T]>, ConfigError> {
        match v {
            None => Ok(None),
            Some(list) if list.is_empty() => Err(self.err(
                field,
                "must not be empty (leave the field out to match everything)",
            )),
            Some(list) => Ok(Some(list.as_slice())),
        }
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    fn try_from(raw: RawConfig) -> Result<Config, ConfigError> {
        let top = Ctx { policy: None };
        let max_tracked = top
            .int(
                "max_tracked_fingerprints",
                &raw.max_tracked_fingerprints,
                1,
                MAX_TRACKED_FINGERPRINTS,
            )?
            .unwrap_or(65_536);
        let max_body_bytes = top
            .int("max_body_bytes", &raw.max_body_bytes, 1, MAX_BODY_BYTES)?
            .unwrap_or(1_048_576);
        let shadow_all = raw.shadow.unwrap_or(false);
        let jwt_payload_in_metadata = match raw.jwt_payload_in_metadata {
            None => "jwt_payload".to_string(),
            Some(k) if k.is_empty() => {
                return Err(top.err("jwt_payload_in_metadata", "must not be empty"))
            }
            Some(k) => k,
        };
        let access_log = match raw.access_log {
            None | Some(AccessLogName::Actions) => AccessLog::Actions,
            Some(AccessLogName::All) => AccessLog::All,
            Some(AccessLogName::Off) => AccessLog::Off,
        };
        let store = match raw.store {
            None => StoreConfig::Local,
            Some(Obj(s)) => store(&top, s)?,
        };
        let webhook = match raw.alerts.and_then(|Obj(a)| a.webhook) {
            None => None,
            Some(Obj(w)) => Some(webhook(&top, w)?),
        };
        let list = raw
            .policies
            .ok_or_else(|| top.err("policies", "is required"))?;
        if list.is_empty() {
            return Err(top.err("policies", "must list at least one policy"));
        }
        if list.len() > MAX_POLICIES {
            return Err(top.err(
                "policies",
                format!(
                    "may list at most {MAX_POLICIES} policies (got {})",
                    list.len()
                ),
            ));
        }
        let mut policies: Vec<Policy> = Vec::with_capacity(list.len());
        for (i, Obj(item)) in list.into_iter().enumerate() {
            let mut p = policy(item, i)?;
            if policies.iter().any(|q| q.id == p.id) {
                return Err(ConfigError {
                    policy: Some(p.id.clone()),
                    field: "id".to_string(),
                    reason: "is used by more than one policy; ids must be unique".to_string(),
                });
            }
            if shadow_all {
                p.mode = Mode::Shadow;
            }
            policies.push(p);
        }
        Ok(Config {
            max_tracked_fingerprints: u32::try_from(max_tracked).unwrap_or(u32::MAX),
            max_body_bytes,
            jwt_payload_in_metadata,
            policies,
            webhook,
            route_metadata: raw.route_metadata.unwrap_or(false),
            access_log,
            store,
            hold_request_headers: raw.hold_request_headers.unwrap_or(false),
        })
    }
}

fn store(ctx: &Ctx, s: RawStore) -> Result<StoreConfig, ConfigError> {
    match s.kind {
        None | Some(StoreName::Local) => {
            let given = [
                ("cluster", s.cluster.is_some()),
                ("authority", s.authority.is_some()),
                ("path", s.path.is_some()),
                ("timeout_ms", s.timeout_ms.is_some()),
                ("on_error", s.on_error.is_some()),
            ];
            if let Some((extra, _)) = given.iter().find(|(_, g)| *g) {
                return Err(ctx.err(
                    &format!("store.{extra}"),
                    "applies only to the \"redis_webdis\" store",
                ));
            }
            Ok(StoreConfig::Local)
        }
        Some(StoreName::RedisWebdis) => {
            let cluster = match s.cluster {
                Some(c) if !c.is_empty() => c,
                _ => {
                    return Err(
                        ctx.err("store.cluster", "is required (the Envoy cluster of webdis)")
                    )
                }
            };
            let authority = s.authority.unwrap_or_else(|| "webdis".to_string());
            if authority.is_empty() {
                return Err(ctx.err("store.authority", "must not be empty"));
            }
            let path = absolute(ctx, "store.path", s.path.unwrap_or_else(|| "/".to_string()))?;
            let timeout_ms = ctx
                .int("store.timeout_ms", &s.timeout_ms, 1, 5_000)?
                .unwrap_or(25);
            let on_error = match s.on_error {
                None | Some(OnErrorName::Local) => OnStoreError::Local,
                Some(OnErrorName::Allow) => OnStoreError::Allow,
            };
            Ok(StoreConfig::RedisWebdis(RedisStore {
                cluster,
                authority,
                path,
                timeout_ms,
                on_error,
            }))
        }
    }
}

fn webhook(ctx: &Ctx, w: RawWebhook) -> Result<Webhook, ConfigError> {
    const SECTION: &str = "alerts.webhook";
    let required = |name: &str, v: Option<String>| -> Result<String, ConfigError> {
        match v {
            Some(s) if !s.is_empty() => Ok(s),
            Some(_) => Err(ctx.err(&format!("{SECTION}.{name}"), "must not be empty")),
            None => Err(ctx.err(&format!("{SECTION}.{name}"), "is required")),
        }
    };
    let cluster = required("cluster", w.cluster)?;
    let authority = required("authority", w.authority)?;
    let path = absolute(
        ctx,
        &format!("{SECTION}.path"),
        w.path.unwrap_or_else(|| "/".to_string()),
    )?;
    let timeout_ms = ctx
        .int(&format!("{SECTION}.timeout_ms"), &w.timeout_ms, 1, 60_000)?
        .unwrap_or(2_000);
    let hmac_secret_env = match w.hmac_secret_env {
        None => None,
        Some(name)
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
        {
            Some(name)
        }
        Some(other) => {
            return Err(ctx.err(
                &format!("{SECTION}.hmac_secret_env"),
                format!("must be an environment variable name (got \"{other}\")"),
            ))
        }
    };
    Ok(Webhook {
        cluster,
        authority,
        path,
        timeout_ms,
        hmac_secret_env,
    })
}

fn policy(raw: RawPolicy, index: usize) -> Result<Policy, ConfigError> {
    let anon = Ctx { policy: None };
    let id = match raw.id {
        None => return Err(anon.err(&format!("policies[{index}].id"), "is required")),
        Some(id) if valid_id(&id) => id,
        Some(other) => {
            return Err(anon.err(
                &format!("policies[{index}].id"),
                format!(
                    "must match [A-Za-z0-9_-]{{1,64}} (got {})",
                    serde_json::Value::from(other)
                ),
            ))
        }
    };
    let ctx = Ctx {
        policy: Some(id.clone()),
    };
    let Some(Obj(spec)) = raw.spec else {
        return Err(ctx.err("spec", "is required"));
    };
    let mode = match spec.mode {
        None | Some(ModeName::Enforce) => Mode::Enforce,
        Some(ModeName::Shadow) => Mode::Shadow,
    };
    let selector = match spec.selector {
        None => return Err(ctx.err("selector", "is required (use {} to match every request)")),
        Some(Obj(s)) => selector(&ctx, s)?,
    };
    let limit_keys = limit_keys(&ctx, spec.limit_keys)?;
    let exempt = exempt(&ctx, spec.exempt)?;
    let has_tool_loops = spec.tool_loops.is_some();
    let reads_text = spec
        .loop_detection
        .as_ref()
        .is_some_and(|Obj(d)| d.similarity.is_some_and(SimilarityName::reads_tail));
    let volatile = match spec.volatile {
        None => Volatile::default_on(),
        Some(_) if !reads_text && !has_tool_loops => {
            return Err(ctx.err(
                "volatile",
                "applies only to similarity \"llm_tail\" or \"near\", or to tool_loops",
            ))
        }
        Some(Obj(v)) => volatile(&ctx, v)?,
    };
    let tool_loops = match spec.tool_loops {
        None => None,
        Some(Obj(t)) => tool_loops(&ctx, t, &volatile)?,
    };
    let detection = match spec.loop_detection {
        None if has_tool_loops => None,
        None => return Err(ctx.err("loop_detection", "is required (or give tool_loops)")),
        Some(Obj(d)) => detection(&ctx, d)?,
    };
    Ok(Policy {
        id,
        mode,
        selector,
        limit_keys,
        exempt,
        detection,
        tool_loops,
        volatile,
    })
}

fn volatile(ctx: &Ctx, v: RawVolatile) -> Result<Volatile, ConfigError> {
    use crate::config::volatile::Class;
    let classes = match v.classes.as_deref() {
        None => Classes::defaults(),
        Some([]) => return Err(ctx.err(
            "volatile.classes",
            "must not be empty (leave it out for the default classes, or set \"enabled\": false)",
        )),
        Some(list) => list
            .iter()
            .map(|c| match c {
                VolatileClassName::Uuid => Class::Uuid,
                VolatileClassName::Datetime => Class::DateTime,
                VolatileClassName::Epoch => Class::Epoch,
                VolatileClassName::Hex => Class::Hex,
                VolatileClassName::PrefixedId => Class::PrefixedId,
                VolatileClassName::NoiseNumbers => Class::NoiseNumbers,
                VolatileClassName::ToolResultNumbers => Class::ToolResultNumbers,
            })
            .collect(),
    };
    let tool_arguments = v.tool_arguments.unwrap_or(false);
    if v.enabled == Some(false) {
        if v.classes.is_some() || tool_arguments {
            return Err(ctx.err(
                "volatile.enabled",
                "is false, so \"classes\" and \"tool_arguments\" would do nothing; remove them or enable masking",
            ));
        }
        return Ok(Volatile::OFF);
    }
    Ok(Volatile {
        classes,
        tool_arguments,
    })
}

fn selector(ctx: &Ctx, s: RawSelector) -> Result<Selector, ConfigError> {
    let path = match (s.path_exact, s.path_prefix) {
        (Some(_), Some(_)) => {
            return Err(ctx.err("selector", "may give pathExact or pathPrefix, not both"))
        }
        (Some(p), None) => PathMatch::Exact(check_path(ctx, "selector.pathExact", p)?),
        (None, Some(p)) => PathMatch::Prefix(check_path(ctx, "selector.pathPrefix", p)?),
        (None, None) => PathMatch::Any,
    };
    let mut methods = Vec::new();
    for (i, m) in ctx
        .non_empty("selector.methods", &s.methods)?
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if m.is_empty() || !m.bytes().all(is_token_byte) {
            return Err(ctx.err(
                &format!("selector.methods[{i}]"),
                format!("must be an HTTP method token (got \"{m}\")"),
            ));
        }
        methods.push(m.to_ascii_uppercase());
    }
    let mut hosts = Vec::new();
    for (i, h) in ctx
        .non_empty("selector.hosts", &s.hosts)?
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let host = normalize_host(h);
        let body = host.strip_prefix("*.").unwrap_or(&host);
        let ok = !body.is_empty()
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b));
        if !ok {
            return Err(ctx.err(
                &format!("selector.hosts[{i}]"),
                format!("must be a host name, optionally starting with \"*.\" (got \"{h}\")"),
            ));
        }
        hosts.push(host);
    }
    let mut routes = Vec::new();
    if let Some(list) = ctx.non_empty("selector.routes", &s.routes)? {
        if list.len() > MAX_ROUTES {
            return Err(ctx.err(
                "selector.routes",
                format!("may list at most {MAX_ROUTES} routes (got {})", list.len()),
            ));
        }
        for (i, r) in list.iter().enumerate() {
            if r.is_empty() {
                return Err(ctx.err(&format!("selector.routes[{i}]"), "must not be empty"));
            }
            routes.push(r.clone());
        }
    }
    Ok(Selector {
        path,
        methods,
        hosts,
        routes,
    })
}

/// A path that starts with `/`.
fn absolute(ctx: &Ctx, field: &str, p: String) -> Result<String, ConfigError> {
    if !p.starts_with('/') {
        return Err(ctx.err(field, format!("must start with \"/\" (got \"{p}\")")));
    }
    Ok(p)
}

/// A path to match: absolute, without a query or fragment.
fn check_path(ctx: &Ctx, field: &str, p: String) -> Result<String, ConfigError> {
    let p = absolute(ctx, field, p)?;
    if p.contains('?') || p.contains('#') {
        return Err(ctx.err(
            field,
            format!("must not contain a query or fragment; matching ignores the query string (got \"{p}\")"),
        ));
    }
    Ok(p)
}

fn limit_keys(ctx: &Ctx, list: Option<Vec<String>>) -> Result<Vec<LimitKey>, ConfigError> {
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    if list.len() > MAX_LIMIT_KEYS {
        return Err(ctx.err(
            "limit_keys",
            format!(
                "may list at most {MAX_LIMIT_KEYS} keys (got {})",
                list.len()
            ),
        ));
    }
    let mut keys: Vec<LimitKey> = Vec::with_capacity(list.len());
    for (i, raw) in list.iter().enumerate() {
        let field = format!("limit_keys[{i}]");
        let key = limit_key(raw).map_err(|reason| ctx.err(&field, reason))?;
        if keys.contains(&key) {
            return Err(ctx.err(&field, format!("repeats \"{raw}\"")));
        }
        keys.push(key);
    }
    keys.sort_by_key(|k| k.name());
    Ok(keys)
}

fn limit_key(raw: &str) -> Result<LimitKey, String> {
    let bad_source = || {
        format!(
            "must be header:<name>, query:<name>, jwt:<claim>, jwt_verified:<claim> or ip:address (got \"{raw}\")"
        )
    };
    let (source, name) = raw.split_once(':').ok_or_else(bad_source)?;
    if name.is_empty() {
        return Err(format!(
            "names no {source} after \"{source}:\" (got \"{raw}\")"
        ));
    }
    match source {
        "header" => {
            if !name.bytes().all(is_token_byte) {
                return Err(format!("has an invalid header name (got \"{raw}\")"));
            }
            Ok(LimitKey::Header(name.to_ascii_lowercase()))
        }
        "query" => Ok(LimitKey::Query(name.to_string())),
        "jwt" => Ok(LimitKey::Jwt(name.to_string())),
        "jwt_verified" => Ok(LimitKey::JwtVerified(name.to_string())),
        "ip" if name == "address" => Ok(LimitKey::IpAddress),
        "ip" => Err(format!("must be ip:address (got \"{raw}\")")),
        _ => Err(bad_source()),
    }
}

fn exempt(ctx: &Ctx, list: Option<Vec<Obj<RawExempt>>>) -> Result<Vec<Exemption>, ConfigError> {
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    if list.len() > MAX_EXEMPTIONS {
        return Err(ctx.err(
            "exempt",
            format!(
                "may list at most {MAX_EXEMPTIONS} entries (got {})",
                list.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, Obj(item)) in list.into_iter().enumerate() {
        let at = format!("exempt[{i}]");
        let key = match &item.key {
            None => return Err(ctx.err(&format!("{at}.key"), "is required")),
            Some(raw) => limit_key(raw).map_err(|r| ctx.err(&format!("{at}.key"), r))?,
        };
        let values = ctx.non_empty(&format!("{at}.values"), &item.values)?;
        let matcher = match (item.present, values) {
            (Some(p), None) => ExemptMatch::Present(p),
            (None, Some(v)) => ExemptMatch::Values(v.to_vec()),
            _ => return Err(ctx.err(&at, "must give exactly one of \"present\" or \"values\"")),
        };
        out.push(Exemption { key, matcher });
    }
    Ok(out)
}

fn action(a: ActionName) -> Action {
    match a {
        ActionName::Reject => Action::Reject,
        ActionName::Throttle => Action::Throttle,
        ActionName::Warn => Action::Warn,
    }
}

fn detection(ctx: &Ctx, d: RawDetection) -> Result<Option<Detection>, ConfigError> {
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

fn tool_loops(
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
        arguments_mask: volatile.argument_classes(),
        result_classes: volatile.classes,
    }))
}

/// RFC 9110 token characters.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
