//! Prices: configured, built in, and the names requests give.
use super::*;
use serde_json::json;

fn prices() -> Prices {
    let m = |model: &str, i: u64, o: u64, c: u64| ModelPrice {
        model: model.to_string(),
        label: label(model),
        input: i,
        output: o,
        cached_input: c,
        cache_write: i * 5 / 4,
    };
    Prices {
        models: vec![
            m("gpt-4o", 2_500_000, 10_000_000, 1_250_000),
            m("gpt-4o-mini", 150_000, 600_000, 75_000),
            m("claude-sonnet-4", 3_000_000, 15_000_000, 300_000),
        ],
    }
}

#[test]
fn models_match_by_name_or_without_their_date() {
    let p = prices();
    assert_eq!(p.lookup("gpt-4o"), Some(0));
    assert_eq!(p.lookup("gpt-4o-mini"), Some(1));
    assert_eq!(p.lookup("gpt-4o-2024-08-06"), Some(0));
    assert_eq!(p.lookup("gpt-4o-mini-2024-07-18"), Some(1));
    assert_eq!(p.lookup("claude-sonnet-4-20250514"), Some(2));
    // A different model that merely starts like a priced one.
    assert_eq!(p.lookup("gpt-4o-audio-preview"), None);
    assert_eq!(p.lookup("gpt-4"), None);
    assert_eq!(p.lookup("gpt-4o-2024"), None);
    assert_eq!(p.lookup(""), None);
}

#[test]
fn cost_prices_cached_input_apart() {
    let p = prices();
    let u = Tokens {
        input: 1_000_000,
        output: 100_000,
        cached_input: 400_000,
        ..Tokens::default()
    };
    // 600k fresh at $2.50/M + 400k cached at $1.25/M + 100k out at $10/M
    // = 1.5 + 0.5 + 1.0 dollars.
    assert_eq!(p.cost(0, &u), 3_000_000);
    assert_eq!(p.cost(9, &u), 0);
    // A cached count above the input (never sent, but bounded).
    let odd = Tokens {
        input: 10,
        cached_input: 50,
        cache_write: 50,
        ..Tokens::default()
    };
    assert_eq!(p.cost(0, &odd), 12);
    // Anthropic: 1000 fresh at $3/M, 2000 read at $0.30/M, 4000
    // written at $3.75/M, 100 out at $15/M.
    let anthropic = Tokens {
        input: 7000,
        output: 100,
        cached_input: 2000,
        cache_write: 4000,
    };
    assert_eq!(p.cost(2, &anthropic), 3000 + 600 + 15_000 + 1500);
    let small = Tokens {
        input: 1200,
        output: 300,
        ..Tokens::default()
    };
    // 1200 * 0.15 + 300 * 0.6 micro-dollars.
    assert_eq!(p.cost(1, &small), 180 + 180);
}

#[test]
fn labels_and_prices_as_written() {
    assert_eq!(label("openai/gpt-4.1"), "openai_gpt-4.1");
    assert_eq!(label("ft:gpt-4o:acme::x1"), "ft_gpt-4o_acme__x1");
    assert_eq!(micro_per_million(&json!(2.5)), Ok(2_500_000));
    assert_eq!(micro_per_million(&json!(0)), Ok(0));
    assert_eq!(micro_per_million(&json!(0.075)), Ok(75_000));
    assert!(micro_per_million(&json!(-1)).unwrap_err().contains(">= 0"));
    assert!(micro_per_million(&json!("2.5"))
        .unwrap_err()
        .contains("must be a number"));
    assert!(micro_per_million(&json!(1e9)).unwrap_err().contains("<="));
}

// --- the built-in table ---------------------------------------------------

