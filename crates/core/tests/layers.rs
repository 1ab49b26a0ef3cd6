//! The core's folders are the stages of a request, and each stage may use
//! only the stages before it: `config` (the model every stage reads),
//! then `request` (reading a request), `detect`, `state` (keeping it),
//! `act`, `response` (reading the answer), and last `flow`, which drives them all. This test reads the
//! sources and fails if a file reaches up (a `crate::` path naming a later
//! stage), so the arrows keep pointing one way as the code grows. It also
//! holds ARCHITECTURE.md, the map of the repository, to the code: every
//! path it names exists, and every crate, module folder and top-level
//! module is named in it, with the stages in this order.
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

// ARCHITECTURE.md maps the repository; these tests hold it to the code.
//
// Its trees are its ```text blocks: a line whose first word starts at most
// two columns right of the entry above it is an entry (a file, or a folder
// ending in `/`), under the nearest entry to its left; a line indented
// further continues the entry's description. A file or folder named in a
// description (a word ending in `/`, or in a source extension) is read
// relative to the entry's folder or a folder above it. In the prose, a
// path in backticks with a `/` in it is read from the repository's root.

/// File endings that make a word in a description a path.
const EXTENSIONS: &[&str] = &[
    "rs", "py", "lua", "json", "jsonl", "yaml", "toml", "sh", "md", "mjs",
];

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Whether `word` names a file or folder.
fn path_like(word: &str) -> bool {
    let has_letter = word.chars().any(|c| c.is_ascii_alphabetic());
    if word.ends_with('/') {
        return has_letter && !word.starts_with('/');
    }
    word.rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && EXTENSIONS.contains(&ext))
}

/// A path ARCHITECTURE.md names: its line, and the folders (relative to
/// the root, each ending in `/` or empty for the root) it may be read from.
struct Named {
    line: usize,
    path: String,
    bases: Vec<String>,
}

impl Named {
    /// The path it resolves to, if it exists.
    fn resolve(&self, root: &Path) -> Option<String> {
        self.bases.iter().find_map(|base| {
            let full = format!("{base}{}", self.path);
            let on_disk = root.join(&full);
            let found = if full.ends_with('/') {
                on_disk.is_dir()
            } else {
                on_disk.is_file()
            };
            found.then_some(full)
        })
    }
}

/// A folder and every folder above it, nearest first, ending with the root.
fn bases(folder: &str) -> Vec<String> {
    let mut out = vec![folder.to_string()];
    let mut rest = folder.trim_end_matches('/');
    while let Some((up, _)) = rest.rsplit_once('/') {
        out.push(format!("{up}/"));
        rest = up;
    }
    if !folder.is_empty() {
        out.push(String::new());
    }
    out
}

/// What ARCHITECTURE.md says: its tree entries in order (full paths from
/// the root) and every path it names.
struct Architecture {
    entries: Vec<String>,
    named: Vec<Named>,
}

