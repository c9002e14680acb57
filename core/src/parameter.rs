//! KServe v2 request and response parameters: a map of small typed values.

use std::collections::BTreeMap;

/// One parameter value, as both protocols can carry it.
#[derive(Debug, Clone, PartialEq)]
pub enum Parameter {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(String),
}

impl Parameter {
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Parameter::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value as an integer, accepting any integral representation.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Parameter::Int(v) => Some(*v),
            Parameter::Uint(v) => i64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Parameter::String(s) => Some(s),
            _ => None,
        }
    }
}

pub type Parameters = BTreeMap<String, Parameter>;

/// As the JSON value it is (KServe v2's `parameters` objects).
impl serde::Serialize for Parameter {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Parameter::Bool(b) => serializer.serialize_bool(*b),
            Parameter::Int(i) => serializer.serialize_i64(*i),
            Parameter::Uint(u) => serializer.serialize_u64(*u),
            Parameter::Double(d) => serializer.serialize_f64(*d),
            Parameter::String(s) => serializer.serialize_str(s),
        }
    }
}
