//! What tokens cost: `prices`, per model, in US dollars per million tokens.
//! A response's usage is priced by its request's model; counts are kept in
//! micro-dollars (whole numbers, as Envoy's counters are).
//!
//! Besides the configured prices there is a built-in [`table`] (generated
//! from LiteLLM's price list by `make prices`). A request's `model` finds
//! its price the way providers write names ([`names`]): `openai/gpt-4o`,
//! `gpt-4o-2024-08-06`, `us.anthropic.claude-sonnet-4-5-20250929-v1:0` and
//! `claude-sonnet-4-5@20250929` all find `gpt-4o` or `claude-sonnet-4-5`.

pub mod names;
pub mod table;

/// The token counts a price applies to (a response's usage, as
/// `crate::response::usage::Usage` reads it): cached reads and cache writes
/// are part of `input`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cached_input: u64,
    pub cache_write: u64,
}

/// The most models `prices` may list (each gets its own metric series).
pub const MAX_PRICED_MODELS: usize = 64;
/// The highest price accepted, in dollars per million tokens.
pub const MAX_PRICE_PER_MILLION: f64 = 100_000.0;

/// One model's prices, in micro-dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPrice {
    /// The model name as configured (the request's `model`).
    pub model: String,
    /// The name as a metric label value: characters other than letters,
    /// digits, `.`, `_` and `-` become `_`.
    pub label: String,
    pub input: u64,
    pub output: u64,
    /// Input tokens read from the provider's prompt cache; the input price
    /// unless set.
    pub cached_input: u64,
    /// Input tokens written to the provider's prompt cache (Anthropic); the
    /// input price unless set.
    pub cache_write: u64,
}

/// The configured prices (none: tokens are counted, dollars are not).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prices {
    pub models: Vec<ModelPrice>,
}

impl Prices {
    /// The index of the priced model a request's `model` names: the same
    /// name, or the name as providers write it ([`names::resolve`]): with a
    /// date suffix (`gpt-4o-2024-08-06`, `claude-sonnet-4-20250514`), a
    /// provider's path (`openai/gpt-4o`), a Bedrock or Vertex AI id.
    pub fn lookup(&self, model: &str) -> Option<usize> {
        names::resolve(model, |name| self.index_of(name))
    }

    /// The configured model named `name` (the same bytes first, then
    /// ignoring ASCII case).
    fn index_of(&self, name: &str) -> Option<usize> {
        self.models
            .iter()
            .position(|m| m.model == name)
            .or_else(|| {
                self.models
                    .iter()
                    .position(|m| m.model.eq_ignore_ascii_case(name))
            })
    }

    /// What `usage` cost at the prices of model `index`, in micro-dollars.
    pub fn cost(&self, index: usize, usage: &Tokens) -> u64 {
        self.models.get(index).map_or(0, |m| m.rate().cost(usage))
    }

    /// The price of a request's `model`: the configured prices first (with
    /// the same name resolution), then the built-in table; `None` when
    /// neither prices it.
    pub fn price_of(&self, model: &str) -> Option<Priced> {
        if let Some(m) = self.lookup(model).and_then(|i| self.models.get(i)) {
            return Some(Priced::new(m.rate(), PriceSource::Configured, &m.model));
        }
        let row = table_row(model)?;
        Some(Priced::new(row.rate(), PriceSource::Table, row.name))
    }

    /// For a model nobody prices: the highest price known for its provider
    /// (the table's chat models and the configured prices of that
    /// provider), else the highest in the table's chat models and the
    /// configuration. Highest is per field: the most any of them asks for
    /// input, output, cached and cache-write tokens each. Embedding,
    /// moderation, speech and image rows never count.
    pub fn highest_for(&self, model: &str) -> Priced {
        if let Some(provider) = provider_of(model) {
            let rows = table::TABLE
                .iter()
                .filter(|r| r.kind == Kind::Chat && r.provider.as_str() == provider)
                .map(Row::rate);
            let configured = self
                .models
                .iter()
                .filter(|m| provider_of(&m.model) == Some(provider))
                .map(ModelPrice::rate);
            if let Some(rate) = rows.chain(configured).reduce(Rate::max) {
                return Priced::new(rate, PriceSource::ProviderMax, provider);
            }
        }
        let rate = table::TABLE
            .iter()
            .filter(|r| r.kind == Kind::Chat)
            .map(Row::rate)
            .chain(self.models.iter().map(ModelPrice::rate))
            .fold(Rate::default(), Rate::max);
        Priced::new(rate, PriceSource::TableMax, TABLE_MAX)
    }
}

/// What [`Priced::resolved`] says for the highest price of all.
pub const TABLE_MAX: &str = "all models";

impl ModelPrice {
    /// Its prices as a [`Rate`].
    pub fn rate(&self) -> Rate {
        Rate::new(self.input, self.output, self.cached_input, self.cache_write)
    }
}

/// Micro-dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rate {
    pub input: u64,
    pub output: u64,
    pub cached_input: u64,
    pub cache_write: u64,
}

impl Rate {
    pub const fn new(input: u64, output: u64, cached_input: u64, cache_write: u64) -> Rate {
        Rate {
            input,
            output,
            cached_input,
            cache_write,
        }
    }

