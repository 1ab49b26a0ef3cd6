#!/usr/bin/env python3
"""Generate loopguard's built-in model price table from LiteLLM's price list.

    tools/prices.py SOURCE [-o OUT] [--revision REV] [--date YYYY-MM-DD]

SOURCE is a URL or a local file holding LiteLLM's
`model_prices_and_context_window.json` (MIT licence, BerriAI/litellm).
The output, `crates/core/src/config/prices/table.rs` under `make prices`,
is a sorted Rust array of one row per model name: the same input, revision
and date give the same bytes.

What is kept: chat, completion and responses models priced per token, of
OpenAI, Anthropic, Google, Mistral, DeepSeek and xAI (from their own APIs
first, then from Vertex AI and Bedrock for names those do not list, then
from the resellers that list the maker's own price, Azure OpenAI, Azure AI
Foundry for Grok and Vercel's AI Gateway, for names nobody else lists), and
common open-weight families (Llama, Qwen, gpt-oss, Kimi, GLM, ...) as
Together AI, Groq, Fireworks AI and Bedrock serve them. From the makers'
own APIs also embedding and moderation models (`kind` Embedding,
Moderation) and speech, transcription and image models priced per token
(Audio, Image; those priced per second, character or image are left out):
their rows never count towards a provider's highest price. A name is the
model as its provider writes it, lower case, without the provider's path
(`gemini/`, `together_ai/meta-llama/`), Bedrock's region, vendor and
version (`us.anthropic.`, `-v1:0`) or Vertex AI's `@date`: the filter
resolves a request's name the same way. A dated name priced as its undated
name (or as that with `-latest`) is left out: the filter falls back to
it. Dated names with neither an undated nor a `-latest` row give one
undated row at the price of the newest of them (so `claude-3-7-sonnet`
and `claude-3-7-sonnet-latest` cost what `claude-3-7-sonnet-20250219`
does); the others keep their rows.
Where one tier lists a name twice (a host's two spellings), each price is
the higher of the two. A cached-input or cache-write price the row's entry
lacks is taken from another entry of the same name at the same input
price, else from the newest dated or undated sibling (`claude-3-5-sonnet`
from `claude-3-5-sonnet-20241022`) at the same input price, else it is the
input price. A model listed at no cost for both input and output (a free
tier, a model priced per image or second) is left out, but for embedding
and moderation models the source prices at 0 explicitly.

Python 3 standard library only.
"""

import argparse
import datetime
import json
import re
import sys
import urllib.request

DEFAULT_SOURCE = (
    "https://raw.githubusercontent.com/BerriAI/litellm/main/"
    "model_prices_and_context_window.json"
)
REPOSITORY = "BerriAI/litellm"
PATH = "model_prices_and_context_window.json"
LICENCE = "MIT (Copyright (c) 2023 Berri AI)"

MODES = {"chat", "completion", "responses"}
# Other modes, from the makers' own APIs (tier 0) only: the row's kind.
OTHER_MODES = {
    "embedding": "Embedding",
    "moderation": "Moderation",
    "audio_transcription": "Audio",
    "audio_speech": "Audio",
    "image_generation": "Image",
}
# Modes whose $0 rows are kept: the source prices them at 0 on purpose.
FREE_MODES = {"embedding", "moderation"}

# litellm_provider -> our provider, for the makers' own APIs (tier 0).
FIRST_PARTY = {
    "openai": "openai",
    "text-completion-openai": "openai",
    "anthropic": "anthropic",
    "gemini": "google",
    "mistral": "mistral",
    "deepseek": "deepseek",
    "xai": "xai",
}
# The makers' models on the big clouds: names their own APIs lack (tier 1).
CLOUDS = {
    "vertex_ai-anthropic_models",
    "vertex_ai-language-models",
    "vertex_ai-mistral_models",
    "vertex_ai",
    "bedrock",
    "bedrock_converse",
}
# Resellers that list the makers' own prices (tier 3), for the families
# given, names no other tier lists; Azure OpenAI without a region's path
# (`azure/eu/` costs 10% more).
RESELLERS = {
    "azure": {"openai"},
    "azure_ai": {"xai"},
    "vercel_ai_gateway": {"openai", "anthropic", "google", "xai"},
}
# Hosts of open-weight models (tier 2), for OPEN_FAMILIES only.
OPEN_HOSTS = {"together_ai", "groq", "fireworks_ai"}
# A host's deployment variants of one model, left out.
OPEN_VARIANTS = re.compile(r".*-(us|spot|fast|ultrafast|hf|basic|long|draft.*|\d+k.*)$")
OPEN_FAMILIES = (
    "llama",
    "meta-llama",
    "qwen",
    "qwq",
    "gpt-oss",
    "kimi",
    "glm",
    "deepseek",
    "mixtral",
    "mistral",
    "gemma",
)

