//! The similarity modes (llm_tail, session, near) and their settings, and
//! the masking of volatile values in the text they compare.

use super::tests::{err_of, ld, with};
use super::*;
use serde_json::json;

#[test]
fn llm_tail_and_session_modes() {
    let mut v = with(&ld("similarity"), json!("llm_tail"));
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(d.similarity, Similarity::LlmTail { tail_messages: 3 });
    v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(6);
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(d.similarity, Similarity::LlmTail { tail_messages: 6 });
    v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(0);
    assert!(err_of(v.clone()).contains("loop_detection.tail_messages must be >= 1 (got 0)"));
    v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(65);
    assert!(err_of(v).contains("must be <= 64"));
    assert!(err_of(with(&ld("tail_messages"), json!(3)))
        .contains("loop_detection.tail_messages applies only to similarity \"llm_tail\""));
    assert!(err_of(with(&ld("session_header"), json!("x-s")))
        .contains("session_header applies only to similarity \"session\""));
    assert!(err_of(with(&ld("fallback_threshold"), json!(9)))
        .contains("fallback_threshold applies only"));

    let mut v = with(&ld("similarity"), json!("session"));
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(
        d.similarity,
        Similarity::Session {
            header: "x-session-id".into(),
            fallback_steps: vec![Step {
                at: 25,
                action: Action::Reject
            }]
        }
    );
    assert_eq!(d.ladder(true).threshold(), 25);
    assert_eq!(d.ladder(true).hits_to_keep(), 25);
    assert_eq!(d.ladder(false).threshold(), 5);
    v["policies"][0]["spec"]["loop_detection"]["session_header"] = json!("X-Agent-Session");
    v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(12);
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(
        d.similarity,
        Similarity::Session {
            header: "x-agent-session".into(),
            fallback_steps: vec![Step {
                at: 12,
                action: Action::Reject
            }]
        }
    );
    v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(4);
    assert!(err_of(v.clone())
        .contains("loop_detection.fallback_threshold must be >= the threshold (4 < 5)"));
    v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(10);
    v["policies"][0]["spec"]["loop_detection"]["session_header"] = json!("bad header");
    assert!(err_of(v).contains("session_header must be a header name"));
}

#[test]
fn fallback_ladder_scales_every_step() {
    let steps = [
        Step {
            at: 3,
            action: Action::Warn,
        },
        Step {
            at: 5,
            action: Action::Throttle,
        },
        Step {
            at: 8,
            action: Action::Reject,
        },
    ];
    assert_eq!(
        scale_steps(&steps, 15),
        vec![
            Step {
                at: 15,
                action: Action::Warn
            },
            Step {
                at: 25,
                action: Action::Throttle
            },
            Step {
                at: 40,
                action: Action::Reject
            }
        ]
    );
    // Capped at 1024, where the later step wins.
    assert_eq!(
        scale_steps(&steps, 1000),
        vec![
            Step {
                at: 1000,
                action: Action::Warn
            },
            Step {
                at: 1024,
                action: Action::Reject
            }
        ]
    );
}

#[test]
fn near_mode_settings() {
    let near = |extra: Value| {
        let mut v = with(&ld("similarity"), json!("near"));
        for (k, x) in extra.as_object().unwrap() {
            v["policies"][0]["spec"]["loop_detection"][k] = x.clone();
        }
        v
    };
    let cfg = Config::from_value(&near(json!({}))).unwrap();
    assert_eq!(
        cfg.policies[0].detection.as_ref().unwrap().similarity,
        Similarity::Near {
            tail_messages: 3,
            similarity_milli: crate::config::DEFAULT_NEAR_SIMILARITY_MILLI,
            history: 64
        }
    );
    let cfg = Config::from_value(&near(
        json!({"near_similarity": 0.35, "near_history": 1024, "tail_messages": 5}),
    ))
    .unwrap();
    assert_eq!(
        cfg.policies[0].detection.as_ref().unwrap().similarity,
        Similarity::Near {
            tail_messages: 5,
            similarity_milli: 350,
            history: 1024
        }
    );
    // 1 is allowed (every word shared); an integral 1.0 too.
    assert!(Config::from_value(&near(json!({"near_similarity": 1}))).is_ok());
    for bad in [json!(0), json!(-0.2), json!(1.01), json!(2)] {
        let e = err_of(near(json!({ "near_similarity": bad })));
        assert!(
            e.contains("policy \"llm-policy\": loop_detection.near_similarity must be above 0 and at most 1"),
            "{e}"
        );
    }
    assert!(err_of(near(json!({"near_similarity": "0.5"}))).contains(
        "loop_detection.near_similarity must be a number above 0 and at most 1 (got \"0.5\")"
    ));
    // The SimHash distance is gone: its replacement is named.
    let e = err_of(near(json!({"near_distance": 3})));
    assert!(
        e.contains("policy \"llm-policy\": loop_detection.near_distance was replaced by \"near_similarity\""),
        "{e}"
    );
    assert!(err_of(near(json!({"near_history": 0})))
        .contains("loop_detection.near_history must be >= 1 (got 0)"));
    // The history must hold the threshold's count.
    assert!(err_of(near(json!({"near_history": 4})))
        .contains("loop_detection.near_history must be >= the count of the last step (4 < 5)"));
    // Near settings elsewhere are errors.
    assert!(err_of(with(&ld("near_similarity"), json!(0.5)))
        .contains("loop_detection.near_similarity applies only to similarity \"near\""));
    assert!(err_of(with(&ld("tail_messages"), json!(3)))
        .contains("applies only to similarity \"llm_tail\" or \"near\""));
}

#[test]
fn volatile_masking_settings() {
    let spec = |volatile: Value, similarity: &str| {
        let mut v = with(&ld("similarity"), json!(similarity));
        v["policies"][0]["spec"]["volatile"] = volatile;
        v
    };
    use crate::request::llm::volatile::Class;
    // Default: every class but every-number masking, arguments unmasked.
    let cfg = Config::from_value(&with(&ld("similarity"), json!("llm_tail"))).unwrap();
    assert_eq!(cfg.policies[0].volatile, Volatile::default_on());
    let cfg = Config::from_value(&spec(
        json!({"classes": ["uuid", "datetime"], "tool_arguments": true}),
        "llm_tail",
    ))
    .unwrap();
    let v = cfg.policies[0].volatile;
    assert!(v.classes.contains(Class::Uuid) && v.classes.contains(Class::DateTime));
    assert!(!v.classes.contains(Class::Epoch));
    assert!(v.tool_arguments);
    let off = Config::from_value(&spec(json!({"enabled": false}), "near")).unwrap();
    assert_eq!(off.policies[0].volatile, Volatile::OFF);
    assert!(err_of(spec(json!({"classes": ["uuids"]}), "llm_tail"))
        .contains("policy \"llm-policy\": volatile.classes[0]"));
    assert!(err_of(spec(json!({"classes": []}), "llm_tail"))
        .contains("volatile.classes must not be empty"));
    assert!(err_of(spec(
        json!({"enabled": false, "tool_arguments": true}),
        "llm_tail"
    ))
    .contains("volatile.enabled is false, so \"classes\" and \"tool_arguments\" would do nothing"));
    // Exact and session modes compare no text.
    assert!(err_of(spec(json!({}), "exact")).contains(
        "volatile applies only to similarity \"llm_tail\" or \"near\", or to tool_loops"
    ));
    assert!(err_of(spec(json!({"clases": []}), "llm_tail")).contains("did you mean \"classes\""));
}
