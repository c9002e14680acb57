//! An input tensor as it goes on the wire, and its JSON form.
//!
//! The raw little-endian bytes are built once and shared (`Bytes`) by every
//! request of a run. The JSON element list is derived from those bytes only
//! for `--http-json`, so both encodings always carry the same values.

use bytes::{BufMut, Bytes, BytesMut};
use half::{bf16, f16};
use serde_json::Value;

use crate::datatype::DataType;
use crate::error::{Error, Result};

/// One request input: signature and raw (Triton binary / gRPC raw) bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct InputTensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub raw: Bytes,
}

/// Elements in a tensor of `shape` (1 for a scalar).
pub fn element_count(shape: &[i64]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| acc.checked_mul(d))
            .ok_or_else(|| Error::Invalid(format!("invalid shape {shape:?}")))
    })
}

/// Appends one `BYTES` element: 4-byte little-endian length, then the bytes.
pub fn put_bytes_element(out: &mut BytesMut, element: &[u8]) {
    out.put_u32_le(element.len() as u32);
    out.put_slice(element);
}

/// Splits raw `BYTES` contents into elements.
pub fn bytes_elements(raw: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| Error::Invalid("truncated BYTES element length".into()))?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(Error::Invalid("truncated BYTES element".into()));
        }
        let (element, tail) = tail.split_at(len);
        out.push(element);
        rest = tail;
    }
    Ok(out)
}

fn flatten<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| flatten(v, out)),
        other => out.push(other),
    }
}

impl InputTensor {
    /// Builds the raw bytes from JSON elements (flat or nested, row-major).
    pub fn from_json(name: &str, datatype: DataType, shape: Vec<i64>, data: &Value) -> Result<Self> {
        let mut values = Vec::new();
        flatten(data, &mut values);
        let expected = element_count(&shape)?;
        if values.len() != expected {
            return Err(Error::Invalid(format!(
                "input '{name}': {} elements for shape {shape:?} (expected {expected})",
                values.len()
            )));
        }
        let bad = |v: &Value| Error::Invalid(format!("input '{name}': {v} is not a valid {datatype}"));
        let mut raw = BytesMut::with_capacity(expected * datatype.byte_size().unwrap_or(8));
        for v in values {
            let int = || v.as_i64().ok_or_else(|| bad(v));
            let uint = || v.as_u64().ok_or_else(|| bad(v));
            let float = || v.as_f64().ok_or_else(|| bad(v));
            match datatype {
                DataType::Bool => raw.put_u8(match v {
                    Value::Bool(b) => u8::from(*b),
                    _ => u8::from(uint()? != 0),
                }),
                DataType::Uint8 => raw.put_u8(u8::try_from(uint()?).map_err(|_| bad(v))?),
                DataType::Uint16 => raw.put_u16_le(u16::try_from(uint()?).map_err(|_| bad(v))?),
                DataType::Uint32 => raw.put_u32_le(u32::try_from(uint()?).map_err(|_| bad(v))?),
                DataType::Uint64 => raw.put_u64_le(uint()?),
                DataType::Int8 => raw.put_i8(i8::try_from(int()?).map_err(|_| bad(v))?),
                DataType::Int16 => raw.put_i16_le(i16::try_from(int()?).map_err(|_| bad(v))?),
                DataType::Int32 => raw.put_i32_le(i32::try_from(int()?).map_err(|_| bad(v))?),
                DataType::Int64 => raw.put_i64_le(int()?),
                DataType::Fp16 => raw.put_slice(&f16::from_f64(float()?).to_le_bytes()),
                DataType::Bf16 => raw.put_slice(&bf16::from_f64(float()?).to_le_bytes()),
                DataType::Fp32 => raw.put_f32_le(float()? as f32),
                DataType::Fp64 => raw.put_f64_le(float()?),
                DataType::Bytes => match v {
                    Value::String(s) => put_bytes_element(&mut raw, s.as_bytes()),
                    other => put_bytes_element(&mut raw, other.to_string().as_bytes()),
                },
            }
        }
        Ok(InputTensor {
            name: name.to_string(),
            datatype,
            shape,
            raw: raw.freeze(),
        })
    }