    /// What `usage` cost at this rate, in micro-dollars: cached reads and
    /// cache writes (bounded by the input) at their own prices, the rest
    /// of the input at the input price.
    pub fn cost(&self, usage: &Tokens) -> u64 {
        let cached = usage.cached_input.min(usage.input);
        let write = usage.cache_write.min(usage.input - cached);
        let micro = u128::from(usage.input - cached - write) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
            + u128::from(write) * u128::from(self.cache_write)
            + u128::from(usage.output) * u128::from(self.output);
        u64::try_from(micro / 1_000_000).unwrap_or(u64::MAX)
    }

    /// The higher of the two, field by field.
    #[must_use]
    pub fn max(self, other: Rate) -> Rate {
        Rate {
            input: self.input.max(other.input),
            output: self.output.max(other.output),
            cached_input: self.cached_input.max(other.cached_input),
            cache_write: self.cache_write.max(other.cache_write),
        }
    }
}

/// Where a model's price came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceSource {
    /// `prices` in the configuration.
    Configured,
    /// The built-in table.
    Table,
    /// Nobody prices it: the highest price of its provider.
    ProviderMax,
    /// Nobody prices it nor knows its provider: the highest price of all.
    TableMax,
}

impl PriceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PriceSource::Configured => "configured",
            PriceSource::Table => "table",
            PriceSource::ProviderMax => "provider_max",
            PriceSource::TableMax => "table_max",
        }
    }
}

/// A model's price, where it came from and what it resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priced {
    pub rate: Rate,
    pub source: PriceSource,
    /// The name it resolved to (configured or table row), or the provider
    /// for a max ([`TABLE_MAX`] for the highest of all).
    pub resolved: String,
}

impl Priced {
    fn new(rate: Rate, source: PriceSource, resolved: &str) -> Priced {
        let resolved = resolved.to_string();
        Priced {
            rate,
            source,
            resolved,
        }
    }
}

/// Who makes a model, as the table and [`provider_of`] name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provider {
    OpenAi,
    Anthropic,
    Google,
    Mistral,
    DeepSeek,
    XAi,
    /// Open-weight models as their hosts serve them (Llama, Qwen, ...).
    Open,
}

impl Provider {
    pub const ALL: [Provider; 7] = [
        Provider::OpenAi,
        Provider::Anthropic,
        Provider::Google,
        Provider::Mistral,
        Provider::DeepSeek,
        Provider::XAi,
        Provider::Open,
    ];

    /// `openai`, `anthropic`, `google`, `mistral`, `deepseek`, `xai`, `open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Google => "google",
            Provider::Mistral => "mistral",
            Provider::DeepSeek => "deepseek",
            Provider::XAi => "xai",
            Provider::Open => "open",
        }
    }
}

/// What a table row's model does: chat (chat, completion and responses
/// APIs, the only kind a provider's highest price is taken from), or
/// another API priced per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Chat,
    Embedding,
    Moderation,
    /// Speech and transcription priced per token.
    Audio,
    /// Image generation priced per token.
    Image,
}

/// One model of the built-in table: its name (lower case, as
/// [`names::resolve`] finds it) and prices in micro-dollars per million
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub name: &'static str,
    pub provider: Provider,
    pub kind: Kind,
    pub input: u64,
    pub output: u64,
    pub cached_input: u64,
    pub cache_write: u64,
}

impl Row {
    pub const fn new(
        name: &'static str,
        provider: Provider,
        input: u64,
        output: u64,
        cached_input: u64,
        cache_write: u64,
    ) -> Row {
        Row {
            name,
            provider,
            kind: Kind::Chat,
            input,
            output,
            cached_input,
            cache_write,
        }
    }

    /// The row as a model of another kind than chat.
    #[must_use]
    pub const fn with_kind(self, kind: Kind) -> Row {
        Row { kind, ..self }
    }

    pub fn rate(&self) -> Rate {
        Rate::new(self.input, self.output, self.cached_input, self.cache_write)
    }
}

/// The table's row named `name`, ignoring ASCII case (binary search).
fn table_get(name: &str) -> Option<&'static Row> {
    table::TABLE
        .binary_search_by(|row| names::cmp_lower(row.name, name))
        .ok()
        .and_then(|i| table::TABLE.get(i))
}

/// The table's row a request's `model` resolves to.
pub fn table_row(model: &str) -> Option<&'static Row> {
    names::resolve(model, table_get)
}

/// The provider of a model: its table row's, else the one its family
/// belongs to (`gpt-`, `o3` → `openai`, `claude` → `anthropic`, `gemini`
/// → `google`, `llama`, `qwen` → `open`, ...); `None` for a name of no
/// family known.
pub fn provider_of(model: &str) -> Option<&'static str> {
    table_row(model)
        .map(|r| r.provider)
        .or_else(|| names::family(model))
        .map(Provider::as_str)
}

/// A metric label value for a model name.
pub fn label(model: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    model.replace(|c: char| !keep(c), "_")
}

/// Dollars per million tokens, as configured, in micro-dollars per
/// million; `Err` says what is wrong with the value.
pub fn micro_per_million(v: &serde_json::Value) -> Result<u64, String> {
    let Some(f) = v.as_f64() else {
        return Err(format!(
            "must be a number of US dollars per million tokens (got {v})"
        ));
    };
    if !f.is_finite() || f < 0.0 {
        return Err(format!("must be >= 0 (got {v})"));
    }
    if f > MAX_PRICE_PER_MILLION {
        return Err(format!("must be <= {MAX_PRICE_PER_MILLION} (got {v})"));
    }
    // Within range: the product fits (at most 1e11).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok((f * 1_000_000.0).round() as u64)
}

#[cfg(test)]
mod tests;
