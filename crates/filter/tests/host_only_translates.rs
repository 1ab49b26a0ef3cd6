//! The host adapters only translate between Envoy and the core (this
//! crate for proxy-wasm, `crates/native` for Envoy's dynamic modules):
//! their sources never look at the store kind, the detection mode, the policy's
//! action or any other policy setting. This test reads them and fails if
//! one does (decisions belong in `loopguard-core`, where the flow is tested
//! natively).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)] // a test

use std::fs;
use std::path::{Path, PathBuf};

/// Names that only code deciding about policy would use.
const FORBIDDEN: &[&str] = &[
    "StoreConfig",
    "RedisWebdis",
    "OnStoreError",
    "Similarity",
    "Verdict",
    "Decision",
    "ToolStep",
    "ToolVerdict",
    "Mode::",
    "Action::Reject",
    "Action::Warn",
    "Action::Throttle",
    "config::Action",
    ".policies",
    ".detection",
    ".tool_loops",
    "max_body_bytes",
    "hold_request_headers",
    "access_log",
    "decision::",
    "tool_loops::",
    "fingerprint::",
    "policy::",
    "window::",
    "slot_table::record",
];

/// Both hosts' source folders.
fn host_dirs() -> [PathBuf; 2] {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    [here.join("src"), here.join("../native/src")]
}

#[test]
fn host_sources_decide_nothing() {
    for dir in host_dirs() {
        decides_nothing(&dir);
    }
}

/// Every `.rs` file under `dir`, subfolders included.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn decides_nothing(dir: &Path) {
    let mut checked = 0;
    let mut found = Vec::new();
    for path in rust_files(dir) {
        let text = fs::read_to_string(&path).unwrap();
        checked += 1;
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in FORBIDDEN {
                if code.contains(word) {
                    found.push(format!(
                        "{}:{}: {word}: {}",
                        path.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        checked >= 6,
        "the host sources were not found in {}",
        dir.display()
    );
    assert!(
        found.is_empty(),
        "host code deciding about policy:\n{}",
        found.join("\n")
    );
}

/// The hosts reach the core through one module, `loopguard_core::host`
/// (the engine, effects, request facts, store calls and replies): nothing
/// of its insides.
#[test]
fn hosts_use_only_the_core_s_host_module() {
    let mut found = Vec::new();
    for dir in host_dirs() {
        for path in rust_files(&dir) {
            let text = fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let mut rest = code;
                while let Some(at) = rest.find("loopguard_core::") {
                    let after = &rest[at + "loopguard_core::".len()..];
                    if !after.starts_with("host") {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                    rest = after;
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "host code reaching past loopguard_core::host:\n{}",
        found.join("\n")
    );
}

#[test]
fn host_files_are_small_enough_to_read_in_one_sitting() {
    for dir in host_dirs() {
        for path in rust_files(&dir) {
            // abi.rs is the fallible host-call layer (declarations and
            // wrappers); the native hooks.rs declares the hooks Envoy calls.
            if path
                .file_name()
                .is_some_and(|n| n == "abi.rs" || n == "hooks.rs")
            {
                continue;
            }
            let lines = fs::read_to_string(&path).unwrap().lines().count();
            assert!(lines <= 300, "{} has {lines} lines", path.display());
        }
    }
}

/// The check itself catches what it should (a test that cannot fail
/// proves nothing).
#[test]
fn the_check_catches_a_policy_decision() {
    let decides = "    if let StoreConfig::RedisWebdis(r) = &plugin.config.store {";
    assert!(FORBIDDEN.iter().any(|w| decides.contains(w)));
    let translates = "    let _ = abi::add_request_header(name, &value);";
    assert!(!FORBIDDEN.iter().any(|w| translates.contains(w)));
}