PROVIDER_VARIANT = {
    "openai": "OpenAi",
    "anthropic": "Anthropic",
    "google": "Google",
    "mistral": "Mistral",
    "deepseek": "DeepSeek",
    "xai": "XAi",
    "open": "Open",
}

# --- the filter's own name rules (crates/core/src/config/prices/names.rs) --

BEDROCK_REGIONS = ("us", "eu", "apac", "global", "jp", "au", "ca", "us-gov")
BEDROCK_VENDORS = (
    "anthropic", "meta", "mistral", "deepseek", "openai", "qwen", "amazon",
    "cohere", "ai21", "google", "moonshot", "moonshotai", "minimax",
    "writer", "nvidia", "zai",
)


def family(name):
    """The provider a model name's family belongs to, or None."""
    n = name.lower()
    if n.startswith("ft:"):
        n = n[3:]
    if n.startswith("gpt-oss"):
        return "open"
    for prefix in ("gpt-", "chatgpt", "text-embedding", "davinci", "babbage",
                   "codex", "computer-use", "omni-moderation",
                   "text-moderation", "whisper", "tts-", "dall-e"):
        if n.startswith(prefix):
            return "openai"
    if re.match(r"o[134](-|$)", n):
        return "openai"
    if n.startswith("claude"):
        return "anthropic"
    if n.startswith(("gemini", "gemma")):
        return "google"
    if n.startswith(("mistral", "codestral", "magistral", "devstral",
                     "ministral", "pixtral", "open-mistral", "open-mixtral",
                     "mixtral", "voxtral")):
        return "mistral"
    if n.startswith("deepseek"):
        return "deepseek"
    if n.startswith("grok"):
        return "xai"
    if n.startswith(("llama", "meta-llama", "qwen", "qwq", "kimi", "glm",
                     "zai-glm", "phi-", "nemotron", "minimax")):
        return "open"
    return None


def _mmdd(s):
    return 1 <= int(s[:2]) <= 12 and 1 <= int(s[2:]) <= 31


def _yymm(s):
    return 23 <= int(s[:2]) <= 30 and 1 <= int(s[2:]) <= 12


def strip_date(n):
    """`name-YYYY-MM-DD`, `name-YYYYMMDD`, `name-MMDD` or `name-YYMM`
    without the date, or None."""
    m = re.fullmatch(r"(.+)-\d{4}-\d{2}-\d{2}", n)
    if m:
        return m.group(1)
    m = re.fullmatch(r"(.+)-(\d{8}|\d{4})", n)
    if m:
        d = m.group(2)
        if len(d) == 8 or _mmdd(d) or _yymm(d):
            return m.group(1)
    return None


def strip_latest(n):
    return n[: -len("-latest")] if n.endswith("-latest") and len(n) > 7 else None


def normalize(key):
    """A source key as the filter resolves a request's name: lower case,
    without path, Bedrock region, vendor and version, Vertex `@date`
    joined as `-date`. None when it is not a plain model name."""
    n = key.strip().lower()
    if n.startswith("ft:"):
        return n if re.fullmatch(r"ft:[a-z0-9.\-]+", n) else None
    n = n.rsplit("/", 1)[-1]
    tag = None
    if "@" in n:
        n, tag = n.split("@", 1)
    vendor = False
    first, dot, rest = n.partition(".")
    if dot and first in BEDROCK_REGIONS:
        v, dot2, rest2 = rest.partition(".")
        if dot2 and v in BEDROCK_VENDORS:
            n, vendor = rest2, True
    elif dot and first in BEDROCK_VENDORS:
        n, vendor = rest, True
    m = re.fullmatch(r"(.+?)(-v?\d+)?:\d+", n)
    if m:
        n = m.group(1)
    elif vendor or tag is not None:
        m = re.fullmatch(r"(.+)-v\d+", n)
        if m:
            n = m.group(1)
    if tag is not None and re.fullmatch(r"\d{8}", tag):
        n = f"{n}-{tag}"
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-_]*", n):
        return None
    return n


# --- reading -----------------------------------------------------------------


