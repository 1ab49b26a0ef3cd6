//! The core's folders are the stages of a request, and each stage may use
//! only the stages before it: `config` (the model every stage reads),
//! then `request` (reading a request), `detect`, `state` (keeping it),
//! `act`, `response` (reading the answer), and last `flow`, which drives them all. This test reads the
//! sources and fails if a file reaches up (a `crate::` path naming a later
//! stage), so the arrows keep pointing one way as the code grows.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test

use std::fs;
use std::path::{Path, PathBuf};

/// The stages in order; a stage may use the ones before it.
const STAGES: &[&str] = &[
    "config", "request", "detect", "state", "act", "response", "flow",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file outside its test modules (tests may reach anywhere).
fn code(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |i| &text[..i])
}

#[test]
fn no_stage_uses_a_later_one() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (i, stage) in STAGES.iter().enumerate() {
        let dir = src.join(stage);
        let mut files = Vec::new();
        if dir.is_dir() {
            sources(&dir, &mut files);
        }
        // config lives in a folder; a stage may also be a single file.
        let file = src.join(format!("{stage}.rs"));
        if file.is_file() {
            files.push(file);
        }
        for path in files {
            let name = path.file_name().unwrap().to_string_lossy();
            if name.ends_with("tests.rs") {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            // Code lines only: a doc comment may point anywhere.
            let code: String = code(&text)
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for later in &STAGES[i + 1..] {
                let needle = format!("crate::{later}");
                if code.contains(&needle) {
                    broken.push(format!(
                        "{} uses {needle}",
                        path.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "a stage reaches up to a later one:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_stage_is_a_folder_that_exists() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for stage in STAGES {
        assert!(src.join(stage).is_dir(), "src/{stage}/ is missing");
    }
}
