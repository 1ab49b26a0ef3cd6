//! The slot table in process memory: what Envoy shared data is to the Wasm
//! host. Every worker thread of the process sees the same table, so counts
//! are exact across workers; each bucket is a compare-and-swap cell (a
//! version and its bytes behind a lock held only to copy them), and the set
//! of buckets is fixed by the layout, so memory is bounded by the
//! configuration, never by the traffic.
//!
//! Tables are found by name (`loopguard.<plugin>.<layout tag>`) in a
//! process-wide registry and outlive the configuration that made them, as
//! shared data does: a reload with the same layout keeps its counts.

use loopguard_core::host::{BucketBackend, CasWrite, TableLayout};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// One bucket: its bytes and their version (0 before the first write).
#[derive(Default)]
struct Cell {
    bytes: Vec<u8>,
    version: u32,
}

impl Cell {
    /// Replace the bytes; the version moves on, never to 0 again (0 is "not
    /// written yet").
    fn set(&mut self, bytes: &[u8]) {
        self.bytes.clear();
        self.bytes.extend_from_slice(bytes);
        self.version = self.version.wrapping_add(1).max(1);
    }
}

/// One plugin's table: the fingerprint buckets `0..layout.buckets` by
/// index, and the other regions the core addresses by bucket number (the
/// loops' spending ledger, MCP call histories), each bounded by the core.
pub struct Table {
    dense: Vec<Mutex<Cell>>,
    sparse: RwLock<HashMap<u32, Arc<Mutex<Cell>>>>,
}

impl Table {
    /// Run `f` on a bucket's cell; `None` when a lock is poisoned (a panic
    /// while it was held) and the cell cannot be trusted.
    fn with_cell<T>(&self, bucket: u32, f: impl FnOnce(&mut Cell) -> T) -> Option<T> {
        if let Some(cell) = self.dense.get(bucket as usize) {
            return cell.lock().ok().map(|mut c| f(&mut c));
        }
        let found = self.sparse.read().ok()?.get(&bucket).cloned();
        let cell = match found {
            Some(cell) => cell,
            None => self.sparse.write().ok()?.entry(bucket).or_default().clone(),
        };
        let mut guard = cell.lock().ok()?;
        Some(f(&mut guard))
    }

    /// Buckets in use outside the fingerprint table.
    #[cfg(test)]
    pub fn sparse_len(&self) -> usize {
        self.sparse.read().map(|m| m.len()).unwrap_or(0)
    }
}

/// A worker's handle on a table.
pub struct Memory {
    table: Arc<Table>,
}

impl BucketBackend for Memory {
    fn read(&mut self, bucket: u32) -> Option<(Vec<u8>, u32)> {
        self.table
            .with_cell(bucket, |c| (c.bytes.clone(), c.version))
    }

    fn write(&mut self, bucket: u32, bytes: &[u8], version: u32) -> CasWrite {
        let written = self.table.with_cell(bucket, |c| {
            let current = c.version == version;
            if current {
                c.set(bytes);
            }
            current
        });
        match written {
            Some(true) => CasWrite::Written,
            Some(false) => CasWrite::Conflict,
            None => CasWrite::Failed,
        }
    }

    fn publish(&mut self, bucket: u32, bytes: &[u8]) -> bool {
        self.table.with_cell(bucket, |c| c.set(bytes)).is_some()
    }
}

fn registry() -> &'static Mutex<HashMap<String, Arc<Table>>> {
    static TABLES: OnceLock<Mutex<HashMap<String, Arc<Table>>>> = OnceLock::new();
    TABLES.get_or_init(Default::default)
}

/// Open (creating it the first time) the table of `plugin` with `layout`.
pub fn open(plugin: &str, layout: TableLayout) -> Result<Memory, String> {
    let name = format!("loopguard.{plugin}.{}", layout.tag());
    let mut tables = registry()
        .lock()
        .map_err(|_| format!("the table registry is unusable (a panic held it): {name}"))?;
    let table = tables
        .entry(name)
        .or_insert_with(|| {
            Arc::new(Table {
                dense: (0..layout.buckets)
                    .map(|_| Mutex::new(Cell::default()))
                    .collect(),
                sparse: RwLock::new(HashMap::new()),
            })
        })
        .clone();
    Ok(Memory { table })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(entries: u32) -> TableLayout {
        TableLayout::new(entries)
    }

    #[test]
    fn compare_and_swap_sees_every_other_write() {
        let mut a = open("cas", layout(64)).unwrap();
        let mut b = open("cas", layout(64)).unwrap();
        assert_eq!(a.read(3), Some((Vec::new(), 0)));
        assert_eq!(a.write(3, b"one", 0), CasWrite::Written);
        // b read before a wrote: its write is refused.
        assert_eq!(b.write(3, b"two", 0), CasWrite::Conflict);
        let (bytes, v) = b.read(3).unwrap();
        assert_eq!(bytes, b"one");
        assert_eq!(b.write(3, b"two", v), CasWrite::Written);
        assert_eq!(a.read(3).unwrap().0, b"two");
    }

    #[test]
    fn sparse_buckets_are_shared_and_kept() {
        let mut a = open("sparse", layout(8)).unwrap();
        let mut b = open("sparse", layout(8)).unwrap();
        assert!(a.publish(0xF000_0001, b"ledger"));
        assert_eq!(b.read(0xF000_0001).unwrap().0, b"ledger");
        assert_eq!(a.table.sparse_len(), 1);
    }

    #[test]
    fn another_layout_is_another_table() {
        let mut a = open("layouts", layout(8)).unwrap();
        let mut b = open("layouts", layout(4096)).unwrap();
        assert_eq!(a.write(1, b"x", 0), CasWrite::Written);
        assert_eq!(b.read(1), Some((Vec::new(), 0)));
    }

    #[test]
    fn threads_counting_together_lose_no_increment() {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    let mut m = open("race", layout(8)).unwrap();
                    for _ in 0..500 {
                        loop {
                            let (bytes, v) = m.read(0).unwrap();
                            let n = bytes.first().map_or(0u32, |_| {
                                u32::from_le_bytes(bytes[..4].try_into().unwrap())
                            });
                            if m.write(0, &(n + 1).to_le_bytes(), v) == CasWrite::Written {
                                break;
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut m = open("race", layout(8)).unwrap();
        let bytes = m.read(0).unwrap().0;
        assert_eq!(u32::from_le_bytes(bytes[..4].try_into().unwrap()), 4000);
    }
}
