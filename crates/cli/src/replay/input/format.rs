//! Opening one traffic file: whether it is gzip-compressed (told by its
//! first two bytes, 1f 8b, whatever its name), then which format it is in
//! (its name, else its first bytes). JSON Lines are read as a stream,
//! through the decompressor when compressed; HAR files and tap traces are
//! single JSON documents, read whole.
//!
//! A file that cannot be read to its end (a corrupt or truncated gzip
//! stream, a disk error) is reported as a skipped entry with its place,
//! like any entry replay cannot read: JSON Lines up to the broken line are
//! replayed.

use super::{har, jsonl, tap, Source};
use crate::replay::record::{Entry, Skipped};
use flate2::bufread::MultiGzDecoder;
use std::fs::File;
use std::io::{BufRead, BufReader, Cursor, Read};
use std::path::Path;

/// The first bytes of every gzip member.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Bytes looked at to tell a format from its content.
const SNIFF_BYTES: usize = 4096;

/// A file's entries, by its format. Only a file that cannot be opened is
/// an error; what is wrong inside it is a skipped entry.
pub fn open(path: &Path, name: &str) -> Result<Source, String> {
    let file = File::open(path).map_err(|e| format!("{name}: cannot open: {e}"))?;
    let mut raw = BufReader::new(file);
    let gzip = match raw.fill_buf() {
        Ok(start) => start.starts_with(&GZIP_MAGIC),
        Err(e) => return Ok(skip(name, format!("cannot read: {e}"))),
    };
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let inner = match file_name.strip_suffix(".gz") {
        Some(_) if !gzip => {
            return Ok(skip(
                name,
                "named .gz, but not gzip data (it does not start with the bytes 1f 8b)".to_string(),
            ))
        }
        Some(inner) => inner,
        None => file_name.as_str(),
    };
    let ext = Path::new(inner)
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("");
    let mut reader: Box<dyn BufRead> = if gzip {
        Box::new(BufReader::new(Gunzip(MultiGzDecoder::new(raw))))
    } else {
        Box::new(raw)
    };
    if ext == "jsonl" || ext == "ndjson" {
        return Ok(Box::new(jsonl::Lines::new(name, reader)));
    }
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    if let Err(e) = reader
        .by_ref()
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
    {
        return Ok(skip(name, format!("cannot read: {e}")));
    }
    Ok(match sniff(ext, &head) {
        // The lines looked at are read again, then the rest as a stream.
        Format::Lines => Box::new(jsonl::Lines::new(name, Cursor::new(head).chain(reader))),
        Format::Har => whole(name, head, reader, har::read),
        Format::Tap => whole(name, head, reader, tap::read),
        Format::Unknown => skip(
            name,
            "not a traffic file replay knows (JSON Lines, HAR 1.2 or an Envoy tap trace)"
                .to_string(),
        ),
    })
}

/// A file that is one JSON document (`head`, then the rest of `reader`),
/// read whole and then by `read`.
fn whole(
    name: &str,
    mut bytes: Vec<u8>,
    mut reader: Box<dyn BufRead>,
    read: fn(&str, &[u8]) -> Vec<Entry>,
) -> Source {
    if let Err(e) = reader.read_to_end(&mut bytes) {
        return skip(name, format!("cannot read: {e}; the file is skipped"));
    }
    Box::new(read(name, &bytes).into_iter())
}

/// The one entry of a file replay cannot read.
fn skip(name: &str, reason: String) -> Source {
    Box::new(std::iter::once(Err(Skipped {
        place: name.to_string(),
        reason,
    })))
}

/// A gzip stream's decompressed bytes; its errors say it was gzip.
struct Gunzip<R>(MultiGzDecoder<R>);

