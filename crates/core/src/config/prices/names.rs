//! How a request's `model` names a priced model. Providers and gateways
//! write one model many ways: `gpt-4o`, `GPT-4o`, `gpt-4o-2024-08-06`,
//! `openai/gpt-4o`, `azure/gpt-4o`; `claude-sonnet-4-5-20250929`,
//! `us.anthropic.claude-sonnet-4-5-20250929-v1:0` (Bedrock),
//! `claude-sonnet-4-5@20250929` (Vertex AI); `ft:gpt-4o-mini-2024-07-18:acme::x1`
//! (a fine-tuned model). [`resolve`] tries the forms of a name most specific
//! first, without allocating: the name as written, then without the
//! provider's path, Bedrock's region, vendor and version and Vertex AI's
//! `@`, then without a date or `-latest`.
//!
//! `tools/prices.py` names the built-in table's rows by the same rules:
//! keep the two in step.

use super::Provider;
use std::cmp::Ordering;

/// Bedrock's cross-region inference prefixes (`us.anthropic.…`).
const REGIONS: &[&str] = &["us", "eu", "apac", "global", "jp", "au", "ca", "us-gov"];
/// Bedrock's model vendors (`anthropic.claude-…`, `meta.llama3-…`).
const VENDORS: &[&str] = &[
    "anthropic",
    "meta",
    "mistral",
    "deepseek",
    "openai",
    "qwen",
    "amazon",
    "cohere",
    "ai21",
    "google",
    "moonshot",
    "moonshotai",
    "minimax",
    "writer",
    "nvidia",
    "zai",
];
/// The longest name built from parts (Vertex AI's `name@date` as
/// `name-date`, `name` as `name-latest`); longer ones are not built.
const MAX_BUILT: usize = 128;

/// Call `find` with the forms of `model`, most specific first, until it
/// finds one; `find` should compare ignoring ASCII case.
///
/// 1. the name as written;
/// 2. a fine-tuned `ft:BASE:org::id` as `ft:BASE` (and undated), then as
///    its base model (the rest of the steps);
/// 3. without leading path segments (`openai/`, `openrouter/anthropic/`,
///    `accounts/fireworks/models/`, `publishers/google/models/`), a
///    Bedrock region and vendor (`us.anthropic.`, `meta.`) and version
///    (`-v1:0`), and a Vertex AI `@tag`; a Vertex AI `@YYYYMMDD` first as
///    `-YYYYMMDD`;
/// 4. without a date (`-2024-08-06`, `-20250514`, `-0613`, `-2411`), then
///    that with `-latest`;
/// 5. without `-latest`, or else with it.
pub fn resolve<T>(model: &str, mut find: impl FnMut(&str) -> Option<T>) -> Option<T> {
    let s = model.trim();
    if s.is_empty() {
        return None;
    }
    if let Some(found) = find(s) {
        return Some(found);
    }
    let Some(rest) = strip_prefix_ci(s, "ft:") else {
        return plain(s, s, find);
    };
    let base = rest.split(':').next().unwrap_or(rest);
    let tuned = s.get(..3 + base.len()).unwrap_or(s);
    (tuned.len() < s.len())
        .then(|| find(tuned))
        .flatten()
        .or_else(|| strip_date(tuned).and_then(&mut find))
        .or_else(|| plain(base, s, find))
}

/// Steps 3 to 5 for `s`; `tried` was looked up already.
fn plain<T>(s: &str, tried: &str, mut find: impl FnMut(&str) -> Option<T>) -> Option<T> {
    let (name, date) = normalize(s);
    if name.is_empty() {
        return None;
    }
    let mut buf = [0u8; MAX_BUILT];
    date.and_then(|date| join(&mut buf, name, date).and_then(&mut find))
        .or_else(|| (name != tried).then(|| find(name)).flatten())
        .or_else(|| {
            let undated = strip_date(name)?;
            find(undated).or_else(|| join(&mut buf, undated, "latest").and_then(&mut find))
        })
        .or_else(|| match strip_latest(name) {
            Some(undated) => find(undated).or_else(|| strip_date(undated).and_then(&mut find)),
            None => join(&mut buf, name, "latest").and_then(&mut find),
        })
}

/// `name-part`, in `buf`.
fn join<'b>(buf: &'b mut [u8; MAX_BUILT], name: &str, part: &str) -> Option<&'b str> {
    let len = name.len() + 1 + part.len();
    let out = buf.get_mut(..len)?;
    let (head, tail) = out.split_at_mut(name.len());
    head.copy_from_slice(name.as_bytes());
    let (dash, rest) = tail.split_first_mut()?;
    *dash = b'-';
    rest.copy_from_slice(part.as_bytes());
    std::str::from_utf8(out).ok()
}

/// `s` without the parts no price list names: the leading path segments,
/// a Bedrock region, vendor and version, a Vertex AI `@tag`; and the tag
/// when it is a date (`@20241022`).
fn normalize(s: &str) -> (&str, Option<&str>) {
    let mut n = s.rsplit('/').next().unwrap_or(s);
    let mut tag = None;
    if let Some((head, t)) = n.split_once('@') {
        n = head;
        tag = Some(t);
    }
    // `region.vendor.model` or `vendor.model` (no region is a vendor).
    let split = match n.split_once('.') {
        Some((region, rest)) if is_one_of(region, REGIONS) => rest.split_once('.'),
        split => split,
    };
    let model = split.filter(|(v, _)| is_one_of(v, VENDORS)).map(|(_, m)| m);
    let vendor = model.is_some();
    n = model.unwrap_or(n);
    // Bedrock's version: `-v1:0`, `-1:0`, `:0`.
    match n.rsplit_once(':') {
        Some((head, num)) if all_digits(num) => {
            n = strip_version(head, true).unwrap_or(head);
        }
        _ if vendor || tag.is_some() => n = strip_version(n, false).unwrap_or(n),
        _ => {}
    }
    let date = tag.filter(|t| t.len() == 8 && all_digits(t));
    (n, date)
}

