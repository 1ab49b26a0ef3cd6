//! Which requests a policy judges and who the caller is: the selector,
//! its paths, the limit keys and the exemptions.

use super::{absolute, is_token_byte, ConfigError, Ctx, Obj, RawExempt, RawSelector};
use crate::config::{
    normalize_host, ExemptMatch, Exemption, LimitKey, PathMatch, Selector, MAX_EXEMPTIONS,
    MAX_LIMIT_KEYS, MAX_ROUTES,
};

pub(super) fn selector(ctx: &Ctx, s: RawSelector) -> Result<Selector, ConfigError> {
    let sel = &ctx.within("selector");
    let path = match (s.path_exact, s.path_prefix) {
        (Some(_), Some(_)) => {
            return Err(ctx.err("selector", "may give pathExact or pathPrefix, not both"))
        }
        (Some(p), None) => PathMatch::Exact(check_path(sel, "pathExact", p)?),
        (None, Some(p)) => PathMatch::Prefix(check_path(sel, "pathPrefix", p)?),
        (None, None) => PathMatch::Any,
    };
    let given = sel.non_empty("methods", &s.methods)?.unwrap_or_default();
    let mut methods = Vec::with_capacity(given.len());
    for (i, m) in given.iter().enumerate() {
        if m.is_empty() || !m.bytes().all(is_token_byte) {
            return Err(sel.err(
                &format!("methods[{i}]"),
                format!("must be an HTTP method token (got \"{m}\")"),
            ));
        }
        methods.push(m.to_ascii_uppercase());
    }
    let given = sel.non_empty("hosts", &s.hosts)?.unwrap_or_default();
    let mut hosts = Vec::with_capacity(given.len());
    for (i, h) in given.iter().enumerate() {
        let host = normalize_host(h);
        let body = host.strip_prefix("*.").unwrap_or(&host);
        let ok = !body.is_empty()
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b));
        if !ok {
            return Err(sel.err(
                &format!("hosts[{i}]"),
                format!("must be a host name, optionally starting with \"*.\" (got \"{h}\")"),
            ));
        }
        hosts.push(host);
    }
    let routes = sel.non_empty("routes", &s.routes)?.unwrap_or_default();
    sel.at_most("routes", routes.len(), MAX_ROUTES, "routes")?;
    if let Some(i) = routes.iter().position(String::is_empty) {
        return Err(sel.err(&format!("routes[{i}]"), "must not be empty"));
    }
    Ok(Selector {
        path,
        methods,
        hosts,
        routes: routes.to_vec(),
    })
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

pub(super) fn limit_keys(
    ctx: &Ctx,
    list: Option<Vec<String>>,
) -> Result<Vec<LimitKey>, ConfigError> {
    let list = list.unwrap_or_default();
    ctx.at_most("limit_keys", list.len(), MAX_LIMIT_KEYS, "keys")?;
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

pub(super) fn exempt(
    ctx: &Ctx,
    list: Option<Vec<Obj<RawExempt>>>,
) -> Result<Vec<Exemption>, ConfigError> {
    let list = list.unwrap_or_default();
    ctx.at_most("exempt", list.len(), MAX_EXEMPTIONS, "entries")?;
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
