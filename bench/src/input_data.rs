//! Where request inputs come from: a KServe-style JSON file, or zero /
//! pseudo-random values.
//!
//! Random data uses a fixed seed, so two runs (or two servers) are fed the
//! same bytes and their numbers are comparable. The generator is a SplitMix64
//! written here; statistical quality is irrelevant, speed and determinism
//! are what matter.

use std::path::Path;

use bytes::{BufMut, BytesMut};
use half::{bf16, f16};
use serde::Deserialize;

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::tensor::{InputTensor, element_count, put_bytes_element};

/// How to fill inputs that no file provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DataMode {
    Zero,
    Random,
}

/// Length of each generated `BYTES` element.
const STRING_LEN: usize = 16;

/// The fixed seed of random data.
const SEED: u64 = 0x6e65_7265_6964;

/// SplitMix64: a tiny deterministic generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A tensor of `shape` filled per `mode`. Random integers are small
/// (0..100) so that models using them as indices or lengths still accept
/// them; random floats are in [0, 1).
pub fn generate(name: &str, datatype: DataType, shape: &[i64], mode: DataMode) -> Result<InputTensor> {
    let n = element_count(shape)?;
    let mut rng = SplitMix64::new(SEED ^ name.len() as u64);
    let mut raw = BytesMut::with_capacity(n * datatype.byte_size().unwrap_or(4 + STRING_LEN));
    let random = mode == DataMode::Random;
    for _ in 0..n {
        let r = if random { rng.next_u64() } else { 0 };
        let small = r % 100;
        let unit = if random { rng.next_f64() } else { 0.0 };
        match datatype {
            DataType::Bool => raw.put_u8((r & 1) as u8),
            DataType::Uint8 | DataType::Int8 => raw.put_u8(small as u8),
            DataType::Uint16 | DataType::Int16 => raw.put_u16_le(small as u16),
            DataType::Uint32 | DataType::Int32 => raw.put_u32_le(small as u32),
            DataType::Uint64 | DataType::Int64 => raw.put_u64_le(small),
            DataType::Fp16 => raw.put_slice(&f16::from_f64(unit).to_le_bytes()),
            DataType::Bf16 => raw.put_slice(&bf16::from_f64(unit).to_le_bytes()),
            DataType::Fp32 => raw.put_f32_le(unit as f32),
            DataType::Fp64 => raw.put_f64_le(unit),
            DataType::Bytes => {
                let mut s = [b'0'; STRING_LEN];
                if random {
                    for c in &mut s {
                        *c = b'a' + (rng.next_u64() % 26) as u8;
                    }
                }
                put_bytes_element(&mut raw, &s);
            }
        }
    }
    Ok(InputTensor {
        name: name.to_string(),
        datatype,
        shape: shape.to_vec(),
        raw: raw.freeze(),
    })
}

#[derive(Deserialize)]
struct FileTensor {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    data: serde_json::Value,
}

#[derive(Deserialize)]
struct InputFile {
    inputs: Vec<FileTensor>,
}

/// Parses a `{"inputs":[{"name","shape","datatype","data"}]}` document.
pub fn parse_input_file(text: &str) -> Result<Vec<InputTensor>> {
    let file: InputFile = serde_json::from_str(text).map_err(|e| Error::Invalid(format!("input data: {e}")))?;
    if file.inputs.is_empty() {
        return Err(Error::Invalid("input data has no inputs".into()));
    }
    file.inputs
        .into_iter()
        .map(|t| {
            let datatype = t.datatype.parse().map_err(Error::Invalid)?;
            InputTensor::from_json(&t.name, datatype, t.shape, &t.data)
        })
        .collect()
}

/// Reads and parses an input-data file.
pub fn load_input_file(path: &Path) -> Result<Vec<InputTensor>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::Invalid(format!("cannot read '{}': {e}", path.display())))?;
    parse_input_file(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_sizes_and_determinism() {
        let a = generate("X", DataType::Fp32, &[2, 3], DataMode::Random).unwrap();
        let b = generate("X", DataType::Fp32, &[2, 3], DataMode::Random).unwrap();
        assert_eq!(a.raw.len(), 24);
        assert_eq!(a, b);
        let z = generate("X", DataType::Int64, &[4], DataMode::Zero).unwrap();
        assert!(z.raw.iter().all(|&b| b == 0));
        let s = generate("S", DataType::Bytes, &[3], DataMode::Random).unwrap();
        assert_eq!(s.raw.len(), 3 * (4 + STRING_LEN));
        assert_eq!(
            generate("B", DataType::Bool, &[5], DataMode::Random).unwrap().raw.len(),
            5
        );
        assert_eq!(
            generate("H", DataType::Fp16, &[5], DataMode::Random).unwrap().raw.len(),
            10
        );
    }

    #[test]
    fn random_floats_are_in_unit_interval() {
        let t = generate("X", DataType::Fp32, &[1000], DataMode::Random).unwrap();
        for c in t.raw.chunks_exact(4) {
            let v = f32::from_le_bytes(c.try_into().unwrap());
            assert!((0.0..1.0).contains(&v));
        }
    }

    #[test]
    fn parses_kserve_input_file() {
        let text = r#"{"inputs":[
            {"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[[1.0,2.0]]},
            {"name":"T","shape":[1],"datatype":"BYTES","data":["hi"]}]}"#;
        let inputs = parse_input_file(text).unwrap();
        assert_eq!(inputs.len(), 2);
        assert_eq!(inputs[0].raw.len(), 8);
        assert_eq!(inputs[1].datatype, DataType::Bytes);
        assert!(parse_input_file(r#"{"inputs":[]}"#).is_err());
        assert!(parse_input_file(r#"{"inputs":[{"name":"X","shape":[2],"datatype":"FP32","data":[1]}]}"#).is_err());
    }
}
