//! The line every guard logs for what shadow mode did not do, in one
//! shape: `shadow: would_<step> [<guard> ]policy="<id>" <field>=<value>..`
//! (repeats name no guard; tool loops, MCP loops and budgets do).

use crate::detect::verdict::{StepName, Verdict};

/// The shadow line of a step not taken.
pub fn line(step: &str, guard: Option<&str>, policy_id: &str, fields: &[(&str, String)]) -> String {
    let guard = guard.map(|g| format!("{g} ")).unwrap_or_default();
    let mut out = format!("shadow: would_{step} {guard}policy=\"{policy_id}\"");
    for (name, value) in fields {
        out.push_str(&format!(" {name}={value}"));
    }
    out
}

/// The shadow line of a repetition guard's verdict: its tier, its tool
/// (`-` when it names none) and `count` (its level, or its occurrences).
pub fn verdict_line<S: StepName, E>(
    guard: &str,
    policy_id: &str,
    v: &Verdict<S, E>,
    tool: Option<String>,
    count: (&str, u32),
) -> String {
    let fields = [
        ("tier", v.tier.as_str().to_string()),
        ("tool", tool.unwrap_or_else(|| "-".to_string())),
        (count.0, count.1.to_string()),
    ];
    line(v.step.as_str(), Some(guard), policy_id, &fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shape_for_every_guard() {
        assert_eq!(
            line("reject", None, "p", &[("count", "5".into())]),
            "shadow: would_reject policy=\"p\" count=5"
        );
        assert_eq!(
            line(
                "block",
                Some("mcp loop"),
                "m",
                &[("tier", "cycle".into()), ("tool", "a".into())]
            ),
            "shadow: would_block mcp loop policy=\"m\" tier=cycle tool=a"
        );
    }
}