#[test]
fn the_table_is_sorted_unique_lower_case_and_every_price_fits() {
    assert!(table::TABLE.len() >= 100, "{}", table::TABLE.len());
    let max = micro_per_million(&json!(MAX_PRICE_PER_MILLION)).unwrap();
    for pair in table::TABLE.windows(2) {
        assert!(
            pair[0].name < pair[1].name,
            "{} {}",
            pair[0].name,
            pair[1].name
        );
    }
    for row in table::TABLE {
        assert_eq!(row.name, row.name.to_ascii_lowercase());
        assert!(!row.name.is_empty() && row.name.is_ascii());
        for price in [row.input, row.output, row.cached_input, row.cache_write] {
            assert!(price <= max, "{}: {price}", row.name);
        }
        // A million of each at its price is counted without overflow.
        let million = Tokens {
            input: 1_000_000,
            output: 1_000_000,
            ..Tokens::default()
        };
        assert_eq!(
            row.rate().cost(&million),
            row.input + row.output,
            "{}",
            row.name
        );
        // Every row is found by its own name.
        assert_eq!(table_row(row.name).map(|r| r.name), Some(row.name));
    }
    for provider in Provider::ALL {
        assert!(
            table::TABLE.iter().any(|r| r.provider == provider),
            "{provider:?}"
        );
    }
    assert!(table::SOURCE.contains("litellm"));
    assert!(table::LICENCE.starts_with("MIT"));
    assert!(!table::COMMIT.is_empty() && !table::DATE.is_empty());
}

/// The table row `model` resolves to.
fn row(model: &str) -> Option<&'static str> {
    table_row(model).map(|r| r.name)
}

