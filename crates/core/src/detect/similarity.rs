//! SimHash: a 64-bit fingerprint of a text such that similar texts get
//! fingerprints a few bits apart (Charikar, 2002). Near mode compares a
//! conversation's normalised, masked tail with the caller's recent ones by
//! the Hamming distance of their SimHashes.
//!
//! The features are the text's words and word pairs (shingles of one and
//! two words, ASCII case ignored), each hashed to 64 bits; bit `i` of the
//! SimHash is set when the features with bit `i` set outweigh the others.
//! A word changed in a 40-word text changes three of its ~80 features; a
//! different text changes most.
//!
//! For a conversation tail, each message's features are salted with its
//! place in the tail (the same messages in another order are another
//! tail), and a tool call's name and arguments weigh four times a word of
//! text: asking for another resource is another action, however much the
//! surrounding text repeats.

use crate::request::llm::{Message, Part};

/// Hamming distance of two SimHashes.
pub fn distance(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

/// Accumulates features into a SimHash.
///
/// Per bit it needs the weight of the features with the bit set (set
/// weight - unset weight decides the bit). Counting bit by bit would cost
/// 64 steps a feature; instead each byte of a feature's hash indexes a
/// table that spreads its 8 bits into the 8 byte lanes of a `u64`, so one
/// addition counts 8 bits at once, and the lanes are emptied into wide
/// counters before they can overflow.
pub struct SimHasher {
    /// Per byte of the hash: 8 lanes, each the weight of the features whose
    /// bit is set, since the last flush.
    lanes: [u64; 8],
    /// Weight added to the lanes since the last flush (at most 255).
    pending: u32,
    /// Per bit: the weight of the features with the bit set.
    set: [u32; 64],
    /// The weight of every feature.
    total: u32,
    /// The previous word's hash (for the pair feature), 0 at a boundary.
    previous: u64,
    features: u32,
    /// Mixed into every feature (the message's place in a tail).
    salt: u64,
    /// The weight of the features being added.
    weight: u32,
    /// Whether random-looking words are read as one placeholder word (in
    /// tool results and the model's text; never in what a user wrote or in
    /// a call's arguments).
    fold_ids: bool,
}

impl Default for SimHasher {
    fn default() -> Self {
        SimHasher {
            lanes: [0; 8],
            pending: 0,
            set: [0; 64],
            total: 0,
            previous: 0,
            features: 0,
            salt: 0,
            weight: 1,
            fold_ids: false,
        }
    }
}

/// `SPREAD[b]`: the 8 bits of `b` as 8 bytes, bit `i` in byte `i`.
// Evaluated at compile time: an index out of range fails the build.
#[allow(clippy::indexing_slicing)]
const SPREAD: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            if b & (1 << i) != 0 {
                t[b] |= 1 << (8 * i);
            }
            i += 1;
        }
        b += 1;
    }
    t
};

/// How much more a tool call's name and arguments weigh than text.
const CALL_WEIGHT: u32 = 4;

impl SimHasher {
    pub fn new() -> Self {
        Self::default()
    }

