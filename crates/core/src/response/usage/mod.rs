//! Token usage read from a provider's response as it passes: the body is
//! never held back or changed, and what is kept per response is bounded
//! whatever its length.
//!
//! - A streamed response (`text/event-stream`) is read line by line (a line
//!   whole in its chunk is read in place; only a line split over chunks is
//!   copied); only the `usage` object of a `data:` line whose `"usage"` key
//!   holds an object is parsed (OpenAI's chunks before the last carry
//!   `"usage":null` and cost a search): OpenAI Chat's final chunk
//!   (with `stream_options.include_usage`), the Responses API's
//!   `response.completed`, Anthropic's `message_start` (input) and
//!   `message_delta` (output, cumulative).
//! - A JSON response is scanned for a `"usage":` key (unescaped quotes can
//!   only be a key: inside a string they are escaped) and the object after
//!   it is parsed; the last one carrying token counts wins (the top-level
//!   usage comes after the content in all three APIs).
//!
//! Cached input tokens (OpenAI's `cached_tokens`, Anthropic's cache reads)
//! and Anthropic's cache writes are part of the input and also counted
//! apart (they have prices of their own); reasoning tokens are part of the
//! output and also counted apart.

use crate::request::llm::scan::after_colon;
use crate::response::repeats::{RepeatSettings, RepeatWatch, Repeated};
use serde_json::Value;

/// Tokens a response reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    /// Of `input`, read from the provider's prompt cache.
    pub cached_input: u64,
    /// Of `input`, written to the provider's prompt cache (Anthropic's
    /// `cache_creation_input_tokens`).
    pub cache_write: u64,
    /// Of `output`, spent on reasoning.
    pub reasoning: u64,
    /// What the call cost, in micro-dollars, when the upstream reports it
    /// (OpenRouter's `usage.cost`, in dollars).
    pub cost_microusd: Option<u64>,
}

/// Dollars as a provider reports them (a number, or a string holding one),
/// in micro-dollars; `None` for anything else or below zero.
pub fn microusd_of(v: &Value) -> Option<u64> {
    let f = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    // At most a million dollars a call.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (f.is_finite() && (0.0..=1e6).contains(&f)).then(|| (f * 1e6).round() as u64)
}

impl Usage {
    /// Usage from a `usage` object of any of the three APIs; `None` when it
    /// holds no token count.
    pub fn from_json(v: &Value) -> Option<Usage> {
        let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
        let deep = |a: &str, b: &str| v.get(a).and_then(|d| d.get(b)).and_then(Value::as_u64);
        // OpenRouter: `cost` is what it charged; with the caller's own
        // provider key (BYOK) the provider's bill is apart, in
        // `cost_details.upstream_inference_cost`.
        let upstream = v
            .get("cost_details")
            .and_then(|d| d.get("upstream_inference_cost"))
            .and_then(microusd_of);
        let cost_microusd = match (v.get("cost").and_then(microusd_of), upstream) {
            (Some(c), Some(u)) => Some(c.saturating_add(u)),
            (c, u) => c.or(u),
        };
        // OpenAI Chat: prompt_tokens / completion_tokens.
        if let (Some(i), o) = (n(v, "prompt_tokens"), n(v, "completion_tokens")) {
            return Some(Usage {
                input: i,
                output: o.unwrap_or(0),
                cached_input: deep("prompt_tokens_details", "cached_tokens").unwrap_or(0),
                cache_write: 0,
                reasoning: deep("completion_tokens_details", "reasoning_tokens").unwrap_or(0),
                cost_microusd,
            });
        }
        let (input, output) = (n(v, "input_tokens"), n(v, "output_tokens"));
        if input.is_none() && output.is_none() {
            return None;
        }
        // Anthropic counts cache reads and writes outside input_tokens;
        // the Responses API inside it (input_tokens_details).
        let cache_read = n(v, "cache_read_input_tokens").unwrap_or(0);
        let cache_write = n(v, "cache_creation_input_tokens").unwrap_or(0);
        let responses_cached = deep("input_tokens_details", "cached_tokens").unwrap_or(0);
        Some(Usage {
            input: input
                .unwrap_or(0)
                .saturating_add(cache_read)
                .saturating_add(cache_write),
            output: output.unwrap_or(0),
            cached_input: cache_read.saturating_add(responses_cached),
            cache_write,
            reasoning: deep("output_tokens_details", "reasoning_tokens").unwrap_or(0),
            cost_microusd,
        })
    }

