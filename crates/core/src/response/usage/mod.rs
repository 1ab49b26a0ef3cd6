//! Token usage read from a provider's response as it passes: the body is
//! never held back or changed, and what is kept per response is bounded
//! whatever its length.
//!
//! - A streamed response (`text/event-stream`) is read line by line; only a
//!   `data:` line that mentions `usage` is parsed: OpenAI Chat's final chunk
//!   (with `stream_options.include_usage`), the Responses API's
//!   `response.completed`, Anthropic's `message_start` (input) and
//!   `message_delta` (output, cumulative).
//! - A JSON response is scanned for a `"usage":` key (unescaped quotes can
//!   only be a key: inside a string they are escaped) and the object after
//!   it is parsed; the last one carrying token counts wins (the top-level
//!   usage comes after the content in all three APIs).
//!
//! Cached input tokens (OpenAI's `cached_tokens`, Anthropic's cache reads
//! and writes) are part of the input and also counted apart; reasoning
//! tokens are part of the output and also counted apart.

use serde_json::Value;

/// Tokens a response reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    /// Of `input`, read from (or written to) the provider's prompt cache.
    pub cached_input: u64,
    /// Of `output`, spent on reasoning.
    pub reasoning: u64,
}

impl Usage {
    /// Usage from a `usage` object of any of the three APIs; `None` when it
    /// holds no token count.
    pub fn from_json(v: &Value) -> Option<Usage> {
        let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
        let deep = |a: &str, b: &str| v.get(a).and_then(|d| d.get(b)).and_then(Value::as_u64);
        // OpenAI Chat: prompt_tokens / completion_tokens.
        if let (Some(i), o) = (n(v, "prompt_tokens"), n(v, "completion_tokens")) {
            return Some(Usage {
                input: i,
                output: o.unwrap_or(0),
                cached_input: deep("prompt_tokens_details", "cached_tokens").unwrap_or(0),
                reasoning: deep("completion_tokens_details", "reasoning_tokens").unwrap_or(0),
            });
        }
        let input = n(v, "input_tokens");
        let output = n(v, "output_tokens");
        if input.is_none() && output.is_none() {
            return None;
        }
        // Anthropic counts cache reads and writes outside input_tokens;
        // the Responses API inside it (input_tokens_details).
        let cache_read = n(v, "cache_read_input_tokens").unwrap_or(0);
        let cache_write = n(v, "cache_creation_input_tokens").unwrap_or(0);
        let responses_cached = deep("input_tokens_details", "cached_tokens").unwrap_or(0);
        Some(Usage {
            input: input.unwrap_or(0) + cache_read + cache_write,
            output: output.unwrap_or(0),
            cached_input: cache_read + cache_write + responses_cached,
            reasoning: deep("output_tokens_details", "reasoning_tokens").unwrap_or(0),
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
            reasoning: pick(self.reasoning, later.reasoning),
        }
    }
}

/// How the response body is framed (from its `content-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
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
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scan {
    /// Looking for `"usage"`.
    Key,
    /// After the key: whitespace, then `:`.
    Colon,
    /// After the colon: whitespace, then `{`.
    Open,
    /// Inside the object (its depth, in a string, after a backslash).
    Object {
        depth: u32,
        string: bool,
        escape: bool,
    },
}

/// Reads one response's usage from its body chunks.
#[derive(Debug)]
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
}

impl UsageReader {
    pub fn new(framing: Framing) -> UsageReader {
        UsageReader {
            framing,
            kept: Vec::new(),
            scan: Scan::Key,
            skipping: false,
            found: None,
            oversize: 0,
        }
    }

    /// The next chunk of the body, as it passes.
    pub fn feed(&mut self, chunk: &[u8]) {
        match self.framing {
            Framing::EventStream => self.feed_lines(chunk),
            Framing::Json => self.feed_json(chunk),
        }
    }

    /// The end of the body: the usage it reported, if any.
    pub fn finish(mut self) -> Option<Usage> {
        if self.framing == Framing::EventStream && !self.kept.is_empty() && !self.skipping {
            let line = std::mem::take(&mut self.kept);
            self.line(&line);
        }
        self.found
    }

    /// The usage read so far.
    pub fn usage(&self) -> Option<Usage> {
        self.found
    }

    fn note(&mut self, u: Usage) {
        self.found = Some(match self.found {
            Some(before) => before.merge(u),
            None => u,
        });
    }

    /// Keep `part` of the current line (or object), unless that would
    /// pass `MAX_KEPT`: then drop it all until it ends, counted.
    fn keep(&mut self, part: &[u8]) {
        if self.skipping {
            return;
        }
        if self.kept.len() + part.len() > MAX_KEPT {
            self.kept.clear();
            self.skipping = true;
            self.oversize += 1;
        } else {
            self.kept.extend_from_slice(part);
        }
    }

    fn feed_lines(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            let (part, rest, ended) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (
                    chunk.get(..i).unwrap_or(&[]),
                    chunk.get(i + 1..).unwrap_or(&[]),
                    true,
                ),
                None => (chunk, &[][..], false),
            };
            chunk = rest;
            self.keep(part);
            if ended {
                if !self.skipping {
                    let line = std::mem::take(&mut self.kept);
                    self.line(&line);
                    self.kept = line;
                    self.kept.clear();
                }
                self.skipping = false;
            }
        }
    }

    /// One line of an event stream.
    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if find(data, b"usage").is_none() {
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            return;
        };
        let usage = v
            .get("usage")
            .filter(|u| !u.is_null())
            .or_else(|| v.get("message").and_then(|m| m.get("usage")))
            .or_else(|| v.get("response").and_then(|r| r.get("usage")));
        if let Some(u) = usage.and_then(Usage::from_json) {
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
                    match find(&window, KEY) {
                        Some(at) => {
                            self.scan = Scan::Colon;
                            // Continue right after the key in this chunk.
                            i += (at + KEY.len()).saturating_sub(carried);
                        }
                        None => {
                            let keep = window.len().min(KEY.len() - 1);
                            self.kept = window.split_off(window.len() - keep);
                            return;
                        }
                    }
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
                            self.scan = Scan::Object {
                                depth: 1,
                                string: false,
                                escape: false,
                            };
                        }
                        // `"usage": null`, or a key named usage inside a
                        // string's text after all: look on.
                        _ => self.scan = Scan::Key,
                    }
                }
                Scan::Object {
                    mut depth,
                    mut string,
                    mut escape,
                } => {
                    let start = i;
                    let mut closed = false;
                    while let Some(&b) = chunk.get(i) {
                        i += 1;
                        if string {
                            if escape {
                                escape = false;
                            } else if b == b'\\' {
                                escape = true;
                            } else if b == b'"' {
                                string = false;
                            }
                            continue;
                        }
                        match b {
                            b'"' => string = true,
                            b'{' | b'[' => depth += 1,
                            b'}' | b']' => {
                                depth = depth.saturating_sub(1);
                                if depth == 0 {
                                    closed = true;
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                    self.keep(chunk.get(start..i).unwrap_or(&[]));
                    if closed {
                        if !self.skipping {
                            if let Some(u) = serde_json::from_slice::<Value>(&self.kept)
                                .ok()
                                .as_ref()
                                .and_then(Usage::from_json)
                            {
                                // The last usage object wins (the
                                // response's own comes after its content).
                                self.found = Some(u);
                            }
                        }
                        self.kept.clear();
                        self.skipping = false;
                        self.scan = Scan::Key;
                    } else {
                        self.scan = Scan::Object {
                            depth,
                            string,
                            escape,
                        };
                    }
                }
            }
        }
    }
}

/// The first position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests;
