//! The structural JSON scanner against serde_json: no panic on any input,
//! and every document serde_json accepts, the scanner accepts too, with the
//! same top-level members and elements.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard_core::request::llm::scan;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let doc = scan::document(data);
    if let Some(span) = doc {
        let _ = scan::members(data, span);
        let _ = scan::elements(data, span);
        let _ = scan::canonical(data, span);
    }
    if let Ok(v) = serde_json::from_slice::<Value>(data) {
        let span = doc.expect("the scanner refused JSON serde_json accepts");
        match v {
            Value::Object(m) => {
                let keys = scan::members(data, span).expect("the members of an object").len();
                // serde_json keeps the last of duplicate keys; the scanner lists all.
                assert!(keys >= m.len());
            }
            Value::Array(a) => assert_eq!(scan::elements(data, span).map(|x| x.len()), Some(a.len())),
            _ => {}
        }
    }
});