    /// Merge a later report into this one: each count the later one has
    /// replaces this one's (Anthropic reports input first, output later;
    /// its output count is cumulative).
    fn merge(self, later: Usage) -> Usage {
        let pick = |a: u64, b: u64| if b > 0 { b } else { a };
        Usage {
            input: pick(self.input, later.input),
            output: pick(self.output, later.output),
            cached_input: pick(self.cached_input, later.cached_input),
            cache_write: pick(self.cache_write, later.cache_write),
            reasoning: pick(self.reasoning, later.reasoning),
            cost_microusd: later.cost_microusd.or(self.cost_microusd),
        }
    }

    /// The counts a price applies to.
    pub fn tokens(&self) -> crate::config::prices::Tokens {
        crate::config::prices::Tokens {
            input: self.input,
            output: self.output,
            cached_input: self.cached_input,
            cache_write: self.cache_write,
        }
    }
}

/// How the response body is framed (from its `content-type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Framing {
    #[default]
    Json,
    EventStream,
}

impl Framing {
    /// The framing of a `content-type` value; `None` for a body that cannot
    /// carry usage (HTML, images...).
    pub fn of_content_type(value: &str) -> Option<Framing> {
        let v = value.trim().to_ascii_lowercase();
        if v.starts_with("text/event-stream") {
            Some(Framing::EventStream)
        } else if v.starts_with("application/json") || v.contains("+json") {
            Some(Framing::Json)
        } else {
            None
        }
    }
}

/// The longest line of a stream (or `usage` object of a JSON body) read;
/// a longer one is passed over and counted.
pub const MAX_KEPT: usize = 64 * 1024;

const KEY: &[u8] = b"\"usage\"";

/// Where a JSON body's scan is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Scan {
    /// Looking for `"usage"`.
    #[default]
    Key,
    /// After the key: whitespace, then `:`.
    Colon,
    /// After the colon: whitespace, then `{`.
    Open,
    /// Inside the object.
    Object(Depth),
}

/// Reads one response's usage from its body chunks.
#[derive(Debug, Default)]
pub struct UsageReader {
    framing: Framing,
    /// A stream: the line so far. JSON: the tail kept to find a key split
    /// over chunks, or the `usage` object so far.
    kept: Vec<u8>,
    scan: Scan,
    /// The current line (or object) is past `MAX_KEPT`: dropped until it
    /// ends.
    skipping: bool,
    found: Option<Usage>,
    /// Lines or objects passed over for their size.
    pub oversize: u32,
    /// The body is gzip-compressed (it cannot be read; nothing more is).
    pub compressed: bool,
    /// A stream's output text, watched for a model repeating itself.
    watch: Option<RepeatWatch>,
    /// What the watch found, until taken.
    repeated: Option<Repeated>,
    /// Stream bytes read so far (the watch starts after [`WATCH_AFTER`]).
    consumed: u64,
    /// A stream line longer than `MAX_KEPT` split over chunks (the
    /// Responses API's `response.completed` repeats the whole response
    /// before its usage): read on as JSON, for its usage object alone.
    long: Option<Box<UsageReader>>,
    /// Count a stream's `data:` events (an estimate's output when the
    /// stream is cut off or reports no usage).
    count_events: bool,
    read: BytesRead,
    /// The model that answered, as the body names it near its start (read
    /// only when asked: a request whose own model was not read).
    model: Option<String>,
    find_model: bool,
}

