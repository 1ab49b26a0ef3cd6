//! Near mode's signature of a conversation tail: an estimate of how many
//! words two tails share, and an anchor of what must not differ at all.
//!
//! **The similarity** is the Jaccard similarity of the tails' word sets
//! (each word salted with its message's place in the tail): 0.5 means half
//! of the words the two tails hold between them are in both. It is
//! estimated from a b-bit one-permutation MinHash (Li & König 2010; Li,
//! Owen & Zhang 2012): every word is hashed into 4 of [`BINS`] bins, each
//! bin keeps its smallest hash, empty bins borrow from the next full one
//! (rotation densification, Shrivastava & Li 2014), and the signature
//! keeps 2 bits of each bin. Two tails' bins agree with probability
//! `J + (1 - J) / 4`, so the fraction of agreeing bins gives `J` back with
//! a standard error of about 0.04 to 0.055 (20 to 150 words). A word
//! costs four hashes and comparisons, however many bins there are.
//!
//! **The anchor** is a digest of what a near repeat must have exactly: the
//! roles in order, every tool call (its name and the words of its
//! arguments, case and punctuation aside), and
//! the numbers left in tool results and the model's text once noise numbers
//! are masked (counts, percentages, amounts, sizes). A coding agent whose
//! test results differ only in their counts, an agent paging with another
//! cursor, or fetching another order, is never a near repeat, however
//! alike the words are. A tail of fewer than [`SHORT_TAIL_WORDS`] words
//! (a one-line tool result a threaded conversation sends alone, a short
//! prompt) anchors all its words: too few to estimate a similarity from,
//! it is near only to the same words.
//!
//! **The payload** is a digest of what the model's text in the tail
//! presents verbatim (its longest piece of code, fenced or inline, or with
//! no code its longest quoted phrase; its words as a set): a model
//! rewording its prose around the same fix (`pip install pyyaml`, a config
//! block with its lines reordered, the same "Cancel subscription" button)
//! repeats its payload, and two tails with the same anchor and payload are
//! near whatever their prose shares.
//!
//! A signature is 4 bytes of anchor, 4 of payload and [`BINS`] × 2 bits
//! (48 bytes): 56 bytes; a hit in the near record is 60 with its time.

use crate::request::llm::{Message, Part};

/// Bins of the MinHash.
pub const BINS: usize = 192;
/// 64-bit words holding the bins' 2-bit values.
const WORDS: usize = BINS / 32;
/// A signature's encoded size: anchor, payload, bins.
pub const SIGNATURE_BYTES: usize = 4 + 4 + 8 * WORDS;
/// A tail with fewer words is near only to a tail with the same words.
pub const SHORT_TAIL_WORDS: u32 = 24;
/// Places each word takes in the MinHash.
const COPIES: usize = 4;
const USER_COPIES: usize = 1;

/// A tail's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Signature {
    pub anchor: u32,
    /// A digest of the code the model's text in the tail carries (its
    /// words, as a set); 0 for none.
    pub payload: u32,
    /// 2 bits per bin, 32 bins to a word.
    pub bins: [u64; WORDS],
}

/// The least similarity that makes two tails near, as the number of bins
/// that must agree (the same decision in the filter and in Redis, in
/// integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NearThreshold {
    pub min_matches: u32,
}

impl NearThreshold {
    /// The threshold for `near_similarity` in thousandths (1..=1000): bins
    /// agree with probability `(1 + 3J) / 4`, so `J >= s` reads `matches >=
    /// BINS * (1 + 3s) / 4`, in integers only.
    pub fn from_milli(milli: u32) -> NearThreshold {
        let milli = milli.min(1000);
        let need = (BINS as u32 * (1000 + 3 * milli)).div_ceil(4000);
        NearThreshold {
            min_matches: need.min(BINS as u32),
        }
    }
}

impl Signature {
    /// Bins whose values agree.
    pub fn matches(&self, other: &Signature) -> u32 {
        self.bins
            .iter()
            .zip(other.bins.iter())
            .map(|(a, b)| {
                let x = a ^ b;
                // A bin differs when either of its bits does.
                let differ = (x | (x >> 1)) & 0x5555_5555_5555_5555;
                32 - differ.count_ones()
            })
            .sum()
    }

