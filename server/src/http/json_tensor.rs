//! Tensor data as JSON arrays (the KServe v2 `data` field), both ways.
//!
//! Requests may nest the array by shape or send it flat; responses are flat
//! and row-major, as Triton writes them.

use bytes::Bytes;
use half::{bf16, f16};
use serde_json::Value;

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::tensor::{bytes_elements, push_bytes_element};

/// Encodes JSON `data` as raw tensor bytes, checking it has `expected` elements.
pub fn decode(name: &str, datatype: DataType, data: &Value, expected: usize) -> Result<Bytes> {
    if matches!(datatype, DataType::Fp16 | DataType::Bf16) {
        return Err(Error::invalid(format!(
            "receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )));
    }
    let mut values = Vec::with_capacity(expected);
    flatten(data, &mut values);
    if values.len() != expected {
        return Err(Error::invalid(format!(
            "unable to parse 'data' of input '{name}': it has {} elements but its shape needs {expected}",
            values.len()
        )));
    }
    let element = |v: &Value| -> Result<()> {
        Err(Error::invalid(format!(
            "unable to parse 'data' of input '{name}': {v} is not a valid {datatype} value"
        )))
    };
    let size = datatype.byte_size().unwrap_or(0);
    let mut out: Vec<u8> = Vec::with_capacity(expected * size.max(4));
    macro_rules! int {
        ($ty:ty) => {
            for v in values {
                let parsed = v
                    .as_i64()
                    .and_then(|i| <$ty>::try_from(i).ok())
                    .or_else(|| v.as_u64().and_then(|u| <$ty>::try_from(u).ok()));
                match parsed {
                    Some(x) => out.extend_from_slice(&x.to_le_bytes()),
                    None => element(v)?,
                }
            }
        };
    }
    match datatype {
        DataType::Bool => {
            for v in values {
                match v.as_bool() {
                    Some(b) => out.push(u8::from(b)),
                    None => element(v)?,
                }
            }
        }
        DataType::Uint8 => int!(u8),
        DataType::Uint16 => int!(u16),
        DataType::Uint32 => int!(u32),
        DataType::Uint64 => int!(u64),
        DataType::Int8 => int!(i8),
        DataType::Int16 => int!(i16),
        DataType::Int32 => int!(i32),
        DataType::Int64 => int!(i64),
        DataType::Fp32 => {
            for v in values {
                match v.as_f64() {
                    Some(x) => out.extend_from_slice(&(x as f32).to_le_bytes()),
                    None => element(v)?,
                }
            }
        }
        DataType::Fp64 => {
            for v in values {
                match v.as_f64() {
                    Some(x) => out.extend_from_slice(&x.to_le_bytes()),
                    None => element(v)?,
                }
            }
        }
        DataType::Bytes => {
            for v in values {
                match v.as_str() {
                    Some(s) => push_bytes_element(&mut out, s.as_bytes())?,
                    None => element(v)?,
                }
            }
        }
        DataType::Fp16 | DataType::Bf16 => unreachable!("rejected above"),
    }
    Ok(Bytes::from(out))
}

fn flatten<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| flatten(v, out)),
        other => out.push(other),
    }
}

/// Raw tensor bytes as a flat JSON array.
pub fn encode(datatype: DataType, data: &[u8]) -> Value {
    macro_rules! nums {
        ($ty:ty, $conv:expr) => {
            Value::Array(
                data.chunks_exact(size_of::<$ty>())
                    .map(|c| {
                        $conv(<$ty>::from_le_bytes(
                            c.try_into().expect("chunk has the element size"),
                        ))
                    })
                    .collect(),
            )
        };
    }
    let float = |x: f64| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
    match datatype {
        DataType::Bool => Value::Array(data.iter().map(|b| Value::Bool(*b != 0)).collect()),
        DataType::Uint8 => nums!(u8, Value::from),
        DataType::Uint16 => nums!(u16, Value::from),
        DataType::Uint32 => nums!(u32, Value::from),
        DataType::Uint64 => nums!(u64, Value::from),
        DataType::Int8 => nums!(i8, Value::from),
        DataType::Int16 => nums!(i16, Value::from),
        DataType::Int32 => nums!(i32, Value::from),
        DataType::Int64 => nums!(i64, Value::from),
        // Triton refuses half floats in JSON; returning them widened is more useful.
        DataType::Fp16 => nums!(f16, |x: f16| float(f64::from(x))),
        DataType::Bf16 => nums!(bf16, |x: bf16| float(f64::from(x))),
        DataType::Fp32 => nums!(f32, |x: f32| float(f64::from(x))),
        DataType::Fp64 => nums!(f64, float),
        DataType::Bytes => Value::Array(
            bytes_elements(data)
                .map(|e| Value::String(String::from_utf8_lossy(e.unwrap_or_default()).into_owned()))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_and_flat_arrays_decode_alike() {
        let flat = decode("X", DataType::Int32, &json!([1, 2, 3, 4]), 4).unwrap();
        let nested = decode("X", DataType::Int32, &json!([[1, 2], [3, 4]]), 4).unwrap();
        assert_eq!(flat, nested);
        assert_eq!(encode(DataType::Int32, &flat), json!([1, 2, 3, 4]));
    }

    #[test]
    fn every_datatype_round_trips() {
        let cases = [
            (DataType::Bool, json!([true, false])),
            (DataType::Uint8, json!([0, 255])),
            (DataType::Uint16, json!([0, 65535])),
            (DataType::Uint32, json!([0, 4294967295u64])),
            (DataType::Uint64, json!([0, u64::MAX])),
            (DataType::Int8, json!([-128, 127])),
            (DataType::Int16, json!([-32768, 32767])),
            (DataType::Int64, json!([i64::MIN, i64::MAX])),
            (DataType::Fp32, json!([1.5, -2.25])),
            (DataType::Fp64, json!([1e300, -2.5])),
            (DataType::Bytes, json!(["", "h\u{e9}llo"])),
        ];
        for (datatype, value) in cases {
            let raw = decode("X", datatype, &value, 2).unwrap();
            assert_eq!(encode(datatype, &raw), value, "{datatype}");
        }
    }

    #[test]
    fn rejects_wrong_counts_types_and_half_floats() {
        let e = decode("X", DataType::Int32, &json!([1, 2, 3]), 4).unwrap_err();
        assert!(e.message().contains("'X'"), "{e}");
        let e = decode("X", DataType::Int8, &json!([300]), 1).unwrap_err();
        assert!(e.message().contains("INT8"), "{e}");
        let e = decode("X", DataType::Bool, &json!(["yes"]), 1).unwrap_err();
        assert!(e.message().contains("'X'"), "{e}");
        let e = decode("H", DataType::Fp16, &json!([1.0]), 1).unwrap_err();
        assert!(
            e.message().contains("receiving FP16 data via JSON is not supported"),
            "{e}"
        );
    }
}
