//! The line every guard logs for what shadow mode did not do, in one
//! shape: `shadow: would_<step> [<guard> ]policy="<id>" <field>=<value>..`
//! (repeats name no guard; tool loops, MCP loops and budgets do).

/// The shadow line of a step not taken.
pub fn line(step: &str, guard: Option<&str>, policy_id: &str, fields: &[(&str, String)]) -> String {
    let mut out = format!("shadow: would_{step} ");
    if let Some(g) = guard {
        out.push_str(g);
        out.push(' ');
    }
    out.push_str(&format!("policy=\"{policy_id}\""));
    for (name, value) in fields {
        out.push_str(&format!(" {name}={value}"));
    }
    out
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
