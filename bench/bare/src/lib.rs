//! The bare detector: fingerprint = SHA-256(method, path, authorization),
//! one shared-data key per fingerprint holding a count, updated with CAS.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};
use sha2::{Digest, Sha256};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| Box::new(Root));
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Bare))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Bare;

impl Context for Bare {}

impl HttpContext for Bare {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let mut h = Sha256::new();
        for name in [":method", ":path", "authorization"] {
            if let Ok(Some(v)) = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name) {
                h.update((v.len() as u32).to_le_bytes());
                h.update(&v);
            }
        }
        let digest = h.finalize();
        let key: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        for _ in 0..8 {
            let Ok((value, cas)) = hostcalls::get_shared_data(&key) else {
                break;
            };
            let count = value
                .and_then(|v| v.try_into().ok())
                .map_or(0, u32::from_le_bytes);
            let next = (count + 1).to_le_bytes();
            if hostcalls::set_shared_data(&key, Some(&next), cas).is_ok() {
                break;
            }
        }
        Action::Continue
    }
}
