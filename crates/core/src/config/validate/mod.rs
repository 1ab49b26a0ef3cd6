//! From the configuration as written ([`super::raw`]) to the model the
//! filter runs ([`super::Config`]): ranges, defaults and the rules that
//! tie fields together. Every error names the policy and the field.

use super::error::{shorten, valid_id, ConfigError};
use super::raw::*;
use super::{
    AccessLog, Classes, Config, Mode, Policy, StoreConfig, Volatile, MAX_BODY_BYTES, MAX_POLICIES,
    MAX_TRACKED_FINGERPRINTS,
};
use std::ops::RangeInclusive;

mod budget;
mod detection;
mod mcp;
mod selector;
mod services;
mod tool_loops;

use self::mcp::mcp;
use budget::budget;
use detection::detection;
use selector::{exempt, limit_keys, selector};
use services::{prices, store, webhook};
use tool_loops::tool_loops;

/// Error construction within one policy (or the top level), for the
/// fields of one section.
#[derive(Default)]
struct Ctx {
    policy: Option<String>,
    /// Put before every field named (`loop_detection.`); empty at the
    /// policy's (or the configuration's) top.
    section: String,
}

impl Ctx {
    /// The top of policy `id`.
    fn policy(id: &str) -> Ctx {
        Ctx {
            policy: Some(id.to_string()),
            section: String::new(),
        }
    }

    /// The same policy, naming fields inside `section`.
    fn within(&self, section: &str) -> Ctx {
        Ctx {
            policy: self.policy.clone(),
            section: format!("{}{section}.", self.section),
        }
    }

    fn err(&self, field: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            policy: self.policy.clone(),
            field: format!("{}{field}", self.section),
            reason: reason.into(),
        }
    }

    /// A whole number within `min..=max`, if given (`max` fits in `T`).
    fn int<T: TryFrom<u64>>(
        &self,
        field: &str,
        v: &Option<Int>,
        min: u64,
        max: u64,
    ) -> Result<Option<T>, ConfigError> {
        let reason = match v {
            None => return Ok(None),
            Some(Int::Whole(n)) if *n < min => format!("must be >= {min} (got {n})"),
            Some(Int::Whole(n)) => match T::try_from(*n) {
                Ok(t) if *n <= max => return Ok(Some(t)),
                _ => format!("must be <= {max} (got {n})"),
            },
            Some(Int::OutOfRange(s)) => format!("must be <= {max} (got {s})"),
            Some(Int::Fraction(s)) => {
                format!("must be a whole number from {min} to {max} (got {s})")
            }
            Some(Int::NotNumber(s)) => {
                let s = shorten(s);
                format!("must be an integer from {min} to {max} (got {s})")
            }
        };
        Err(self.err(field, reason))
    }

    /// [`Ctx::int`], or `default` when not given.
    fn int_or<T: TryFrom<u64>>(
        &self,
        field: &str,
        v: &Option<Int>,
        range: RangeInclusive<u64>,
        default: T,
    ) -> Result<T, ConfigError> {
        Ok(self
            .int(field, v, *range.start(), *range.end())?
            .unwrap_or(default))
    }

    /// A count from 2 to `max` where 0 switches `what` off (1 would make
    /// every occurrence a repeat).
    fn off_or_from_2(
        &self,
        field: &str,
        v: &Option<Int>,
        max: u32,
        what: &str,
    ) -> Result<Option<u32>, ConfigError> {
        match self.int(field, v, 0, u64::from(max))? {
            Some(1) => Err(self.err(
                field,
                format!("must be >= 2 (got 1); use 0 to switch {what} off"),
            )),
            n => Ok(n),
        }
    }

    /// A list of at most `max` `what`.
    fn at_most(&self, field: &str, len: usize, max: usize, what: &str) -> Result<(), ConfigError> {
        if len > max {
            return Err(self.err(field, format!("may list at most {max} {what} (got {len})")));
        }
        Ok(())
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
        let top = Ctx::default();
        let max_tracked_fingerprints = top.int_or(
            "max_tracked_fingerprints",
            &raw.max_tracked_fingerprints,
            1..=MAX_TRACKED_FINGERPRINTS,
            65_536,
        )?;
        let max_body_bytes = top.int_or(
            "max_body_bytes",
            &raw.max_body_bytes,
            1..=MAX_BODY_BYTES,
            1_048_576,
        )?;
        let shadow_all = raw.shadow.unwrap_or(false);
        let jwt_payload_in_metadata = raw.jwt_payload_in_metadata.unwrap_or("jwt_payload".into());
        if jwt_payload_in_metadata.is_empty() {
            return Err(top.err("jwt_payload_in_metadata", "must not be empty"));
        }
        let store = raw
            .store
            .map_or(Ok(StoreConfig::Local), |Obj(s)| store(&top, s))?;
        let hook = raw.alerts.and_then(|Obj(a)| a.webhook);
        let webhook = hook.map(|Obj(w)| webhook(&top, w)).transpose()?;
        let prices = prices(&top, raw.prices)?;
        let list = raw
            .policies
            .ok_or_else(|| top.err("policies", "is required"))?;
        if list.is_empty() {
            return Err(top.err("policies", "must list at least one policy"));
        }
        top.at_most("policies", list.len(), MAX_POLICIES, "policies")?;
        let mut policies: Vec<Policy> = Vec::with_capacity(list.len());
        for (i, Obj(item)) in list.into_iter().enumerate() {
            let mut p = policy(item, i)?;
            if policies.iter().any(|q| q.id == p.id) {
                let reason = "is used by more than one policy; ids must be unique";
                return Err(Ctx::policy(&p.id).err("id", reason));
            }
            if shadow_all {
                p.mode = Mode::Shadow;
            }
            policies.push(p);
        }
        Ok(Config {
            max_tracked_fingerprints,
            max_body_bytes,
            jwt_payload_in_metadata,
            policies,
            webhook,
            route_metadata: raw.route_metadata.unwrap_or(false),
            access_log: raw.access_log.unwrap_or(AccessLog::Actions),
            store,
            hold_request_headers: raw.hold_request_headers.unwrap_or(false),
            prices,
        })
    }
}