def micro(v):
    """Dollars per token as micro-dollars per million tokens (the same
    number as dollars per million, times a million)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        return None
    return int(round(v * 1e12))


def rate(entry):
    """(input, output, cached, write), cached and write None when the
    entry lacks them or lists them at 0; None without input and output prices (an
    embedding's output price is 0 unless given)."""
    i = micro(entry.get("input_cost_per_token"))
    o = micro(entry.get("output_cost_per_token"))
    if o is None and entry.get("mode") == "embedding" and "output_cost_per_token" not in entry:
        o = 0
    if i is None or o is None:
        return None
    # A cache price of 0 is no price: its tokens are not charged apart.
    c = micro(entry.get("cache_read_input_token_cost")) or None
    w = micro(entry.get("cache_creation_input_token_cost")) or None
    return (i, o, c, w)


def kind_of(entry):
    """The row's kind for an entry's mode, else None."""
    mode = entry.get("mode")
    if mode in MODES:
        return "Chat"
    return OTHER_MODES.get(mode)


def tier_of(key, entry):
    """(tier, provider) for an entry kept, else None."""
    src = entry.get("litellm_provider")
    if src in FIRST_PARTY:
        return 0, FIRST_PARTY[src]
    if src in CLOUDS:
        # Bedrock: the plain ids only (a region's endpoint may cost more).
        if src.startswith("bedrock") and "/" in key:
            return None
        if src.startswith("bedrock") and key.split(".", 1)[0] in BEDROCK_REGIONS:
            return None
        return 1, None
    if src in OPEN_HOSTS:
        return 2, None
    if src in RESELLERS:
        if src == "azure" and key.count("/") != 1:
            return None
        return 3, None
    return None


def select(data):
    """{name: (provider, kind, rate)} from the source's entries."""
    tiers = [{}, {}, {}, {}]
    for key in sorted(data):
        entry = data[key]
        if not isinstance(entry, dict):
            continue
        kind = kind_of(entry)
        if kind is None:
            continue
        t = tier_of(key, entry)
        if t is None:
            continue
        tier, provider = t
        # Other modes from the makers' own price lists only.
        if kind != "Chat" and tier != 0:
            continue
        r = rate(entry)
        name = normalize(key)
        if r is None or name is None:
            continue
        # Listed at no cost (free tiers, models priced per something
        # else): left out, a dollar cap charges it as `budget.unpriced`
        # says; but an embedding or moderation model the source prices
        # at 0 is free.
        if r[0] == 0 and r[1] == 0 and entry.get("mode") not in FREE_MODES:
            continue
        fam = family(name)
        if tier == 2 and (not name.startswith(OPEN_FAMILIES) or OPEN_VARIANTS.match(name)):
            continue
        if tier == 3 and fam not in RESELLERS[entry["litellm_provider"]]:
            continue
        # The clouds' and hosts' names of a family, with a version in them
        # (Bedrock's legacy `anthropic.claude-v2` is plain `claude`).
        if tier > 0 and (fam is None or not re.search(r"\d", name)):
            continue
        provider = fam or provider
        seen = tiers[tier].get(name)
        if seen:
            r = tuple(_max(a, b) for a, b in zip(seen[2], r))
            provider, kind = seen[0], seen[1]
        tiers[tier][name] = (provider, kind, r)
    rows = {}
    others = {}
    for t in tiers:
        for name, row in t.items():
            if name in rows:
                others.setdefault(name, []).append(row[2])
            else:
                rows[name] = row
    return collapse(fill_cache(rows, others))


def _max(a, b):
    if a is None or b is None:
        return b if a is None else a
    return max(a, b)


def date_key(name):
    """How new a name's date is, as a number (YYYYMMDD; `-MMDD` as of year
    0, `-YYMM` as of the month's first); an undated name is newest."""
    u = strip_latest(name) or name
    stem = strip_date(u)
    if stem is None:
        return 99999999
    d = u[len(stem) + 1:].replace("-", "")
    if len(d) == 8:
        return int(d)
    if _mmdd(d):
        return int(d)
    return (2000 + int(d[:2])) * 10000 + int(d[2:]) * 100 + 1


def stem_of(name):
    u = strip_latest(name) or name
    return strip_date(u) or u


def fill_cache(rows, others):
    """Cached-input and cache-write prices the source leaves out (or lists
    at 0): another tier's entry of the same name, else the newest sibling
    (same name without date or `-latest`) of the same kind, both at the
    same input price; else the input price."""
    own = {}
    for name, (provider, kind, r) in rows.items():
        filled = list(r)
        for j in (2, 3):
            if filled[j] is None:
                same = [o[j] for o in others.get(name, ()) if o[0] == r[0] and o[j]]
                filled[j] = max(same) if same else None
        own[name] = (provider, kind, tuple(filled))
    siblings = {}
    for name in own:
        siblings.setdefault(stem_of(name), []).append(name)
    out = {}
    for name in sorted(own):
        provider, kind, r = own[name]
        filled = list(r)
        for j in (2, 3):
            if filled[j] is not None:
                continue
            near = [
                n for n in siblings[stem_of(name)]
                if n != name and own[n][1] == kind and own[n][2][0] == r[0] and own[n][2][j]
            ]
            newest = max(near, key=lambda n: (date_key(n), n), default=None)
            filled[j] = r[0] if newest is None else own[newest][2][j]
        out[name] = (provider, kind, tuple(filled))
    return out


def collapse(rows):
    """Leave out dated and `-latest` names the filter finds through their
    undated name at the same price; dated names with no undated or
    `-latest` row give one, at the price of the newest of them."""
    groups = {}
    for name in rows:
        u = strip_date(name)
        if u:
            groups.setdefault(u, []).append(name)
    for u, names in sorted(groups.items()):
        # The filter tries the undated name, then it with `-latest`.
        target = next((t for t in (u, u + "-latest") if t in rows), None)
        if target is None:
            newest = max(names, key=lambda n: (date_key(n), n))
            rows[u] = rows[newest]
            target = u
        for n in names:
            if rows[n] == rows[target]:
                del rows[n]
    for name in sorted(rows):
        u = strip_latest(name)
        if u and u in rows and rows[u] == rows[name]:
            del rows[name]
    return rows


# --- writing -----------------------------------------------------------------


def render(rows, revision, date):
    out = []
    w = out.append
    w("// The built-in model prices, in micro-dollars per million tokens.\n")
    w("//\n")
    w(f"// Source: {REPOSITORY}, {PATH}, revision {revision}, read {date}.\n")
    w(f"// Licence of the source data: {LICENCE}.\n")
    w("// Generated by `make prices` (tools/prices.py), do not edit.\n")
    w("\n")
    kinds = any(kind != "Chat" for _, kind, _ in rows.values())
    w("use super::{Kind, Provider, Row};\n" if kinds else "use super::{Provider, Row};\n")
    w("\n")
    w(f'pub const SOURCE: &str = "{REPOSITORY} {PATH}";\n')
    w(f'pub const COMMIT: &str = "{revision}";\n')
    w(f'pub const DATE: &str = "{date}";\n')
    w(f'pub const LICENCE: &str = "{LICENCE}";\n')
    w("\n")
    w("/// One row per model name, sorted by name (lower case).\n")
    w("#[rustfmt::skip]\n")
    w("pub static TABLE: &[Row] = &[\n")
    for name in sorted(rows):
        provider, kind, (i, o, c, cw) = rows[name]
        v = PROVIDER_VARIANT[provider]
        k = "" if kind == "Chat" else f".with_kind(Kind::{kind})"
        w(f'    Row::new("{name}", Provider::{v}, {i}, {o}, {c}, {cw}){k},\n')
    w("];\n")
    return "".join(out)


def revision_of(source):
    """The commit or branch a raw GitHub URL names, else 'unknown'."""
    m = re.match(r"https://raw\.githubusercontent\.com/[^/]+/[^/]+/([^/]+)/", source)
    return m.group(1) if m else "unknown"


def read(source):
    if re.match(r"https?://", source):
        with urllib.request.urlopen(source, timeout=60) as r:
            return json.load(r)
    with open(source, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="?", default=DEFAULT_SOURCE,
                   help="URL or file of model_prices_and_context_window.json")
    p.add_argument("-o", "--output", default="-", help="the table.rs to write (- for stdout)")
    p.add_argument("--revision", help="the source's commit (default: from a GitHub URL)")
    p.add_argument("--date", help="the date to record, YYYY-MM-DD (default: today, UTC)")
    a = p.parse_args(argv)
    date = a.date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    revision = a.revision or revision_of(a.source)
    for label, value in (("revision", revision), ("date", date)):
        if not re.fullmatch(r"[A-Za-z0-9 ._:+\-]+", value):
            p.error(f"--{label} {value!r}: letters, digits, spaces and ._:+- only")
    try:
        data = read(a.source)
    except (OSError, ValueError) as e:
        print(f"prices.py: {a.source}: {e}", file=sys.stderr)
        return 1
    if not isinstance(data, dict):
        print(f"prices.py: {a.source}: not a JSON object", file=sys.stderr)
        return 1
    text = render(select(data), revision, date)
    if a.output == "-":
        sys.stdout.write(text)
    else:
        with open(a.output, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        print(f"{a.output}: {text.count('Row::new(')} models", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