#[test]
fn names_resolve_as_providers_write_them() {
    // Exact, and ignoring case.
    assert_eq!(row("gpt-4o"), Some("gpt-4o"));
    assert_eq!(row("GPT-4o"), Some("gpt-4o"));
    assert_eq!(row(" gpt-4o-mini "), Some("gpt-4o-mini"));
    assert_eq!(row("claude-sonnet-4-5"), Some("claude-sonnet-4-5"));
    assert_eq!(row("gemini-2.5-pro"), Some("gemini-2.5-pro"));
    assert_eq!(row("deepseek-chat"), Some("deepseek-chat"));
    assert_eq!(row("grok-4.20"), Some("grok-4.20"));
    assert_eq!(row("mistral-large-latest"), Some("mistral-large-latest"));
    // Dated: a dated row priced apart wins, others fall back to undated.
    assert_eq!(row("gpt-4o-2024-05-13"), Some("gpt-4o-2024-05-13"));
    assert_eq!(row("gpt-4o-2024-08-06"), Some("gpt-4o"));
    assert_eq!(row("gpt-4o-mini-2024-07-18"), Some("gpt-4o-mini"));
    assert_eq!(row("claude-sonnet-4-5-20250929"), Some("claude-sonnet-4-5"));
    assert_eq!(row("claude-haiku-4-5-20251001"), Some("claude-haiku-4-5"));
    assert_eq!(row("gpt-3.5-turbo-0125"), Some("gpt-3.5-turbo"));
    assert_eq!(row("o3-2025-04-16"), Some("o3"));
    // `-latest`, both ways.
    assert_eq!(row("claude-3-5-haiku-latest"), Some("claude-3-5-haiku"));
    assert_eq!(row("magistral-medium"), Some("magistral-medium-latest"));
    assert_eq!(row("codestral"), Some("codestral-latest"));
    assert_eq!(row("mistral-large"), Some("mistral-large-latest"));
    assert_eq!(row("devstral-medium"), Some("devstral-medium-latest"));
    // A provider's path.
    assert_eq!(row("openai/gpt-4o"), Some("gpt-4o"));
    assert_eq!(row("azure/gpt-4.1-mini"), Some("gpt-4.1-mini"));
    assert_eq!(row("anthropic/claude-opus-4-5"), Some("claude-opus-4-5"));
    assert_eq!(row("google/gemini-2.5-flash"), Some("gemini-2.5-flash"));
    assert_eq!(row("gemini/gemini-2.5-flash"), Some("gemini-2.5-flash"));
    assert_eq!(row("vertex_ai/gemini-2.5-pro"), Some("gemini-2.5-pro"));
    assert_eq!(row("openrouter/openai/gpt-4o"), Some("gpt-4o"));
    assert_eq!(
        row("openrouter/anthropic/claude-sonnet-4-5"),
        Some("claude-sonnet-4-5")
    );
    assert_eq!(row("deepseek/deepseek-reasoner"), Some("deepseek-reasoner"));
    assert_eq!(row("xai/grok-4.3"), Some("grok-4.3"));
    assert_eq!(
        row("mistral/mistral-small-latest"),
        Some("mistral-small-latest")
    );
    assert_eq!(row("groq/openai/gpt-oss-120b"), Some("gpt-oss-120b"));
    assert_eq!(
        row("together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo"),
        Some("llama-3.3-70b-instruct-turbo")
    );
    assert_eq!(
        row("fireworks_ai/accounts/fireworks/models/llama-v3p1-8b-instruct"),
        Some("llama-v3p1-8b-instruct")
    );
    assert_eq!(
        row("accounts/fireworks/models/qwen3-235b-a22b"),
        Some("qwen3-235b-a22b")
    );
    assert_eq!(
        row("Qwen/Qwen2.5-72B-Instruct"),
        Some("qwen2.5-72b-instruct")
    );
    // Bedrock ids: vendor, region, version.
    assert_eq!(
        row("anthropic.claude-3-5-sonnet-20240620-v1:0"),
        Some("claude-3-5-sonnet")
    );
    assert_eq!(
        row("us.anthropic.claude-sonnet-4-5-20250929-v1:0"),
        Some("claude-sonnet-4-5")
    );
    assert_eq!(
        row("eu.anthropic.claude-haiku-4-5-20251001-v1:0"),
        Some("claude-haiku-4-5")
    );
    assert_eq!(
        row("apac.anthropic.claude-opus-4-5-20251101-v1:0"),
        Some("claude-opus-4-5")
    );
    assert_eq!(
        row("global.anthropic.claude-sonnet-4-5-20250929-v1:0"),
        Some("claude-sonnet-4-5")
    );
    assert_eq!(
        row("bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0"),
        Some("claude-3-5-sonnet")
    );
    assert_eq!(
        row("meta.llama3-1-70b-instruct-v1:0"),
        Some("llama3-1-70b-instruct")
    );
    assert_eq!(
        row("us.meta.llama3-2-90b-instruct-v1:0"),
        Some("llama3-2-90b-instruct")
    );
    assert_eq!(row("openai.gpt-oss-120b-1:0"), Some("gpt-oss-120b"));
    // Vertex AI ids.
    assert_eq!(
        row("claude-3-5-sonnet-v2@20241022"),
        Some("claude-3-5-sonnet")
    );
    assert_eq!(row("claude-sonnet-4-5@20250929"), Some("claude-sonnet-4-5"));
    assert_eq!(row("claude-opus-4-6@default"), Some("claude-opus-4-6"));
    assert_eq!(
        row("publishers/google/models/gemini-2.5-pro"),
        Some("gemini-2.5-pro")
    );
    assert_eq!(
        row("projects/p/locations/us-central1/publishers/anthropic/models/claude-3-haiku@20240307"),
        Some("claude-3-haiku")
    );
    // Fine-tuned: its own price where listed, else its base's.
    assert_eq!(row("ft:gpt-4o-2024-08-06:acme::9x1"), Some("ft:gpt-4o"));
    assert_eq!(
        row("ft:gpt-4o-mini-2024-07-18:org::id"),
        Some("ft:gpt-4o-mini")
    );
    assert_eq!(row("ft:gpt-4.1-2025-04-14:acme:tag:id"), Some("ft:gpt-4.1"));
    assert_eq!(row("ft:gpt-5-mini-2025-08-07:acme::id"), Some("gpt-5-mini"));
    // Unknown names stay unknown.
    assert_eq!(row("gpt-4o-audio"), None);
    assert_eq!(row("my-model"), None);
    assert_eq!(row("openai/"), None);
    assert_eq!(row(""), None);
    assert_eq!(row("ft:"), None);
    assert_eq!(row("@20241022"), None);
    assert_eq!(row(&"x".repeat(300)), None);
}

