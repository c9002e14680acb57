//! The JSON header of an HTTP infer request, parsed with bounds.
//!
//! Every structure a client can make the server allocate is bounded here,
//! not only by the body size: a JSON text of a few bytes per item can make a
//! generic parser allocate tens of bytes per item (a value tree, map nodes),
//! so 128 MiB of `{"p":[0,0,0,...]}` would cost gigabytes. So:
//!
//! - tensor `data` is kept as the raw JSON text ([`RawValue`], a slice of the
//!   body) and decoded later, straight into its typed buffer
//!   ([`super::json_tensor`]);
//! - `parameters` accept scalars only and at most [`MAX_PARAMETERS`] keys;
//! - shapes have at most [`MAX_DIMS`] dimensions, and a request at most
//!   [`MAX_TENSORS`] inputs and outputs.
//!
//! The limits are far above what any model uses (ONNX Runtime models rarely
//! exceed rank 8; KServe requests carry a handful of parameters).

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::parameter::{Parameter, Parameters};

/// The most dimensions a tensor shape may have.
pub const MAX_DIMS: usize = 64;
/// The most keys one `parameters` object may have.
pub const MAX_PARAMETERS: usize = 64;
/// The most inputs, or outputs, one request may name.
pub const MAX_TENSORS: usize = 4096;

#[derive(Deserialize)]
pub struct RequestJson<'a> {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub parameters: JsonParameters,
    #[serde(borrow)]
    pub inputs: Bounded<InputJson<'a>, MAX_TENSORS>,
    #[serde(default)]
    pub outputs: Option<Bounded<OutputJson, MAX_TENSORS>>,
}

#[derive(Deserialize)]
pub struct InputJson<'a> {
    pub name: String,
    pub shape: Bounded<i64, MAX_DIMS>,
    pub datatype: String,
    #[serde(default)]
    pub parameters: JsonParameters,
    /// The raw JSON text of `data`, decoded once the shape is known to fit.
    #[serde(default, borrow)]
    pub data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub struct OutputJson {
    pub name: String,
    #[serde(default)]
    pub parameters: JsonParameters,
}

/// A JSON array of at most `N` items.
pub struct Bounded<T, const N: usize>(pub Vec<T>);

impl<T, const N: usize> Default for Bounded<T, N> {
    fn default() -> Self {
        Bounded(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BoundedVisitor<T, const N: usize>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for BoundedVisitor<T, N> {
            type Value = Bounded<T, N>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an array of at most {N} items")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(N).min(16));
                while let Some(item) = seq.next_element()? {
                    if items.len() == N {
                        return Err(de::Error::custom(format!("more than {N} items in an array")));
                    }
                    items.push(item);
                }
                Ok(Bounded(items))
            }
        }

        deserializer.deserialize_seq(BoundedVisitor::<T, N>(PhantomData))
    }
}

/// A `parameters` object: scalar values only, at most [`MAX_PARAMETERS`] keys.
#[derive(Default)]
pub struct JsonParameters(pub Parameters);

impl<'de> Deserialize<'de> for JsonParameters {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;

        impl<'de> Visitor<'de> for MapVisitor {
            type Value = JsonParameters;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an object of at most {MAX_PARAMETERS} parameters")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(JsonParameters::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Parameters::new();
                while let Some(key) = map.next_key::<String>()? {
                    if out.len() == MAX_PARAMETERS && !out.contains_key(&key) {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_PARAMETERS} parameters in one object"
                        )));
                    }
                    let value = map.next_value_seed(ScalarSeed(&key))?;
                    out.insert(key, value);
                }
                Ok(JsonParameters(out))
            }
        }

        deserializer.deserialize_any(MapVisitor)
    }
}

/// One parameter value; arrays and objects are refused without being parsed.
struct ScalarSeed<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for ScalarSeed<'_> {
    type Value = Parameter;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Parameter, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed<'_> {
    type Value = Parameter;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parameter '{}' to be a boolean, number or string", self.0)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Parameter, E> {
        Ok(Parameter::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Parameter, E> {
        Ok(Parameter::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Parameter, E> {
        Ok(i64::try_from(v).map_or(Parameter::Uint(v), Parameter::Int))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Parameter, E> {
        Ok(Parameter::Double(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Parameter, E> {
        Ok(Parameter::String(v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RequestJson<'_>, serde_json::Error> {
        serde_json::from_str(text)
    }

    #[test]
    fn keeps_data_raw_and_parameters_typed() {
        let text = r#"{"id":"r","parameters":{"a":1,"b":true,"c":"x","d":1.5,"e":18446744073709551615},
            "inputs":[{"name":"X","shape":[2],"datatype":"INT32","data":[[1],[2]]}],"outputs":[{"name":"Y"}]}"#;
        let r = parse(text).unwrap();
        assert_eq!(r.inputs.0[0].data.unwrap().get(), "[[1],[2]]");
        let p = &r.parameters.0;
        assert_eq!(p["a"], Parameter::Int(1));
        assert_eq!(p["b"], Parameter::Bool(true));
        assert_eq!(p["c"], Parameter::String("x".into()));
        assert_eq!(p["d"], Parameter::Double(1.5));
        assert_eq!(p["e"], Parameter::Uint(u64::MAX));
        assert_eq!(r.outputs.unwrap().0[0].name, "Y");
    }

    #[test]
    fn refuses_structures_past_their_bounds() {
        let dims = vec!["1"; MAX_DIMS + 1].join(",");
        let text = format!(r#"{{"inputs":[{{"name":"X","shape":[{dims}],"datatype":"INT32","data":[1]}}]}}"#);
        let e = parse(&text).err().unwrap();
        assert!(e.to_string().contains("more than 64 items"), "{e}");

        let params: Vec<String> = (0..=MAX_PARAMETERS).map(|i| format!(r#""k{i}":1"#)).collect();
        let text = format!(r#"{{"parameters":{{{}}},"inputs":[]}}"#, params.join(","));
        let e = parse(&text).err().unwrap();
        assert!(e.to_string().contains("more than 64 parameters"), "{e}");

        // A repeated key does not count twice.
        let text = format!(
            r#"{{"parameters":{{{}}},"inputs":[]}}"#,
            vec![r#""k":1"#; 100].join(",")
        );
        assert_eq!(parse(&text).unwrap().parameters.0.len(), 1);
    }

    #[test]
    fn parameter_values_must_be_scalars() {
        let e = parse(r#"{"parameters":{"p":[0,0,0]},"inputs":[]}"#).err().unwrap();
        assert!(
            e.to_string()
                .contains("parameter 'p' to be a boolean, number or string"),
            "{e}"
        );
        let e = parse(r#"{"parameters":{"p":{"q":1}},"inputs":[]}"#).err().unwrap();
        assert!(e.to_string().contains("parameter 'p'"), "{e}");
    }
}
