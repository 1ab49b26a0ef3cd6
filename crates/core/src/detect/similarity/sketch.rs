//! The sketch a signature is made from: each word hashed into the
//! MinHash bins, the anchor, the payload.

use super::words::{fnv1a, is_list_marker, is_number, looks_random, mix, quoted, words, GOLDEN};
use super::{Signature, BINS, COPIES, SHORT_TAIL_WORDS, USER_COPIES, WORDS};

/// Builds a signature from a tail's words.
pub struct Sketcher {
    /// Per bin, the smallest value of the words hashed into it.
    pub(super) mins: [u32; BINS],
    /// Mixed into every word (the task, and the message's place).
    pub(super) salt: u64,
    pub(super) anchor: u64,
    /// Every word in order: a short tail's anchor.
    pub(super) all_words: u64,
    pub(super) words: u32,
    /// In tool results and the model's text: random-looking words read as
    /// one placeholder word, and numbers folded into the anchor. Never in
    /// what a user wrote or in a call's arguments.
    pub(super) machine_text: bool,
    pub(super) authored: bool,
    /// Every word is part of the anchor too (a call's arguments).
    pub(super) anchor_words: bool,
    /// The whole tail is the anchor: near only to the same words.
    pub(super) exact: bool,
    /// The words of the code in the model's text.
    pub(super) code: Vec<u64>,
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
            // The high bits pick the bin (a 64-bit multiply: WebAssembly
            // has no 128-bit one), the low bits are the value.
            let bin = (((h >> 32) * BINS as u64) >> 32) as usize;
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

    /// Every word of `text`, as [`super::words`] reads them.
    pub fn text(&mut self, text: &str) {
        words(text, |w, after| {
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
            let words: Vec<u64> = words.map(|w| fnv1a(w.as_bytes())).collect();
            if words.len() > longest.len() {
                longest = words;
            }
            rest = rest
                .get(body_start + len + fence.len()..)
                .unwrap_or_default();
        }
        if longest.is_empty() {
            for q in quoted(text) {
                let words: Vec<u64> = code_words(&q).map(|w| fnv1a(w.as_bytes())).collect();
                if words.len() > longest.len() {
                    longest = words;
                }
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
    #[cfg(test)]
    pub fn words(&self) -> u32 {
        self.words
    }

    pub fn finish(&self) -> Signature {
        let mut mins = self.mins;
        densify(&mut mins);
        let mut bins = [0u64; WORDS];
        // Bin `i` at bits `2 * (i % 32)` of word `i / 32`.
        for (w, ms) in bins.iter_mut().zip(mins.chunks_exact(32)) {
            *w = ms.iter().rev().fold(0, |w, m| w << 2 | u64::from(m & 3));
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
    // Walk right to left from the first full bin (wrapping), remembering
    // the nearest full bin to the right. Each bin is read before it is
    // written, so whether it was full is read from the bin itself.
    let mut source = mins.get(first_full).copied().unwrap_or(0);
    let mut distance = 0u64;
    let (before, from) = mins.split_at_mut(first_full);
    for m in before.iter_mut().rev().chain(from.iter_mut().rev()) {
        distance += 1;
        if *m != u32::MAX {
            source = *m;
            distance = 0;
        } else {
            *m = mix(u64::from(source) ^ distance.wrapping_mul(GOLDEN)) as u32;
        }
    }
}

#[cfg(test)]
mod densify_tests {
    use super::{densify, mix, BINS, GOLDEN};

    /// `densify` as it was (a copy of which bins were full, indices
    /// wrapping by remainder).
    fn reference(mins: &mut [u32; BINS]) {
        let Some(first_full) = mins.iter().position(|&m| m != u32::MAX) else {
            return;
        };
        let full: Vec<bool> = mins.iter().map(|&m| m != u32::MAX).collect();
        let mut source = mins[first_full];
        let mut distance = 0u64;
        for k in 1..=BINS {
            let i = (first_full + BINS - k) % BINS;
            distance += 1;
            if full[i] {
                source = mins[i];
                distance = 0;
            } else {
                mins[i] = mix(u64::from(source) ^ distance.wrapping_mul(GOLDEN)) as u32;
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn densifies_as_before(full in proptest::collection::vec((0usize..BINS, proptest::num::u32::ANY), 0..40)) {
            let mut mins = [u32::MAX; BINS];
            for (i, v) in full {
                mins[i] = v;
            }
            let mut expected = mins;
            reference(&mut expected);
            densify(&mut mins);
            proptest::prop_assert_eq!(mins.to_vec(), expected.to_vec());
        }
    }
}
