//! The command line: every subcommand, its options and their help text
//! (`loopguard --help`, `loopguard SUBCOMMAND --help`; `-h` for the
//! summary), parsed by clap. Usage errors exit 2, clap's own among them.

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "loopguard",
    version,
    about = "loopguard: check loopguard configurations, explain fingerprints, replay traffic",
    subcommand_required = true,
    arg_required_else_help = true,
    after_help = "`loopguard SUBCOMMAND --help` says what each one does, with its options."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    #[command(
        about = "Validate configurations, warn of setups that silently do less",
        long_about = CHECK
    )]
    Check(CheckArgs),
    #[command(
        about = "Show a request's policy, fingerprint components and digest",
        long_about = EXPLAIN
    )]
    Explain(ExplainArgs),
    #[command(
        about = "Replay recorded traffic; report what a configuration would do",
        long_about = REPLAY
    )]
    Replay(ReplayArgs),
    #[command(
        about = "Show what a model's tokens cost: configured or built-in prices",
        long_about = PRICES
    )]
    Prices(PricesArgs),
    #[command(
        about = "Print the JSON Schema of the configuration",
        long_about = "Print the JSON Schema of the configuration (schema/loopguard.schema.json)."
    )]
    Schema,
    #[command(
        about = "Print the Lua library a Redis Cluster store runs, or its SHA1",
        long_about = REDIS_SCRIPT
    )]
    RedisScript(RedisScriptArgs),
    /// The version, as --version prints it.
    #[command(hide = true)]
    Version,
}

const CHECK: &str = "\
Validate every loopguard configuration in the files (a policy JSON, an
Envoy bootstrap or xDS resource with the loopguard Wasm filter, an ECDS
discovery response, an Istio WasmPlugin, an Envoy Gateway
EnvoyExtensionPolicy; YAML files may hold several documents) and warn
about setups that silently do less than intended. Files given together
are checked together (a WasmPlugin with its EnvoyFilter and
VirtualService). With --envoy, also what will not work on that Envoy
release. Exits 1 on any error (with --strict, on any warning).";

const EXPLAIN: &str = "\
Show which policy applies to the request, the fingerprint's
components in order and the digest the filter computes. The request is
raw HTTP/1.1 (request line, headers, blank line, body) or JSON/YAML:
{method, path, headers, body | body_json, route, route_policy,
source_address, verified_claims}. --filter picks one configuration when
the file holds several (a filter, WasmPlugin or policy name).";

const REPLAY: &str = "\
Run recorded traffic (JSON Lines, HAR 1.2, Envoy tap traces, or
directories of them; each may be gzip-compressed) through each
configuration with the filter's own engine on the recorded clock, and
report per policy the loops found, what each action would have done and
to how many requests and callers, the tokens those requests carried, and
what each spend cap (budget) would have rejected and warned.
--set replays once per value of one field (a sweep); --verdicts writes
what the filter did to each request, one JSON line each; --html writes a
self-contained page with a timeline per looping caller. While it reads,
it shows its progress on stderr when stderr is a terminal.";

const PRICES: &str = "\
Without MODEL: the built-in price table's source, revision, date,
licence and size, and with --config the configuration's own prices.
With MODEL (as a request names it: gpt-4o-2024-08-06, openai/gpt-4o,
us.anthropic.claude-sonnet-4-5-20250929-v1:0): its price per million
input, output, cached-input and cache-write tokens, the name it resolved
to and where the price comes from (the configuration's prices, the
built-in table, or for a model neither prices, the highest price of its
provider, as budget.unpriced: max charges it).";