fn policy(raw: RawPolicy, index: usize) -> Result<Policy, ConfigError> {
    let (anon, field) = (Ctx::default(), format!("policies[{index}].id"));
    let id = match raw.id {
        None => return Err(anon.err(&field, "is required")),
        Some(id) if valid_id(&id) => id,
        Some(other) => {
            let got = serde_json::Value::from(other);
            let reason = format!("must match [A-Za-z0-9_-]{{1,64}} (got {got})");
            return Err(anon.err(&field, reason));
        }
    };
    let ctx = Ctx::policy(&id);
    let Some(Obj(spec)) = raw.spec else {
        return Err(ctx.err("spec", "is required"));
    };
    let selector = match spec.selector {
        None => return Err(ctx.err("selector", "is required (use {} to match every request)")),
        Some(Obj(s)) => selector(&ctx, s)?,
    };
    let limit_keys = limit_keys(&ctx, spec.limit_keys)?;
    let exempt = exempt(&ctx, spec.exempt)?;
    let has_tool_loops = spec.tool_loops.is_some();
    let has_mcp = spec.mcp.is_some();
    if has_mcp {
        // One policy, one kind of traffic: an MCP endpoint's JSON-RPC
        // calls are judged by their results, not counted as requests.
        for (field, given) in [
            ("loop_detection", spec.loop_detection.is_some()),
            ("tool_loops", has_tool_loops),
            ("budget", spec.budget.is_some()),
        ] {
            if given {
                return Err(ctx.err(
                    field,
                    "cannot be combined with mcp in one policy (give the MCP endpoint a policy of its own)",
                ));
            }
        }
    }
    let reads_text = spec
        .loop_detection
        .as_ref()
        .is_some_and(|Obj(d)| d.similarity.is_some_and(SimilarityName::reads_tail));
    let classes_listed = matches!(&spec.volatile, Some(Obj(v)) if v.classes.is_some());
    let volatile = match spec.volatile {
        None => Volatile::default_on(),
        Some(_) if !reads_text && !has_tool_loops && !has_mcp => {
            return Err(ctx.err(
                "volatile",
                "applies only to similarity \"llm_tail\" or \"near\", or to tool_loops or mcp",
            ))
        }
        Some(Obj(v)) => volatile(&ctx, v)?,
    };
    let tool_loops = spec
        .tool_loops
        .map_or(Ok(None), |Obj(t)| tool_loops(&ctx, t, &volatile))?;
    let mcp = spec
        .mcp
        .map_or(Ok(None), |Obj(m)| mcp(&ctx, m, &volatile, classes_listed))?;
    let budget = spec.budget.map(|Obj(b)| budget(&ctx, b)).transpose()?;
    let detection = match spec.loop_detection {
        None if has_tool_loops || has_mcp || budget.is_some() => None,
        None => {
            return Err(ctx.err(
                "loop_detection",
                "is required (or give tool_loops, mcp or budget)",
            ))
        }
        Some(Obj(d)) => detection(&ctx, d)?,
    };
    Ok(Policy {
        id,
        mode: spec.mode.unwrap_or(Mode::Enforce),
        selector,
        limit_keys,
        exempt,
        detection,
        tool_loops,
        mcp,
        volatile,
        budget,
    })
}

fn volatile(ctx: &Ctx, v: RawVolatile) -> Result<Volatile, ConfigError> {
    let classes = match v.classes.as_deref() {
        None => Classes::defaults(),
        Some([]) => return Err(ctx.err(
            "volatile.classes",
            "must not be empty (leave it out for the default classes, or set \"enabled\": false)",
        )),
        Some(list) => list.iter().copied().collect(),
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

/// A path that starts with `/`.
fn absolute(ctx: &Ctx, field: &str, p: String) -> Result<String, ConfigError> {
    if !p.starts_with('/') {
        return Err(ctx.err(field, format!("must start with \"/\" (got \"{p}\")")));
    }
    Ok(p)
}

/// RFC 9110 token characters.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
