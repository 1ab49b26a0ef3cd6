//! Degenerate output: a model stuck repeating the same sentence or block
//! within one streamed response, burning output tokens.
//!
//! The output text (the text deltas of the stream's events, see
//! [`output_delta`]) is cut into segments at sentence ends (`.`, `!` or `?`
//! followed by whitespace; `。` `！` `？`) and at newlines; a segment longer
//! than [`RepeatSettings::max_segment_bytes`] is cut there. Whitespace is
//! normalised (a run of it is one space, none at either end), and each
//! segment is hashed as it arrives: no text is kept. A finished segment
//! leaves its hash, its length in chars and the letters it uses in a ring.
//! Blank lines and bare list numbers (`12.`) are skipped, so a list
//! repeating one item under growing numbers is still one repeat.
//!
//! For each period `p` (1 to [`RepeatSettings::max_period`] segments), a
//! counter holds how many of the newest segments in a row equal the one `p`
//! before them: the newest `counter + p` segments are a unit of `p`
//! segments repeated. The output is degenerate when, for a period whose
//! unit is not itself a shorter unit repeated (two `Thanks.` are one short
//! unit, not a long one), the unit repeats at least
//! [`RepeatSettings::repeats`] times, is
//! at least [`RepeatSettings::min_unit_chars`] long, uses at least
//! [`RepeatSettings::min_distinct_letters`] distinct letters, and the
//! repeats cover at least [`RepeatSettings::min_total_chars`]. The work per
//! segment is bounded by `max_period²`, and what is kept by `max_period`
//! (and `history`), whatever the stream's length.
//!
//! Precision comes first: a unit of closing braces or `end`s, a table's
//! separator row, a zero matrix or a refrain sung twice is not degeneracy.

use crate::request::Fnv;

/// How degenerate output is recognised (see [`Default`] for the values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatSettings {
    /// The shortest repeated unit, in chars of normalised text (each
    /// segment's break counted as one): a shorter unit (`}`, `end`, a
    /// bullet) is never flagged, however often it repeats. Default 16.
    pub min_unit_chars: usize,
    /// How many times in a row the unit must repeat (at least 2). Default 4:
    /// a refrain or a chorus sung twice is healthy.
    pub repeats: u32,
    /// The least repeated text in total, in chars. Default 200 (about 50
    /// tokens): a short sentence must repeat more often than a long one.
    pub min_total_chars: usize,
    /// The longest unit, in segments (at least 1). Default 8.
    pub max_period: usize,
    /// Segments remembered: the ring holds this many, and at least
    /// `max_period` (a longer repeat is still counted whole). Default 64.
    pub history: usize,
    /// The longest segment, in bytes (at least 4): a longer one is cut
    /// there. Default 1024.
    pub max_segment_bytes: usize,
    /// The fewest distinct letters the unit must use: rows of `0 0 0` or
    /// `| N/A | N/A |` are data, not a model repeating itself. Default 5.
    pub min_distinct_letters: u32,
}

impl Default for RepeatSettings {
    fn default() -> Self {
        RepeatSettings {
            min_unit_chars: 16,
            repeats: 4,
            min_total_chars: 200,
            max_period: 8,
            history: 64,
            max_segment_bytes: 1024,
            min_distinct_letters: 5,
        }
    }
}

/// What was found: the repeated unit's length in chars, how many times it
/// repeated in a row, and the chars of output it covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeated {
    /// The unit's length, in chars of normalised text (each segment's
    /// break counted as one).
    pub unit_chars: usize,
    /// How many whole copies of the unit came in a row.
    pub repeats: u32,
    /// `unit_chars` times `repeats`.
    pub covered_chars: usize,
}

/// One finished segment, as remembered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Segment {
    /// FNV-1a of the normalised text.
    hash: u64,
    /// Chars of normalised text, plus one for the break.
    chars: usize,
    /// The letters used: `a`-`z` case-folded on bits 0-25, any other
    /// letter (accented, Greek, CJK...) hashed onto bits 26-63.
    letters: u64,
}

/// What the segment read so far is, to skip bare list numbers (`12.`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Marker {
    #[default]
    Empty,
    Digits,
    DigitsDot,
    Text,
}

