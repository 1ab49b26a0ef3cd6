//! Reading the files operators hand the CLI: JSON, or YAML with one or
//! more documents (Kubernetes manifests, Envoy bootstraps, ECDS discovery
//! responses), each turned into a `serde_json::Value`.

use serde::Deserialize;
use serde_json::Value;
use std::fmt;
use std::path::Path;

/// One document of a file.
#[derive(Debug, Clone)]
pub struct Document {
    pub file: String,
    /// Position in a multi-document YAML file (0-based).
    pub index: usize,
    pub value: Value,
}

impl Document {
    /// `kind` of a Kubernetes object.
    pub fn kind(&self) -> Option<&str> {
        self.value.get("kind").and_then(Value::as_str)
    }

    /// `namespace/name` of a Kubernetes object (`default` when unset).
    pub fn object_name(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    pub fn namespace(&self) -> &str {
        self.value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
    }

    pub fn name(&self) -> &str {
        self.value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?")
    }

    /// How findings in this document name it.
    pub fn describe(&self) -> String {
        match self.kind() {
            Some(kind) if self.value.get("apiVersion").is_some() => {
                format!("{kind} {}", self.object_name())
            }
            _ if self.index > 0 => format!("document {}", self.index + 1),
            _ => String::new(),
        }
    }
}

/// A file that could not be read or parsed.
#[derive(Debug)]
pub struct ReadError {
    pub file: String,
    pub message: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

/// Read every document of a file. JSON files keep their numbers exactly;
/// YAML files may hold several documents (`---`); empty ones are skipped.
pub fn read(path: &Path) -> Result<Vec<Document>, ReadError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ReadError {
        file: file.clone(),
        message: format!("cannot read: {e}"),
    })?;
    parse(&file, &text)
}

/// Parse text as JSON, else as (multi-document) YAML.
pub fn parse(file: &str, text: &str) -> Result<Vec<Document>, ReadError> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(vec![Document {
            file: file.to_string(),
            index: 0,
            value,
        }]);
    }
    let mut docs = Vec::new();
    for (index, de) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).map_err(|e| ReadError {
            file: file.to_string(),
            message: format!("not valid JSON or YAML: {e}"),
        })?;
        if !value.is_null() {
            docs.push(Document {
                file: file.to_string(),
                index,
                value,
            });
        }
    }
    if docs.is_empty() {
        return Err(ReadError {
            file: file.to_string(),
            message: "holds no document".to_string(),
        });
    }
    Ok(docs)
}

/// A value as a protobuf `Struct` carries it (Istio's `pluginConfig`):
/// every number becomes a double.
pub fn as_struct(v: &Value) -> Value {
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Value::Array(a) => Value::Array(a.iter().map(as_struct).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), as_struct(v))).collect())
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_yaml_and_multi_document_yaml() {
        let d = parse("a.json", r#"{"policies": [], "n": 5}"#).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].value["n"], 5);
        let y = parse(
            "b.yaml",
            "apiVersion: v1\nkind: A\nmetadata: {name: x, namespace: ns}\n---\n---\nkind: B\nn: 5.0\n",
        )
        .unwrap();
        assert_eq!(y.len(), 2);
        assert_eq!(y[0].describe(), "A ns/x");
        assert_eq!(y[1].index, 2);
        assert_eq!(y[1].describe(), "document 3");
        assert!(y[1].value["n"].is_f64());
        assert!(parse("c.yaml", "a: [")
            .unwrap_err()
            .message
            .starts_with("not valid JSON or YAML"));
        assert!(parse("d.yaml", "").is_err());
    }

    #[test]
    fn struct_numbers_are_doubles() {
        let v = as_struct(&serde_json::json!({"a": [1, {"b": 2}], "c": "3"}));
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"a":[1.0,{"b":2.0}],"c":"3"}"#
        );
    }
}
