//! The checked-in JSON Schema (`schema/loopguard.schema.json`) is the one
//! the configuration types generate (`make schema` writes it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)] // a test
#![cfg(feature = "schema")]

use loopguard_core::config::{schema, Config};

const CHECKED_IN: &str = include_str!("../../../schema/loopguard.schema.json");

#[test]
fn checked_in_schema_is_current() {
    let generated = serde_json::to_string_pretty(&schema()).unwrap() + "\n";
    assert!(
        CHECKED_IN == generated,
        "schema/loopguard.schema.json is out of date: run `make schema`"
    );
}

#[test]
fn the_schema_names_every_field_the_configuration_accepts() {
    let s: serde_json::Value = serde_json::from_str(CHECKED_IN).unwrap();
    let top: Vec<&str> = s["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for key in [
        "$schema",
        "max_tracked_fingerprints",
        "max_body_bytes",
        "hold_request_headers",
        "policies",
        "store",
        "alerts",
    ] {
        assert!(top.contains(&key), "{key}");
    }
    // A configuration using $schema loads.
    let cfg = Config::parse(
        br#"{"$schema": "https://example/loopguard.schema.json", "policies": [{"id": "p", "spec": {"selector": {},
            "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}}]}"#,
    );
    assert!(cfg.is_ok(), "{cfg:?}");
}
