//! Finding loopguard configurations inside what operators deploy: a policy
//! JSON itself, an Envoy bootstrap (or xDS resource) with the Wasm filter,
//! an ECDS discovery response, an Istio `WasmPlugin`, or an Envoy Gateway
//! `EnvoyExtensionPolicy`.

use super::documents::{as_struct, Document};
use serde_json::Value;

pub const WASM_FILTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
pub const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
pub const BUFFER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer";
pub const HEADER_MUTATION_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";
const STRING_VALUE_TYPE: &str = "type.googleapis.com/google.protobuf.StringValue";

/// Where a configuration was found.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// The file is the plugin configuration.
    Plain,
    /// A Wasm filter in Envoy configuration (bootstrap, listener, ECDS
    /// resource, EnvoyFilter patch): its `PluginConfig`.
    Envoy { filter: String, plugin: Value },
    /// An Istio `WasmPlugin`.
    WasmPlugin,
    /// An Envoy Gateway `EnvoyExtensionPolicy`'s `spec.wasm[index]`.
    ExtensionPolicy { index: usize },
}

/// One loopguard configuration and where it came from.
#[derive(Debug, Clone)]
pub struct Found<'a> {
    pub doc: &'a Document,
    pub origin: Origin,
    /// Where in the document, for messages (`filter "loopguard"`).
    pub place: String,
    /// The bytes the filter receives as its configuration, or why they
    /// cannot be known.
    pub bytes: Result<Vec<u8>, String>,
}

impl Found<'_> {
    /// `file (document): place` for messages.
    pub fn location(&self) -> String {
        location(self.doc, &self.place)
    }
}

/// `file (document) place`: where a configuration is, for messages.
pub fn location(doc: &Document, place: &str) -> String {
    let mut s = doc.file.clone();
    let what = doc.describe();
    if !what.is_empty() {
        s.push_str(&format!(" ({what})"));
    }
    if !place.is_empty() {
        s.push_str(&format!(" {place}"));
    }
    s
}

/// Every loopguard configuration in `docs`.
pub fn find(docs: &[Document]) -> Vec<Found<'_>> {
    let mut out = Vec::new();
    for doc in docs {
        match doc.kind() {
            Some("WasmPlugin") if is_api(doc, "extensions.istio.io") => {
                if let Some(f) = wasm_plugin(doc) {
                    out.push(f);
                }
            }
            Some("EnvoyExtensionPolicy") if is_api(doc, "gateway.envoyproxy.io") => {
                out.extend(extension_policy(doc));
            }
            _ if doc.value.get("policies").is_some() => out.push(Found {
                doc,
                origin: Origin::Plain,
                place: String::new(),
                bytes: serde_json::to_vec(&doc.value).map_err(|e| e.to_string()),
            }),
            _ => out.extend(wasm_filters(doc)),
        }
    }
    out
}

/// Whether the document's `apiVersion` is of `group`.
pub fn is_api(doc: &Document, group: &str) -> bool {
    doc.value
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| v.starts_with(group))
}

/// An Istio WasmPlugin that loads loopguard: `pluginName: loopguard`, a
/// URL naming it, or a `pluginConfig` with policies. istiod passes
/// `pluginConfig` through a protobuf Struct: every number is a double.
fn wasm_plugin(doc: &Document) -> Option<Found<'_>> {
    let spec = doc.value.get("spec")?;
    let plugin_config = spec.get("pluginConfig");
    let named = spec.get("pluginName").and_then(Value::as_str) == Some("loopguard")
        || spec
            .get("url")
            .and_then(Value::as_str)
            .is_some_and(|u| u.contains("loopguard"));
    if !named && plugin_config.and_then(|c| c.get("policies")).is_none() {
        return None;
    }
    let bytes = match plugin_config {
        None => Err("spec.pluginConfig is missing: loopguard needs a configuration".to_string()),
        Some(c) => serde_json::to_vec(&as_struct(c)).map_err(|e| e.to_string()),
    };
    Some(Found {
        doc,
        origin: Origin::WasmPlugin,
        place: "spec.pluginConfig".to_string(),
        bytes,
    })
}

/// The loopguard entries of an EnvoyExtensionPolicy: `rootID: loopguard`,
/// a code URL naming it, or a `config` with policies. `config` reaches the
/// filter as the JSON it is.
fn extension_policy(doc: &Document) -> Vec<Found<'_>> {
    let Some(list) = doc.value.pointer("/spec/wasm").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .enumerate()
        .filter(|(_, w)| {
            w.get("rootID").and_then(Value::as_str) == Some("loopguard")
                || ["/code/http/url", "/code/image/url"].iter().any(|p| {
                    w.pointer(p)
                        .and_then(Value::as_str)
                        .is_some_and(|u| u.contains("loopguard"))
                })
                || w.get("config").and_then(|c| c.get("policies")).is_some()
        })
        .map(|(i, w)| Found {
            doc,
            origin: Origin::ExtensionPolicy { index: i },
            place: format!("spec.wasm[{i}].config"),
            bytes: match w.get("config") {
                None => Err(format!(
                    "spec.wasm[{i}].config is missing: loopguard needs a configuration"
                )),
                Some(c) => serde_json::to_vec(c).map_err(|e| e.to_string()),
            },
        })
        .collect()
}

