//! What tokens cost: `prices`, per model, in US dollars per million tokens.
//! A response's usage is priced by its request's model; counts are kept in
//! micro-dollars (whole numbers, as Envoy's counters are).

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
    /// name, or the same name with a date suffix (`gpt-4o-2024-08-06`,
    /// `claude-sonnet-4-20250514`) that the price list names without it.
    pub fn lookup(&self, model: &str) -> Option<usize> {
        if let Some(i) = self.models.iter().position(|m| m.model == model) {
            return Some(i);
        }
        let undated = strip_date(model)?;
        self.models.iter().position(|m| m.model == undated)
    }

    /// What `usage` cost at the prices of model `index`, in micro-dollars.
    pub fn cost(&self, index: usize, usage: &Tokens) -> u64 {
        let Some(m) = self.models.get(index) else {
            return 0;
        };
        let cached = usage.cached_input.min(usage.input);
        let write = usage.cache_write.min(usage.input - cached);
        let micro = u128::from(usage.input - cached - write) * u128::from(m.input)
            + u128::from(cached) * u128::from(m.cached_input)
            + u128::from(write) * u128::from(m.cache_write)
            + u128::from(usage.output) * u128::from(m.output);
        u64::try_from(micro / 1_000_000).unwrap_or(u64::MAX)
    }
}

/// A metric label value for a model name.
pub fn label(model: &str) -> String {
    model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `name-YYYY-MM-DD` or `name-YYYYMMDD` without its date.
fn strip_date(model: &str) -> Option<&str> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    // -YYYY-MM-DD
    if model.len() > 11 {
        let (head, tail) = model.split_at(model.len() - 11);
        let t = tail.as_bytes();
        if t.first() == Some(&b'-')
            && t.get(5) == Some(&b'-')
            && t.get(8) == Some(&b'-')
            && digits(tail.get(1..5).unwrap_or(""))
            && digits(tail.get(6..8).unwrap_or(""))
            && digits(tail.get(9..).unwrap_or(""))
        {
            return Some(head);
        }
    }
    // -YYYYMMDD
    let (head, tail) = model.rsplit_once('-')?;
    (tail.len() == 8 && digits(tail) && !head.is_empty()).then_some(head)
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
mod tests {
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
}
