//! The services the filter calls: the shared store (`store`) and the
//! alert webhook (`alerts.webhook`).

use super::tests::{base, err_of, with};
use super::*;
use serde_json::json;

#[test]
fn store_block() {
    assert_eq!(
        Config::from_value(&base()).unwrap().store,
        StoreConfig::Local
    );
    assert_eq!(
        Config::from_value(&with(&["store"], json!({"type": "local"})))
            .unwrap()
            .store,
        StoreConfig::Local
    );
    let cfg = Config::from_value(&with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "loopguard_redis",
        "authority": "webdis", "timeout_ms": 25, "on_error": "local"}),
    ))
    .unwrap();
    assert_eq!(
        cfg.store,
        StoreConfig::RedisWebdis(RedisStore {
            topology: RedisTopology::Single,
            cluster: "loopguard_redis".into(),
            authority: "webdis".into(),
            path: "/".into(),
            timeout_ms: 25,
            on_error: OnStoreError::Local
        })
    );
    let cfg = Config::from_value(&with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "on_error": "allow"}),
    ))
    .unwrap();
    assert!(matches!(
        cfg.store,
        StoreConfig::RedisWebdis(RedisStore {
            on_error: OnStoreError::Allow,
            ..
        })
    ));
    assert!(err_of(with(&["store"], json!({"type": "redis_webdis"})))
        .starts_with("store.cluster is required"));
    assert!(err_of(with(&["store"], json!({"type": "redis"})))
        .starts_with("store.type must be \"local\" or \"redis_webdis\""));
    assert!(err_of(with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "timeout_ms": 0})
    ))
    .contains("store.timeout_ms must be >= 1"));
    assert!(err_of(with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "on_error": "deny"})
    ))
    .contains("store.on_error must be"));
    assert!(
        err_of(with(&["store"], json!({"type": "local", "cluster": "r"})))
            .contains("store.cluster applies only to the \"redis_webdis\" store")
    );
    assert!(err_of(with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "host": "x"})
    ))
    .contains("store.host is not a known field"));
}

#[test]
fn store_topology() {
    let topology = |store: serde_json::Value| match Config::from_value(&with(&["store"], store))
        .unwrap()
        .store
    {
        StoreConfig::RedisWebdis(r) => r.topology,
        StoreConfig::Local => panic!("a redis store"),
    };
    assert_eq!(
        topology(json!({"type": "redis_webdis", "cluster": "r"})),
        RedisTopology::Single
    );
    assert_eq!(
        topology(json!({"type": "redis_webdis", "cluster": "r", "topology": "single"})),
        RedisTopology::Single
    );
    assert_eq!(
        topology(json!({"type": "redis_webdis", "cluster": "r", "topology": "cluster"})),
        RedisTopology::Cluster
    );
    let err = err_of(with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "topology": "sentinel"}),
    ));
    assert!(
        err.contains("store.topology must be \"single\" or \"cluster\""),
        "{err}"
    );
    let err = err_of(with(
        &["store"],
        json!({"type": "local", "topology": "cluster"}),
    ));
    assert!(
        err.contains("store.topology applies only to the \"redis_webdis\" store"),
        "{err}"
    );
}