    fn feature(&mut self, h: u64) {
        let h = mix(h ^ self.salt);
        let w = self.weight;
        if self.pending + w > 255 {
            self.flush();
        }
        self.features += 1;
        self.total += w;
        self.pending += w;
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            let byte = (h >> (8 * i)) as u8;
            // Each lane holds at most 255: no carry into the next.
            // A byte always indexes the 256 entries (the check compiles away).
            let spread = SPREAD.get(usize::from(byte)).copied().unwrap_or(0);
            *lane += spread * u64::from(w);
        }
    }

    /// Empty the byte lanes into the wide counters.
    fn flush(&mut self) {
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            for j in 0..8 {
                if let Some(c) = self.set.get_mut(8 * i + j) {
                    *c += ((*lane >> (8 * j)) & 0xff) as u32;
                }
            }
            *lane = 0;
        }
        self.pending = 0;
    }

    /// Salt the features that follow (a message's place in a tail).
    pub fn salt(&mut self, salt: u64) {
        self.salt = mix(salt.wrapping_add(PAIR));
    }

    /// One word (or any token): itself, and the pair it makes with the
    /// word before it.
    pub fn word(&mut self, w: &[u8]) {
        let w = if self.fold_ids && looks_random(w) {
            b"<rand>".as_slice()
        } else {
            w
        };
        let h = mix(fnv1a(w));
        self.feature(h);
        if self.previous != 0 {
            self.feature(mix(self.previous.rotate_left(17) ^ h ^ PAIR));
        }
        self.previous = h;
    }

    /// Every word of `text`: runs of letters and digits (any script), plus
    /// `<`, `>` and `#` so masking placeholders stay whole (a token whose
    /// digits were masked, `j#U#w#M#fHq`, is one word, not seven).
    pub fn text(&mut self, text: &str) {
        if text.is_ascii() {
            // The common case, a byte at a time.
            let b = text.as_bytes();
            let mut start = None;
            for (i, &c) in b.iter().enumerate() {
                let inside = c.is_ascii_alphanumeric() || matches!(c, b'<' | b'>' | b'_' | b'#');
                match (inside, start) {
                    (true, None) => start = Some(i),
                    (false, Some(s)) => {
                        self.word(b.get(s..i).unwrap_or_default());
                        start = None;
                    }
                    _ => {}
                }
            }
            if let Some(s) = start {
                self.word(b.get(s..).unwrap_or_default());
            }
            return;
        }
        let mut start = None;
        for (i, c) in text.char_indices() {
            let inside = c.is_alphanumeric() || matches!(c, '<' | '>' | '_' | '#');
            match (inside, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    self.word(text.as_bytes().get(s..i).unwrap_or_default());
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            self.word(text.as_bytes().get(s..).unwrap_or_default());
        }
    }

    /// A marker token (a role, a part kind) that starts a new run of pairs.
    pub fn marker(&mut self, m: &[u8]) {
        self.previous = 0;
        self.word(m);
    }

    pub fn finish(&mut self) -> u64 {
        if self.features == 0 {
            return 0;
        }
        self.flush();
        // A bit is set when the features with it set outweigh the others.
        let total = self.total;
        self.set.iter().enumerate().fold(
            0u64,
            |acc, (bit, c)| if 2 * c > total { acc | (1 << bit) } else { acc },
        )
    }

    /// Features seen.
    pub fn features(&self) -> u32 {
        self.features
    }
}

/// The salt of a conversation's tail: a digest of its opening (system
/// prompt and first user message). Salted with it, two turns of one
/// conversation compare by their tails, while two tasks that merely look
/// alike (a batch job's runs through the same tools) get unrelated
/// SimHashes. Computed apart from the tail so that the opening need not be
/// held in memory while the tail is.
pub fn opening_salt(opening: &[Message]) -> u64 {
    let mut d = fnv1a(b"opening");
    for m in opening {
        d = mix(d ^ fnv1a(m.role.as_bytes()));
        for p in &m.parts {
            if let Part::Text(t) = p {
                d = mix(d ^ fnv1a(t.as_bytes()));
            }
        }
    }
    d
}

/// The SimHash of a conversation's tail, salted with [`opening_salt`]:
/// each message's role, then its parts (text words; a tool call's name and
/// argument words; a tool result's words; a media hash; another block's
/// type), each message's features salted with its place in the tail too.
pub fn of_conversation(salt: u64, tail: &[Message]) -> u64 {
    let mut h = SimHasher::new();
    for (i, m) in tail.iter().enumerate() {
        h.salt(salt ^ (i as u64 + 1));
        h.marker(m.role.as_bytes());
        h.fold_ids = !m.is_authored();
        parts(&mut h, &m.parts);
    }
    h.finish()
}