/// Where the answering model is looked for: the first bytes of the body
/// (OpenAI's and Anthropic's responses and first events name it there).
const MODEL_WITHIN: u64 = 4096;

/// The value of the first `"model":"..."` member in `chunk`.
fn model_in(chunk: &[u8]) -> Option<String> {
    let at = memchr::memmem::find(chunk, b"\"model\"")?;
    let rest = chunk.get(after_colon(chunk, at + 7)?..)?;
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    let name = rest.get(..end)?;
    (!name.is_empty() && name.len() <= 128).then(|| String::from_utf8_lossy(name).into_owned())
}

/// How much of a response body was read: what a spending estimate is made
/// from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BytesRead {
    /// Body bytes fed.
    pub bytes: u64,
    /// A stream's `data:` events (0 for a JSON body, or when not counted).
    pub events: u64,
    /// A stream's closing event was seen (when events are counted:
    /// OpenAI's `[DONE]`, Anthropic's `message_stop`, the Responses API's
    /// `response.completed`): its usage is whole even if the client leaves
    /// before the body ends.
    pub closed: bool,
}

/// A stream is watched for repetition once this many bytes have passed: a
/// shorter one cannot have burnt much (8 KB of events is about 300 tokens of
/// text), and a degenerate one goes on repeating past it. Short answers
/// cost nothing more to read.
pub const WATCH_AFTER: u64 = 8 * 1024;

impl UsageReader {
    pub fn new(framing: Framing) -> UsageReader {
        UsageReader {
            framing,
            ..UsageReader::default()
        }
    }

    /// Also read which model answered ([`UsageReader::model`]).
    pub fn finding_model(mut self) -> UsageReader {
        self.find_model = true;
        self
    }

    /// The model the response names, if it was looked for and found.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Also count a stream's events ([`UsageReader::bytes_read`]).
    pub fn counting_events(mut self) -> UsageReader {
        self.count_events = self.framing == Framing::EventStream;
        self
    }

    /// How much of the body was read so far.
    pub fn bytes_read(&self) -> BytesRead {
        self.read
    }

    /// Also watch a stream's output text for degenerate repetition (see
    /// [`crate::response::repeats`]).
    pub fn watching(mut self, settings: RepeatSettings) -> UsageReader {
        if self.framing == Framing::EventStream {
            self.watch = Some(RepeatWatch::new(settings));
        }
        self
    }

    /// The repetition the watch found since the last call (once per
    /// stream).
    pub fn take_repeated(&mut self) -> Option<Repeated> {
        self.repeated.take()
    }