#[test]
fn dates_and_latest_come_off_only_when_they_are_dates() {
    use names::{strip_date, strip_latest};
    assert_eq!(strip_date("gpt-4o-2024-08-06"), Some("gpt-4o"));
    assert_eq!(
        strip_date("claude-sonnet-4-20250514"),
        Some("claude-sonnet-4")
    );
    assert_eq!(strip_date("gpt-4-0613"), Some("gpt-4"));
    assert_eq!(strip_date("mistral-large-2411"), Some("mistral-large"));
    assert_eq!(strip_date("gpt-4o-2024"), None);
    assert_eq!(strip_date("qwen3-235b-a22b"), None);
    assert_eq!(strip_date("llama-3.1-405b"), None);
    assert_eq!(strip_date("gpt-4-9999"), None);
    assert_eq!(strip_date("-20250514"), None);
    assert_eq!(strip_date("gpt-4o"), None);
    assert_eq!(strip_latest("chatgpt-4o-latest"), Some("chatgpt-4o"));
    assert_eq!(strip_latest("X-LATEST"), Some("X"));
    assert_eq!(strip_latest("-latest"), None);
    assert_eq!(strip_latest("latest"), None);
}

#[test]
fn providers_come_from_the_row_or_the_family() {
    let cases = [
        ("gpt-4o", "openai"),
        ("openai/gpt-9-turbo", "openai"),
        ("o1", "openai"),
        ("o3-mini-2099-01-01", "openai"),
        ("o4-mini-high", "openai"),
        ("chatgpt-4o-latest", "openai"),
        ("text-embedding-3-large", "openai"),
        ("ft:gpt-4o-mini-2024-07-18:org::id", "openai"),
        ("claude-opus-9", "anthropic"),
        ("us.anthropic.claude-next-v1:0", "anthropic"),
        ("gemini-9-ultra", "google"),
        ("gemma-9-it", "google"),
        ("codestral-2099", "mistral"),
        ("magistral-huge", "mistral"),
        ("devstral-x", "mistral"),
        ("ministral-1b", "mistral"),
        ("pixtral-12b", "mistral"),
        ("open-mistral-7b", "mistral"),
        ("deepseek-v9", "deepseek"),
        ("grok-9", "xai"),
        ("llama-9-400b", "open"),
        ("meta.llama9-v1:0", "open"),
        ("Qwen/Qwen9-Max", "open"),
        ("gpt-oss-9b", "open"),
    ];
    for (model, provider) in cases {
        assert_eq!(provider_of(model), Some(provider), "{model}");
    }
    assert_eq!(provider_of("o5x"), None);
    assert_eq!(provider_of("my-model"), None);
    assert_eq!(provider_of(""), None);
}

#[test]
fn configured_names_resolve_like_the_table() {
    let p = prices();
    assert_eq!(p.lookup("openai/gpt-4o"), Some(0));
    assert_eq!(p.lookup("GPT-4o-Mini"), Some(1));
    assert_eq!(p.lookup("azure/gpt-4o-2024-11-20"), Some(0));
    assert_eq!(
        p.lookup("us.anthropic.claude-sonnet-4-20250514-v1:0"),
        Some(2)
    );
    assert_eq!(p.lookup("claude-sonnet-4@20250514"), Some(2));
    assert_eq!(p.lookup("ft:gpt-4o-mini-2024-07-18:org::id"), Some(1));
    assert_eq!(p.lookup("gpt-4.1"), None);
}