/// Every object of type `type_url` anywhere in Envoy configuration
/// (bootstrap, listener, ECDS resource, EnvoyFilter patch), depth first,
/// with the nearest enclosing `name` (the HTTP filter's).
pub fn typed_filters<'v>(v: &'v Value, type_url: &str) -> Vec<(String, &'v Value)> {
    fn walk<'v>(
        v: &'v Value,
        type_url: &str,
        names: &mut Vec<String>,
        out: &mut Vec<(String, &'v Value)>,
    ) {
        match v {
            Value::Object(o) => {
                if o.get("@type").and_then(Value::as_str) == Some(type_url) {
                    out.push((names.last().cloned().unwrap_or_default(), v));
                    return;
                }
                let pushed = match o.get("name").and_then(Value::as_str) {
                    Some(n) => {
                        names.push(n.to_string());
                        true
                    }
                    None => false,
                };
                for value in o.values() {
                    walk(value, type_url, names, out);
                }
                if pushed {
                    names.pop();
                }
            }
            Value::Array(a) => {
                for value in a {
                    walk(value, type_url, names, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, type_url, &mut Vec::new(), &mut out);
    out
}

/// Wasm filters that run loopguard in Envoy configuration.
fn wasm_filters(doc: &Document) -> Vec<Found<'_>> {
    typed_filters(&doc.value, WASM_FILTER_TYPE)
        .into_iter()
        .filter_map(|(filter, typed)| {
            let plugin = typed.get("config").filter(|p| is_loopguard_plugin(p))?;
            Some(Found {
                doc,
                origin: Origin::Envoy {
                    filter: filter.clone(),
                    plugin: plugin.clone(),
                },
                place: format!("filter \"{filter}\""),
                bytes: configuration_bytes(plugin),
            })
        })
        .collect()
}

/// A Wasm `PluginConfig` that runs loopguard.
pub fn is_loopguard_plugin(plugin: &Value) -> bool {
    if plugin.get("root_id").and_then(Value::as_str) == Some("loopguard") {
        return true;
    }
    let code = plugin.pointer("/vm_config/code");
    let names_it = ["/local/filename", "/remote/http_uri/uri"].iter().any(|p| {
        code.and_then(|c| c.pointer(p))
            .and_then(Value::as_str)
            .is_some_and(|s| s.contains("loopguard"))
    });
    names_it || holds_policies(configuration_bytes(plugin))
}

/// Whether a filter's configuration bytes are a JSON object with policies.
pub fn holds_policies(bytes: Result<Vec<u8>, String>) -> bool {
    bytes
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|v| v.get("policies").is_some())
}

/// The bytes Envoy hands the plugin: the `configuration` StringValue.
pub fn configuration_bytes(plugin: &Value) -> Result<Vec<u8>, String> {
    let Some(c) = plugin.get("configuration") else {
        return Err("the Wasm filter has no configuration".to_string());
    };
    match c.get("@type").and_then(Value::as_str) {
        Some(STRING_VALUE_TYPE) => Ok(c
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .as_bytes()
            .to_vec()),
        other => Err(format!(
            "configuration must be a google.protobuf.StringValue holding the JSON (got {})",
            other.unwrap_or("no @type")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::documents::parse;

    #[test]
    fn finds_every_shape() {
        let policy = r#"{"policies": [{"id": "p", "spec": {"selector": {}}}]}"#;
        let docs = parse("p.json", policy).unwrap();
        let f = find(&docs);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].origin, Origin::Plain);

        let bootstrap = format!(
            r#"
static_resources:
  listeners:
  - name: main
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM_TYPE}
          http_filters:
          - name: guard
            typed_config:
              "@type": {WASM_FILTER_TYPE}
              config:
                root_id: loopguard
                configuration:
                  "@type": {STRING_VALUE_TYPE}
                  value: '{policy}'
          - name: other-wasm
            typed_config:
              "@type": {WASM_FILTER_TYPE}
              config: {{root_id: something, configuration: {{"@type": {STRING_VALUE_TYPE}, value: "{{}}"}}}}
"#
        );
        let docs = parse("envoy.yaml", &bootstrap).unwrap();
        let f = find(&docs);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].place, "filter \"guard\"");
        assert_eq!(f[0].bytes.as_ref().unwrap(), policy.as_bytes());

        let k8s = r#"
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: lg, namespace: gw}
spec:
  pluginName: loopguard
  pluginConfig: {max_body_bytes: 1024, policies: []}
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyExtensionPolicy
metadata: {name: eep}
spec:
  wasm:
  - name: other
    code: {type: HTTP, http: {url: "https://x/other.wasm"}}
  - name: lg
    rootID: loopguard
    code: {type: Image, image: {url: "oci://r/loopguard:0.1.0"}}
    config: {max_body_bytes: 1024, policies: []}
"#;
        let docs = parse("k8s.yaml", k8s).unwrap();
        let f = find(&docs);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].origin, Origin::WasmPlugin);
        // Through a Struct: numbers as doubles.
        assert_eq!(
            f[0].bytes.as_ref().unwrap(),
            br#"{"max_body_bytes":1024.0,"policies":[]}"#
        );
        assert_eq!(f[1].origin, Origin::ExtensionPolicy { index: 1 });
        assert_eq!(
            f[1].bytes.as_ref().unwrap(),
            br#"{"max_body_bytes":1024,"policies":[]}"#
        );
        assert_eq!(
            f[1].location(),
            "k8s.yaml (EnvoyExtensionPolicy default/eep) spec.wasm[1].config"
        );
    }

    #[test]
    fn a_configuration_that_is_not_a_string_value_is_reported() {
        let plugin = serde_json::json!({"root_id": "loopguard", "configuration": {"@type": "type.googleapis.com/google.protobuf.Struct"}});
        assert!(configuration_bytes(&plugin)
            .unwrap_err()
            .contains("must be a google.protobuf.StringValue"));
        assert!(is_loopguard_plugin(&plugin));
    }
}