impl<R: BufRead> Read for Gunzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0
            .read(buf)
            .map_err(|e| std::io::Error::new(e.kind(), format!("gzip: {e}")))
    }
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
    let head = bytes.get(..SNIFF_BYTES).unwrap_or(bytes);
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
    use flate2::write::GzEncoder;
    use std::io::Write;
    use std::path::PathBuf;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    /// A file's entries: each request's place, time and path, or what was
    /// skipped and why.
    fn entries(path: &Path) -> Vec<String> {
        let name = path.file_name().unwrap().to_str().unwrap();
        open(path, name)
            .unwrap()
            .map(|e| match e {
                Ok(r) => format!("{} {} {}", r.place, r.at_ms, r.request.path),
                Err(s) => format!("{} skipped: {}", s.place, s.reason),
            })
            .collect()
    }

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir()
                .join(format!("loopguard-format-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
        fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn lines(n: usize) -> String {
        (0..n)
            .map(|i| format!("{{\"timestamp\": {}, \"path\": \"/v1/{i}\"}}\n", 1000 + i))
            .collect()
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
    fn gzip_is_told_by_its_bytes_and_read_as_the_plain_file() {
        let d = Dir::new("gzip");
        // Longer than what is looked at to tell the format.
        let text = lines(300);
        assert!(text.len() > 2 * SNIFF_BYTES);
        let plain = entries(&d.write("t.jsonl", text.as_bytes()));
        assert_eq!(plain.len(), 300);
        assert_eq!(plain[0], "t.jsonl:1 1000000 /v1/0");
        let same = |name: &str, bytes: &[u8]| {
            let got = entries(&d.write(name, bytes));
            let want: Vec<String> = plain
                .iter()
                .map(|p| p.replacen("t.jsonl", name, 1))
                .collect();
            assert_eq!(got, want, "{name}");
        };
        let gz = gzip(text.as_bytes());
        same("t.jsonl.gz", &gz);
        same("T.JSONL.GZ", &gz);
        // By its bytes: a name without .gz, or with no extension at all.
        same("gzipped.jsonl", &gz);
        same("capture", &gz);
        same("capture.json.gz", &gz);
        // Told from their content, plain or not: the lines looked at are
        // read again.
        same("lines.json", text.as_bytes());
        // Members one after another (as `cat a.gz b.gz` makes) are one
        // stream.
        let (first, second) = text.split_at(text.find("{\"timestamp\": 1020").unwrap());
        let mut members = gzip(first.as_bytes());
        members.extend(gzip(second.as_bytes()));
        same("members.jsonl.gz", &members);
    }

    #[test]
    fn whole_documents_are_read_through_gzip_too() {
        let d = Dir::new("documents");
        let har = r#"{"log": {"version": "1.2", "entries": [
            {"startedDateTime": "2026-11-25T18:33:44.123Z", "request": {"method": "GET", "url": "http://a/v1/x", "headers": []}}]}}"#;
        assert_eq!(
            entries(&d.write("t.har.gz", &gzip(har.as_bytes()))),
            ["t.har.gz entry 1 1795631624123 /v1/x"]
        );
        assert_eq!(
            entries(&d.write("export.json.gz", &gzip(har.as_bytes()))),
            ["export.json.gz entry 1 1795631624123 /v1/x"]
        );
        let trace = r#"{"http_buffered_trace": {"request": {"headers": [{"key": ":method", "value": "GET"},
            {"key": ":path", "value": "/v1/t"}, {"key": ":authority", "value": "a"}],
            "headers_received_time": "2026-11-25T18:40:30.096Z"}}}"#;
        assert_eq!(
            entries(&d.write("trace_1.json.gz", &gzip(trace.as_bytes()))),
            ["trace_1.json.gz 1795632030096 /v1/t"]
        );
    }

    #[test]
    fn a_corrupt_gzip_stream_is_a_skipped_entry_with_its_place() {
        let d = Dir::new("corrupt");
        // JSON Lines: the lines before the break are read, then the break
        // is reported at the line where it was met.
        let gz = gzip(lines(2000).as_bytes());
        let cut = &gz[..gz.len() / 2];
        let got = entries(&d.write("cut.jsonl.gz", cut));
        let (last, read) = got.split_last().unwrap();
        assert!(read.len() > 100, "{}", read.len());
        assert!(read.iter().all(|r| !r.contains("skipped")), "{read:?}");
        assert!(
            last.starts_with(&format!(
                "cut.jsonl.gz:{} skipped: cannot read: gzip: ",
                read.len() + 1
            )),
            "{last}"
        );
        assert!(
            last.ends_with("; the rest of the file is skipped"),
            "{last}"
        );
        // Bytes that are not deflate data after a gzip header.
        let mut garbage = gz[..10].to_vec();
        garbage.extend_from_slice(&[0xff; 64]);
        let got = entries(&d.write("garbage.jsonl.gz", &garbage));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("garbage.jsonl.gz:1 skipped: cannot read: gzip: "),
            "{got:?}"
        );
        // A whole document cut short: the file is skipped.
        let har = gzip(
            format!(
                "{{\"log\": {{\"entries\": [], \"pad\": \"{}\"}}}}",
                "x".repeat(9000)
            )
            .as_bytes(),
        );
        let got = entries(&d.write("t.har.gz", &har[..har.len() - 12]));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("t.har.gz skipped: cannot read: gzip: "),
            "{got:?}"
        );
        assert!(got[0].ends_with("; the file is skipped"), "{got:?}");
        // Named .gz, but not compressed.
        let got = entries(&d.write("plain.jsonl.gz", lines(1).as_bytes()));
        assert_eq!(
            got,
            ["plain.jsonl.gz skipped: named .gz, but not gzip data (it does not start with the bytes 1f 8b)"]
        );
    }
}