#[test]
fn price_of_asks_the_configuration_then_the_table() {
    let p = prices();
    let configured = p.price_of("openai/gpt-4o-2024-08-06").unwrap();
    assert_eq!(configured.source, PriceSource::Configured);
    assert_eq!(configured.resolved, "gpt-4o");
    assert_eq!(configured.rate, p.models[0].rate());
    let table = p
        .price_of("anthropic.claude-sonnet-4-5-20250929-v1:0")
        .unwrap();
    assert_eq!(table.source, PriceSource::Table);
    assert_eq!(table.resolved, "claude-sonnet-4-5");
    let r = table_row("claude-sonnet-4-5").unwrap();
    assert_eq!(table.rate, r.rate());
    assert!(r.input > 0 && r.output > r.input && r.cached_input < r.input);
    assert_eq!(p.price_of("my-model"), None);
    assert_eq!(
        Prices::default().price_of("gpt-4o").unwrap().source,
        PriceSource::Table
    );
    // Prices::cost is Rate::cost.
    let u = Tokens {
        input: 5000,
        output: 700,
        cached_input: 1000,
        cache_write: 2000,
    };
    assert_eq!(p.cost(2, &u), p.models[2].rate().cost(&u));
}

#[test]
fn the_highest_price_of_a_provider_for_models_nobody_prices() {
    let p = prices();
    let most = |provider: Provider| {
        table::TABLE
            .iter()
            .filter(|r| r.provider == provider && r.kind == Kind::Chat)
            .fold(Rate::default(), |m, r| m.max(r.rate()))
    };
    let h = p.highest_for("claude-opus-99");
    assert_eq!(h.source, PriceSource::ProviderMax);
    assert_eq!(h.resolved, "anthropic");
    assert_eq!(h.rate, most(Provider::Anthropic));
    // A configured price above the table's counts for its provider.
    let mut dear = prices();
    dear.models[1].output = 999_000_000_000;
    let h = dear.highest_for("gpt-99");
    assert_eq!(h.source, PriceSource::ProviderMax);
    assert_eq!(h.resolved, "openai");
    assert_eq!(h.rate.output, 999_000_000_000);
    assert_eq!(h.rate.input, most(Provider::OpenAi).input);
    // No family: the highest of all.
    let h = dear.highest_for("my-model");
    assert_eq!(h.source, PriceSource::TableMax);
    assert_eq!(h.resolved, TABLE_MAX);
    let all = Provider::ALL
        .iter()
        .fold(Rate::default(), |m, &p| m.max(most(p)));
    assert_eq!(
        h.rate,
        Rate {
            output: 999_000_000_000,
            ..all
        }
    );
    assert_eq!(PriceSource::Configured.as_str(), "configured");
    assert_eq!(PriceSource::Table.as_str(), "table");
    assert_eq!(PriceSource::ProviderMax.as_str(), "provider_max");
    assert_eq!(PriceSource::TableMax.as_str(), "table_max");
}

// --- the generator (`make prices`) ----------------------------------------

