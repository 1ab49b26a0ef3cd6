//! The counters the engine names as it first counts them
//! ([`crate::flow::Effect::CountNamed`]): a looping caller's series, the
//! MCP counters per tier, step and reason. Each name is a family's name
//! followed by its labels as `.label.value` pairs, the shape Envoy's stats
//! tag extraction reads. A host that defines every metric up front (an
//! Envoy dynamic module may define metrics only while its configuration
//! loads) defines these families with their label names, and counts a named
//! counter as its family with the label values [`split`] reads from it.

/// One family of named counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    pub labels: &'static [&'static str],
}

const fn family(name: &'static str, labels: &'static [&'static str]) -> Family {
    Family { name, labels }
}

/// Every family the engine names counters in.
pub const FAMILIES: &[Family] = &[
    family(
        "loopguard.caller_loop_requests_total",
        &["policy", "caller"],
    ),
    family("loopguard.budget_spend_total", &["policy", "budget", "key"]),
    family("loopguard.mcp_exempt_total", &["policy"]),
    family("loopguard.mcp_loops_total", &["policy", "tier", "step"]),
    family("loopguard.mcp_shadow_total", &["policy", "tier", "step"]),
    family("loopguard.mcp_unjudged_total", &["policy", "reason"]),
    family("loopguard.mcp_histories_evicted_total", &["policy"]),
];

/// The family (its index in [`FAMILIES`]) and the label values of a named
/// counter; `None` for a name of no family, or whose labels are not the
/// family's, in order.
pub fn split(name: &str) -> Option<(usize, Vec<&str>)> {
    FAMILIES.iter().enumerate().find_map(|(i, f)| {
        let rest = name.strip_prefix(f.name)?.strip_prefix('.')?;
        let mut parts = rest.split('.');
        let mut values = Vec::with_capacity(f.labels.len());
        for label in f.labels {
            if parts.next()? != *label {
                return None;
            }
            values.push(parts.next()?);
        }
        parts.next().is_none().then_some((i, values))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{McpStep, StepName};
    use crate::detect::mcp::Tier;
    use crate::metrics::budget as b;
    use crate::metrics::mcp::{self as m, McpUnjudged};

    #[test]
    fn every_name_the_engine_makes_splits_into_its_family() {
        let cases = [
            (
                crate::metrics::caller_loop_requests("p-1", "c0ffee"),
                0,
                vec!["p-1", "c0ffee"],
            ),
            (
                b::spend("p", "hour", "c0ffee"),
                1,
                vec!["p", "hour", "c0ffee"],
            ),
            (m::exempt("p"), 2, vec!["p"]),
            (
                m::loops("p", false, Tier::Identical, McpStep::Block),
                3,
                vec!["p", Tier::Identical.as_str(), McpStep::Block.as_str()],
            ),
            (
                m::loops("p", true, Tier::Cycle, McpStep::Note),
                4,
                vec!["p", Tier::Cycle.as_str(), McpStep::Note.as_str()],
            ),
            (
                m::unjudged("p", McpUnjudged::TooLarge),
                5,
                vec!["p", "too_large"],
            ),
            (m::evicted("p"), 6, vec!["p"]),
        ];
        for (name, family, values) in cases {
            assert_eq!(split(&name), Some((family, values)), "{name}");
        }
    }

    #[test]
    fn other_names_belong_to_no_family() {
        for name in [
            "loopguard.requests_total",
            "loopguard.mcp_exempt_total",
            "loopguard.mcp_exempt_total.policy",
            "loopguard.mcp_exempt_total.policy.p.extra.x",
            "loopguard.mcp_loops_total.policy.p.step.block.tier.identical",
            "loopguard.mcp_exempt_totalx.policy.p",
        ] {
            assert_eq!(split(name), None, "{name}");
        }
    }
}
