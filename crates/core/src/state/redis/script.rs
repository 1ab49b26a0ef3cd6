//! The Lua library as a script, for a Redis Cluster behind Envoy's
//! `redis_proxy`, which passes `EVAL`/`EVALSHA` but refuses `FCALL`.
//!
//! There is one source: `envoy/redis/loopguard.lua`, loaded on a single
//! node as a Redis Function. The script is derived from it here, by rule:
//! the `#!lua` header and the `redis.register_function` lines become
//! comments (so line numbers in Redis's error messages stay the same), and
//! a dispatcher is appended that calls the registered entry named by the
//! first argument with the remaining ones. The function bodies are the very
//! same text, so the two forms cannot drift apart.

use sha1::{Digest, Sha1};

/// The library, exactly as shipped.
pub const LIBRARY: &str = include_str!("../../../../../envoy/redis/loopguard.lua");

/// The library in script form, with its SHA1 (what `EVALSHA` names it by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    pub source: String,
    /// Lower-case hex SHA1 of `source`'s bytes, as Redis computes it.
    pub sha1: String,
    /// The entry points, in the library's order (`loopguard_hit`, ...).
    pub entries: Vec<String>,
}

impl Script {
    /// The shipped library as a script.
    pub fn shipped() -> Script {
        // The shipped library always derives (a unit test holds it to
        // that); an empty script would only make every call fail open.
        Script::derive(LIBRARY).unwrap_or_else(|_| Script::from_source(String::new(), Vec::new()))
    }

    /// Derive the script form of a function library (see the module's
    /// documentation for the rule).
    pub fn derive(library: &str) -> Result<Script, String> {
        let mut source = String::with_capacity(library.len() + 512);
        let mut entries: Vec<(String, String)> = Vec::new();
        for (i, line) in library.lines().enumerate() {
            let trimmed = line.trim();
            if i == 0 && trimmed.starts_with("#!lua") {
                source.push_str("-- (script form: the library header is not read by EVAL)\n");
                continue;
            }
            if let Some(rest) = trimmed.strip_prefix("redis.register_function(") {
                let (name, function) = registration(rest)
                    .ok_or_else(|| format!("line {}: cannot read {trimmed:?}", i + 1))?;
                source.push_str(&format!("-- {trimmed}\n"));
                entries.push((name, function));
                continue;
            }
            source.push_str(&format!("{line}\n"));
        }
        if entries.is_empty() {
            return Err("the library registers no function".to_string());
        }
        source.push_str(
            "\n-- Script form: ARGV[1] names the entry point, the rest are its\n\
             -- arguments, as FCALL would pass them.\n\
             local entries = {",
        );
        let table: Vec<String> = entries.iter().map(|(n, f)| format!("{n} = {f}")).collect();
        source.push_str(&table.join(", "));
        source.push_str(
            "}\n\
             local entry = entries[ARGV[1]]\n\
             if not entry then\n  \
             return redis.error_reply('loopguard: unknown entry ' .. tostring(ARGV[1]))\n\
             end\n\
             return entry(KEYS, {unpack(ARGV, 2)})\n",
        );
        let names = entries.into_iter().map(|(name, _)| name).collect();
        Ok(Script::from_source(source, names))
    }

    fn from_source(source: String, entries: Vec<String>) -> Script {
        let digest = Sha1::digest(source.as_bytes());
        let sha1 = digest.iter().map(|b| format!("{b:02x}")).collect();
        Script {
            source,
            sha1,
            entries,
        }
    }
}

/// `'name', function)` of a `redis.register_function(` line: the entry's
/// name and the local function it runs. Only the plain two-argument form
/// the library uses is read.
fn registration(rest: &str) -> Option<(String, String)> {
    let inner = rest.strip_suffix(')')?;
    let (name, function) = inner.split_once(',')?;
    let name = name.trim().trim_matches(|c| c == '\'' || c == '"');
    let function = function.trim();
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    (ident(name) && ident(function)).then(|| (name.to_string(), function.to_string()))
}

#[cfg(test)]
mod tests {
    use super::super::Entry;
    use super::*;

    #[test]
    fn the_shipped_library_derives_with_its_five_entries() {
        let s = Script::derive(LIBRARY).unwrap();
        assert_eq!(
            s.entries,
            [
                "loopguard_hit",
                "loopguard_near",
                "loopguard_forgive",
                "loopguard_budget",
                "loopguard_mcp"
            ]
        );
        assert_eq!(s, Script::shipped());
        assert_eq!(s.sha1.len(), 40);
        assert!(!s.source.contains("#!lua"));
        assert!(!s
            .source
            .lines()
            .any(|l| l.trim_start().starts_with("redis.register_function")));
        assert!(s
            .source
            .ends_with("return entry(KEYS, {unpack(ARGV, 2)})\n"));
        assert!(s.source.contains(
            "local entries = {loopguard_hit = hit, loopguard_near = near, loopguard_forgive = forgive, loopguard_budget = budget, loopguard_mcp = mcp}"
        ));
        // Every entry the core calls is one the script dispatches.
        for entry in [
            Entry::Hit,
            Entry::Near,
            Entry::Forgive,
            Entry::Budget,
            Entry::Mcp,
        ] {
            assert!(s.entries.iter().any(|e| e == entry.name()), "{entry:?}");
        }
    }

    #[test]
    fn every_library_line_keeps_its_number() {
        let s = Script::derive(LIBRARY).unwrap();
        let lib: Vec<&str> = LIBRARY.lines().collect();
        let script: Vec<&str> = s.source.lines().collect();
        for (i, line) in lib.iter().enumerate() {
            let kept = script[i];
            assert!(
                kept == *line || kept.starts_with("--"),
                "line {}: {line:?} became {kept:?}",
                i + 1
            );
        }
    }

    #[test]
    fn the_sha1_is_redis_s() {
        // SHA1("return 1"), as `SCRIPT LOAD "return 1"` answers it.
        let lib = "#!lua name=x\nreturn 1\nredis.register_function('x', y)\n";
        let s = Script::derive(lib).unwrap();
        let d = Sha1::digest(s.source.as_bytes());
        assert_eq!(
            s.sha1,
            d.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        assert_eq!(
            Script::from_source("return 1".into(), vec![]).sha1,
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn a_library_it_cannot_read_is_refused() {
        assert!(Script::derive("#!lua name=x\nlocal x = 1\n").is_err());
        assert!(
            Script::derive("redis.register_function{function_name='x', callback=f}\n").is_err()
        );
        assert!(Script::derive("redis.register_function('x', function() end)\n").is_err());
    }
}