/// `tools/prices.py` on `tools/prices_fixture.json`: the table it writes.
fn generate_fixture() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = std::process::Command::new(python)
        .args([
            "tools/prices.py",
            "tools/prices_fixture.json",
            "--revision",
            "abc123",
            "--date",
            "2025-01-02",
        ])
        .current_dir(&root)
        .output()
        .expect("python3 runs tools/prices.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_generator_writes_the_fixture_table_by_the_filters_name_rules() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = generate_fixture();
    // The same bytes every time, and as checked in beside the fixture
    // (regenerate it with the command above when the rules change).
    assert_eq!(text, generate_fixture());
    let expected = std::fs::read_to_string(root.join("tools/prices_fixture.table.rs")).unwrap();
    assert_eq!(
        text, expected,
        "tools/prices_fixture.table.rs is out of date"
    );
    for line in [
        "// Source: BerriAI/litellm, model_prices_and_context_window.json, revision abc123, read 2025-01-02.",
        "// Licence of the source data: MIT (Copyright (c) 2023 Berri AI).",
        "// Generated by `make prices` (tools/prices.py), do not edit.",
        "pub const COMMIT: &str = \"abc123\";",
        // Cached input and cache writes as listed, else at the input price.
        "    Row::new(\"claude-sonnet-4-5\", Provider::Anthropic, 3000000, 15000000, 300000, 3750000),",
        "    Row::new(\"gpt-4o\", Provider::OpenAi, 2500000, 10000000, 1250000, 2500000),",
        // A dated release priced apart keeps its row.
        "    Row::new(\"gpt-4o-2024-05-13\", Provider::OpenAi, 5000000, 15000000, 5000000, 5000000),",
        // The first party's price, not Vertex AI's or Bedrock's.
        "    Row::new(\"gemini-2.5-pro\", Provider::Google, 1250000, 10000000, 125000, 1250000),",
        // Two hosts of one open model: the higher price of each.
        "    Row::new(\"gpt-oss-120b\", Provider::Open, 150000, 750000, 150000, 150000),",
        // Dated names only, priced apart: the undated name at the newest's
        // price (the odd older row stays).
        "    Row::new(\"claude-3-7-sonnet\", Provider::Anthropic, 3000000, 15000000, 300000, 3750000),",
        "    Row::new(\"claude-3-7-sonnet-20240620\", Provider::Anthropic, 3600000, 18000000, 360000, 4500000),",
        // Cache prices Vertex AI leaves out: from a dated sibling (Bedrock's
        // claude-3-5-sonnet-20241022), from another tier's entry of the
        // same name (Vercel's claude-3-haiku); none: the input price (grok-4).
        "    Row::new(\"claude-3-5-sonnet\", Provider::Anthropic, 3000000, 15000000, 300000, 3750000),",
        "    Row::new(\"claude-3-haiku\", Provider::Anthropic, 250000, 1250000, 30000, 300000),",
        "    Row::new(\"grok-4\", Provider::XAi, 3000000, 15000000, 3000000, 3000000),",
        // Names only resellers list: Azure OpenAI (not a region's), Azure
        // AI for Grok.
        "    Row::new(\"o1-mini\", Provider::OpenAi, 1100000, 4400000, 550000, 1100000),",
        "    Row::new(\"grok-3\", Provider::XAi, 3000000, 15000000, 3000000, 3000000),",
        // Other kinds, priced per token; free embeddings and moderation kept.
        "    Row::new(\"text-embedding-3-small\", Provider::OpenAi, 20000, 0, 20000, 20000).with_kind(Kind::Embedding),",
        "    Row::new(\"mistral-embed\", Provider::Mistral, 100000, 0, 100000, 100000).with_kind(Kind::Embedding),",
        "    Row::new(\"omni-moderation-latest\", Provider::OpenAi, 0, 0, 0, 0).with_kind(Kind::Moderation),",
        "    Row::new(\"gpt-4o-transcribe\", Provider::OpenAi, 2500000, 10000000, 2500000, 2500000).with_kind(Kind::Audio),",
        "    Row::new(\"gpt-image-1\", Provider::OpenAi, 5000000, 40000000, 1250000, 5000000).with_kind(Kind::Image),",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    let rows: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Row::new(\""))
        .filter_map(|l| l.split('"').next())
        .collect();
    let mut sorted = rows.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(rows, sorted);
    // Left out: dated names priced as their undated (or -latest) name,
    // other modes, other providers, a host's variants, no output price,
    // no price at all.
    for gone in [
        "gpt-4o-2024-08-06",
        "claude-sonnet-4-5-20250929",
        "claude-3-7-sonnet-20250219",
        "claude-3-5-sonnet-20241022",
        "grok-4-0709",
        "mistral-small-latest",
        "dall-e-3",
        "whisper-1",
        "tts-1",
        "deepseek-r1",
        "o1-mini-2024-09-12",
        "command-r",
        "yi-large",
        "qwen3-235b-a22b-fast",
        "gpt-no-output-price",
        "gemma-3-27b-it",
        "claude",
        "sample_spec",
    ] {
        assert!(!rows.contains(&gone), "{gone}");
    }
    // Every model the fixture prices is found in its table by the
    // filter's resolution of the name as the source writes it.
    let data: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tools/prices_fixture.json")).unwrap(),
    )
    .unwrap();
    let find = |name: &str| {
        rows.binary_search_by(|r| names::cmp_lower(r, name))
            .ok()
            .map(|i| rows[i])
    };
    for key in data.as_object().unwrap().keys() {
        let found = names::resolve(key, find);
        let unpriced = [
            "sample_spec",
            "dall-e-3",
            "whisper-1",
            "tts-1",
            "azure_ai/deepseek-r1",
            "cohere/command-r",
            "gpt-no-output-price",
            "anthropic.claude-v2:1",
            "fireworks_ai/accounts/fireworks/models/yi-large",
            "fireworks_ai/accounts/fireworks/models/qwen3-235b-a22b-fast",
            "gemini/gemma-3-27b-it",
        ];
        assert_eq!(found.is_none(), unpriced.contains(&key.as_str()), "{key}");
    }
    assert_eq!(
        names::resolve("vertex_ai/claude-3-5-sonnet-v2@20241022", find),
        Some("claude-3-5-sonnet")
    );
    assert_eq!(
        names::resolve("mistral/mistral-large-2411", find),
        Some("mistral-large-2411")
    );
    assert_eq!(names::resolve("grok-4-0709", find), Some("grok-4"));
    assert_eq!(
        names::resolve("claude-3-7-sonnet-latest", find),
        Some("claude-3-7-sonnet")
    );
    assert_eq!(
        names::resolve("claude-3-7-sonnet-20250219", find),
        Some("claude-3-7-sonnet")
    );
    assert_eq!(
        names::resolve("azure/eu/o1-mini-2024-09-12", find),
        Some("o1-mini")
    );
}