const REDIS_SCRIPT: &str = "\
Print the Lua library in the script form a Redis Cluster store runs
(store.topology cluster: EVALSHA, then EVAL on NOSCRIPT), or only its
SHA1, e.g. to SCRIPT LOAD it on every node ahead of traffic.";

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Exit 1 on any warning too (an error always exits 1)
    #[arg(long)]
    pub strict: bool,
    /// Also say what will not work on this Envoy release (1.39, 1.39.3)
    ///
    /// The supported releases are 1.36 to 1.40 (envoy/versions.txt): the
    /// Wasm filter's allow_on_headers_stop_iteration needs 1.35+; the native
    /// module loads on 1.39 and 1.40, each from a build for its ABI (a
    /// module file named in the configuration and present here is read).
    #[arg(long, value_name = "VERSION", verbatim_doc_comment)]
    pub envoy: Option<String>,
    /// Files to check, together
    ///
    /// A policy JSON, an Envoy bootstrap or xDS resource, an ECDS discovery
    /// response, an Istio WasmPlugin (with its EnvoyFilter and
    /// VirtualService), an Envoy Gateway EnvoyExtensionPolicy; YAML files
    /// may hold several documents.
    #[arg(value_name = "FILE", required = true, verbatim_doc_comment)]
    pub files: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The file with the loopguard configuration
    ///
    /// Any file `check` reads: a policy JSON, Envoy, Istio or Envoy Gateway
    /// resources.
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub config: String,
    /// Which configuration, when the file holds several
    ///
    /// A filter, WasmPlugin or policy name.
    #[arg(long, value_name = "NAME", verbatim_doc_comment)]
    pub filter: Option<String>,
    /// The request to explain
    ///
    /// Raw HTTP/1.1 (request line, headers, blank line, body) or JSON/YAML:
    /// {method, path, headers, body | body_json, route, route_policy,
    /// source_address, verified_claims}.
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub request: String,
    /// Print the explanation as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Configuration to replay through; repeat to compare
    ///
    /// Several configurations are replayed side by side over one pass of
    /// the traffic.
    #[arg(
        long = "config",
        value_name = "FILE",
        required = true,
        verbatim_doc_comment
    )]
    pub configs: Vec<String>,
    /// Which configuration, when a file holds several
    ///
    /// A filter, WasmPlugin or policy name.
    #[arg(long, value_name = "NAME", verbatim_doc_comment)]
    pub filter: Option<String>,
    /// Replay once per value of one field (a sweep)
    ///
    /// Given once: a sweep varies one field. PATH walks the configuration's
    /// JSON: fields by name, list items by id or name (or position); a
    /// policy's spec may be left out
    /// (policies.agents.budget.limits.session-hour.usd=1,2,5). Each value
    /// is read as JSON when it is JSON (3, 0.35, true), else as text.
    #[arg(long = "set", value_name = "PATH=V1,V2,...", verbatim_doc_comment)]
    pub sets: Vec<String>,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// Write an HTML page: a timeline per looping caller
    ///
    /// The page is self-contained (no external scripts, styles or fonts),
    /// with a table per policy, a timeline strip per looping caller coloured
    /// by action and, for a sweep, the curve of loops found and requests
    /// touched against the swept value.
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub html: Option<String>,
    /// Write each request's verdict, one JSON line each
    ///
    /// What the filter did to each request in each configuration: its place
    /// in the input, time, policy, action, status, throttle delay, count,
    /// tool-loop verdict and the decision record.
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub verdicts: Option<String>,
    /// Show no progress on stderr
    ///
    /// Progress (requests read, files done, requests per second) is shown
    /// only when stderr is a terminal.
    #[arg(long, short = 'q', visible_alias = "no-progress", verbatim_doc_comment)]
    pub quiet: bool,
    /// Traffic files or directories of them
    ///
    /// JSON Lines, HAR 1.2 or Envoy tap traces (JSON), each may be
    /// gzip-compressed (.jsonl.gz, .har.gz, .json.gz); a directory is read
    /// as the files in it.
    #[arg(value_name = "TRAFFIC", required = true, verbatim_doc_comment)]
    pub traffic: Vec<String>,
}

#[derive(Args, Debug)]
pub struct RedisScriptArgs {
    /// Print only the script's SHA1 (the name EVALSHA calls it by)
    #[arg(long)]
    pub sha1: bool,
}

#[derive(Args, Debug)]
pub struct PricesArgs {
    /// The model to price, as a request names it
    #[arg(value_name = "MODEL")]
    pub model: Option<String>,
    /// A file with a loopguard configuration: its prices come first
    ///
    /// Any file `check` reads: a policy JSON, Envoy, Istio or Envoy Gateway
    /// resources.
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub config: Option<String>,
    /// Which configuration, when the file holds several
    ///
    /// A filter, WasmPlugin or policy name.
    #[arg(long, value_name = "NAME", verbatim_doc_comment)]
    pub filter: Option<String>,
}
