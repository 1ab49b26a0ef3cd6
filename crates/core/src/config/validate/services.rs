//! The services the filter calls through Envoy clusters: the shared store
//! (`store`) and the alert webhook (`alerts.webhook`); what their tokens
//! cost (`prices`).

use super::{
    absolute, ConfigError, Ctx, Obj, RawPrice, RawStore, RawWebhook, StoreConfig, StoreName,
};
use crate::config::prices;
use crate::config::{ModelPrice, OnStoreError, Prices, RedisStore, Webhook};

pub(super) fn store(ctx: &Ctx, s: RawStore) -> Result<StoreConfig, ConfigError> {
    let ctx = &ctx.within("store");
    match s.kind {
        None | Some(StoreName::Local) => {
            let given = [
                ("topology", s.topology.is_some()),
                ("cluster", s.cluster.is_some()),
                ("authority", s.authority.is_some()),
                ("path", s.path.is_some()),
                ("timeout_ms", s.timeout_ms.is_some()),
                ("on_error", s.on_error.is_some()),
            ];
            if let Some((extra, _)) = given.iter().find(|(_, g)| *g) {
                return Err(ctx.err(extra, "applies only to the \"redis_webdis\" store"));
            }
            Ok(StoreConfig::Local)
        }
        Some(StoreName::RedisWebdis) => {
            let cluster = match s.cluster {
                Some(c) if !c.is_empty() => c,
                _ => return Err(ctx.err("cluster", "is required (the Envoy cluster of webdis)")),
            };
            let authority = s.authority.unwrap_or_else(|| "webdis".to_string());
            if authority.is_empty() {
                return Err(ctx.err("authority", "must not be empty"));
            }
            let path = absolute(ctx, "path", s.path.unwrap_or_else(|| "/".to_string()))?;
            let timeout_ms = ctx.int_or("timeout_ms", &s.timeout_ms, 1..=5_000, 25)?;
            Ok(StoreConfig::RedisWebdis(RedisStore {
                topology: s.topology.unwrap_or_default(),
                cluster,
                authority,
                path,
                timeout_ms,
                on_error: s.on_error.unwrap_or(OnStoreError::Local),
            }))
        }
    }
}

pub(super) fn webhook(ctx: &Ctx, w: RawWebhook) -> Result<Webhook, ConfigError> {
    let ctx = &ctx.within("alerts.webhook");
    let required = |name: &str, v: Option<String>| -> Result<String, ConfigError> {
        match v {
            Some(s) if !s.is_empty() => Ok(s),
            Some(_) => Err(ctx.err(name, "must not be empty")),
            None => Err(ctx.err(name, "is required")),
        }
    };
    let cluster = required("cluster", w.cluster)?;
    let authority = required("authority", w.authority)?;
    let path = absolute(ctx, "path", w.path.unwrap_or_else(|| "/".to_string()))?;
    let timeout_ms = ctx.int_or("timeout_ms", &w.timeout_ms, 1..=60_000, 2_000)?;
    let env_name = |n: &&String| n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if let Some(other) = w
        .hmac_secret_env
        .as_ref()
        .filter(|n| n.is_empty() || !env_name(n))
    {
        let reason = format!("must be an environment variable name (got \"{other}\")");
        return Err(ctx.err("hmac_secret_env", reason));
    }
    Ok(Webhook {
        cluster,
        authority,
        path,
        timeout_ms,
        hmac_secret_env: w.hmac_secret_env,
    })
}

pub(super) fn prices(
    ctx: &Ctx,
    raw: Option<std::collections::BTreeMap<String, Obj<RawPrice>>>,
) -> Result<Prices, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Prices::default());
    };
    ctx.at_most("prices", raw.len(), prices::MAX_PRICED_MODELS, "models")?;
    let mut models = Vec::with_capacity(raw.len());
    for (model, Obj(p)) in raw {
        if model.trim().is_empty() {
            return Err(ctx.err("prices", "a model name must not be empty"));
        }
        let field = |name: &str| format!("prices.{model}.{name}");
        let price = |name: &str,
                     v: Option<serde_json::Value>|
         -> Result<Option<u64>, ConfigError> {
            v.map(|v| {
                    let micro =
                        prices::micro_per_million(&v).map_err(|why| ctx.err(&field(name), why))?;
                    // Kept in micro-dollars per million tokens: a price that
                    // rounds to nothing would make the model free.
                    if micro == 0 && v.as_f64().is_some_and(|f| f > 0.0) {
                        return Err(ctx.err(
                            &field(name),
                            format!("{v} rounds to $0 (prices are kept in micro-dollars per million tokens): the smallest price is 0.000001, or 0 for free"),
                        ));
                    }
                    Ok(micro)
                })
                .transpose()
        };
        let input = price("input_per_million", p.input_per_million)?
            .ok_or_else(|| ctx.err(&field("input_per_million"), "is required"))?;
        let output = price("output_per_million", p.output_per_million)?
            .ok_or_else(|| ctx.err(&field("output_per_million"), "is required"))?;
        let cached_input =
            price("cached_input_per_million", p.cached_input_per_million)?.unwrap_or(input);
        let cache_write =
            price("cache_write_per_million", p.cache_write_per_million)?.unwrap_or(input);
        let label = prices::label(&model);
        if label == "other" {
            return Err(ctx.err(
                &format!("prices.{model}"),
                "\"other\" is the model label of unpriced models; name the model as requests do",
            ));
        }
        if label.starts_with('.') || label.ends_with('.') || label.contains("..") {
            return Err(ctx.err(
                &format!("prices.{model}"),
                "a model name may not start or end with a dot, or hold two in a row (it is part of a metric name)",
            ));
        }
        if let Some(other) = models.iter().find(|m: &&ModelPrice| m.label == label) {
            return Err(ctx.err(
                "prices",
                format!(
                    "models \"{}\" and \"{model}\" have the same metric label \"{label}\"",
                    other.model
                ),
            ));
        }
        models.push(ModelPrice {
            model,
            label,
            input,
            output,
            cached_input,
            cache_write,
        });
    }
    Ok(Prices { models })
}
