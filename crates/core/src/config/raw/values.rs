//! How single values are read: [`Obj`] (an object and only an object),
//! [`Int`] (a whole number as written) and [`Fraction`] (any number), each
//! keeping what it cannot read so validation can name it (see [`super`]).

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::marker::PhantomData;

#[cfg(feature = "schema")]
use schemars::JsonSchema;

/// An object, and only an object: serde's derive would also read a
/// struct from a list of its fields in order, which a configuration never
/// means.
#[derive(Debug)]
pub struct Obj<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(V(PhantomData)).map(Obj)
    }
}

#[cfg(feature = "schema")]
impl<T: JsonSchema> JsonSchema for Obj<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(g)
    }
    fn inline_schema() -> bool {
        T::inline_schema()
    }
}

/// A number meant as a whole number, as written. Any JSON value is read,
/// so the validation step can report a wrong one with the field's range:
/// control planes that carry the configuration in a protobuf `Struct`
/// (Istio's `pluginConfig`) pass every number through a double, so an
/// integral `5.0` is a whole number too.
#[derive(Debug, Clone, PartialEq)]
pub enum Int {
    Whole(u64),
    /// Integral but negative, or beyond 2^64.
    OutOfRange(String),
    Fraction(String),
    /// Not a number: the value as JSON.
    NotNumber(String),
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let shown = v.to_string();
        // A JSON integer is a u64 when not negative, else an i64; any other
        // number is an f64.
        Ok(match (v.as_u64(), v.as_f64()) {
            (Some(n), _) => Int::Whole(n),
            (None, Some(f)) if f < 0.0 => Int::NotNumber(shown),
            (None, Some(f)) if f.fract() != 0.0 || !f.is_finite() => Int::Fraction(shown),
            (None, Some(f)) if f >= 18_446_744_073_709_551_616.0 => Int::OutOfRange(shown),
            (None, Some(f)) => Int::Whole(f as u64),
            (None, None) => Int::NotNumber(shown),
        })
    }
}

/// A number that may have a fraction (JSON numbers, integral or not);
/// what is not a number is kept as JSON so validation can show it.
#[derive(Debug, Clone, PartialEq)]
pub enum Fraction {
    Number(f64),
    NotNumber(String),
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(match v.as_f64() {
            Some(f) if v.is_number() => Fraction::Number(f),
            _ => Fraction::NotNumber(v.to_string()),
        })
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for Fraction {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Fraction".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "number"})
    }
    fn inline_schema() -> bool {
        true
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for Int {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "WholeNumber".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // JSON Schema's integer is any number without a fractional part, so
        // 5.0 validates as it loads.
        schemars::json_schema!({"type": "integer"})
    }
    fn inline_schema() -> bool {
        true
    }
}
