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
//! Each may be gzip-compressed (`.jsonl.gz`, `.har.gz`, a tap trace's
//! `.json.gz`): gzip is told by its first bytes, whatever the file's name,
//! and decompressed as it is read (`format`), so JSON Lines stay a stream.
//!
//! A directory is read as the files in it (sorted by name; not recursive).
//! Each file is expected in time order; files are merged by time. An
//! entry earlier than the one before it in the same file is replayed at
//! the later time (the simulated clock never runs backwards) and counted.

mod format;
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
use std::path::{Path, PathBuf};

type Source = Box<dyn Iterator<Item = Entry>>;

/// One input file and the entries not yet taken from it.
struct Head {
    entries: Source,
    next: Option<Recorded>,
    /// Skipped entries met while looking for the next request.
    skipped: VecDeque<Skipped>,
    last_ms: u64,
    /// Its entries are all read (`next` may still hold the last request).
    exhausted: bool,
    /// Counted in `files_done`.
    done: bool,
}

/// All inputs' entries, merged in time order.
pub struct Merged {
    heads: Vec<Head>,
    /// Entries replayed at a later time than recorded (out of order in
    /// their file).
    pub out_of_order: u64,
    /// The files read, in order.
    pub files: Vec<String>,
    /// Files whose requests have all been taken.
    files_done: usize,
}

impl Merged {
    /// Open every path (files, or directories of files). A path that
    /// cannot be opened is an error: replay reads everything it is given or
    /// says why not. `opened(n, total)` is called as each file is opened
    /// (HAR files and tap traces are read then).
    pub fn open(paths: &[String], opened: &mut dyn FnMut(usize, usize)) -> Result<Merged, String> {
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
        let mut merged = Merged {
            heads: Vec::with_capacity(files.len()),
            out_of_order: 0,
            files: Vec::with_capacity(files.len()),
            files_done: 0,
        };
        for (i, f) in files.iter().enumerate() {
            let name = f.display().to_string();
            merged.heads.push(Head {
                entries: format::open(f, &name)?,
                next: None,
                skipped: VecDeque::new(),
                last_ms: 0,
                exhausted: false,
                done: false,
            });
            merged.files.push(name);
            merged.fill(i);
            opened(i + 1, files.len());
        }
        Ok(merged)
    }

    /// How many files have had all their requests taken.
    pub fn files_done(&self) -> usize {
        self.files_done
    }

    /// Pull file `i`'s next request (and the skipped entries before it).
    fn fill(&mut self, i: usize) {
        let Some(h) = self.heads.get_mut(i) else {
            return;
        };
        while h.next.is_none() && !h.exhausted {
            match h.entries.next() {
                None => h.exhausted = true,
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
        if h.exhausted && h.next.is_none() && !h.done {
            h.done = true;
            self.files_done += 1;
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
    fn files_merge_in_time_order_with_skipped_entries_reported() {
        let dir = std::env::temp_dir().join(format!("loopguard-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.jsonl");
        let b = dir.join("b.jsonl");
        std::fs::write(&a, "{\"timestamp\": 1000, \"path\": \"/a1\"}\n{\"timestamp\": 3000, \"path\": \"/a3\"}\n{\"timestamp\": 2000, \"path\": \"/a2-late\"}\n").unwrap();
        std::fs::write(&b, "{\"timestamp\": 2500, \"path\": \"/b\"}\nnot json\n").unwrap();
        let paths = vec![a.display().to_string(), b.display().to_string()];
        let mut opened = Vec::new();
        let merged = Merged::open(&paths, &mut |n, total| opened.push((n, total))).unwrap();
        assert_eq!(opened, [(1, 2), (2, 2)]);
        let mut seen = Vec::new();
        let mut m = merged;
        assert_eq!(m.files_done(), 0);
        let mut done = Vec::new();
        while let Some(e) = m.next() {
            done.push(m.files_done());
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
        // b is done once its one request is taken (its broken line is
        // reported before a's next request); a once its last one is.
        assert_eq!(done, [0, 1, 1, 1, 2]);
        assert_eq!(m.out_of_order, 1);
        assert!(Merged::open(&[dir.join("none").display().to_string()], &mut |_, _| {}).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