    /// The estimated similarity of two tails (0 when their anchors differ).
    pub fn similarity(&self, other: &Signature) -> f64 {
        if self.anchor != other.anchor {
            return 0.0;
        }
        let p = f64::from(self.matches(other)) / BINS as f64;
        ((4.0 * p - 1.0) / 3.0).clamp(0.0, 1.0)
    }

    /// Whether `other` is a near repeat of this tail: the same anchor, and
    /// at least the threshold's agreeing bins or the same code in the
    /// model's text (a model rewording its prose around the same fix).
    pub fn is_near(&self, other: &Signature, t: NearThreshold) -> bool {
        self.anchor == other.anchor
            && ((self.payload != 0 && self.payload == other.payload)
                || self.matches(other) >= t.min_matches)
    }

    pub fn to_bytes(&self) -> [u8; SIGNATURE_BYTES] {
        let mut out = [0u8; SIGNATURE_BYTES];
        let (head, rest) = out.split_at_mut(8);
        let (anchor, payload) = head.split_at_mut(4);
        anchor.copy_from_slice(&self.anchor.to_le_bytes());
        payload.copy_from_slice(&self.payload.to_le_bytes());
        for (dst, w) in rest.chunks_exact_mut(8).zip(self.bins.iter()) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(b: &[u8]) -> Option<Signature> {
        if b.len() != SIGNATURE_BYTES {
            return None;
        }
        let (head, rest) = b.split_at(8);
        let (anchor, payload) = head.split_at(4);
        let mut s = Signature {
            anchor: u32::from_le_bytes(anchor.try_into().ok()?),
            payload: u32::from_le_bytes(payload.try_into().ok()?),
            bins: [0; WORDS],
        };
        for (w, src) in s.bins.iter_mut().zip(rest.chunks_exact(8)) {
            *w = u64::from_le_bytes(src.try_into().ok()?);
        }
        Some(s)
    }

    /// 112 hex digits: the anchor (8), the payload (8), then the bins'
    /// words (16 each), as the Redis function reads them.
    pub fn hex(&self) -> String {
        let mut s = format!("{:08x}{:08x}", self.anchor, self.payload);
        for w in &self.bins {
            s.push_str(&format!("{w:016x}"));
        }
        s
    }

    pub fn from_hex(h: &str) -> Option<Signature> {
        if h.len() != 2 * SIGNATURE_BYTES || !h.is_ascii() {
            return None;
        }
        let mut s = Signature {
            anchor: u32::from_str_radix(h.get(..8)?, 16).ok()?,
            payload: u32::from_str_radix(h.get(8..16)?, 16).ok()?,
            bins: [0; WORDS],
        };
        for (i, w) in s.bins.iter_mut().enumerate() {
            *w = u64::from_str_radix(h.get(16 + 16 * i..16 + 16 * (i + 1))?, 16).ok()?;
        }
        Some(s)
    }
}

/// Builds a signature from a tail's words.
pub struct Sketcher {
    /// Per bin, the smallest value of the words hashed into it.
    mins: [u32; BINS],
    /// Mixed into every word (the task, and the message's place).
    salt: u64,
    anchor: u64,
    /// Every word in order: a short tail's anchor.
    all_words: u64,
    words: u32,
    /// In tool results and the model's text: random-looking words read as
    /// one placeholder word, and numbers folded into the anchor. Never in
    /// what a user wrote or in a call's arguments.
    machine_text: bool,
    authored: bool,
    /// Every word is part of the anchor too (a call's arguments).
    anchor_words: bool,
    /// The whole tail is the anchor: near only to the same words.
    exact: bool,
    /// The words of the code in the model's text.
    code: Vec<u64>,
}

impl Default for Sketcher {
    fn default() -> Self {
        Sketcher {
            mins: [u32::MAX; BINS],
            salt: 0,
            anchor: fnv1a(b"anchor"),
            all_words: 0,
            words: 0,
            machine_text: false,
            authored: false,
            anchor_words: false,
            exact: false,
            code: Vec::new(),
        }
    }
}

impl Sketcher {
    pub fn new() -> Self {
        Self::default()
    }