fn parts(h: &mut SimHasher, parts: &[Part]) {
    for p in parts {
        match p {
            Part::Text(t) => h.text(t),
            Part::Media(hash) => {
                h.marker(b"<media>");
                // A digest's bytes, never a token to fold.
                let fold = std::mem::replace(&mut h.fold_ids, false);
                h.word(hash);
                h.fold_ids = fold;
            }
            Part::ToolCall { name, arguments } => {
                h.marker(b"<call>");
                let fold = std::mem::replace(&mut h.fold_ids, false);
                h.weight = CALL_WEIGHT;
                h.word(name.as_bytes());
                h.text(arguments);
                h.weight = 1;
                h.fold_ids = fold;
            }
            Part::ToolResult { content, is_error } => {
                h.marker(if *is_error { b"<error>" } else { b"<result>" });
                let fold = std::mem::replace(&mut h.fold_ids, true);
                self::parts(h, content);
                h.fold_ids = fold;
            }
            Part::Other(kind) => {
                h.marker(b"<other>");
                h.word(kind.as_bytes());
            }
        }
    }
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

const PAIR: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a over the bytes, ASCII letters lower-cased.
fn fnv1a(b: &[u8]) -> u64 {
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
mod tests {
    use super::*;

    /// A tail's SimHash with no opening salt.
    fn of_messages(messages: &[Message]) -> u64 {
        of_conversation(0, messages)
    }

    fn of(s: &str) -> u64 {
        let mut h = SimHasher::new();
        h.text(s);
        h.finish()
    }

    const APOLOGY: &str = "i am sorry, i could not complete the deployment because the staging cluster rejected the manifest. the error says the image tag is missing. i will try again with the same manifest and report back as soon as the rollout finishes, unless you want me to stop here and wait for instructions from the release team";

    #[test]
    fn the_same_text_is_the_same_hash() {
        assert_eq!(of(APOLOGY), of(APOLOGY));
        assert_eq!(distance(of(APOLOGY), of(APOLOGY)), 0);
        assert_eq!(of(""), 0);
    }

    #[test]
    fn one_word_changed_is_near_another_text_is_far() {
        let one = APOLOGY.replace("complete", "finish");
        let d_one = distance(of(APOLOGY), of(&one));
        let other = "the quarterly revenue grew by eight percent, driven by the new subscription tier and lower churn in the enterprise segment; marketing spend stayed flat while the support backlog shrank to its lowest level this year";
        let d_other = distance(of(APOLOGY), of(other));
        assert!(d_one <= 6, "one word changed: {d_one}");
        assert!(d_other >= 20, "another text: {d_other}");
    }

    proptest::proptest! {
        /// The byte-lane counters agree with counting every bit.
        #[test]
        fn lanes_count_like_bits(features in proptest::collection::vec((proptest::prelude::any::<u64>(), 1u32..=4), 0..700)) {
            let mut h = SimHasher::new();
            let mut set = [0u32; 64];
            let mut total = 0u32;
            for &(f, w) in &features {
                h.weight = w;
                h.feature(f);
                let m = mix(f ^ h.salt);
                total += w;
                for (bit, c) in set.iter_mut().enumerate() {
                    if m >> bit & 1 == 1 {
                        *c += w;
                    }
                }
            }
            let want = if features.is_empty() {
                0
            } else {
                (0..64).fold(0u64, |acc, bit| if 2 * set[bit] > total { acc | 1 << bit } else { acc })
            };
            proptest::prop_assert_eq!(h.finish(), want);
        }
    }

    #[test]
    fn distance_counts_differing_bits() {
        assert_eq!(distance(0, u64::MAX), 64);
        assert_eq!(distance(0b1011, 0b0001), 2);
    }

    #[test]
    fn a_tail_in_another_order_is_another_tail() {
        use crate::request::llm::{Message, Part};
        let m = |role: &str, t: &str| Message {
            role: role.into(),
            parts: vec![Part::Text(t.into())],
        };
        let a = [
            m("user", "run the linter"),
            m("assistant", "found one error in handlers"),
        ];
        let b = [a[1].clone(), a[0].clone()];
        assert_eq!(of_messages(&a), of_messages(&a));
        assert!(distance(of_messages(&a), of_messages(&b)) > 8);
    }

    #[test]
    fn arguments_outweigh_text() {
        use crate::request::llm::{Message, Part};
        let call = |id: &str| Message {
            role: "assistant".into(),
            parts: vec![
                Part::Text("fetching the next order now, as before, for the report".into()),
                Part::ToolCall {
                    name: "get_order".into(),
                    arguments: format!("{{\"order_id\":\"{id}\"}}"),
                },
            ],
        };
        let d = distance(
            of_messages(&[call("7010651600")]),
            of_messages(&[call("7090168683")]),
        );
        assert!(d > 8, "another resource: {d}");
        let case = |q: &str| Message {
            role: "assistant".into(),
            parts: vec![Part::ToolCall {
                name: "search".into(),
                arguments: format!("{{\"query\":\"{q}\"}}"),
            }],
        };
        assert_eq!(
            of_messages(&[case("USB-C charger 65W")]),
            of_messages(&[case("usb-c  charger 65w")])
        );
    }

    #[test]
    fn unicode_words_count() {
        assert_ne!(of("fehler über alles"), of("fehler unter alles"));
        assert_eq!(of("日本語 テキスト"), of("日本語  テキスト"));
    }

    #[test]
    fn random_looking_words() {
        for w in [
            "j9U91w8M0730fHqnp3ue9RLAq",
            "f7167b20",
            "itH0Q8K8Al1VGZmhdq_Ai0WV",
            "j#U#w#M#fHqnp#ue#RLAq",
        ] {
            assert!(looks_random(w.as_bytes()), "{w}");
        }
        for w in [
            "sha256sum",
            "base64encoded",
            "gpt4o",
            "deployment",
            "12345678",
            "x86_64",
            "f#b#",
        ] {
            assert!(!looks_random(w.as_bytes()), "{w}");
        }
    }

    #[test]
    fn random_tokens_fold_in_results_and_model_text_not_in_user_words_or_arguments() {
        use crate::request::llm::{Message, Part};
        let result = |token: &str| Message {
            role: "tool".into(),
            parts: vec![Part::ToolResult {
                content: vec![Part::Text(format!(
                    "build failed: unexpected eof (session {token})"
                ))],
                is_error: true,
            }],
        };
        // Digits already masked in a tool result, as the filter sees it.
        assert_eq!(
            of_messages(&[result("j#U#w#M#fHqnp#ue#RLAq")]),
            of_messages(&[result("T#CdW#UvtQ#XJVWzdXqLP#TZC")])
        );
        let said = |role: &str, token: &str| Message {
            role: role.into(),
            parts: vec![Part::Text(format!("the session {token} expired, retrying"))],
        };
        assert_eq!(
            of_messages(&[said("assistant", "j9U91w8M0730f")]),
            of_messages(&[said("assistant", "x0pdAB4vzyn9Q")])
        );
        // What a user wrote is their question: another order is another one.
        assert_ne!(
            of_messages(&[said("user", "j9U91w8M0730f")]),
            of_messages(&[said("user", "x0pdAB4vzyn9Q")])
        );
        let call = |id: &str| Message {
            role: "assistant".into(),
            parts: vec![Part::ToolCall {
                name: "get_order".into(),
                arguments: format!("{{\"id\":\"{id}\"}}"),
            }],
        };
        assert_ne!(
            of_messages(&[call("A7K2M9P4Q1")]),
            of_messages(&[call("B3N8L2W5R7")])
        );
    }

    #[test]
    fn media_digests_are_never_folded() {
        use crate::request::llm::{Message, Part};
        // Two digests whose bytes happen to read as random-looking words.
        let shot = |d: &[u8; 32]| Message {
            role: "tool".into(),
            parts: vec![Part::ToolResult {
                content: vec![Part::Media(*d)],
                is_error: false,
            }],
        };
        let a = *b"a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6";
        let b = *b"z9y8x7w6v5u4t3s2r1q0p9o8n7m6l5k4";
        assert!(looks_random(&a) && looks_random(&b));
        assert_ne!(of_messages(&[shot(&a)]), of_messages(&[shot(&b)]));
    }
}
