//! `loopguard prices [MODEL] [--config FILE]`: what the filter charges a
//! model's tokens at under a dollar cap, from the same code: a
//! configuration's `prices` first, then the built-in table
//! (`loopguard_core::config::prices`), and for a model neither prices the
//! highest price of its provider (`budget.unpriced: max`).

use crate::args::PricesArgs;
use crate::Stop;
use loopguard_core::config::prices::{self, table, PriceSource, Prices, Provider, Rate};
use std::io::Write;

pub fn command(a: &PricesArgs, out: &mut dyn Write) -> Result<i32, Stop> {
    let configured = match &a.config {
        Some(file) => Some((
            file.as_str(),
            super::load_config(file, a.filter.as_deref())?.prices,
        )),
        None => None,
    };
    let empty = Prices::default();
    let prices = configured.as_ref().map_or(&empty, |(_, p)| p);
    let text = match &a.model {
        Some(model) => one(model, prices),
        None => summary(configured.as_ref().map(|(f, p)| (*f, p))),
    };
    let _ = out.write_all(text.as_bytes());
    Ok(0)
}

/// The table's source and size, and the configured prices.
fn summary(configured: Option<(&str, &Prices)>) -> String {
    let count = |p: Provider| table::TABLE.iter().filter(|r| r.provider == p).count();
    let by_provider: Vec<String> = Provider::ALL
        .iter()
        .map(|&p| format!("{} {}", p.as_str(), count(p)))
        .collect();
    let mut s = format!(
        "built-in prices: {} models ({})\n\
         source:   {}\n\
         revision: {}\n\
         date:     {}\n\
         licence:  {}\n",
        table::TABLE.len(),
        by_provider.join(", "),
        table::SOURCE,
        table::COMMIT,
        table::DATE,
        table::LICENCE,
    );
    if let Some((file, p)) = configured {
        if p.models.is_empty() {
            s += &format!("configured prices ({file}): none\n");
        } else {
            s += &format!(
                "configured prices ({file}), before the built-in table, US dollars per million tokens:\n"
            );
            let rows: Vec<(String, Rate)> = p
                .models
                .iter()
                .map(|m| (m.model.clone(), m.rate()))
                .collect();
            s += &rate_table(&rows);
        }
    }
    s
}

/// One model: its price, what it resolved to and where the price came from.
fn one(model: &str, prices: &Prices) -> String {
    let provider = prices::provider_of(model).unwrap_or("unknown");
    let mut s = format!("model:     {model}\nprovider:  {provider}\n");
    match prices.price_of(model) {
        Some(p) => {
            let from = match p.source {
                PriceSource::Configured => "configured prices",
                _ => "built-in table",
            };
            s += &format!("priced as: {} ({from})\n", p.resolved);
            s += "US dollars per million tokens:\n";
            s += &rate_lines(&p.rate);
        }
        None => {
            let h = prices.highest_for(model);
            let of = match h.source {
                PriceSource::ProviderMax => format!("the highest price of {}", h.resolved),
                _ => "the highest price of all models".to_string(),
            };
            s += "priced as: unpriced (neither the configuration nor the built-in table prices it)\n";
            s += &format!(
                "under a dollar cap with budget.unpriced: max (the default) it is charged at {of}, \
                 US dollars per million tokens:\n"
            );
            s += &rate_lines(&h.rate);
            s += "(budget.unpriced: reject refuses it; ignore lets it spend nothing)\n";
        }
    }
    s
}

fn rate_lines(r: &Rate) -> String {
    let w = [r.input, r.output, r.cached_input, r.cache_write]
        .iter()
        .map(|&m| usd(m).len())
        .max()
        .unwrap_or(0);
    format!(
        "  input         {:>w$}\n  output        {:>w$}\n  cached input  {:>w$}\n  cache write   {:>w$}\n",
        usd(r.input),
        usd(r.output),
        usd(r.cached_input),
        usd(r.cache_write),
    )
}

fn rate_table(rows: &[(String, Rate)]) -> String {
    let head = ["MODEL", "INPUT", "OUTPUT", "CACHED", "CACHE WRITE"];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|(m, r)| {
            [
                m.clone(),
                usd(r.input),
                usd(r.output),
                usd(r.cached_input),
                usd(r.cache_write),
            ]
        })
        .collect();
    let mut widths = head.map(str::len);
    for c in &cells {
        for (w, cell) in widths.iter_mut().zip(c) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |c: [&str; 5]| {
        let mut l = format!("  {:<w$}", c[0], w = widths[0]);
        for (cell, w) in c.iter().zip(widths).skip(1) {
            l += &format!("  {cell:>w$}");
        }
        l + "\n"
    };
    let mut s = line(head);
    for c in &cells {
        s += &line([&c[0], &c[1], &c[2], &c[3], &c[4]]);
    }
    s
}