/// `model`'s table price: the row it resolves to, then input, output,
/// cached input and cache write in micro-dollars per million tokens.
fn priced(model: &str) -> Option<(&'static str, u64, u64, u64, u64)> {
    table_row(model).map(|r| (r.name, r.input, r.output, r.cached_input, r.cache_write))
}

#[test]
fn aliases_and_undated_names_find_the_newest_release() {
    // The undated name and `-latest` of dated releases priced apart: the
    // newest release's price (claude-3-7-sonnet-20250219), not the
    // provider's highest; the odd Bedrock `-20240620` row keeps its own.
    for name in [
        "claude-3-7-sonnet-latest",
        "claude-3-7-sonnet",
        "claude-3-7-sonnet-20250219",
        "anthropic/claude-3-7-sonnet-latest",
        "us.anthropic.claude-3-7-sonnet-20250219-v1:0",
    ] {
        assert_eq!(
            priced(name),
            Some((
                "claude-3-7-sonnet",
                3_000_000,
                15_000_000,
                300_000,
                3_750_000
            )),
            "{name}"
        );
    }
    // Cached input at the cache-read price its dated releases list, not
    // the input price.
    for name in [
        "claude-3-5-sonnet-latest",
        "claude-3-5-sonnet",
        "claude-3-5-sonnet-20240620",
        "claude-3-5-sonnet-20241022",
    ] {
        assert_eq!(
            priced(name),
            Some((
                "claude-3-5-sonnet",
                3_000_000,
                15_000_000,
                300_000,
                3_750_000
            )),
            "{name}"
        );
    }
    assert_eq!(
        priced("claude-3-haiku-20240307"),
        Some(("claude-3-haiku", 250_000, 1_250_000, 30_000, 300_000))
    );
    // Listed by resellers at the makers' prices only (Azure OpenAI, Azure
    // AI Foundry, Vercel's AI Gateway).
    assert_eq!(
        priced("o1-mini"),
        Some(("o1-mini", 1_100_000, 4_400_000, 550_000, 1_100_000))
    );
    assert_eq!(priced("o1-mini-2024-09-12").map(|p| p.0), Some("o1-mini"));
    for name in ["grok-4", "xai/grok-4", "grok-4-0709"] {
        assert_eq!(
            priced(name),
            Some(("grok-4", 3_000_000, 15_000_000, 3_000_000, 3_000_000)),
            "{name}"
        );
    }
    for name in ["grok-3", "xai/grok-3", "grok-3-latest"] {
        assert_eq!(
            priced(name),
            Some(("grok-3", 3_000_000, 15_000_000, 3_000_000, 3_000_000)),
            "{name}"
        );
    }
    // Not in the source (litellm 1.110.2) under any key: unpriced.
    for name in [
        "chatgpt-4o-latest",
        "gemini-1.5-pro",
        "gemini/gemini-1.5-pro",
        "gemini-2.5-flash-preview-05-20",
    ] {
        assert_eq!(priced(name), None, "{name}");
    }
}

