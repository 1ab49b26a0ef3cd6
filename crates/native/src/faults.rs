//! Fault injection for the end-to-end test of panic isolation (cargo
//! feature `fault-injection`; never part of the module `make build`
//! ships): a request header `x-loopguard-fault: crash` panics inside the
//! module, in the request headers hook.
#![allow(clippy::panic)]

use loopguard_core::host::HeaderBlock;

pub fn on_request(headers: &HeaderBlock) {
    if headers.get("x-loopguard-fault") == Some(b"crash") {
        panic!("injected crash");
    }
}
