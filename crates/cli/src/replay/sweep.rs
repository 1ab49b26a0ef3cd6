//! `--set PATH=V1,V2,...`: one run per value, with the configuration's
//! field at PATH set to it.
//!
//! PATH walks the configuration's JSON: object fields by name, list items
//! by their `id` or `name` (or position), and a policy's `spec` may be left
//! out (`policies.agents.loop_detection.threshold_identical_requests` is
//! `policies[id=agents].spec.loop_detection.threshold_identical_requests`;
//! `policies.agents.budget.limits.session-hour.usd` is the `usd` of the
//! budget limit named `session-hour`).
//!
//! One PATH is not the configuration's: `budget.unpriced=max,reject,ignore`
//! sets `budget.unpriced` in every policy with a dollar cap (what such a
//! cap charges a model no price names).

use serde_json::Value;

/// The `--set` key that sets `budget.unpriced` in every policy with a
/// dollar cap.
pub const UNPRICED: &str = "budget.unpriced";
/// Its values.
const UNPRICED_VALUES: [&str; 3] = ["max", "reject", "ignore"];

/// A parsed `--set`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    pub path: String,
    pub values: Vec<Value>,
}

impl Sweep {
    /// `PATH=V1,V2,...`; each value is read as JSON when it is JSON (`3`,
    /// `0.35`, `true`, `"x"`), else as text.
    pub fn parse(arg: &str) -> Result<Sweep, String> {
        let (path, values) = arg
            .split_once('=')
            .ok_or_else(|| format!("--set {arg}: expected PATH=VALUE[,VALUE...]"))?;
        let path = path.trim();
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(format!(
                "--set {arg}: the path is empty or has an empty part"
            ));
        }
        let values: Vec<Value> = values
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string())))
            .collect();
        if values.is_empty() {
            return Err(format!("--set {arg}: give at least one value"));
        }
        if path == UNPRICED {
            if let Some(v) = values
                .iter()
                .find(|v| !v.as_str().is_some_and(|s| UNPRICED_VALUES.contains(&s)))
            {
                let shown = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                return Err(format!(
                    "--set {arg}: {UNPRICED} is max, reject or ignore (got {shown})"
                ));
            }
        }
        Ok(Sweep {
            path: path.to_string(),
            values,
        })
    }
}

/// Set the field at `path` in `config` to `value`: the objects and list
/// items on the way must exist; the field itself is added if absent (the
/// configuration's validation then refuses a misspelt one). A policy's
/// `spec` may be left out of the path.
pub fn set(config: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path == UNPRICED {
        return set_unpriced(config, &value);
    }
    let parts: Vec<&str> = path.split('.').collect();
    let Some((last, walk)) = parts.split_last() else {
        return Err("empty path".to_string());
    };
    let mut at = config;
    let mut seen = String::new();
    for part in walk {
        at = step(at, part).ok_or_else(|| missing(&seen, part))?;
        push(&mut seen, part);
    }
    match at {
        Value::Object(o) if o.contains_key(*last) => {
            o.insert((*last).to_string(), value);
        }
        // A field the configuration leaves at its default is added (in a
        // policy, to its spec); a misspelt one is then refused by the
        // configuration's own validation, with its suggestion.
        Value::Object(o) => {
            let into = match o.get_mut("spec") {
                Some(Value::Object(spec)) => spec,
                _ => o,
            };
            into.insert((*last).to_string(), value);
        }
        Value::Array(_) => {
            let target = step(at, last).ok_or_else(|| missing(&seen, last))?;
            *target = value;
        }
        _ => return Err(missing(&seen, last)),
    }
    Ok(())
}

