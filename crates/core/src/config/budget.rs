//! Spend caps (`spec.budget`): tokens, dollars or model calls per caller,
//! session or conversation over a sliding window. The spending is read
//! from the responses ([`crate::response::usage`]) and kept in
//! [`crate::state::budget`]; [`crate::flow`] checks it before a request
//! goes upstream.

/// Budget limits per policy, at most.
pub const MAX_LIMITS: usize = 8;
/// Session sources per policy, at most (and user sources).
pub const MAX_SESSION_SOURCES: usize = 8;
/// The longest window of a cap: 31 days, in seconds (a monthly budget).
pub const MAX_BUDGET_WINDOW_SECONDS: u64 = 2_678_400;

/// A policy's spend caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub limits: Vec<BudgetLimit>,
    pub action: BudgetAction,
    /// From this fraction of a cap (in thousandths; 0: never) a request
    /// carries the warning.
    pub warn_at_permille: u32,
    /// Where a session id is read, first found wins.
    pub session: Vec<SessionSource>,
    /// Where the end user's id is read (for `per: user`), first found
    /// wins.
    pub user: Vec<SessionSource>,
    /// What a dollar cap charges for a model no price list names.
    pub unpriced: Unpriced,
    /// Budget keys tracked at once (the table's capacity).
    pub max_tracked_keys: u32,
}

impl Budget {
    /// Whether a limit counts `per` this (for a session or user, the
    /// request's id of it is then read).
    pub fn has_per(&self, per: BudgetPer) -> bool {
        self.limits.iter().any(|l| l.per == per)
    }

    /// Whether a limit counts tokens or dollars (a response's usage
    /// matters; calls alone need none).
    pub fn reads_usage(&self) -> bool {
        self.limits.iter().any(|l| !matches!(l.cap, Cap::Calls(_)))
    }

    /// Whether a limit is in dollars.
    pub fn has_usd(&self) -> bool {
        self.limits
            .iter()
            .any(|l| matches!(l.cap, Cap::MicroUsd(_)))
    }
}

/// What a dollar cap does with a model that neither `prices` nor the
/// built-in table prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "UnpricedName", transform = super::raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum Unpriced {
    /// Charged at the highest price known for its provider (or in the
    /// table): never free.
    #[default]
    Max,
    /// Refused before it goes upstream.
    Reject,
    /// Charged nothing in dollars (its tokens and calls still count).
    Ignore,
}

impl Unpriced {
    pub fn as_str(self) -> &'static str {
        match self {
            Unpriced::Max => "max",
            Unpriced::Reject => "reject",
            Unpriced::Ignore => "ignore",
        }
    }
}

// What happens at a cap. Read as written (`raw`); no doc comment: the
// schema would show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "BudgetActionName"))]
#[serde(rename_all = "snake_case")]
pub enum BudgetAction {
    Reject,
    Warn,
}

/// Whose spending a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "BudgetPerName", transform = super::raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum BudgetPer {
    Caller,
    Session,
    Conversation,
    /// The end user behind a caller (a shared API key), as the request
    /// names them.
    User,
}

impl BudgetPer {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPer::Caller => "caller",
            BudgetPer::Session => "session",
            BudgetPer::Conversation => "conversation",
            BudgetPer::User => "user",
        }
    }
}

/// One spend cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetLimit {
    pub name: String,
    pub per: BudgetPer,
    pub window_ms: u64,
    pub cap: Cap,
}

// Which tokens a token cap counts. Read as written (`raw`); no doc
// comment: the schema would show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "TokensOfName"))]
#[serde(rename_all = "snake_case")]
pub enum TokensOf {
    Input,
    Output,
    All,
}

/// A cap and its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Micro-dollars.
    MicroUsd(u64),
    Tokens(u64, TokensOf),
    Calls(u64),
}

impl Cap {
    /// The cap in the unit spending is kept in (micro-dollars, tokens,
    /// calls).
    pub fn amount(self) -> u64 {
        match self {
            Cap::MicroUsd(n) | Cap::Tokens(n, _) | Cap::Calls(n) => n,
        }
    }

    /// The unit's name in headers, events and messages.
    pub fn unit(self) -> &'static str {
        match self {
            Cap::MicroUsd(_) => "usd",
            Cap::Tokens(..) => "tokens",
            Cap::Calls(_) => "calls",
        }
    }

    /// An amount in this cap's unit, as people read it: dollars with
    /// cents (and more digits below a cent), tokens and calls whole.
    pub fn show(self, amount: u64) -> String {
        match self {
            Cap::MicroUsd(_) => show_usd(amount),
            _ => amount.to_string(),
        }
    }

    /// What one response spent, in this cap's unit.
    pub fn spent(self, s: &Spent) -> u64 {
        match self {
            Cap::MicroUsd(_) => s.microusd,
            Cap::Tokens(_, TokensOf::Input) => s.input,
            Cap::Tokens(_, TokensOf::Output) => s.output,
            Cap::Tokens(_, TokensOf::All) => s.input.saturating_add(s.output),
            Cap::Calls(_) => s.calls,
        }
    }
}

/// What one response spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    pub input: u64,
    pub output: u64,
    pub microusd: u64,
    pub calls: u64,
}

/// Micro-dollars as dollars: `5.00`, `0.0042`.
pub fn show_usd(micro: u64) -> String {
    let whole = micro / 1_000_000;
    let frac = micro % 1_000_000;
    if whole == 0 && frac > 0 && frac < 10_000 {
        let s = format!("0.{frac:06}");
        s.trim_end_matches('0').to_string()
    } else {
        format!("{whole}.{:02}", frac / 10_000)
    }
}

/// Where a session's or an end user's id is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionSource {
    /// A request header (lower case).
    Header(String),
    /// A top-level field of the JSON body, or a field of one (`a.b`).
    Body(Vec<String>),
    /// A claim of the request's bearer JWT, read without verifying it (as
    /// the `jwt:` limit key).
    Jwt(String),
    /// A claim of the JWT payload Envoy's `jwt_authn` verified (as the
    /// `jwt_verified:` limit key).
    JwtVerified(String),
}

impl SessionSource {
    /// As written in the configuration.
    pub fn show(&self) -> String {
        match self {
            SessionSource::Header(h) => format!("header:{h}"),
            SessionSource::Body(path) => format!("body:{}", path.join(".")),
            SessionSource::Jwt(claim) => format!("jwt:{claim}"),
            SessionSource::JwtVerified(claim) => format!("jwt_verified:{claim}"),
        }
    }

    /// Whether it is read from the request headers (else from the body).
    pub fn in_headers(&self) -> bool {
        !matches!(self, SessionSource::Body(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_show_cents_or_what_is_below_a_cent() {
        assert_eq!(show_usd(5_000_000), "5.00");
        assert_eq!(show_usd(5_021_300), "5.02");
        assert_eq!(show_usd(4_200), "0.0042");
        assert_eq!(show_usd(0), "0.00");
        assert_eq!(show_usd(123_456_789), "123.45");
    }

    #[test]
    fn each_cap_reads_its_own_part_of_a_response() {
        let s = Spent {
            input: 100,
            output: 20,
            microusd: 7,
            calls: 1,
        };
        assert_eq!(Cap::MicroUsd(1).spent(&s), 7);
        assert_eq!(Cap::Tokens(1, TokensOf::Input).spent(&s), 100);
        assert_eq!(Cap::Tokens(1, TokensOf::Output).spent(&s), 20);
        assert_eq!(Cap::Tokens(1, TokensOf::All).spent(&s), 120);
        assert_eq!(Cap::Calls(1).spent(&s), 1);
    }
}
