//! Reading traffic: which format a file is, and the entries of all files
//! merged into one stream in time order.
//!
//! - JSON Lines (`.jsonl`, `.ndjson`, or a `.json` file of one object a
//!   line): streamed, so memory does not grow with the file;
//! - HAR 1.2 (`.har`, or JSON with `log.entries`): one JSON document, read
//!   whole;
//! - Envoy tap traces (JSON with `http_buffered_trace`, one file per
//!   trace, or a directory of them): each file read whole.
//!
//! A directory is read as the files in it (sorted by name; not recursive).
//! Each file is expected in time order; files are merged by time. An
//! entry earlier than the one before it in the same file is replayed at
//! the later time (the simulated clock never runs backwards) and counted.

pub mod har;
pub mod jsonl;
pub mod tap;
pub mod time;

/// Base64 text as HAR files and tap traces write bodies (the standard or
/// the URL alphabet; padding and line breaks allowed), decoded by the
/// core's decoder (the one that reads JWTs).
pub fn base64(text: &str) -> Result<Vec<u8>, String> {
    let compact: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    loopguard_core::request::base64url_decode(&compact).ok_or_else(|| "not base64".to_string())
}

use super::record::{Entry, Recorded, Skipped};
use std::collections::VecDeque;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

type Source = Box<dyn Iterator<Item = Entry>>;

/// One input file and the entries not yet taken from it.
struct Head {
    entries: Source,
    next: Option<Recorded>,
    /// Skipped entries met while looking for the next request.
    skipped: VecDeque<Skipped>,
    last_ms: u64,
}

/// All inputs' entries, merged in time order.
pub struct Merged {
    heads: Vec<Head>,
    /// Entries replayed at a later time than recorded (out of order in
    /// their file).
    pub out_of_order: u64,
    /// The files read, in order.
    pub files: Vec<String>,
}

impl Merged {
    /// Open every path (files, or directories of files). A path that
    /// cannot be opened is an error: replay reads everything it is given or
    /// says why not.
    pub fn open(paths: &[String]) -> Result<Merged, String> {
        let mut files = Vec::new();
        for p in paths {
            let path = Path::new(p);
            if path.is_dir() {
                let mut inside: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|e| format!("{p}: cannot read the directory: {e}"))?
                    .filter_map(|d| d.ok().map(|d| d.path()))
                    .filter(|f| f.is_file())
                    .collect();
                inside.sort();
                if inside.is_empty() {
                    return Err(format!("{p}: the directory holds no files"));
                }
                files.extend(inside);
            } else if path.is_file() {
                files.push(path.to_path_buf());
            } else {
                return Err(format!("{p}: no such file or directory"));
            }
        }
        let mut heads = Vec::new();
        let mut names = Vec::new();
        for f in &files {
            let name = f.display().to_string();
            heads.push(Head {
                entries: open_file(f, &name)?,
                next: None,
                skipped: VecDeque::new(),
                last_ms: 0,
            });
            names.push(name);
        }
        let mut merged = Merged {
            heads,
            out_of_order: 0,
            files: names,
        };
        for i in 0..merged.heads.len() {
            merged.fill(i);
        }
        Ok(merged)
    }

    /// Pull file `i`'s next request (and the skipped entries before it).
    fn fill(&mut self, i: usize) {
        let Some(h) = self.heads.get_mut(i) else {
            return;
        };
        while h.next.is_none() {
            match h.entries.next() {
                None => return,
                Some(Err(s)) => h.skipped.push_back(s),
                Some(Ok(mut r)) => {
                    if r.at_ms < h.last_ms {
                        r.at_ms = h.last_ms;
                        self.out_of_order += 1;
                    }
                    h.last_ms = r.at_ms;
                    h.next = Some(r);
                }
            }
        }
    }
}

impl Iterator for Merged {
    type Item = Entry;

    /// Skipped entries first (as soon as they are met), then the earliest
    /// request of any file (the first file wins a tie).
    fn next(&mut self) -> Option<Entry> {
        for h in &mut self.heads {
            if let Some(s) = h.skipped.pop_front() {
                return Some(Err(s));
            }
        }
        let earliest = self
            .heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.next.as_ref().map(|r| (r.at_ms, i)))
            .min()?
            .1;
        let taken = self.heads.get_mut(earliest)?.next.take();
        self.fill(earliest);
        taken.map(Ok)
    }
}

