//! The services the filter calls through Envoy clusters: the shared store
//! and the alert webhook.

/// Where window state lives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreConfig {
    /// Envoy shared data: exact across one Envoy's workers.
    #[default]
    Local,
    /// Redis, through webdis, through an Envoy cluster: shared by every
    /// Envoy replica.
    RedisWebdis(RedisStore),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStore {
    /// One Redis node (a Redis Function, `FCALL`) or a Redis Cluster
    /// behind Envoy's `redis_proxy` (a script, `EVALSHA`).
    pub topology: RedisTopology,
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub timeout_ms: u64,
    pub on_error: OnStoreError,
}

/// What webdis talks to, and so how loopguard calls its Lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = super::raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum RedisTopology {
    /// One Redis node: the library is loaded once as a Redis Function and
    /// called with `FCALL`.
    #[default]
    Single,
    /// A Redis Cluster through Envoy's `redis_proxy`, which refuses
    /// `FCALL`: the same library is sent as a script, `EVALSHA` first and
    /// `EVAL` when a node answers `NOSCRIPT`.
    Cluster,
}

/// What a request does when the shared store fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = super::raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Count it in the local table instead.
    Local,
    /// Let it pass unchecked.
    Allow,
}

/// A webhook receiving signed `loop.detected` alerts through an Envoy
/// cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub timeout_ms: u64,
    /// The VM environment variable holding the HMAC secret (Envoy's
    /// `vm_config.environment_variables`), if the alerts are signed.
    pub hmac_secret_env: Option<String>,
}