    /// Salt the words that follow (a message's place in a tail, with the
    /// task's salt).
    pub fn salt(&mut self, salt: u64) {
        self.salt = mix(salt.wrapping_add(GOLDEN));
    }

    /// A word goes into [`COPIES`] places: the MinHash of the set of
    /// (word, copy) pairs estimates the same similarity, and a short tail
    /// fills four times as many bins (half the error on 20 words).
    fn hash(&mut self, h: u64) {
        let mut h = mix(h ^ self.salt);
        let copies = if self.authored { USER_COPIES } else { COPIES };
        for _ in 0..copies {
            // The high bits pick the bin, the low bits are the value.
            let bin = ((u128::from(h) * BINS as u128) >> 64) as usize;
            if let Some(m) = self.mins.get_mut(bin) {
                *m = (*m).min(h as u32);
            }
            h = mix(h.wrapping_add(GOLDEN));
        }
    }

    fn anchor(&mut self, b: &[u8]) {
        self.anchor = mix(self.anchor ^ fnv1a(b));
    }

    /// One word (or any token).
    pub fn word(&mut self, w: &[u8]) {
        if self.anchor_words || (self.machine_text && is_number(w)) {
            // A number left by masking carries meaning: it must not differ.
            self.anchor(w);
        }
        let w = if self.machine_text && looks_random(w) {
            b"<rand>".as_slice()
        } else {
            w
        };
        let h = fnv1a(w);
        self.all_words = mix(self.all_words ^ h);
        self.words += 1;
        self.hash(h);
    }

    /// Every word of `text`: runs of letters and digits (any script), plus
    /// `<`, `>`, `_` and `#` so masking placeholders stay whole (a token
    /// whose digits were masked, `j#U#w#M#fHq`, is one word); in a script
    /// written without spaces (Chinese, Japanese, Thai), each pair of
    /// neighbouring characters.
    pub fn text(&mut self, text: &str) {
        words_in_context(text, |w, after| {
            // A list's markers (`1)`, `2.`) are its layout, not numbers
            // that carry meaning: a reworded answer numbers its steps or not.
            let machine = self.machine_text;
            self.machine_text = machine && !is_list_marker(w, after);
            self.word(w);
            self.machine_text = machine;
        });
    }

    /// What a text of the model's presents verbatim: its longest piece of
    /// code (fenced or inline, between backticks) or, with no code, its
    /// longest quoted phrase (a UI label, a path). Its words, as a set,
    /// make the tail's payload. A fence's language tag is not a word of
    /// the code (`bash`, `sh`: the same command).
    pub fn payload(&mut self, text: &str) {
        fn keep_longest(longest: &mut Vec<u64>, words: Vec<u64>) {
            if words.len() > longest.len() {
                *longest = words;
            }
        }
        let mut longest: Vec<u64> = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('`') {
            let after = rest.get(open..).unwrap_or_default();
            let fence = if after.starts_with("```") { "```" } else { "`" };
            let body_start = open + fence.len();
            let Some(len) = rest.get(body_start..).and_then(|r| r.find(fence)) else {
                break;
            };
            let body = rest.get(body_start..body_start + len).unwrap_or_default();
            let mut words = code_words(body).peekable();
            if fence == "```" && words.peek().is_some_and(|w| LANGUAGE_TAGS.contains(w)) {
                words.next();
            }
            keep_longest(&mut longest, words.map(|w| fnv1a(w.as_bytes())).collect());
            rest = rest
                .get(body_start + len + fence.len()..)
                .unwrap_or_default();
        }
        if longest.is_empty() {
            for q in quoted(text) {
                keep_longest(
                    &mut longest,
                    code_words(&q).map(|w| fnv1a(w.as_bytes())).collect(),
                );
            }
        }
        self.code.extend(longest);
    }

    /// A marker (a role, a part's kind): a word, and part of the anchor.
    pub fn marker(&mut self, m: &[u8]) {
        self.anchor(m);
        self.hash(fnv1a(m));
    }

    /// Words hashed so far.
    pub fn words(&self) -> u32 {
        self.words
    }

