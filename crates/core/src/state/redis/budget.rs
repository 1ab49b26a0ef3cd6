//! Budgets in the shared store: one call of `loopguard_budget` adds a
//! request's spending to its budget keys and answers, for each, what was
//! spent in its window and how long until that is below its cap. Redis
//! keeps each key as the local table does ([`crate::state::budget::Slices`]:
//! 60 slices of the window, the same arithmetic; `tests/redis_agreement.rs`
//! compares them), in a hash of slice number -> amount.
//!
//! ```text
//! FCALL loopguard_budget <n> <key 1> .. <key n>
//!       <now_ms> <slice_ms 1> <add 1> <cap 1> .. <slice_ms n> <add n> <cap n>
//! -> [total 1, until_below_ms 1, .., total n, until_below_ms n]
//! ```
//!
//! The time is the caller's (Redis's clock is not read), so a key's slices
//! are numbered as in this Envoy's local table. Amounts travel as Lua
//! numbers: exact integers below 2^53 ([`MAX_AMOUNT`]; a cap of a million
//! dollars is 10^12 micro-dollars).

use super::{Call, Entry, RedisStore};
use crate::state::store::StoreFailure;
use serde_json::Value;

/// The largest amount, cap or time a call carries: Lua's numbers are
/// exact integers below 2^53 (larger ones are sent as this; the library
/// refuses anything larger).
pub const MAX_AMOUNT: u64 = (1 << 53) - 1;

/// One budget key of a request: what to add to it now (0: only check) and
/// its cap (0: none), over windows of 60 slices of `slice_ms`
/// ([`crate::state::budget::slice_ms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetKey {
    pub key: u64,
    pub slice_ms: u64,
    pub add: u64,
    pub cap: u64,
}

/// The store keys of a request's budget keys: every one under the
/// caller's hash tag, so a Redis Cluster keeps them on one shard and one
/// call checks them all (`redis_proxy` routes a call by its first key, and
/// Redis refuses a script whose keys span slots). They hold digests and
/// the plugin name only.
pub fn budget_keys(namespace: &str, caller: u64, keys: &[BudgetKey]) -> Vec<String> {
    keys.iter()
        .map(|k| format!("lg:{namespace}:{{b{caller:016x}}}:{:016x}", k.key))
        .collect()
}

/// The call adding to and checking a request's budget keys
/// (`loopguard_budget`): the time, then each key's slice length, addition
/// and cap.
pub fn budget_call(namespace: &str, caller: u64, keys: &[BudgetKey], now_ms: u64) -> Call {
    let mut args = Vec::with_capacity(1 + 3 * keys.len());
    args.push(now_ms.min(MAX_AMOUNT).to_string());
    for k in keys {
        args.push(k.slice_ms.max(1).to_string());
        args.push(k.add.min(MAX_AMOUNT).to_string());
        args.push(k.cap.min(MAX_AMOUNT).to_string());
    }
    Call {
        entry: Entry::Budget,
        keys: budget_keys(namespace, caller, keys),
        args,
    }
}

impl RedisStore {
    /// The library call adding to and checking a request's budget keys.
    pub fn budget_of(&self, caller: u64, keys: &[BudgetKey], now_ms: u64) -> Call {
        budget_call(&self.namespace, caller, keys, now_ms)
    }
}

/// Read webdis's answer to a budget call of `n` keys (`status`: `None`
/// when none came): each key's total and milliseconds until below its cap,
/// in the call's order.
pub fn budget_answer(
    status: Option<&str>,
    body: &[u8],
    n: usize,
) -> Result<Vec<(u64, u64)>, StoreFailure> {
    let status = status.ok_or_else(super::no_answer)?;
    let items = super::wire::result_list(status, body)?;
    if items.len() != 2 * n {
        return Err(StoreFailure::Reply(format!(
            "the budget result has {} elements for {n} keys",
            items.len()
        )));
    }
    let num = |i: usize| {
        items.get(i).and_then(Value::as_u64).ok_or_else(|| {
            StoreFailure::Reply(format!(
                "element {i} of the result is not a non-negative number"
            ))
        })
    };
    (0..n).map(|k| Ok((num(2 * k)?, num(2 * k + 1)?))).collect()
}