#[test]
fn webhook_alerts() {
    let cfg = Config::from_value(&with(
        &["alerts"],
        json!({"webhook": {"cluster": "alerts", "authority": "hooks.example.com",
        "path": "/loopguard", "timeout_ms": 500, "hmac_secret_env": "LOOPGUARD_WEBHOOK_SECRET"}}),
    ))
    .unwrap();
    assert_eq!(
        cfg.webhook,
        Some(Webhook {
            cluster: "alerts".into(),
            authority: "hooks.example.com".into(),
            path: "/loopguard".into(),
            timeout_ms: 500,
            hmac_secret_env: Some("LOOPGUARD_WEBHOOK_SECRET".into())
        })
    );
    let cfg = Config::from_value(&with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h"}}),
    ))
    .unwrap();
    let w = cfg.webhook.unwrap();
    assert_eq!(
        (w.path.as_str(), w.timeout_ms, w.hmac_secret_env),
        ("/", 2_000, None)
    );
    assert!(Config::from_value(&base()).unwrap().webhook.is_none());
    assert!(
        err_of(with(&["alerts"], json!({"webhook": {"authority": "h"}})))
            .starts_with("alerts.webhook.cluster is required")
    );
    assert!(err_of(with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h", "path": "x"}})
    ))
    .contains("alerts.webhook.path must start with"));
    assert!(err_of(with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h", "timeout_ms": 0}})
    ))
    .contains("alerts.webhook.timeout_ms must be >= 1"));
    assert!(err_of(with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h", "hmac_secret_env": "A B"}})
    ))
    .contains("hmac_secret_env must be an environment variable name"));
    assert!(err_of(with(&["alerts"], json!({"slack": {}})))
        .starts_with("alerts.slack is not a known field"));
}

#[test]
fn prices_are_read_and_each_error_names_the_field() {
    let cfg = Config::from_value(&with(
        &["prices"],
        json!({"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10, "cached_input_per_million": 1.25},
               "openai/gpt-4.1": {"input_per_million": 2, "output_per_million": 8, "cache_write_per_million": 2.5}}),
    ))
    .unwrap();
    let m = &cfg.prices.models;
    assert_eq!(m.len(), 2);
    assert_eq!(
        (
            m[0].model.as_str(),
            m[0].input,
            m[0].cached_input,
            m[0].cache_write
        ),
        ("gpt-4o", 2_500_000, 1_250_000, 2_500_000)
    );
    assert_eq!(
        (m[1].label.as_str(), m[1].cached_input, m[1].cache_write),
        ("openai_gpt-4.1", 2_000_000, 2_500_000)
    );
    assert!(Config::from_value(&base())
        .unwrap()
        .prices
        .models
        .is_empty());
    let e = |prices: Value| err_of(with(&["prices"], prices));
    assert_eq!(
        e(json!({"gpt-4o": {"output_per_million": 10}})),
        "prices.gpt-4o.input_per_million is required"
    );
    assert_eq!(
        e(json!({"gpt-4o": {"input_per_million": -1, "output_per_million": 10}})),
        "prices.gpt-4o.input_per_million must be >= 0 (got -1)"
    );
    assert_eq!(
        e(json!({"gpt-4o": {"input_per_million": 1e-7, "output_per_million": 10}})),
        "prices.gpt-4o.input_per_million 1e-7 rounds to $0 (prices are kept in micro-dollars per million tokens): the smallest price is 0.000001, or 0 for free"
    );
    assert!(
        e(json!({"gpt-4o": {"input_per_million": "2.5", "output_per_million": 10}}))
            .contains("must be a number of US dollars per million tokens")
    );
    assert!(e(
        json!({"a_b": {"input_per_million": 1, "output_per_million": 1},
                     "a/b": {"input_per_million": 1, "output_per_million": 1}})
    )
    .contains("have the same metric label"));
    assert!(e(
        json!({"gpt-4o": {"input_per_million": 1, "output_per_million": 1, "input_per_milion": 1}})
    )
    .contains("input_per_milion"));
    assert!(
        e(json!({"other": {"input_per_million": 1, "output_per_million": 1}}))
            .contains("label of unpriced models")
    );
    assert!(
        e(json!({"gpt..4": {"input_per_million": 1, "output_per_million": 1}}))
            .contains("may not start or end with a dot")
    );
    let many: serde_json::Map<String, Value> = (0..65)
        .map(|i| {
            (
                format!("m{i}"),
                json!({"input_per_million": 1, "output_per_million": 1}),
            )
        })
        .collect();
    assert!(e(Value::Object(many)).contains("at most 64 models"));
}