/// Watches one streamed response's output text for degenerate repetition.
#[derive(Debug, Default)]
pub struct RepeatWatch {
    settings: RepeatSettings,
    /// The last segments, oldest overwritten first (`pushed` says where).
    ring: Vec<Segment>,
    /// Segments finished so far.
    pushed: u64,
    /// `runs[p - 1]`: how many of the newest segments in a row equal the
    /// one `p` before them.
    runs: Vec<u64>,
    seg: Reading,
    reported: bool,
}

/// The segment being read: its hash so far, bytes, chars and letters.
#[derive(Debug, Default)]
struct Reading {
    hash: Fnv,
    bytes: usize,
    chars: usize,
    letters: u64,
    marker: Marker,
    /// Whitespace came after the segment's text: one space goes in before
    /// the next char.
    space: bool,
    /// The last char was `.`, `!` or `?`: whitespace now ends the segment.
    sentence_end: bool,
}

impl RepeatWatch {
    /// A watch for one response (settings out of range are raised to their
    /// least: `repeats` 2, `max_period` 1, `max_segment_bytes` 4).
    pub fn new(settings: RepeatSettings) -> RepeatWatch {
        let settings = RepeatSettings {
            repeats: settings.repeats.max(2),
            max_period: settings.max_period.max(1),
            history: settings.history.max(settings.max_period).max(1),
            max_segment_bytes: settings.max_segment_bytes.max(4),
            ..settings
        };
        RepeatWatch {
            ring: vec![Segment::default(); settings.history],
            runs: vec![0; settings.max_period],
            settings,
            ..RepeatWatch::default()
        }
    }

    /// One server-sent event's data (the bytes after `data:`, as sent) of
    /// any of the three APIs: its output text delta is fed (other events
    /// are ignored, see [`output_delta`]). Returns `Some` the first time
    /// the stream is found degenerate, `None` otherwise (and after: it
    /// reports once per stream).
    pub fn feed_data(&mut self, data: &[u8]) -> Option<Repeated> {
        if self.reported {
            return None;
        }
        self.feed_text(&output_delta(data)?)
    }