#[test]
fn embedding_moderation_speech_and_image_rows_never_set_a_providers_highest() {
    let kind = |model: &str| table_row(model).map(|r| r.kind);
    assert_eq!(
        priced("text-embedding-3-small"),
        Some(("text-embedding-3-small", 20_000, 0, 20_000, 20_000))
    );
    assert_eq!(
        priced("openai/text-embedding-3-large"),
        Some(("text-embedding-3-large", 130_000, 0, 130_000, 130_000))
    );
    assert_eq!(kind("text-embedding-3-small"), Some(Kind::Embedding));
    assert_eq!(
        priced("gemini/gemini-embedding-001"),
        Some(("gemini-embedding-001", 150_000, 0, 150_000, 150_000))
    );
    assert_eq!(
        priced("mistral/mistral-embed"),
        Some(("mistral-embed", 100_000, 0, 100_000, 100_000))
    );
    // Moderation: free, as the source says.
    assert_eq!(
        priced("omni-moderation-latest"),
        Some(("omni-moderation-latest", 0, 0, 0, 0))
    );
    assert_eq!(kind("omni-moderation-latest"), Some(Kind::Moderation));
    assert_eq!(provider_of("omni-moderation-2099-01-01"), Some("openai"));
    // Per token: kept; per second or character: not.
    assert_eq!(
        priced("gpt-4o-transcribe"),
        Some((
            "gpt-4o-transcribe",
            2_500_000,
            10_000_000,
            2_500_000,
            2_500_000
        ))
    );
    assert_eq!(kind("gpt-4o-transcribe"), Some(Kind::Audio));
    assert_eq!(kind("gpt-image-1.5"), Some(Kind::Image));
    assert_eq!(priced("whisper-1"), None);
    assert_eq!(priced("tts-1"), None);
    assert_eq!(provider_of("whisper-1"), Some("openai"));
    // The highest price of a provider comes from its chat rows alone.
    let p = Prices::default();
    for provider in Provider::ALL {
        let chat = table::TABLE
            .iter()
            .filter(|r| r.provider == provider && r.kind == Kind::Chat)
            .fold(Rate::default(), |m, r| m.max(r.rate()));
        assert_ne!(chat, Rate::default(), "{provider:?}");
    }
    let google = p.highest_for("gemini-99");
    assert_eq!(google.resolved, "google");
    let chat_max = table::TABLE
        .iter()
        .filter(|r| r.provider == Provider::Google && r.kind == Kind::Chat)
        .fold(Rate::default(), |m, r| m.max(r.rate()));
    assert_eq!(google.rate, chat_max);
    // xAI's highest is at least grok-4's now grok-4 is priced.
    assert!(p.highest_for("grok-99").rate.output >= 15_000_000);
    // An unpriced chat model is never charged at an embedding's price.
    let h = p.highest_for("text-embedding-99");
    assert_eq!(h.resolved, "openai");
    assert!(h.rate.output > 0);
}