    pub fn finish(&self) -> Signature {
        let mut mins = self.mins;
        densify(&mut mins);
        let mut bins = [0u64; WORDS];
        for (i, m) in mins.iter().enumerate() {
            if let Some(w) = bins.get_mut(i / 32) {
                *w |= u64::from(m & 3) << (2 * (i % 32));
            }
        }
        // Too few words to estimate a similarity from (a handful of shared
        // words would dominate): a short tail is near only to the same words.
        let anchor = if self.exact || self.words < SHORT_TAIL_WORDS {
            mix(self.anchor ^ self.all_words)
        } else {
            self.anchor
        };
        let mut code = self.code.clone();
        code.sort_unstable();
        code.dedup();
        let payload = match code.iter().fold(0u64, |d, w| mix(d ^ w)) {
            _ if code.is_empty() => 0,
            d => ((d ^ (d >> 32)) as u32).max(1),
        };
        Signature {
            anchor: (anchor ^ (anchor >> 32)) as u32,
            payload,
            bins,
        }
    }
}

/// Every word of `text`, in order: runs of letters and digits (any
/// script), plus `<`, `>`, `_` and `#` so masking placeholders stay whole
/// (a token whose digits were masked, `j#U#w#M#fHq`, is one word); in a
/// script written without spaces (Chinese, Japanese, Thai), each pair of
/// neighbouring characters (a lone character, itself).
pub fn words(text: &str, mut word: impl FnMut(&[u8])) {
    words_in_context(text, |w, _| word(w));
}

/// [`words`], each with the text that follows it.
pub fn words_in_context(text: &str, mut word: impl FnMut(&[u8], &[u8])) {
    let b = text.as_bytes();
    if text.is_ascii() {
        let mut start = None;
        for (i, &c) in b.iter().enumerate() {
            let inside = c.is_ascii_alphanumeric() || matches!(c, b'<' | b'>' | b'_' | b'#');
            match (inside, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    word(
                        b.get(s..i).unwrap_or_default(),
                        b.get(i..).unwrap_or_default(),
                    );
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            word(b.get(s..).unwrap_or_default(), &[]);
        }
        return;
    }
    let mut start = None;
    // A run of an unsegmented script: where its previous character
    // starts, and how long the run is.
    let mut run: Option<(usize, u32)> = None;
    for (i, c) in text.char_indices() {
        if unsegmented(c) {
            if let Some(s) = start.take() {
                word(
                    b.get(s..i).unwrap_or_default(),
                    b.get(i..).unwrap_or_default(),
                );
            }
            let end = i + c.len_utf8();
            run = Some(match run {
                Some((prev, n)) => {
                    word(
                        b.get(prev..end).unwrap_or_default(),
                        b.get(end..).unwrap_or_default(),
                    );
                    (i, n + 1)
                }
                None => (i, 1),
            });
            continue;
        }
        if let Some((prev, n)) = run.take() {
            if n == 1 {
                word(
                    b.get(prev..i).unwrap_or_default(),
                    b.get(i..).unwrap_or_default(),
                );
            }
        }
        let inside = c.is_alphanumeric() || matches!(c, '<' | '>' | '_' | '#');
        match (inside, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                word(
                    b.get(s..i).unwrap_or_default(),
                    b.get(i..).unwrap_or_default(),
                );
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        word(b.get(s..).unwrap_or_default(), &[]);
    }
    if let Some((prev, 1)) = run {
        word(b.get(prev..).unwrap_or_default(), &[]);
    }
}

/// The phrases a text quotes (`'Olá, time da Lumina,'`, `「【ゆずリビング】発送遅延
/// のお詫び」`, `"Maria"`): between matching quotes, at least 2 characters.
pub fn quoted(text: &str) -> Vec<String> {
    const PAIRS: [(char, char); 8] = [
        ('"', '"'),
        ('\'', '\''),
        ('“', '”'),
        ('‘', '’'),
        ('«', '»'),
        ('「', '」'),
        ('『', '』'),
        ('„', '“'),
    ];
    // An ASCII quote opens after a space or punctuation and closes before
    // one: an apostrophe (`it's`, `don't`) is not a quote.
    let opens = |t: &str, i: usize| {
        t.get(..i)
            .and_then(|h| h.chars().next_back())
            .is_none_or(|c| !c.is_alphanumeric())
    };
    let closes = |t: &str, j: usize| {
        t.get(j..)
            .and_then(|r| r.chars().nth(1))
            .is_none_or(|c| !c.is_alphanumeric())
    };
    let mut out = Vec::new();
    for (open, close) in PAIRS {
        let ascii = open.is_ascii();
        let mut from = 0;
        while let Some(i) = text
            .get(from..)
            .and_then(|r| r.find(open))
            .map(|i| from + i)
        {
            let start = i + open.len_utf8();
            from = start;
            if ascii && !opens(text, i) {
                continue;
            }
            let Some(j) = text.get(start..).and_then(|r| {
                r.match_indices(close)
                    .map(|(j, _)| start + j)
                    .find(|&j| !ascii || closes(text, j))
            }) else {
                break;
            };
            let phrase = text.get(start..j).unwrap_or_default().trim();
            if (2..=200).contains(&phrase.chars().count()) {
                out.push(phrase.to_string());
            }
            from = j + close.len_utf8();
        }
    }
    out
}

/// Words of code: runs of letters, digits and `_`, lower-cased by the
/// digest.
fn code_words(code: &str) -> impl Iterator<Item = &str> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// Fence tags that name a language, not code.
const LANGUAGE_TAGS: &[&str] = &[
    "bash",
    "sh",
    "shell",
    "zsh",
    "console",
    "powershell",
    "ps1",
    "bat",
    "cmd",
    "python",
    "py",
    "yaml",
    "yml",
    "json",
    "nginx",
    "sql",
    "js",
    "javascript",
    "ts",
    "typescript",
    "go",
    "rust",
    "java",
    "c",
    "cpp",
    "text",
    "txt",
    "ini",
    "toml",
    "xml",
    "html",
    "css",
    "dockerfile",
    "diff",
    "regex",
];

/// Fill each empty bin from the next full one to its right (wrapping),
/// mixed with the distance, so two tails that leave the same bins empty
/// fill them alike. A tail with no words keeps every bin empty.
fn densify(mins: &mut [u32; BINS]) {
    let Some(first_full) = mins.iter().position(|&m| m != u32::MAX) else {
        return;
    };
    let full: Vec<bool> = mins.iter().map(|&m| m != u32::MAX).collect();
    // Walk right to left from the first full bin, remembering the nearest
    // full bin to the right.
    let mut source = mins.get(first_full).copied().unwrap_or(0);
    let mut distance = 0u64;
    for k in 1..=BINS {
        let i = (first_full + BINS - k) % BINS;
        distance += 1;
        if full.get(i).copied().unwrap_or(false) {
            source = mins.get(i).copied().unwrap_or(0);
            distance = 0;
        } else if let Some(m) = mins.get_mut(i) {
            *m = mix(u64::from(source) ^ distance.wrapping_mul(GOLDEN)) as u32;
        }
    }
}

/// The salt of a conversation's tail: a digest of its task, the first
/// message a user wrote (as written). Salted with it, turns of one task (or
/// the same task started again) compare by their tails, while two tasks
/// that merely look alike (a batch job's runs through the same tools) get
/// unrelated signatures. The system prompt is left out: agents rewrite it
/// between turns (the current time, a scratchpad, a token budget), and a
/// loop must stay one loop. With no user message, the prompts stand in.
pub fn opening_salt(opening: &[Message]) -> u64 {
    let task: Vec<&Message> = match opening.iter().find(|m| !m.is_prompt()) {
        Some(first) => vec![first],
        None => opening.iter().collect(),
    };
    let mut d = fnv1a(b"opening");
    for m in task {
        d = mix(d ^ fnv1a(m.role.as_bytes()));
        for p in &m.parts {
            match p {
                Part::Text(t) => d = mix(d ^ fnv1a(t.as_bytes())),
                Part::Media(h) => d = mix(d ^ fnv1a(h)),
                _ => {}
            }
        }
    }
    d
}

/// The signature of a conversation's tail, salted with [`opening_salt`]:
/// each message's role, then its parts (text words; a tool call's name and
/// argument words; a tool result's words; a media digest; another block's
/// type), each message's words salted with its place in the tail too.
/// `exact`: the tail is near only to the same words (its newest answer
/// made progress: the next edit of a text is not a repeat of the last).
pub fn of_conversation(salt: u64, tail: &[Message], exact: bool) -> Signature {
    let mut s = Sketcher::new();
    s.exact = exact;
    for (i, m) in tail.iter().enumerate() {
        s.salt(salt ^ (i as u64 + 1));
        s.machine_text = false;
        s.authored = m.is_authored();
        s.marker(m.role.as_bytes());
        s.machine_text = !m.is_authored();
        parts(&mut s, &m.parts);
        if !m.is_authored() {
            for p in &m.parts {
                if let Part::Text(t) = p {
                    s.payload(t);
                }
            }
        }
    }
    s.finish()
}

fn parts(s: &mut Sketcher, parts: &[Part]) {
    for p in parts {
        match p {
            Part::Text(t) => s.text(t),
            Part::Media(hash) => {
                s.marker(b"<media>");
                // A digest's bytes: part of the anchor, never folded.
                s.marker(hash);
            }
            Part::ToolCall { name, arguments } => {
                s.marker(b"<call>");
                let machine = std::mem::replace(&mut s.machine_text, false);
                s.marker(name.as_bytes());
                // Every word of the arguments is anchored (another order,
                // another cursor, is another action); case, spacing and
                // punctuation are not (`"USB-C  charger"` is `"usb c
                // charger"`).
                s.anchor_words = true;
                s.text(arguments);
                s.anchor_words = false;
                s.machine_text = machine;
            }
            Part::ToolResult { content, is_error } => {
                s.marker(if *is_error { b"<error>" } else { b"<result>" });
                // A tool's words, even inside a user message (Anthropic).
                let machine = std::mem::replace(&mut s.machine_text, true);
                let authored = std::mem::replace(&mut s.authored, false);
                self::parts(s, content);
                s.machine_text = machine;
                s.authored = authored;
            }
            Part::Other(kind) => {
                s.marker(b"<other>");
                s.word(kind.as_bytes());
            }
        }
    }
}

/// A character of a script written without spaces between words: its
/// text is read as character pairs (Han, Hiragana, Katakana, Thai, Lao,
/// Khmer, Myanmar).
pub fn unsegmented(c: char) -> bool {
    matches!(u32::from(c),
        0x3040..=0x30FF | 0x31F0..=0x31FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF
        | 0xF900..=0xFAFF | 0x20000..=0x2FA1F | 0x0E00..=0x0EFF | 0x1780..=0x17FF
        | 0x1000..=0x109F)
}

/// A list's marker: a number up to 20 followed by `)`, or by `.` and a
/// space (`1) open settings`, `2. clear the cache`).
fn is_list_marker(w: &[u8], after: &[u8]) -> bool {
    is_number(w)
        && w.len() <= 2
        && std::str::from_utf8(w)
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n <= 20)
        && (after.first() == Some(&b')') || after.starts_with(b". "))
}

/// Digits only: a number (`1,843.5` reads as the words `1`, `843`, `5`).
fn is_number(w: &[u8]) -> bool {
    !w.is_empty() && w.iter().all(u8::is_ascii_digit)
}

/// A word that looks machine-made rather than written: 8 or more
/// characters, letters and digits (at least 2 of each) switching kind at
/// least 3 times (`j9U91w8M0730fHq`, `f7167b20`, `itH0Q8K8Al1VGZ_Ai0WV`),
/// but not `sha256sum`, `base64encoded` or `gpt4`. Session tokens and
/// worker ids that no masking class names.
fn looks_random(w: &[u8]) -> bool {
    if w.len() < 8 {
        return false;
    }
    let (mut digits, mut letters, mut switches) = (0u32, 0u32, 0u32);
    let mut last_digit = None;
    for &c in w {
        // `#`: a digit masked in a tool result.
        let digit = if c.is_ascii_digit() || c == b'#' {
            digits += 1;
            true
        } else if c.is_ascii_alphabetic() {
            letters += 1;
            false
        } else {
            continue;
        };
        if last_digit.is_some_and(|d| d != digit) {
            switches += 1;
        }
        last_digit = Some(digit);
    }
    digits >= 2 && letters >= 2 && switches >= 3
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a over the bytes, ASCII letters lower-cased.
pub fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
        (h ^ u64::from(c.to_ascii_lowercase())).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// splitmix64's finaliser: every input bit reaches every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
