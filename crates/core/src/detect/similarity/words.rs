//! Words as near mode reads them, in any script, and the hashes made of
//! them.

/// Every word of `text`, in order: runs of letters and digits (any
/// script), plus `<`, `>`, `_` and `#` so masking placeholders stay whole
/// (a token whose digits were masked, `j#U#w#M#fHq`, is one word); in a
/// script written without spaces (Chinese, Japanese, Thai), each pair of
/// neighbouring characters (a lone character, itself). Each word comes
/// with the text that follows it.
pub fn words(text: &str, mut word: impl FnMut(&[u8], &[u8])) {
    let b = text.as_bytes();
    // The word at `s..e`, and the text after it.
    let mut emit = |s: usize, e: usize| {
        word(
            b.get(s..e).unwrap_or_default(),
            b.get(e..).unwrap_or_default(),
        )
    };
    let mut start = None;
    if text.is_ascii() {
        for (i, &c) in b.iter().enumerate() {
            if c.is_ascii_alphanumeric() || matches!(c, b'<' | b'>' | b'_' | b'#') {
                start.get_or_insert(i);
            } else if let Some(s) = start.take() {
                emit(s, i);
            }
        }
        if let Some(s) = start {
            emit(s, b.len());
        }
        return;
    }
    // A run of an unsegmented script: where its previous character
    // starts, and how long the run is.
    let mut run: Option<(usize, u32)> = None;
    for (i, c) in text.char_indices() {
        if unsegmented(c) {
            if let Some(s) = start.take() {
                emit(s, i);
            }
            let end = i + c.len_utf8();
            run = Some(match run {
                Some((prev, n)) => {
                    emit(prev, end);
                    (i, n + 1)
                }
                None => (i, 1),
            });
            continue;
        }
        if let Some((prev, 1)) = run.take() {
            emit(prev, i);
        }
        if c.is_alphanumeric() || matches!(c, '<' | '>' | '_' | '#') {
            start.get_or_insert(i);
        } else if let Some(s) = start.take() {
            emit(s, i);
        }
    }
    if let Some(s) = start {
        emit(s, b.len());
    }
    if let Some((prev, 1)) = run {
        emit(prev, b.len());
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
    // Text without a non-ASCII byte holds none of the other quotes.
    let ascii_text = text.is_ascii();
    for (open, close) in PAIRS {
        let ascii = open.is_ascii();
        if ascii_text && !ascii {
            continue;
        }
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

/// A word that can tell what a text says: four characters or more, or a
/// character of a script written without spaces.
pub fn telling(w: &[u8]) -> bool {
    std::str::from_utf8(w).is_ok_and(|s| s.chars().count() >= 4 || s.chars().any(unsegmented))
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
pub(super) fn is_list_marker(w: &[u8], after: &[u8]) -> bool {
    is_number(w)
        && w.len() <= 2
        && w.iter().fold(0, |n, &d| 10 * n + u32::from(d - b'0')) <= 20
        && (after.first() == Some(&b')') || after.starts_with(b". "))
}

/// Digits only: a number (`1,843.5` reads as the words `1`, `843`, `5`).
pub(super) fn is_number(w: &[u8]) -> bool {
    !w.is_empty() && w.iter().all(u8::is_ascii_digit)
}

/// A word that looks machine-made rather than written: 8 or more
/// characters, letters and digits (at least 2 of each) switching kind at
/// least 3 times (`j9U91w8M0730fHq`, `f7167b20`, `itH0Q8K8Al1VGZ_Ai0WV`),
/// but not `sha256sum`, `base64encoded` or `gpt4`. Session tokens and
/// worker ids that no masking class names.
pub fn looks_random(w: &[u8]) -> bool {
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

pub(super) const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a over the bytes, ASCII letters lower-cased.
pub fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
        (h ^ u64::from(c.to_ascii_lowercase())).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// splitmix64's finaliser: every input bit reaches every output bit.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