    /// The next chunk of the body, as it passes.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.find_model && self.model.is_none() && self.read.bytes < MODEL_WITHIN {
            self.model = model_in(chunk);
        }
        self.read.bytes = self.read.bytes.saturating_add(chunk.len() as u64);
        if self.count_events {
            // An event split over chunks at "data:" is missed: an estimate.
            let n = memchr::memmem::find_iter(chunk, b"data:").count();
            self.read.events = self.read.events.saturating_add(n as u64);
            // A closing marker split over chunks is missed: the usage then
            // counts as an estimate's floor, not as whole.
            self.read.closed = self.read.closed
                || [&b"data: [DONE]"[..], b"message_stop", b"response.completed"]
                    .iter()
                    .any(|m| memchr::memmem::find(chunk, m).is_some());
        }
        // gzip's magic bytes where text should start.
        self.compressed |=
            self.consumed == 0 && self.kept.is_empty() && chunk.starts_with(&[0x1f, 0x8b]);
        if self.compressed {
            return;
        }
        match self.framing {
            Framing::EventStream => self.feed_lines(chunk),
            Framing::Json => {
                // Counted for the gzip check only.
                self.consumed = self.consumed.saturating_add(chunk.len() as u64);
                self.feed_json(chunk);
            }
        }
    }

    /// The end of the body: the usage it reported, if any.
    pub fn finish(mut self) -> Option<Usage> {
        if self.framing == Framing::EventStream {
            self.end_line();
        }
        self.found
    }

    /// Whether the usage read so far is what the response reports: a
    /// JSON body's usage object was read (it comes after the content), or
    /// a stream's closing event passed (when events are counted).
    pub fn usage_final(&self) -> bool {
        self.found.is_some() && (self.framing == Framing::Json || self.read.closed)
    }

    fn note(&mut self, u: Usage) {
        self.found = Some(self.found.map_or(u, |before| before.merge(u)));
    }

    /// Keep `part` of the current line (or object), unless that would
    /// pass `MAX_KEPT`: then a stream's line is read on as JSON for its
    /// usage object alone, and a JSON body's object is dropped until it
    /// ends; both counted.
    fn keep(&mut self, part: &[u8]) {
        if let Some(long) = self.long.as_mut() {
            long.feed(part);
            return;
        }
        if self.skipping {
            return;
        }
        if self.kept.len() + part.len() > MAX_KEPT {
            self.oversize += 1;
            if self.framing == Framing::EventStream {
                let mut long = UsageReader::new(Framing::Json);
                long.feed(&self.kept);
                long.feed(part);
                self.long = Some(Box::new(long));
            } else {
                self.skipping = true;
            }
            self.kept.clear();
        } else {
            self.kept.extend_from_slice(part);
        }
    }

    /// The current line of a stream ended: read it (a long one for its
    /// usage), and start the next.
    fn end_line(&mut self) {
        if let Some(long) = self.long.take() {
            if let Some(u) = long.finish() {
                self.note(u);
            }
        } else if !self.skipping {
            let kept = std::mem::take(&mut self.kept);
            self.line(&kept);
            self.kept = kept;
        }
        self.kept.clear();
        self.skipping = false;
    }

    fn feed_lines(&mut self, mut chunk: &[u8]) {
        // A line begun in an earlier chunk: finish it first.
        if !self.kept.is_empty() || self.skipping || self.long.is_some() {
            let Some(i) = memchr::memchr(b'\n', chunk) else {
                self.keep(chunk);
                self.consumed += chunk.len() as u64;
                return;
            };
            self.keep(chunk.get(..i).unwrap_or(&[]));
            self.end_line();
            self.consumed += i as u64 + 1;
            chunk = chunk.get(i + 1..).unwrap_or(&[]);
        }
        // Whole lines, read in place; the last, unfinished one is kept.
        let whole = memchr::memrchr(b'\n', chunk).map_or(0, |i| i + 1);
        let (lines, tail) = chunk.split_at(whole);
        if self.watch.is_some() && self.consumed + lines.len() as u64 > WATCH_AFTER {
            // Line by line: the watch reads each event's text.
            for line in lines.split(|&b| b == b'\n') {
                self.consumed += line.len() as u64 + 1;
                self.line(line);
            }
            self.consumed = self.consumed.saturating_sub(1);
        } else {
            // Only the usage objects (searched over the whole chunk at
            // once; a JSON line holds no raw newline, so an object found
            // ends on its line).
            self.consumed += lines.len() as u64;
            let mut from = 0;
            while let Some((object, end)) = usage_object(lines, from) {
                from = end;
                if let Some(u) = usage_of(object) {
                    self.note(u);
                }
            }
        }
        self.keep(tail);
        self.consumed += tail.len() as u64;
    }

    /// One line of an event stream.
    fn line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if let Some(w) = self.watch.as_mut().filter(|_| self.consumed > WATCH_AFTER) {
            if let Some(r) = w.feed_data(data) {
                self.repeated = Some(r);
                // Reported once: no more reading of the text.
                self.watch = None;
            }
        }
        if let Some(u) = usage_object(data, 0).and_then(|(object, _)| usage_of(object)) {
            self.note(u);
        }
    }

    fn feed_json(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while i < chunk.len() {
            match self.scan {
                Scan::Key => {
                    // Search the kept tail and this chunk together for the
                    // key, keeping only what could start a split one.
                    let rest = chunk.get(i..).unwrap_or(&[]);
                    let carried = self.kept.len();
                    let mut window = std::mem::take(&mut self.kept);
                    window.extend_from_slice(rest);
                    let Some(at) = find_key(&window) else {
                        let keep = window.len().min(KEY.len() - 1);
                        self.kept = window.split_off(window.len() - keep);
                        return;
                    };
                    self.scan = Scan::Colon;
                    // Continue right after the key in this chunk.
                    i += (at + KEY.len()).saturating_sub(carried);
                }
                Scan::Colon | Scan::Open => {
                    let b = chunk.get(i).copied().unwrap_or(b' ');
                    i += 1;
                    match (&self.scan, b) {
                        (_, b' ' | b'\t' | b'\r' | b'\n') => {}
                        (Scan::Colon, b':') => self.scan = Scan::Open,
                        (Scan::Open, b'{') => {
                            self.kept.clear();
                            self.kept.push(b'{');
                            self.skipping = false;
                            self.scan = Scan::Object(Depth {
                                depth: 1,
                                ..Depth::default()
                            });
                        }
                        // `"usage": null`, or a key named usage inside a
                        // string's text after all: look on.
                        _ => self.scan = Scan::Key,
                    }
                }
                Scan::Object(mut d) => {
                    let rest = chunk.get(i..).unwrap_or(&[]);
                    let closed = rest.iter().position(|&b| d.step(b));
                    let part = rest.get(..closed.map_or(rest.len(), |at| at + 1));
                    let part = part.unwrap_or(rest);
                    i += part.len();
                    self.keep(part);
                    if closed.is_some() {
                        if !self.skipping {
                            // The last usage object wins (the response's
                            // own comes after its content).
                            self.found = usage_of(&self.kept).or(self.found);
                        }
                        self.kept.clear();
                        self.skipping = false;
                        self.scan = Scan::Key;
                    } else {
                        self.scan = Scan::Object(d);
                    }
                }
            }
        }
    }
}

