//! The services the filter calls through Envoy clusters: the shared store
//! (`store`) and the alert webhook (`alerts.webhook`).

use super::*;

pub(super) fn store(ctx: &Ctx, s: RawStore) -> Result<StoreConfig, ConfigError> {
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

pub(super) fn webhook(ctx: &Ctx, w: RawWebhook) -> Result<Webhook, ConfigError> {
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
