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
//! The limits ([`crate::request_limits`]) are gRPC's too.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::parameter::{Parameter, Parameters};
use crate::shared_memory;

pub use crate::request_limits::{MAX_DIMS, MAX_PARAMETERS, MAX_TENSORS};

// Names and datatypes are borrowed from the body: only a name the request
// keeps (an input's, an output's) becomes a `String`, once.
#[derive(Deserialize)]
pub struct RequestJson<'a> {
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default)]
    pub parameters: JsonParameters,
    #[serde(borrow)]
    pub inputs: Bounded<InputJson<'a>, MAX_TENSORS>,
    #[serde(default, borrow)]
    pub outputs: Option<Bounded<OutputJson<'a>, MAX_TENSORS>>,
}

#[derive(Deserialize)]
pub struct InputJson<'a> {
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    pub shape: Bounded<i64, MAX_DIMS>,
    #[serde(borrow)]
    pub datatype: Cow<'a, str>,
    #[serde(default)]
    pub parameters: TensorParameters,
    /// The raw JSON text of `data`, decoded once the shape is known to fit.
    #[serde(default, borrow)]
    pub data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub struct OutputJson<'a> {
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    #[serde(default)]
    pub parameters: TensorParameters,
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
        let mut out = Parameters::new();
        deserializer.deserialize_any(ParametersVisitor(|key: Cow<'de, str>, value| {
            if out.len() == MAX_PARAMETERS && !out.contains_key(key.as_ref()) {
                return Err(too_many());
            }
            out.insert(key.into_owned(), value);
            Ok(())
        }))?;
        Ok(JsonParameters(out))
    }
}

/// A tensor's `parameters`, as the infer endpoint reads them: its own keys
/// typed, shared memory's in a map (made only when they are there), and
/// any other key checked like the rest and then dropped, so that the usual
/// `{"binary_data_size": n}` costs no allocation.
#[derive(Default)]
pub struct TensorParameters {
    pub binary_data_size: Option<Parameter>,
    pub binary_data: Option<Parameter>,
    pub classification: Option<Parameter>,
    /// The `shared_memory_*` keys, for [`shared_memory::TensorRegion::from_parameters`].
    pub shared_memory: Parameters,
}

impl<'de> Deserialize<'de> for TensorParameters {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut out = TensorParameters::default();
        // Keys seen that are not kept, so that each counts once.
        let mut others: Vec<Cow<'de, str>> = Vec::new();
        deserializer.deserialize_any(ParametersVisitor(|key: Cow<'de, str>, value| {
            let known = [&out.binary_data_size, &out.binary_data, &out.classification];
            let count = known.iter().filter(|p| p.is_some()).count() + out.shared_memory.len() + others.len();
            let slot = match key.as_ref() {
                "binary_data_size" => Some(&mut out.binary_data_size),
                "binary_data" => Some(&mut out.binary_data),
                "classification" => Some(&mut out.classification),
                _ => None,
            };
            match slot {
                Some(slot) => {
                    if slot.is_none() && count == MAX_PARAMETERS {
                        return Err(too_many());
                    }
                    *slot = Some(value);
                }
                None if key.starts_with(shared_memory::PREFIX) => {
                    if count == MAX_PARAMETERS && !out.shared_memory.contains_key(key.as_ref()) {
                        return Err(too_many());
                    }
                    out.shared_memory.insert(key.into_owned(), value);
                }
                None if others.contains(&key) => {}
                None if count == MAX_PARAMETERS => return Err(too_many()),
                None => others.push(key),
            }
            Ok(())
        }))?;
        Ok(out)
    }
}

fn too_many() -> String {
    format!("more than {MAX_PARAMETERS} parameters in one object")
}

/// Visits a `parameters` object (or `null`): each key, borrowed when it
/// has no escapes, with its scalar value, to `put`, whose error is the
/// parse's.
struct ParametersVisitor<F>(F);

impl<'de, F> Visitor<'de> for ParametersVisitor<F>
where
    F: FnMut(Cow<'de, str>, Parameter) -> Result<(), String>,
{
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an object of at most {MAX_PARAMETERS} parameters")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let value = map.next_value_seed(ScalarSeed(&key))?;
            (self.0)(key, value).map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

/// An object key, borrowed from the text unless it has escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a parameter name")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }

        deserializer.deserialize_str(KeyVisitor)
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
    fn keeps_a_tensors_own_parameters_and_checks_the_rest() {
        let text = r#"{"inputs":[{"name":"X","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":8,"shared_memory_offset":4,"other":"x"}}],
            "outputs":[{"name":"Y","parameters":{"binary_data":true,"classification":3}}]}"#;
        let r = parse(text).unwrap();
        let input = &r.inputs.0[0].parameters;
        assert_eq!(input.binary_data_size, Some(Parameter::Int(8)));
        assert_eq!(
            input.shared_memory.get("shared_memory_offset"),
            Some(&Parameter::Int(4))
        );
        let output = &r.outputs.unwrap().0[0].parameters;
        assert_eq!(output.binary_data, Some(Parameter::Bool(true)));
        assert_eq!(output.classification, Some(Parameter::Int(3)));

        let tensor = |params: &str| {
            format!(r#"{{"inputs":[{{"name":"X","shape":[1],"datatype":"INT32","parameters":{{{params}}}}}]}}"#)
        };
        let many: Vec<String> = (0..=MAX_PARAMETERS).map(|i| format!(r#""k{i}":1"#)).collect();
        let e = parse(&tensor(&many.join(","))).err().unwrap();
        assert!(e.to_string().contains("more than 64 parameters"), "{e}");
        // A repeated key counts once, kept or not.
        let repeated = vec![r#""k":1,"binary_data_size":4"#; 100].join(",");
        assert!(parse(&tensor(&repeated)).is_ok());
        let e = parse(&tensor(r#""p":[1]"#)).err().unwrap();
        assert!(
            e.to_string()
                .contains("parameter 'p' to be a boolean, number or string"),
            "{e}"
        );
        // Escaped names are read as well as plain ones.
        let escaped = tensor(r#""binary\u005fdata_size":4"#);
        let r = parse(&escaped).unwrap();
        assert_eq!(r.inputs.0[0].parameters.binary_data_size, Some(Parameter::Int(4)));
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
