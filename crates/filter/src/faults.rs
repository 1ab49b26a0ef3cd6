//! Fault injection for the end-to-end tests of Envoy's `failure_policy`
//! (cargo feature `fault-injection`; never part of the shipped module,
//! which `make build` compiles without it).
//!
//! A request header `x-loopguard-fault: crash` makes the VM panic (a trap:
//! Envoy marks the VM failed, as any runtime crash would);
//! `crash-then-fail-reloads=N` also makes the next N configurations fail,
//! so the reloads Envoy attempts under `FAIL_RELOAD` fail. The count lives
//! in shared data, which survives the crashed VM.
#![allow(clippy::panic)]

use crate::abi;
use loopguard_core::host::HeaderBlock;

const HEADER: &str = "x-loopguard-fault";
const FAILING_CONFIGURES: &str = "loopguard.fault.failing_configures";

/// Act on the request's fault header, if any.
pub fn on_request(headers: &HeaderBlock) {
    let Some(value) = headers.get(HEADER) else {
        return;
    };
    let value = String::from_utf8_lossy(value);
    if let Some(n) = value.strip_prefix("crash-then-fail-reloads=") {
        let n: u32 = n.trim().parse().unwrap_or(0);
        let _ = abi::shared_set(FAILING_CONFIGURES, n.to_string().as_bytes(), 0);
        panic!("injected crash; the next {n} configurations fail");
    }
    if value == "crash" {
        panic!("injected crash");
    }
}

/// Whether this configuration must fail (and count it).
pub fn configure_fails() -> bool {
    let Ok(Some((value, cas))) = abi::shared_get(FAILING_CONFIGURES) else {
        return false;
    };
    let left: u32 = String::from_utf8_lossy(&value).parse().unwrap_or(0);
    if left == 0 {
        return false;
    }
    let _ = abi::shared_set(FAILING_CONFIGURES, (left - 1).to_string().as_bytes(), cas);
    true
}
