//! Any bytes as an LLM request body, for every format: recognition, the
//! tail, tool calls (with and without the cache, which must agree), the
//! tool-loop judge and the byte-level edits. An edit of a body that is valid
//! JSON must leave valid JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard_core::config::Config;
use loopguard_core::request::llm::{self, CallCache};
use loopguard_core::detect::progress::TextCache;
use loopguard_core::detect::tool_loops;

const PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/messages", "/v1/responses"];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let path = PATHS[usize::from(sel) % PATHS.len()];
    // Keep a few items or all of them, as policies do.
    let keep = if sel & 0x80 == 0 { usize::from(sel % 8) } else { usize::MAX };
    let Ok(req) = llm::parse(body, path, keep) else { return };
    let _ = req.tail_before(usize::from(sel % 8), usize::MAX);
    let _ = req.first_message();
    let plain = req.tool_history(None);
    let mut cache = CallCache::default();
    assert_eq!(req.tool_history(Some(&mut cache)), plain);
    assert_eq!(req.tool_history(Some(&mut cache)), plain);
    let cfg = Config::parse(br#"{"policies": [{"id": "p", "spec": {"selector": {},
        "tool_loops": {"enabled": true, "identical_min": 2, "pattern_min": 2, "directive_disables_tools": true}}}]}"#)
        .ok()
        .and_then(|c| c.policies.into_iter().next())
        .and_then(|p| p.tool_loops);
    if let Some(cfg) = cfg {
        // The text cache only saves work: the verdict is the same with
        // none, an empty one, and one the same body filled.
        let verdict = tool_loops::judge(&cfg, &plain, &req, None);
        let texts = TextCache::default();
        assert_eq!(tool_loops::judge(&cfg, &plain, &req, Some(&texts)), verdict);
        assert_eq!(tool_loops::judge(&cfg, &plain, &req, Some(&texts)), verdict);
        if let Some(v) = verdict {
            let _ = tool_loops::rewrite(&cfg, &req, &v);
        }
    }
    let valid = serde_json::from_slice::<serde_json::Value>(body).is_ok();
    for edited in [req.with_note("note \"quoted\""), req.with_note_and_no_tools("n")].into_iter().flatten() {
        if valid {
            assert!(serde_json::from_slice::<serde_json::Value>(&edited).is_ok(), "an edit broke valid JSON");
        }
    }
});