/// `budget.unpriced` in every policy whose budget has a dollar cap (a
/// limit with `usd`): the only policies it applies to.
fn set_unpriced(config: &mut Value, value: &Value) -> Result<(), String> {
    let mut set = 0;
    let policies = config
        .get_mut("policies")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten();
    for p in policies {
        let spec = match p.get_mut("spec") {
            Some(spec) => spec,
            None => p,
        };
        let Some(budget) = spec.get_mut("budget").and_then(Value::as_object_mut) else {
            continue;
        };
        let dollars = budget
            .get("limits")
            .and_then(Value::as_array)
            .is_some_and(|limits| limits.iter().any(|l| l.get("usd").is_some()));
        if dollars {
            budget.insert("unpriced".to_string(), value.clone());
            set += 1;
        }
    }
    if set == 0 {
        return Err(format!(
            "--set: {UNPRICED} applies to dollar caps, and no policy has a budget with a usd limit"
        ));
    }
    Ok(())
}

/// One step down: an object's field (or its `spec`'s), a list's item by
/// `id`, else `name`, else position.
fn step<'a>(at: &'a mut Value, part: &str) -> Option<&'a mut Value> {
    match at {
        Value::Object(o) => {
            if o.contains_key(part) {
                o.get_mut(part)
            } else {
                o.get_mut("spec")
                    .and_then(Value::as_object_mut)
                    .and_then(|spec| spec.get_mut(part))
            }
        }
        Value::Array(items) => {
            let named = |key: &str| {
                items
                    .iter()
                    .position(|i| i.get(key).and_then(Value::as_str) == Some(part))
            };
            let index = named("id")
                .or_else(|| named("name"))
                .or_else(|| part.parse::<usize>().ok())?;
            items.get_mut(index)
        }
        _ => None,
    }
}

fn push(seen: &mut String, part: &str) {
    if !seen.is_empty() {
        seen.push('.');
    }
    seen.push_str(part);
}