/// Micro-dollars per million tokens as dollars per million: at least two
/// decimals, more when the price has them (`2.50`, `0.075`).
fn usd(micro: u64) -> String {
    let frac = format!("{:06}", micro % 1_000_000);
    let frac = frac.trim_end_matches('0');
    let digits = if frac.len() < 2 {
        format!("{frac:0<2}")
    } else {
        frac.to_string()
    };
    format!("{}.{digits}", micro / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> (i32, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = crate::run(args, &mut out, &mut err, false);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    fn config(dir: &std::path::Path, prices: &str) -> String {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("c.json");
        std::fs::write(
            &path,
            format!(
                r#"{{"prices": {prices}, "policies": [{{"id": "p", "spec": {{"selector": {{}}, "loop_detection": {{"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}}}}}]}}"#
            ),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    }

    #[test]
    fn dollars_as_written() {
        assert_eq!(usd(2_500_000), "2.50");
        assert_eq!(usd(75_000), "0.075");
        assert_eq!(usd(0), "0.00");
        assert_eq!(usd(150_000_000), "150.00");
        assert_eq!(usd(1_234_567), "1.234567");
        assert_eq!(usd(28_000), "0.028");
    }

    #[test]
    fn without_a_model_the_table_and_its_source() {
        let (code, out, err) = run_args(&["prices"]);
        assert_eq!((code, err.as_str()), (0, ""));
        assert!(
            out.starts_with(&format!(
                "built-in prices: {} models (openai ",
                table::TABLE.len()
            )),
            "{out}"
        );
        for want in [
            "source:   BerriAI/litellm model_prices_and_context_window.json\n",
            &format!("revision: {}\n", table::COMMIT),
            &format!("date:     {}\n", table::DATE),
            "licence:  MIT",
        ] {
            assert!(out.contains(want), "{want}\n{out}");
        }
        assert!(!out.contains("configured"), "{out}");
    }

    #[test]
    fn a_model_priced_by_the_table() {
        let (code, out, err) =
            run_args(&["prices", "us.anthropic.claude-sonnet-4-5-20250929-v1:0"]);
        assert_eq!((code, err.as_str()), (0, ""));
        let row = prices::table_row("claude-sonnet-4-5").unwrap();
        let want = format!(
            "model:     us.anthropic.claude-sonnet-4-5-20250929-v1:0\n\
             provider:  anthropic\n\
             priced as: claude-sonnet-4-5 (built-in table)\n\
             US dollars per million tokens:\n\
             {}",
            rate_lines(&row.rate())
        );
        assert_eq!(out, want);
        assert!(
            out.contains("  input          3.00\n  output        15.00\n"),
            "{out}"
        );
    }

    #[test]
    fn a_model_nobody_prices_takes_its_providers_highest() {
        let (code, out, _) = run_args(&["prices", "claude-opus-99"]);
        assert_eq!(code, 0);
        assert!(out.contains("provider:  anthropic\n"), "{out}");
        assert!(out.contains("priced as: unpriced"), "{out}");
        assert!(out.contains("at the highest price of anthropic"), "{out}");
        let h = Prices::default().highest_for("claude-opus-99");
        assert!(out.contains(&rate_lines(&h.rate)), "{out}");
        let (code, out, _) = run_args(&["prices", "my-model"]);
        assert_eq!(code, 0);
        assert!(out.contains("provider:  unknown\n"), "{out}");
        assert!(out.contains("the highest price of all models"), "{out}");
    }

    #[test]
    fn configured_prices_come_first() {
        let dir = std::env::temp_dir().join(format!("loopguard-prices-{}", std::process::id()));
        let file = config(
            &dir,
            r#"{"gpt-4o": {"input_per_million": 2, "output_per_million": 8, "cached_input_per_million": 0.5}}"#,
        );
        let (code, out, err) = run_args(&["prices", "--config", &file]);
        assert_eq!((code, err.as_str()), (0, ""));
        assert!(
            out.contains(&format!(
                "configured prices ({file}), before the built-in table, US dollars per million tokens:\n  \
                 MODEL   INPUT  OUTPUT  CACHED  CACHE WRITE\n  \
                 gpt-4o   2.00    8.00    0.50         2.00\n"
            )),
            "{out}"
        );
        let (code, out, _) = run_args(&["prices", "openai/gpt-4o-2024-08-06", "--config", &file]);
        assert_eq!(code, 0);
        assert!(
            out.contains("priced as: gpt-4o (configured prices)\n"),
            "{out}"
        );
        assert!(out.contains("  input         2.00\n"), "{out}");
        // Others still come from the table.
        let (_, out, _) = run_args(&["prices", "gpt-4o-mini", "--config", &file]);
        assert!(
            out.contains("priced as: gpt-4o-mini (built-in table)"),
            "{out}"
        );
        let none = config(&dir, "{}");
        let (_, out, _) = run_args(&["prices", "--config", &none]);
        assert!(
            out.ends_with(&format!("configured prices ({none}): none\n")),
            "{out}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_configuration_exits_2() {
        let dir = std::env::temp_dir().join(format!("loopguard-prices-bad-{}", std::process::id()));
        let file = config(
            &dir,
            r#"{"gpt-4o": {"input_per_million": -1, "output_per_million": 8}}"#,
        );
        let (code, out, err) = run_args(&["prices", "gpt-4o", "--config", &file]);
        assert_eq!((code, out.as_str()), (2, ""));
        assert!(err.starts_with(&format!("loopguard: {file}")), "{err}");
        assert!(
            err.contains("prices.gpt-4o.input_per_million must be >= 0"),
            "{err}"
        );
        let (code, _, err) = run_args(&["prices", "--config", "/nonexistent/c.json"]);
        assert_eq!(code, 2);
        assert!(err.starts_with("loopguard: /nonexistent/c.json"), "{err}");
        let (code, _, err) = run_args(&["prices", "a", "b"]);
        assert_eq!(code, 2);
        assert!(err.contains("unexpected argument 'b' found"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn help_names_the_options() {
        let (code, out, _) = run_args(&["prices", "--help"]);
        assert_eq!(code, 0);
        for want in ["[MODEL]", "--config <FILE>", "--filter <NAME>", "built-in"] {
            assert!(out.contains(want), "{want}\n{out}");
        }
        let (_, out, _) = run_args(&["--help"]);
        assert!(out.contains("prices"), "{out}");
    }
}