/// A file's entries, by its format.
fn open_file(path: &Path, name: &str) -> Result<Source, String> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ext == "jsonl" || ext == "ndjson" {
        let f = File::open(path).map_err(|e| format!("{name}: cannot open: {e}"))?;
        return Ok(Box::new(jsonl::Lines::new(name, BufReader::new(f))));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let format = sniff(&ext, &bytes);
    Ok(match format {
        Format::Har => Box::new(har::read(name, &bytes).into_iter()),
        Format::Tap => Box::new(tap::read(name, &bytes).into_iter()),
        Format::Lines => Box::new(jsonl::Lines::new(name, std::io::Cursor::new(bytes))),
        Format::Unknown => Box::new(std::iter::once(Err(Skipped {
            place: name.to_string(),
            reason: "not a traffic file replay knows (JSON Lines, HAR 1.2 or an Envoy tap trace)"
                .to_string(),
        }))),
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Format {
    Lines,
    Har,
    Tap,
    Unknown,
}

/// Which format a file's bytes are in, from its extension and its start.
fn sniff(ext: &str, bytes: &[u8]) -> Format {
    if ext == "har" {
        return Format::Har;
    }
    let head = bytes.get(..4096).unwrap_or(bytes);
    let text = String::from_utf8_lossy(head);
    let start = text.trim_start();
    if !start.starts_with('{') {
        return Format::Unknown;
    }
    let first_line = start.lines().next().unwrap_or("");
    // One object a line: the first line is a whole JSON object.
    if serde_json::from_str::<serde_json::Value>(first_line).is_ok_and(|v| v.is_object())
        && start
            .lines()
            .filter(|l| !l.trim().is_empty())
            .nth(1)
            .is_some()
    {
        return Format::Lines;
    }
    if text.contains("\"http_buffered_trace\"") || text.contains("\"http_streamed_trace_segment\"")
    {
        return Format::Tap;
    }
    if text.contains("\"log\"") {
        return Format::Har;
    }
    if serde_json::from_str::<serde_json::Value>(first_line).is_ok_and(|v| v.is_object()) {
        return Format::Lines;
    }
    Format::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_bodies() {
        assert_eq!(base64("").unwrap(), b"");
        assert_eq!(base64("Zg==").unwrap(), b"f");
        assert_eq!(base64("Zm9vYg").unwrap(), b"foob");
        assert_eq!(base64("aMOpbGxv\n").unwrap(), "héllo".as_bytes());
        assert_eq!(base64("-_8=").unwrap(), base64("+/8=").unwrap());
        assert_eq!(base64("Zm9v!").unwrap_err(), "not base64");
        assert!(base64("Z").is_err());
    }

    #[test]
    fn formats_are_told_apart() {
        assert_eq!(sniff("har", b"{}"), Format::Har);
        assert_eq!(sniff("json", b"{\"log\": {\"entries\": []}}"), Format::Har);
        assert_eq!(sniff("json", b"{\"http_buffered_trace\": {}}"), Format::Tap);
        assert_eq!(
            sniff("json", b"{\"http_buffered_trace\": {\n\"request\": {}}}"),
            Format::Tap
        );
        assert_eq!(
            sniff(
                "json",
                b"{\"timestamp\": 1, \"path\": \"/\"}\n{\"timestamp\": 2, \"path\": \"/\"}\n"
            ),
            Format::Lines
        );
        assert_eq!(sniff("txt", b"GET / HTTP/1.1"), Format::Unknown);
    }

    #[test]
    fn files_merge_in_time_order_with_skipped_entries_reported() {
        let dir = std::env::temp_dir().join(format!("loopguard-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.jsonl");
        let b = dir.join("b.jsonl");
        std::fs::write(&a, "{\"timestamp\": 1000, \"path\": \"/a1\"}\n{\"timestamp\": 3000, \"path\": \"/a3\"}\n{\"timestamp\": 2000, \"path\": \"/a2-late\"}\n").unwrap();
        std::fs::write(&b, "{\"timestamp\": 2500, \"path\": \"/b\"}\nnot json\n").unwrap();
        let paths = vec![a.display().to_string(), b.display().to_string()];
        let merged = Merged::open(&paths).unwrap();
        let mut seen = Vec::new();
        let mut m = merged;
        for e in m.by_ref() {
            seen.push(match e {
                Ok(r) => format!("{} {}", r.at_ms, r.request.path),
                Err(s) => format!("skip {}", s.place.rsplit('/').next().unwrap_or("")),
            });
        }
        assert_eq!(
            seen,
            [
                "1000000 /a1",
                "2500000 /b",
                "skip b.jsonl:2",
                "3000000 /a3",
                "3000000 /a2-late"
            ]
        );
        assert_eq!(m.out_of_order, 1);
        assert!(Merged::open(&[dir.join("none").display().to_string()]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