fn missing(seen: &str, part: &str) -> String {
    if seen.is_empty() {
        format!("--set: the configuration has no field {part}")
    } else {
        format!(
            "--set: {seen} has no field or item {part} (lists are walked by item id, name or position)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_values_as_json_or_text() {
        let s = Sweep::parse("policies.a.x=3, 4,0.35,true,near").unwrap();
        assert_eq!(s.path, "policies.a.x");
        assert_eq!(
            s.values,
            vec![json!(3), json!(4), json!(0.35), json!(true), json!("near")]
        );
        assert!(Sweep::parse("nothing").is_err());
        assert!(Sweep::parse("a..b=1").is_err());
        assert!(Sweep::parse("a=").is_err());
    }

    #[test]
    fn walks_policies_by_id_and_skips_spec() {
        let mut c = json!({"policies": [
            {"id": "other", "spec": {"loop_detection": {"threshold_identical_requests": 9}}},
            {"id": "agents", "spec": {"loop_detection": {"threshold_identical_requests": 5}}}
        ]});
        set(
            &mut c,
            "policies.agents.loop_detection.threshold_identical_requests",
            json!(3),
        )
        .unwrap();
        assert_eq!(
            c["policies"][1]["spec"]["loop_detection"]["threshold_identical_requests"],
            3
        );
        assert_eq!(
            c["policies"][0]["spec"]["loop_detection"]["threshold_identical_requests"],
            9
        );
        set(
            &mut c,
            "policies.0.spec.loop_detection.threshold_identical_requests",
            json!(7),
        )
        .unwrap();
        assert_eq!(
            c["policies"][0]["spec"]["loop_detection"]["threshold_identical_requests"],
            7
        );
        set(
            &mut c,
            "policies.agents.loop_detection.near_similarity",
            json!(0.5),
        )
        .unwrap();
        assert_eq!(
            c["policies"][1]["spec"]["loop_detection"]["near_similarity"],
            0.5
        );
        set(&mut c, "policies.agents.mode", json!("shadow")).unwrap();
        assert_eq!(c["policies"][1]["spec"]["mode"], "shadow");
        let err = set(&mut c, "policies.agents.loop_detecton.threshold", json!(3)).unwrap_err();
        assert!(
            err.contains("policies.agents has no field or item loop_detecton"),
            "{err}"
        );
        let err = set(&mut c, "policies.nobody.loop_detection", json!(3)).unwrap_err();
        assert!(
            err.contains("policies has no field or item nobody"),
            "{err}"
        );
    }

    #[test]
    fn budget_limits_are_found_by_name() {
        let mut c = json!({"policies": [{"id": "agents", "spec": {"budget": {"limits": [
            {"name": "session-hour", "per": "session", "window_seconds": 3600, "usd": 5},
            {"name": "caller-day", "per": "caller", "window_seconds": 86400, "usd": 50},
            {"name": "0", "per": "caller", "window_seconds": 60, "calls": 9}
        ]}}}]});
        set(
            &mut c,
            "policies.agents.budget.limits.caller-day.usd",
            json!(20),
        )
        .unwrap();
        set(
            &mut c,
            "policies.agents.budget.limits.session-hour.usd",
            json!(2),
        )
        .unwrap();
        let limits = &c["policies"][0]["spec"]["budget"]["limits"];
        assert_eq!(
            (limits[0]["usd"].as_i64(), limits[1]["usd"].as_i64()),
            (Some(2), Some(20))
        );
        // A name that reads as a position is the name.
        set(&mut c, "policies.agents.budget.limits.0.calls", json!(3)).unwrap();
        assert_eq!(limits_of(&c)[2]["calls"], 3);
        set(&mut c, "policies.agents.budget.limits.1.usd", json!(30)).unwrap();
        assert_eq!(limits_of(&c)[1]["usd"], 30);
        let err = set(&mut c, "policies.agents.budget.limits.hourly.usd", json!(1)).unwrap_err();
        assert!(
            err.contains("policies.agents.budget.limits has no field or item hourly (lists are walked by item id, name or position)"),
            "{err}"
        );
    }

    #[test]
    fn budget_unpriced_is_set_in_every_policy_with_a_dollar_cap() {
        let s = Sweep::parse("budget.unpriced=max,reject,ignore").unwrap();
        assert_eq!(
            s.values,
            vec![json!("max"), json!("reject"), json!("ignore")]
        );
        for bad in [
            "budget.unpriced=free",
            "budget.unpriced=max,3",
            "budget.unpriced=Max",
        ] {
            let err = Sweep::parse(bad).unwrap_err();
            assert!(
                err.contains(": budget.unpriced is max, reject or ignore (got "),
                "{err}"
            );
        }
        assert_eq!(
            Sweep::parse("budget.unpriced=free").unwrap_err(),
            "--set budget.unpriced=free: budget.unpriced is max, reject or ignore (got free)"
        );
        let usd =
            json!({"limits": [{"name": "d", "per": "caller", "window_seconds": 60, "usd": 1}]});
        let calls =
            json!({"limits": [{"name": "c", "per": "caller", "window_seconds": 60, "calls": 1}]});
        let mut c = json!({"policies": [
            {"id": "a", "spec": {"budget": usd.clone()}},
            {"id": "b", "spec": {"budget": calls}},
            {"id": "c", "spec": {"loop_detection": {"enabled": true}}},
            {"id": "d", "spec": {"budget": usd}}
        ]});
        set(&mut c, UNPRICED, json!("reject")).unwrap();
        let unpriced: Vec<&Value> = (0..4)
            .map(|i| &c["policies"][i]["spec"]["budget"]["unpriced"])
            .collect();
        assert_eq!(
            unpriced,
            [
                &json!("reject"),
                &Value::Null,
                &Value::Null,
                &json!("reject")
            ]
        );
        let mut none = json!({"policies": [{"id": "b", "spec": {"budget": {"limits": [
            {"name": "c", "per": "caller", "window_seconds": 60, "calls": 1}]}}}]});
        let err = set(&mut none, UNPRICED, json!("max")).unwrap_err();
        assert_eq!(
            err,
            "--set: budget.unpriced applies to dollar caps, and no policy has a budget with a usd limit"
        );
    }

    fn limits_of(c: &Value) -> &Vec<Value> {
        c["policies"][0]["spec"]["budget"]["limits"]
            .as_array()
            .unwrap()
    }
}
