//! Any bytes as plugin configuration: an error or a configuration, never a
//! panic; a configuration that parses, parses the same way twice.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard_core::config::Config;

fuzz_target!(|data: &[u8]| {
    if let Ok(cfg) = Config::parse(data) {
        assert_eq!(Config::parse(data).ok(), Some(cfg));
    }
});