    /// The elements as a flat JSON list, for KServe's JSON `data` field.
    pub fn to_json(&self) -> Result<Value> {
        let raw = &self.raw[..];
        let size = self.datatype.byte_size().unwrap_or(1);
        let chunks = raw.chunks_exact(size);
        let float = |f: f64| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number);
        let values: Vec<Value> = match self.datatype {
            DataType::Bool => raw.iter().map(|&b| Value::Bool(b != 0)).collect(),
            DataType::Uint8 => raw.iter().map(|&b| Value::from(b)).collect(),
            DataType::Int8 => raw.iter().map(|&b| Value::from(b as i8)).collect(),
            DataType::Uint16 => chunks.map(|c| Value::from(u16::from_le_bytes([c[0], c[1]]))).collect(),
            DataType::Int16 => chunks.map(|c| Value::from(i16::from_le_bytes([c[0], c[1]]))).collect(),
            DataType::Uint32 => chunks
                .map(|c| Value::from(u32::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            DataType::Int32 => chunks
                .map(|c| Value::from(i32::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            DataType::Uint64 => chunks
                .map(|c| Value::from(u64::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            DataType::Int64 => chunks
                .map(|c| Value::from(i64::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            DataType::Fp16 => chunks
                .map(|c| float(f16::from_le_bytes([c[0], c[1]]).to_f64()))
                .collect(),
            DataType::Bf16 => chunks
                .map(|c| float(bf16::from_le_bytes([c[0], c[1]]).to_f64()))
                .collect(),
            DataType::Fp32 => chunks
                .map(|c| float(f64::from(f32::from_le_bytes(c.try_into().unwrap()))))
                .collect(),
            DataType::Fp64 => chunks
                .map(|c| float(f64::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            DataType::Bytes => bytes_elements(raw)?
                .into_iter()
                .map(|e| Value::String(String::from_utf8_lossy(e).into_owned()))
                .collect(),
        };
        Ok(Value::Array(values))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_round_trip_for_each_datatype() {
        let cases = [
            (DataType::Fp32, json!([[1.5, -2.0], [0.25, 8.0]])),
            (DataType::Fp16, json!([1.5, -2.0, 0.25, 8.0])),
            (DataType::Int32, json!([1, -2, 3, 2147483647])),
            (DataType::Int64, json!([1, -2, 3, 9007199254740993_i64])),
            (DataType::Uint8, json!([0, 1, 128, 255])),
            (DataType::Bool, json!([true, false, false, true])),
            (DataType::Bytes, json!(["a", "", "héllo", "xyz"])),
        ];
        for (dt, data) in cases {
            let t = InputTensor::from_json("X", dt, vec![2, 2], &data).unwrap();
            let mut flat = Vec::new();
            flatten(&data, &mut flat);
            assert_eq!(
                t.to_json().unwrap(),
                Value::Array(flat.into_iter().cloned().collect()),
                "{dt}"
            );
        }
    }

    #[test]
    fn raw_layout() {
        let t = InputTensor::from_json("X", DataType::Fp32, vec![2], &json!([1.0, 2.0])).unwrap();
        assert_eq!(&t.raw[..], &[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
        let s = InputTensor::from_json("S", DataType::Bytes, vec![1], &json!(["ab"])).unwrap();
        assert_eq!(&s.raw[..], &[2, 0, 0, 0, b'a', b'b']);
    }

    #[test]
    fn rejects_wrong_counts_and_ranges() {
        assert!(InputTensor::from_json("X", DataType::Fp32, vec![3], &json!([1.0])).is_err());
        assert!(InputTensor::from_json("X", DataType::Uint8, vec![1], &json!([256])).is_err());
        assert!(InputTensor::from_json("X", DataType::Int32, vec![1], &json!(["a"])).is_err());
        assert!(element_count(&[-1, 2]).is_err());
        assert_eq!(element_count(&[]).unwrap(), 1);
    }

    #[test]
    fn bytes_elements_detects_truncation() {
        assert_eq!(bytes_elements(&[1, 0, 0, 0, 7]).unwrap(), vec![&[7u8][..]]);
        assert!(bytes_elements(&[5, 0, 0, 0, 7]).is_err());
        assert!(bytes_elements(&[1, 0]).is_err());
    }
}
