//! The slot table in Envoy shared data.
//!
//! Shared data is process-wide (every worker's VM sees it) but has no TTL
//! and no delete, so the table is a fixed set of keys created at configure
//! time: `loopguard.<plugin>.<layout tag>.<bucket>`. Updates are
//! compare-and-swap with bounded retries (see `core::store::SlotStore`).

use crate::abi::{self, STATUS_CAS_MISMATCH};
use loopguard_core::host::{BucketBackend, CasWrite, TableLayout};

pub struct SharedData {
    prefix: String,
    /// Reused for every key, to avoid an allocation per request.
    key: String,
}

impl SharedData {
    fn key(&mut self, bucket: u32) -> &str {
        self.key.clear();
        self.key.push_str(&self.prefix);
        // Not `write!`: core::fmt costs hundreds of instructions in Wasm,
        // on every read and write of a request.
        self.key.push_str(itoa::Buffer::new().format(bucket));
        &self.key
    }
}

impl BucketBackend for SharedData {
    fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
        // Created at configure time; if it is gone anyway (empty, version
        // 0), an unconditional first write recreates it.
        abi::shared_get(self.key(bucket))
            .ok()
            .map(Option::unwrap_or_default)
    }

    fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
        match abi::shared_set(self.key(bucket), bytes, version) {
            Ok(()) => CasWrite::Written,
            Err(e) if e.0 == STATUS_CAS_MISMATCH => CasWrite::Conflict,
            Err(_) => CasWrite::Failed,
        }
    }

    fn publish(&mut self, bucket: u32, bytes: &[u8]) -> bool {
        // A CAS of 0 writes whatever the version (one call, no read).
        abi::shared_set(self.key(bucket), bytes, 0).is_ok()
    }
}

/// Open the table for `plugin`, creating any bucket key of the core's
/// layout ([`TableLayout::all_buckets`]) that does not exist yet.
/// Existing keys (a reload with the same layout, or another worker that got
/// here first) keep their contents.
pub fn open(plugin: &str, layout: TableLayout) -> Result<SharedData, String> {
    let mut data = SharedData {
        prefix: format!("loopguard.{plugin}.{}.", layout.tag()),
        key: String::new(),
    };
    for bucket in layout.all_buckets() {
        let key = data.key(bucket).to_string();
        let found = abi::shared_get(&key)
            .map_err(|e| format!("cannot read shared-data key {key}: host status {}", e.0))?;
        if found.is_none() {
            abi::shared_set(&key, &[], 0)
                .map_err(|e| format!("cannot create shared-data key {key}: host status {}", e.0))?;
        }
    }
    Ok(data)
}
