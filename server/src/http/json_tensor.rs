//! Tensor data as JSON arrays (the KServe v2 `data` field), both ways.
//!
//! Requests may nest the array by shape or send it flat; responses are flat
//! and row-major, as Triton writes them.
//!
//! Decoding never builds a JSON value tree: the `data` text is walked once
//! by a serde visitor that writes each element straight into the tensor's
//! raw little-endian buffer. The buffer is sized from the shape only after
//! the shape has been checked against the bytes actually received (every
//! element needs at least one character and a separator), and reserved in
//! the server's [`MemoryBudget`](crate::memory_budget::MemoryBudget) before
//! it is allocated, so a request claiming 10^15 elements costs nothing.
//! Encoding likewise serialises straight from the raw buffer.

use std::fmt;

use bytes::Bytes;
use half::{bf16, f16};
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeSeq, Serializer};
use serde_json::value::RawValue;

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::memory_budget::Reservation;
use crate::tensor::{bytes_elements, push_bytes_element};

/// The most elements a JSON text of `len` bytes can hold.
pub fn max_elements(len: usize) -> usize {
    // "[1,2]": n elements need at least 2n - 1 characters plus brackets; a
    // bare scalar needs one.
    len.div_ceil(2)
}

/// Decodes JSON `data` into raw tensor bytes, checking it has `expected`
/// elements. The buffer is reserved in `reservation` before it is allocated.
pub fn decode(
    name: &str,
    datatype: DataType,
    data: &RawValue,
    expected: usize,
    reservation: &mut Reservation,
) -> Result<Bytes> {
    if matches!(datatype, DataType::Fp16 | DataType::Bf16) {
        return Err(Error::invalid(format!(
            "receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )));
    }
    let text = data.get();
    if expected > max_elements(text.len()) {
        return Err(Error::invalid(format!(
            "unable to parse 'data' of input '{name}': its shape needs {expected} elements, more than {} bytes of JSON can hold",
            text.len()
        )));
    }
    // For BYTES, the strings' bytes plus a 4-byte length each; the text is
    // at least as long as the strings (escapes only make it longer).
    let capacity = match datatype.byte_size() {
        Some(size) => expected.saturating_mul(size),
        None => text.len().saturating_add(expected.saturating_mul(4)),
    };
    reservation.grow(capacity)?;
    let mut sink = Sink {
        datatype,
        out: Vec::with_capacity(capacity),
        count: 0,
        expected,
    };
    let mut deserializer = serde_json::Deserializer::from_str(text);
    Elements(&mut sink)
        .deserialize(&mut deserializer)
        .map_err(|e| Error::invalid(format!("unable to parse 'data' of input '{name}': {e}")))?;
    if sink.count != expected {
        return Err(Error::invalid(format!(
            "unable to parse 'data' of input '{name}': it has {} elements but its shape needs {expected}",
            sink.count
        )));
    }
    Ok(Bytes::from(sink.out))
}

/// How many scalars a JSON value holds: 1 for a scalar, every element of
/// a (possibly nested) array. Nothing is allocated.
pub fn count_elements(name: &str, data: &RawValue) -> Result<usize> {
    struct Count<'c>(&'c mut usize);

    impl<'de> DeserializeSeed<'de> for Count<'_> {
        type Value = ();

        fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<(), D::Error> {
            deserializer.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Count<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a value or an array of values")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
            while seq.next_element_seed(Count(&mut *self.0))?.is_some() {}
            Ok(())
        }

        fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<(), E> {
            *self.0 += 1;
            Ok(())
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<(), E> {
            *self.0 += 1;
            Ok(())
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<(), E> {
            *self.0 += 1;
            Ok(())
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<(), E> {
            *self.0 += 1;
            Ok(())
        }

        fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<(), E> {
            *self.0 += 1;
            Ok(())
        }
    }

    let mut count = 0;
    let mut deserializer = serde_json::Deserializer::from_str(data.get());
    Count(&mut count)
        .deserialize(&mut deserializer)
        .map_err(|e| Error::invalid(format!("unable to parse the value of input '{name}': {e}")))?;
    Ok(count)
}

/// Where decoded elements go, and how many there may be.
struct Sink {
    datatype: DataType,
    out: Vec<u8>,
    count: usize,
    expected: usize,
}

/// One JSON scalar, for error messages.
enum Scalar<'a> {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(&'a str),
}

impl fmt::Display for Scalar<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Uint(u) => write!(f, "{u}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl Sink {
    fn push(&mut self, value: Scalar<'_>) -> std::result::Result<(), String> {
        self.count += 1;
        if self.count > self.expected {
            return Err(format!("it has more elements than its shape needs ({})", self.expected));
        }
        let invalid = || format!("{value} is not a valid {} value", self.datatype);
        macro_rules! int {
            ($ty:ty) => {{
                let parsed = match value {
                    Scalar::Int(i) => <$ty>::try_from(i).ok(),
                    Scalar::Uint(u) => <$ty>::try_from(u).ok(),
                    _ => None,
                };
                let x = parsed.ok_or_else(invalid)?;
                self.out.extend_from_slice(&x.to_le_bytes());
            }};
        }
        let float = match value {
            Scalar::Int(i) => Some(i as f64),
            Scalar::Uint(u) => Some(u as f64),
            Scalar::Float(x) => Some(x),
            _ => None,
        };
        match self.datatype {
            DataType::Bool => match value {
                Scalar::Bool(b) => self.out.push(u8::from(b)),
                _ => return Err(invalid()),
            },
            DataType::Uint8 => int!(u8),
            DataType::Uint16 => int!(u16),
            DataType::Uint32 => int!(u32),
            DataType::Uint64 => int!(u64),
            DataType::Int8 => int!(i8),
            DataType::Int16 => int!(i16),
            DataType::Int32 => int!(i32),
            DataType::Int64 => int!(i64),
            DataType::Fp32 => {
                let x = float.ok_or_else(invalid)?;
                self.out.extend_from_slice(&(x as f32).to_le_bytes());
            }
            DataType::Fp64 => {
                let x = float.ok_or_else(invalid)?;
                self.out.extend_from_slice(&x.to_le_bytes());
            }
            DataType::Bytes => match value {
                Scalar::Str(s) => push_bytes_element(&mut self.out, s.as_bytes()).map_err(|e| e.to_string())?,
                _ => return Err(invalid()),
            },
            DataType::Fp16 | DataType::Bf16 => return Err(invalid()),
        }
        Ok(())
    }
}

/// Walks a (possibly nested) array, pushing every scalar into the sink.
struct Elements<'s>(&'s mut Sink);

impl<'de> DeserializeSeed<'de> for Elements<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Elements<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of values")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let sink = self.0;
        while seq.next_element_seed(Elements(&mut *sink))?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<(), E> {
        self.0.push(Scalar::Bool(v)).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<(), E> {
        self.0.push(Scalar::Int(v)).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<(), E> {
        self.0.push(Scalar::Uint(v)).map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<(), E> {
        self.0.push(Scalar::Float(v)).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<(), E> {
        self.0.push(Scalar::Str(v)).map_err(E::custom)
    }
}

/// The longest JSON text [`Data`] writes for `bytes` bytes of `datatype`:
/// what an answer's encoding is reserved for before it is written. JSON
/// widens a tensor: a float becomes up to 24 characters (widened to f64, as
/// Triton writes it), so half floats grow 12.5 times; a control byte of a
/// BYTES element becomes `\u0001`, six.
pub fn max_json_len(datatype: DataType, bytes: usize) -> usize {
    // (the bytes of one element, its longest text with its comma)
    let (size, text) = match datatype {
        DataType::Bool => (1, 6),
        DataType::Uint8 => (1, 4),
        DataType::Int8 => (1, 5),
        DataType::Uint16 => (2, 6),
        DataType::Int16 => (2, 7),
        DataType::Uint32 => (4, 11),
        DataType::Int32 => (4, 12),
        DataType::Uint64 | DataType::Int64 => (8, 21),
        DataType::Fp16 | DataType::Bf16 => (2, 25),
        DataType::Fp32 => (4, 25),
        DataType::Fp64 => (8, 25),
        // An element of L bytes (plus its 4 of length) is at most 6 L
        // characters escaped, and 3 for its quotes and comma: 6 a byte.
        DataType::Bytes => return bytes.saturating_mul(6).saturating_add(2),
    };
    (bytes / size + 1).saturating_mul(text).saturating_add(2)
}

/// Raw tensor bytes, serialised as a flat JSON array without building one.
pub struct Data<'a> {
    pub datatype: DataType,
    pub data: &'a [u8],
}

impl Data<'_> {
    /// How many elements the data holds.
    pub fn len(&self) -> usize {
        match self.datatype {
            DataType::Bytes => bytes_elements(self.data).count(),
            datatype => self.data.len() / datatype.byte_size().unwrap_or(1).max(1),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        macro_rules! each {
            ($ty:ty, $conv:expr) => {{
                let chunks = self.data.chunks_exact(size_of::<$ty>());
                let mut seq = serializer.serialize_seq(Some(chunks.len()))?;
                for c in chunks {
                    let value = <$ty>::from_le_bytes(c.try_into().expect("chunk has the element size"));
                    seq.serialize_element(&$conv(value))?;
                }
                seq.end()
            }};
        }
        // Floats go out widened to f64, as Triton writes them; NaN and
        // infinities become null, the only JSON for them.
        let float = |x: f64| x.is_finite().then_some(x);
        match self.datatype {
            DataType::Bool => {
                let mut seq = serializer.serialize_seq(Some(self.data.len()))?;
                for b in self.data {
                    seq.serialize_element(&(*b != 0))?;
                }
                seq.end()
            }
            DataType::Uint8 => each!(u8, |x| x),
            DataType::Uint16 => each!(u16, |x| x),
            DataType::Uint32 => each!(u32, |x| x),
            DataType::Uint64 => each!(u64, |x| x),
            DataType::Int8 => each!(i8, |x| x),
            DataType::Int16 => each!(i16, |x| x),
            DataType::Int32 => each!(i32, |x| x),
            DataType::Int64 => each!(i64, |x| x),
            // Triton refuses half floats in JSON; returning them widened is more useful.
            DataType::Fp16 => each!(f16, |x: f16| float(f64::from(x))),
            DataType::Bf16 => each!(bf16, |x: bf16| float(f64::from(x))),
            DataType::Fp32 => each!(f32, |x: f32| float(f64::from(x))),
            DataType::Fp64 => each!(f64, float),
            DataType::Bytes => {
                let mut seq = serializer.serialize_seq(None)?;
                for element in bytes_elements(self.data) {
                    seq.serialize_element(&String::from_utf8_lossy(element.unwrap_or_default()))?;
                }
                seq.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_budget::MemoryBudget;
    use serde_json::{Value, json};

    fn raw(value: &Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).unwrap()
    }

    fn decode_value(datatype: DataType, value: &Value, expected: usize) -> Result<Bytes> {
        decode("X", datatype, &raw(value), expected, &mut Reservation::default())
    }

    fn encode(datatype: DataType, data: &[u8]) -> Value {
        serde_json::to_value(Data { datatype, data }).unwrap()
    }

    #[test]
    fn the_longest_text_of_every_datatype_is_within_its_bound() {
        let text = |datatype: DataType, data: &[u8]| serde_json::to_vec(&Data { datatype, data }).unwrap().len();
        // Values whose text is longest: the most negative integers, floats
        // with 17 digits and a 3-digit exponent, control bytes.
        let cases: Vec<(DataType, Vec<u8>)> = vec![
            (DataType::Bool, vec![0; 1000]),
            (
                DataType::Int8,
                [i8::MIN].repeat(1000).iter().map(|v| *v as u8).collect(),
            ),
            (DataType::Uint8, vec![255; 1000]),
            (DataType::Int16, i16::MIN.to_le_bytes().repeat(1000)),
            (DataType::Uint16, u16::MAX.to_le_bytes().repeat(1000)),
            (DataType::Int32, i32::MIN.to_le_bytes().repeat(1000)),
            (DataType::Uint32, u32::MAX.to_le_bytes().repeat(1000)),
            (DataType::Int64, i64::MIN.to_le_bytes().repeat(1000)),
            (DataType::Uint64, u64::MAX.to_le_bytes().repeat(1000)),
            (DataType::Fp16, f16::from_f32(-6.1e-5).to_le_bytes().repeat(1000)),
            (
                DataType::Bf16,
                bf16::from_f32(-1.1754944e-38).to_le_bytes().repeat(1000),
            ),
            (DataType::Fp32, (-1.1754942e-38f32).to_le_bytes().repeat(1000)),
            (DataType::Fp64, (-2.2250738585072014e-308f64).to_le_bytes().repeat(1000)),
            (
                DataType::Bytes,
                [1u32.to_le_bytes().as_slice(), &[1]].concat().repeat(1000),
            ),
            (
                DataType::Bytes,
                [8u32.to_le_bytes().as_slice(), &[0x1f; 8]].concat().repeat(100),
            ),
        ];
        for (datatype, data) in cases {
            let written = text(datatype, &data);
            let bound = max_json_len(datatype, data.len());
            assert!(written <= bound, "{datatype:?}: {written} > {bound}");
            assert!(
                bound <= 4 * written + 64,
                "{datatype:?}: {bound} is loose for {written}"
            );
        }
    }

    #[test]
    fn nested_and_flat_arrays_decode_alike() {
        let flat = decode_value(DataType::Int32, &json!([1, 2, 3, 4]), 4).unwrap();
        let nested = decode_value(DataType::Int32, &json!([[1, 2], [3, 4]]), 4).unwrap();
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
            let raw = decode_value(datatype, &value, 2).unwrap();
            assert_eq!(encode(datatype, &raw), value, "{datatype}");
        }
    }

    #[test]
    fn rejects_wrong_counts_types_and_half_floats() {
        let e = decode_value(DataType::Int32, &json!([1, 2, 3]), 4).unwrap_err();
        assert!(e.message().contains("'X'"), "{e}");
        let e = decode_value(DataType::Int32, &json!([1, 2, 3]), 2).unwrap_err();
        assert!(e.message().contains("more elements than its shape needs (2)"), "{e}");
        let e = decode_value(DataType::Int8, &json!([300]), 1).unwrap_err();
        assert!(e.message().contains("INT8"), "{e}");
        let e = decode_value(DataType::Int32, &json!([1.5]), 1).unwrap_err();
        assert!(e.message().contains("1.5 is not a valid INT32 value"), "{e}");
        let e = decode_value(DataType::Bool, &json!(["yes"]), 1).unwrap_err();
        assert!(e.message().contains("'X'"), "{e}");
        let e = decode_value(DataType::Fp32, &json!([null]), 1).unwrap_err();
        assert!(e.message().contains("'X'"), "{e}");
        let e = decode_value(DataType::Fp16, &json!([1.0]), 1).unwrap_err();
        assert!(
            e.message().contains("receiving FP16 data via JSON is not supported"),
            "{e}"
        );
    }

    #[test]
    fn a_shape_the_text_cannot_hold_is_refused_before_any_allocation() {
        let budget = MemoryBudget::new(1024);
        let mut reservation = budget.reservation();
        for claimed in [1_000_000_000_000_000usize, usize::MAX] {
            let e = decode("X", DataType::Fp32, &raw(&json!([1])), claimed, &mut reservation).unwrap_err();
            assert!(e.message().contains("more than 3 bytes of JSON can hold"), "{e}");
        }
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_buffer_is_reserved_before_it_is_allocated() {
        let budget = MemoryBudget::new(16);
        let mut reservation = budget.reservation();
        let value = json!([1, 2, 3, 4]);
        decode("X", DataType::Int32, &raw(&value), 4, &mut reservation).unwrap();
        assert_eq!(reservation.bytes(), 16);
        let e = decode("X", DataType::Int32, &raw(&value), 4, &mut reservation).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::ResourceExhausted);
    }

    #[test]
    fn elements_are_counted_without_decoding() {
        let count = |v: &Value| count_elements("X", &raw(v));
        assert_eq!(count(&json!(7)).unwrap(), 1);
        assert_eq!(count(&json!("text")).unwrap(), 1);
        assert_eq!(count(&json!([[1, 2], [3, 4], [5, 6]])).unwrap(), 6);
        assert_eq!(count(&json!([])).unwrap(), 0);
        let e = count(&json!({"a": 1})).unwrap_err();
        assert!(e.message().contains("input 'X'"), "{e}");
    }

    #[test]
    fn non_finite_floats_encode_as_null() {
        let data: Vec<u8> = [f32::NAN, 1.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(encode(DataType::Fp32, &data), json!([null, 1.0]));
    }
}
