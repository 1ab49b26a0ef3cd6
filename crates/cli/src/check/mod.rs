//! `loopguard check`: validate every loopguard configuration in the given
//! files (the Wasm filter's and the native module's) with the filter's own
//! validation, then look at the setup around it for mistakes that make
//! loopguard silently do less than intended.

mod budget;
#[cfg(test)]
mod budget_tests;
mod envoy;
mod gateway;
mod istio;
pub(crate) mod native;
mod routes;
#[cfg(test)]
mod tests;
pub mod versions;

use crate::discover::{self, Found, Origin};
use crate::documents::Document;
use envoy::{envoy_setup, has_hcm};
use gateway::gateway_setup;
use istio::{envoy_filter_anchors, istio_setup};
use loopguard_core::config::{Action, Config, ToolStep};
use native::{native_setup, per_route_lints, Native};

const BUFFER_FILTER: &str = "envoy.filters.http.buffer";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub location: String,
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {sev}: {}", self.location, self.message)
    }
}

struct Report(Vec<Finding>);

impl Report {
    fn error(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Error, location, message);
    }
    fn warn(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Warning, location, message);
    }
    /// A warning, unless the same one was given (a configuration that
    /// runs in several connection managers is looked at in each).
    fn warn_once(&mut self, location: impl Into<String>, message: impl Into<String>) {
        let f = Finding {
            severity: Severity::Warning,
            location: location.into(),
            message: message.into(),
        };
        if !self.0.contains(&f) {
            self.0.push(f);
        }
    }
    fn push(
        &mut self,
        severity: Severity,
        location: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.0.push(Finding {
            severity,
            location: location.into(),
            message: message.into(),
        });
    }
}

/// Kinds that only support a loopguard setup (checked against it, not
/// required to hold a configuration).
const SUPPORTING_KINDS: [&str; 8] = [
    "EnvoyFilter",
    "VirtualService",
    "Gateway",
    "HTTPRoute",
    "EnvoyProxy",
    "BackendTrafficPolicy",
    "ClientTrafficPolicy",
    "AIGatewayRoute",
];

/// Check every document of every file given together.
#[cfg(test)]
pub fn check(docs: &[Document]) -> Vec<Finding> {
    check_for(docs, None)
}

/// [`check`], and with `envoy`, what will not work on that Envoy release.
pub fn check_for(docs: &[Document], envoy: Option<&versions::EnvoyTarget>) -> Vec<Finding> {
    let mut r = Report(Vec::new());
    let found = discover::find(docs);
    let mut configs: Vec<(&Found<'_>, Config)> = Vec::new();
    for f in &found {
        match &f.bytes {
            Err(why) => r.error(f.location(), why.clone()),
            Ok(bytes) => match Config::parse(bytes) {
                Ok(cfg) => configs.push((f, cfg)),
                Err(e) => r.error(f.location(), e.to_string()),
            },
        }
    }
    let natives = native::find(docs);
    let mut native_configs: Vec<(&Native<'_>, Config)> = Vec::new();
    for n in &natives {
        match &n.bytes {
            Err(why) => r.error(n.location(), why.clone()),
            Ok(bytes) => match Config::parse(bytes) {
                Ok(cfg) => native_configs.push((n, cfg)),
                Err(e) => r.error(n.location(), e.to_string()),
            },
        }
    }
    // A file with nothing loopguard in it was probably given by mistake.
    let mut files: Vec<&str> = Vec::new();
    for d in docs {
        if !files.contains(&d.file.as_str()) {
            files.push(&d.file);
        }
    }
    for file in files {
        let has_config =
            found.iter().any(|f| f.doc.file == file) || natives.iter().any(|n| n.doc.file == file);
        let supports = docs
            .iter()
            .filter(|d| d.file == file)
            .any(|d| d.kind().is_some_and(|k| SUPPORTING_KINDS.contains(&k)) || has_hcm(&d.value));
        if !has_config && !supports {
            r.error(
                file,
                "holds no loopguard configuration (a policy JSON, an Envoy config with the loopguard Wasm filter or dynamic module, a WasmPlugin or an EnvoyExtensionPolicy)",
            );
        }
    }
    for (f, cfg) in &configs {
        mcp_lints(&mut r, &f.location(), cfg);
        budget::budget_lints(&mut r, &f.location(), cfg);
        match &f.origin {
            Origin::Plain => {}
            Origin::Envoy { filter, plugin } => envoy_setup(&mut r, docs, f, filter, plugin, cfg),
            Origin::WasmPlugin => istio_setup(&mut r, docs, f, cfg),
            Origin::ExtensionPolicy { index } => gateway_setup(&mut r, docs, f, *index, cfg),
        }
    }
    for (n, cfg) in &native_configs {
        mcp_lints(&mut r, &n.location(), cfg);
        budget::budget_lints(&mut r, &n.location(), cfg);
        native_setup(&mut r, docs, n, cfg);
    }
    per_route_lints(&mut r, docs, &natives);
    envoy_filter_anchors(&mut r, docs);
    if let Some(target) = envoy {
        versions::version_findings(&mut r, target, &configs, &native_configs);
    }
    r.0
}

/// MCP policies that can never judge a call: a `tools/call` is a POST.
fn mcp_lints(r: &mut Report, loc: &str, cfg: &Config) {
    for p in cfg.policies.iter().filter(|p| p.mcp.is_some()) {
        let methods = &p.selector.methods;
        if !methods.is_empty() && !methods.iter().any(|m| m == "POST") {
            r.warn(
                loc,
                format!(
                    "policy \"{}\": mcp judges tools/call requests, which are POSTs, but selector.methods lists only {}: the policy never judges a call",
                    p.id,
                    methods.join(", ")
                ),
            );
        }
    }
}

/// Whether requests with a body reach an active policy (then loopguard
/// decides after the body: the headers must wait for it).
fn bodies_matter(cfg: &Config) -> bool {
    cfg.policies.iter().any(|p| {
        p.is_active()
            && (p.selector.methods.is_empty()
                || p.selector.methods.iter().any(|m| {
                    !matches!(m.as_str(), "GET" | "HEAD" | "DELETE" | "OPTIONS" | "TRACE")
                }))
    })
}

/// Whether some policy adds headers meant for the upstream (warn, tool-loop
/// nudges and directives).
fn warns_upstream(cfg: &Config) -> bool {
    cfg.policies.iter().any(|p| {
        p.detection
            .as_ref()
            .is_some_and(|d| d.steps.iter().any(|s| s.action == Action::Warn))
            || p.tool_loops.as_ref().is_some_and(|t| {
                t.ladder
                    .iter()
                    .any(|s| matches!(s, ToolStep::Nudge | ToolStep::Directive))
            })
    })
}

/// Names in quotes, separated by commas.
fn quoted_list(names: &[&String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}
