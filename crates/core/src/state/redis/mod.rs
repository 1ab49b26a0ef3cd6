//! The shared store: one call of loopguard's Lua library per hit, sent to
//! webdis in a POST body and answered as JSON. On one Redis node the
//! library is a Redis Function (`FCALL/loopguard_hit/3/<keys>/<args>`); on
//! a Redis Cluster behind Envoy's `redis_proxy` it is a script
//! (`EVALSHA/<sha1>/3/<keys>/loopguard_hit/<args>`, sent again as `EVAL`
//! when a node answers `NOSCRIPT`). The library is
//! `envoy/redis/loopguard.lua`; [`script`] derives the script from it.
//! Budgets use the same library and the same two forms ([`budget`]).

pub mod budget;
pub mod mcp;
pub mod script;
pub mod wire;

pub use budget::{budget_answer, budget_call, budget_keys, BudgetKey};
pub use script::Script;
pub use wire::{encode_arg, is_noscript, parse_reply, parse_take_back, Entry, Invoke};

use crate::config::{self, RedisTopology};
use crate::detect::fingerprint::Fingerprint;
use crate::state::store::{
    CallReply, Hit, StoreAnswer, StoreCall, StoreFailure, StoreReceipt, TakeBack,
};

/// The shared store: calls of the Lua library through webdis. The flow
/// sends each ([`RedisStore::send`]) and reads its answer.
pub struct RedisStore {
    cfg: config::RedisStore,
    /// The plugin's name: keeps deployments sharing one Redis apart.
    namespace: String,
    /// Makes each hit's log member unique among every Envoy sharing the
    /// store: a random seed per plugin instance, and the hit's id.
    seed: u64,
    /// The library as a script, for a Redis Cluster (`None`: one node,
    /// where it is a Redis Function).
    script: Option<Script>,
}

impl RedisStore {
    pub fn new(cfg: config::RedisStore, namespace: &str, seed: u64) -> RedisStore {
        let script = (cfg.topology == RedisTopology::Cluster).then(Script::shipped);
        RedisStore {
            cfg,
            namespace: namespace.to_string(),
            seed,
            script,
        }
    }

    /// A hit's log member: unique among every Envoy sharing the store.
    fn nonce(&self, id: u64) -> String {
        format!("{:x}-{:x}", self.seed, id)
    }

    /// How calls name the Lua: the function, or the script by its SHA1
    /// (`full`: the whole script, after a `NOSCRIPT`).
    fn invoke(&self, full: bool) -> Invoke<'_> {
        match (&self.script, full) {
            (None, _) => Invoke::Function,
            (Some(s), false) => Invoke::Cached(s),
            (Some(s), true) => Invoke::Full(s),
        }
    }

    /// A library call as webdis receives it (`full`: with the whole
    /// script, for a node that answered `NOSCRIPT`).
    pub fn send(&self, call: &Call, full: bool) -> StoreCall {
        StoreCall {
            cluster: self.cfg.cluster.clone(),
            headers: vec![
                (":method", "POST".to_string()),
                (":path", self.cfg.path.clone()),
                (":authority", self.cfg.authority.clone()),
                ("content-type", "text/plain".to_string()),
            ],
            body: call.body(self.invoke(full)).into_bytes(),
            timeout_ms: self.cfg.timeout_ms,
        }
    }

    /// Whether a call's answer says its node had not cached the script
    /// (`NOSCRIPT`, a Redis Cluster only): it is then sent once more with
    /// the whole script.
    pub fn needs_script(&self, status: Option<&str>, body: &[u8]) -> bool {
        self.script.is_some() && is_noscript(status, body)
    }

    /// The library call recording a hit (`loopguard_hit`, or
    /// `loopguard_near`).
    pub fn hit_of(&self, hit: &Hit) -> Call {
        hit_call(&self.namespace, hit, &self.nonce(hit.id))
    }

    /// The library call taking a hit back (`loopguard_forgive`).
    pub fn take_back_of(&self, t: &TakeBack) -> Call {
        take_back_call(&self.namespace, t, &self.nonce(t.id))
    }

    /// The window state a hit's call answered (or why it is unusable).
    pub fn complete(&self, reply: &CallReply) -> StoreAnswer {
        let status = reply.status.as_deref().ok_or_else(no_answer);
        match status.and_then(|status| parse_reply(status, &reply.body)) {
            Ok(state) => StoreAnswer::Ready(StoreReceipt {
                state,
                ..StoreReceipt::default()
            }),
            Err(failure) => StoreAnswer::Failed(failure),
        }
    }
}

/// A call that got no answer.
pub fn no_answer() -> StoreFailure {
    StoreFailure::Unavailable("no answer within the timeout, or the connection failed".to_string())
}

/// The store keys of a fingerprint: the sliding log, the cooldown and the
/// event state; of a near-mode record (`near`: a caller and model), the
/// history of signatures, the cooldowns and each loop's event state. They
/// are under one hash tag so a Redis Cluster keeps them on one shard
/// (`redis_proxy` routes a call by its first key, and Redis refuses a
/// script whose keys span slots). `namespace` (the plugin's name) keeps
/// deployments sharing one Redis apart, as the plugin name does in shared
/// data. Keys hold digests and the plugin name only, never request content
/// or API keys.
pub fn keys(namespace: &str, fp: &Fingerprint, near: bool) -> [String; 3] {
    let hex = fp.hex();
    let names = if near {
        ["n", "ncd", "nev"]
    } else {
        ["w", "cd", "ev"]
    };
    names.map(|name| format!("lg:{namespace}:{{{hex}}}:{name}"))
}

/// One call of the library, as Redis receives it: the entry point, the
/// keys and the arguments. [`Call::body`] writes it for webdis; the
/// agreement test sends the very same call over RESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub entry: Entry,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// The call recording one hit (`loopguard_hit`, or `loopguard_near` for a
/// near-mode hit). `nonce` makes the hit's log member unique among
/// concurrent callers.
pub fn hit_call(namespace: &str, hit: &Hit, nonce: &str) -> Call {
    let q = &hit.query;
    let mut args = vec![
        q.window_ms.to_string(),
        q.capacity.to_string(),
        q.trip_at.to_string(),
        q.cooldown_ms.to_string(),
        q.detect_at.to_string(),
        q.event_every_ms.to_string(),
        nonce.to_string(),
    ];
    if let Some(p) = &hit.near {
        args.extend([p.signature.hex(), p.threshold.min_matches.to_string()]);
    }
    let near = hit.near.is_some();
    Call {
        entry: if near { Entry::Near } else { Entry::Hit },
        keys: keys(namespace, &hit.key, near).to_vec(),
        args,
    }
}

/// The call taking back the hit logged as `nonce` (`loopguard_forgive`).
pub fn take_back_call(namespace: &str, t: &TakeBack, nonce: &str) -> Call {
    let [log, _, _] = keys(namespace, &t.key, t.near.is_some());
    // What the record forgave: beside its log, in its hash tag.
    let forgiven = format!("{log}fg");
    Call {
        entry: Entry::Forgive,
        keys: vec![log, forgiven],
        args: vec![
            nonce.to_string(),
            t.forgiveness.window_ms.to_string(),
            t.forgiveness.max.to_string(),
        ],
    }
}

#[cfg(test)]
mod tests;