/// The first `"usage"` in `hay`.
fn find_key(hay: &[u8]) -> Option<usize> {
    static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
        std::sync::OnceLock::new();
    FINDER
        .get_or_init(|| memchr::memmem::Finder::new(KEY))
        .find(hay)
}

/// The usage a JSON object's bytes report.
fn usage_of(object: &[u8]) -> Option<Usage> {
    Usage::from_json(&serde_json::from_slice(object).ok()?)
}

/// The next `"usage"` object of `text` from `from` (`"usage": null` is
/// passed over), and where the search goes on.
fn usage_object(text: &[u8], mut from: usize) -> Option<(&[u8], usize)> {
    while let Some(at) = text.get(from..).and_then(find_key) {
        from += at + KEY.len();
        // Not an object: `"usage": null` (OpenAI's chunks before the last).
        let Some(i) = after_colon(text, from).filter(|&i| text.get(i) == Some(&b'{')) else {
            continue;
        };
        let Some(len) = text.get(i..).and_then(object_len) else {
            continue;
        };
        return Some((text.get(i..i + len)?, i + len));
    }
    None
}

/// Where a scan through a JSON value is: its depth of objects and
/// arrays, inside a string, after a backslash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Depth {
    depth: u32,
    string: bool,
    escape: bool,
}

impl Depth {
    /// The next byte; `true` when it closes the outermost value.
    fn step(&mut self, b: u8) -> bool {
        if self.string {
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.string = false;
            }
            return false;
        }
        match b {
            b'"' => self.string = true,
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ => {}
        }
        false
    }
}

/// The length of the JSON object `s` starts with (`None`: it does not end
/// within `s`).
fn object_len(s: &[u8]) -> Option<usize> {
    let mut d = Depth::default();
    s.iter().position(|&b| d.step(b)).map(|i| i + 1)
}

#[cfg(test)]
mod tests;