fn architecture() -> Architecture {
    let text = fs::read_to_string(root().join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md, the map of the repository, is missing");
    let mut entries = Vec::new();
    let mut named = Vec::new();
    let (mut fenced, mut tree) = (false, false);
    // The tree's open folders (indent, path), and the last entry's indent
    // and folder.
    let mut open: Vec<(usize, String)> = Vec::new();
    let mut last: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            tree = !fenced && trimmed == "```text";
            fenced = !fenced;
            open.clear();
            last = None;
            continue;
        }
        if !fenced {
            for (j, span) in line.split('`').enumerate() {
                let is_path = j % 2 == 1
                    && span.contains('/')
                    && !span.starts_with("target/")
                    && !span.contains(|c: char| c.is_whitespace() || "*=<>".contains(c))
                    && path_like(span);
                if is_path {
                    named.push(Named {
                        line: n,
                        path: span.to_string(),
                        bases: vec![String::new()],
                    });
                }
            }
            continue;
        }
        if !tree || trimmed.is_empty() {
            continue;
        }
        let indent = line.len() - trimmed.len();
        let entry = last
            .as_ref()
            .map_or(indent == 0, |(at, _)| indent <= at + 2);
        let description = if entry {
            let (word, rest) = trimmed
                .split_once(char::is_whitespace)
                .unwrap_or((trimmed, ""));
            while open.last().is_some_and(|(at, _)| *at >= indent) {
                open.pop();
            }
            let parent = open.last().map_or(String::new(), |(_, p)| p.clone());
            let full = format!("{parent}{word}");
            let folder = if full.ends_with('/') {
                open.push((indent, full.clone()));
                full.clone()
            } else {
                parent.clone()
            };
            entries.push(full.clone());
            named.push(Named {
                line: n,
                path: full,
                bases: vec![String::new()],
            });
            last = Some((indent, folder));
            rest
        } else {
            trimmed
        };
        let folder = last.as_ref().map_or(String::new(), |(_, f)| f.clone());
        let words = description
            .split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
            .map(|w| w.trim_end_matches('.'))
            .filter(|w| path_like(w));
        for word in words {
            named.push(Named {
                line: n,
                path: word.to_string(),
                bases: bases(&folder),
            });
        }
    }
    Architecture { entries, named }
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = root();
    let missing: Vec<String> = architecture()
        .named
        .iter()
        .filter(|p| p.resolve(&root).is_none())
        .map(|p| format!("line {}: {}", p.line, p.path))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist (renamed or removed? update the page):\n{}",
        missing.join("\n")
    );
}

/// Whether a source file is a test (unit tests sit beside their code).
fn is_test_file(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with("tests.rs"))
}

/// Whether a folder holds code other than tests, at any depth.
fn holds_code(dir: &Path) -> bool {
    let mut files = Vec::new();
    sources(dir, &mut files);
    files.iter().any(|f| !is_test_file(f))
}

/// What ARCHITECTURE.md must name, relative to the root (folders ending
/// in `/`): every crate; in each, every top-level module and every module
/// folder below `src/` that holds code, and every integration test and
/// example; and every top-level folder of the repository but `target/`.
fn must_be_named(root: &Path) -> Vec<String> {
    let rel = |p: &Path| p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
    let mut out = Vec::new();
    for entry in fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() && !name.starts_with('.') && name != "target" {
            out.push(format!("{name}/"));
        }
    }
    for krate in fs::read_dir(root.join("crates")).unwrap() {
        let krate = krate.unwrap().path();
        if !krate.is_dir() {
            continue;
        }
        out.push(format!("{}/", rel(&krate)));
        let mut folders = vec![krate.join("src")];
        while let Some(dir) = folders.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    if holds_code(&path) {
                        out.push(format!("{}/", rel(&path)));
                        folders.push(path);
                    }
                } else if dir == krate.join("src")
                    && path.extension().is_some_and(|e| e == "rs")
                    && !is_test_file(&path)
                {
                    out.push(rel(&path));
                }
            }
        }
        for extra in ["tests", "examples"] {
            let Ok(files) = fs::read_dir(krate.join(extra)) else {
                continue;
            };
            for entry in files {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs") {
                    out.push(rel(&path));
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn architecture_md_names_every_crate_module_and_folder() {
    let root = root();
    let named: Vec<String> = architecture()
        .named
        .iter()
        .filter_map(|p| p.resolve(&root))
        .collect();
    let unnamed: Vec<String> = must_be_named(&root)
        .into_iter()
        .filter(|p| !named.contains(p))
        .collect();
    assert!(
        unnamed.is_empty(),
        "ARCHITECTURE.md does not name (new or renamed? add it to the page):\n{}",
        unnamed.join("\n")
    );
}

#[test]
fn architecture_md_lists_the_stages_in_order() {
    let listed: Vec<&str> = architecture()
        .entries
        .iter()
        .filter_map(|e| e.strip_prefix("crates/core/src/")?.strip_suffix('/'))
        .filter(|s| !s.contains('/') && STAGES.contains(s))
        .map(|s| STAGES.iter().copied().find(|t| *t == s).unwrap())
        .collect();
    assert_eq!(
        listed, STAGES,
        "ARCHITECTURE.md's core tree lists the stages in the order they may use each other"
    );
}