    /// Output text as it arrives, split anywhere. Returns `Some` the first
    /// time the stream is found degenerate, `None` otherwise (and after).
    pub fn feed_text(&mut self, text: &str) -> Option<Repeated> {
        if self.reported {
            return None;
        }
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            // ASCII byte by byte (most output); anything else as a char.
            let (found, len) = if b.is_ascii() {
                (self.ascii(b), 1)
            } else {
                let c = text.get(i..).and_then(|t| t.chars().next());
                c.map_or((None, 1), |c| (self.char(c), c.len_utf8()))
            };
            i += len;
            if let Some(found) = found {
                self.reported = true;
                return Some(found);
            }
        }
        None
    }

    /// One ASCII byte of output ([`Self::char`] takes the others).
    fn ascii(&mut self, b: u8) -> Option<Repeated> {
        match b {
            b'\n' => return self.finish(),
            b' ' | b'\t' | b'\r' | 0x0b | 0x0c => return self.space(),
            _ => {}
        }
        let found = self.before(1);
        self.add_ascii(b);
        self.seg.sentence_end = matches!(b, b'.' | b'!' | b'?');
        found
    }

    /// Whitespace: it ends a sentence's segment, or else one space goes in
    /// before the segment's next char.
    fn space(&mut self) -> Option<Repeated> {
        if self.seg.sentence_end {
            return self.finish();
        }
        self.seg.space = self.seg.bytes > 0;
        None
    }

    /// Before a char of `len` bytes that is not whitespace: the segment is
    /// finished if the char would make it too long, and a pending space
    /// goes in.
    fn before(&mut self, len: usize) -> Option<Repeated> {
        let mut found = None;
        if self.seg.bytes + usize::from(self.seg.space) + len > self.settings.max_segment_bytes {
            found = self.finish();
        }
        if self.seg.space {
            self.add_ascii(b' ');
            self.seg.space = false;
        }
        found
    }

    fn add_ascii(&mut self, b: u8) {
        self.seg.hash.write(&[b]);
        self.seg.bytes += 1;
        self.seg.chars += 1;
        if b.is_ascii_alphabetic() {
            self.seg.letters |= 1 << (b.to_ascii_lowercase() - b'a');
        }
        self.seg.marker = match (self.seg.marker, b) {
            (Marker::Empty | Marker::Digits, b'0'..=b'9') => Marker::Digits,
            (Marker::Digits, b'.') => Marker::DigitsDot,
            _ => Marker::Text,
        };
    }

    /// Whether it has reported.
    #[cfg(test)]
    pub fn reported(&self) -> bool {
        self.reported
    }

    /// The bytes this watch keeps, whatever the stream's length: the
    /// ring and the counters (no text is kept).
    #[cfg(test)]
    pub fn kept_bytes(&self) -> usize {
        std::mem::size_of::<RepeatWatch>()
            + self.ring.capacity() * std::mem::size_of::<Segment>()
            + self.runs.capacity() * std::mem::size_of::<u64>()
    }

    /// One char of output that is not ASCII (ASCII goes to
    /// [`Self::ascii`]); `Some` if the segment it finishes makes the output
    /// degenerate.
    fn char(&mut self, c: char) -> Option<Repeated> {
        if c.is_whitespace() {
            return self.space();
        }
        let mut found = self.before(c.len_utf8());
        self.seg.hash.write(c.encode_utf8(&mut [0u8; 4]).as_bytes());
        self.seg.bytes += c.len_utf8();
        self.seg.chars += 1;
        if c.is_alphabetic() {
            // Any letter but `a`-`z`, hashed onto bits 26-63.
            self.seg.letters |= 1 << (26 + u32::from(c) % 38);
        }
        self.seg.marker = Marker::Text;
        self.seg.sentence_end = false;
        if found.is_none() && matches!(c, '。' | '！' | '？') {
            found = self.finish();
        }
        found
    }

    /// End the segment being read: remember it (unless it is blank or a
    /// bare list number) and check the newest segments.
    fn finish(&mut self) -> Option<Repeated> {
        let seg = std::mem::take(&mut self.seg);
        if seg.bytes == 0 || seg.marker == Marker::DigitsDot {
            return None;
        }
        self.push(Segment {
            hash: seg.hash.0,
            chars: seg.chars + 1,
            letters: seg.letters,
        });
        self.check()
    }

    /// The segment `back` places before the newest (0: the newest).
    fn back(&self, back: usize) -> Option<Segment> {
        let back = back as u64;
        if back >= self.pushed || back >= self.ring.len() as u64 {
            return None;
        }
        let at = (self.pushed - 1 - back) % self.ring.len() as u64;
        self.ring.get(usize::try_from(at).ok()?).copied()
    }

    fn push(&mut self, segment: Segment) {
        for p in 1..=self.settings.max_period {
            // Before the push, the segment `p` before the new one is
            // `p - 1` back.
            let same = self.back(p - 1) == Some(segment);
            if let Some(run) = self.runs.get_mut(p - 1) {
                *run = if same { run.saturating_add(1) } else { 0 };
            }
        }
        let at = self.pushed.checked_rem(self.ring.len() as u64);
        if let Some(slot) = at.and_then(|at| self.ring.get_mut(usize::try_from(at).ok()?)) {
            *slot = segment;
        }
        self.pushed += 1;
    }

    /// Whether the newest segments end with a unit repeated enough.
    fn check(&self) -> Option<Repeated> {
        let s = &self.settings;
        for (p, &run) in (1..=s.max_period).zip(self.runs.iter()) {
            let copies = (run + p as u64) / p as u64;
            if copies < u64::from(s.repeats) || !self.primitive(p) {
                continue;
            }
            let (mut unit_chars, mut letters) = (0usize, 0u64);
            for back in 0..p {
                let seg = self.back(back)?;
                unit_chars += seg.chars;
                letters |= seg.letters;
            }
            let covered = usize::try_from(copies)
                .unwrap_or(usize::MAX)
                .saturating_mul(unit_chars);
            if unit_chars >= s.min_unit_chars
                && letters.count_ones() >= s.min_distinct_letters
                && covered >= s.min_total_chars
            {
                return Some(Repeated {
                    unit_chars,
                    repeats: u32::try_from(copies).unwrap_or(u32::MAX),
                    covered_chars: covered,
                });
            }
        }
        None
    }

    /// Whether the newest `p` segments are not themselves a shorter unit
    /// repeated (that repetition is judged under its own period).
    fn primitive(&self, p: usize) -> bool {
        !(1..p).any(|d| p.is_multiple_of(d) && (0..p - d).all(|i| self.back(i) == self.back(i + d)))
    }
}

mod delta;
pub use delta::output_delta;

#[cfg(test)]
mod delta_tests;
#[cfg(test)]
mod tests;