/// `name-vN` (or, `plain`, `name-N`) without its version.
fn strip_version(s: &str, plain: bool) -> Option<&str> {
    let (head, tail) = s.rsplit_once('-')?;
    let num = match tail.strip_prefix(['v', 'V']) {
        Some(n) => n,
        None if plain => tail,
        None => return None,
    };
    (all_digits(num) && !head.is_empty()).then_some(head)
}

/// `name-YYYY-MM-DD`, `name-YYYYMMDD`, `name-MMDD` (`gpt-4-0613`) or
/// `name-YYMM` (`mistral-large-2411`) without its date.
pub fn strip_date(model: &str) -> Option<&str> {
    // -YYYY-MM-DD
    if model.len() > 11 {
        let (head, tail) = model.split_at_checked(model.len() - 11)?;
        let t = tail.as_bytes();
        if t.first() == Some(&b'-')
            && t.get(5) == Some(&b'-')
            && t.get(8) == Some(&b'-')
            && all_digits(tail.get(1..5).unwrap_or(""))
            && all_digits(tail.get(6..8).unwrap_or(""))
            && all_digits(tail.get(9..).unwrap_or(""))
        {
            return Some(head);
        }
    }
    let (head, tail) = model.rsplit_once('-')?;
    if head.is_empty() || !all_digits(tail) {
        return None;
    }
    let pair = |i: usize| tail.get(i..i + 2).and_then(|d| d.parse::<u8>().ok());
    let dated = match tail.len() {
        8 => true,
        4 => match (pair(0), pair(2)) {
            // MMDD, or YYMM
            (Some(a), Some(b)) => {
                ((1..=12).contains(&a) && (1..=31).contains(&b))
                    || ((23..=30).contains(&a) && (1..=12).contains(&b))
            }
            _ => false,
        },
        _ => false,
    };
    dated.then_some(head)
}

/// `name-latest` without `-latest`.
pub fn strip_latest(model: &str) -> Option<&str> {
    let cut = model.len().checked_sub("-latest".len())?;
    let (head, tail) = model.split_at_checked(cut)?;
    (!head.is_empty() && tail.eq_ignore_ascii_case("-latest")).then_some(head)
}

/// The provider a model's family belongs to, by its name (without path,
/// Bedrock prefixes, `ft:`).
pub fn family(model: &str) -> Option<Provider> {
    let s = model.trim();
    let s = strip_prefix_ci(s, "ft:").unwrap_or(s);
    let (n, _) = normalize(s);
    let b = n.as_bytes();
    if matches!(b.first(), Some(b'o' | b'O'))
        && matches!(b.get(1), Some(b'1' | b'3' | b'4'))
        && matches!(b.get(2), None | Some(b'-'))
    {
        return Some(Provider::OpenAi);
    }
    FAMILIES
        .iter()
        .find(|(prefix, _)| strip_prefix_ci(n, prefix).is_some())
        .map(|(_, provider)| *provider)
}

/// How families' names start, the first match winning (`gpt-oss` is not
/// OpenAI's `gpt-`); OpenAI's `o1`, `o3`, `o4` are [`family`]'s own.
const FAMILIES: &[(&str, Provider)] = &[
    ("gpt-oss", Provider::Open),
    ("gpt-", Provider::OpenAi),
    ("chatgpt", Provider::OpenAi),
    ("text-embedding", Provider::OpenAi),
    ("davinci", Provider::OpenAi),
    ("babbage", Provider::OpenAi),
    ("codex", Provider::OpenAi),
    ("computer-use", Provider::OpenAi),
    ("omni-moderation", Provider::OpenAi),
    ("text-moderation", Provider::OpenAi),
    ("whisper", Provider::OpenAi),
    ("tts-", Provider::OpenAi),
    ("dall-e", Provider::OpenAi),
    ("claude", Provider::Anthropic),
    ("gemini", Provider::Google),
    ("gemma", Provider::Google),
    ("mistral", Provider::Mistral),
    ("codestral", Provider::Mistral),
    ("magistral", Provider::Mistral),
    ("devstral", Provider::Mistral),
    ("ministral", Provider::Mistral),
    ("pixtral", Provider::Mistral),
    ("open-mistral", Provider::Mistral),
    ("open-mixtral", Provider::Mistral),
    ("mixtral", Provider::Mistral),
    ("voxtral", Provider::Mistral),
    ("deepseek", Provider::DeepSeek),
    ("grok", Provider::XAi),
    ("llama", Provider::Open),
    ("meta-llama", Provider::Open),
    ("qwen", Provider::Open),
    ("qwq", Provider::Open),
    ("kimi", Provider::Open),
    ("glm", Provider::Open),
    ("zai-glm", Provider::Open),
    ("phi-", Provider::Open),
    ("nemotron", Provider::Open),
    ("minimax", Provider::Open),
];

/// `a` against `b` in lower case, byte by byte (the table is sorted by
/// its lower-case names).
pub fn cmp_lower(a: &str, b: &str) -> Ordering {
    a.bytes()
        .map(|c| c.to_ascii_lowercase())
        .cmp(b.bytes().map(|c| c.to_ascii_lowercase()))
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn is_one_of(s: &str, list: &[&str]) -> bool {
    list.iter().any(|x| x.eq_ignore_ascii_case(s))
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let (head, tail) = s.split_at_checked(prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then_some(tail)
}
