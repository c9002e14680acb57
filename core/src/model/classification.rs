//! Triton's classification extension: an output returned as its top-k
//! classes, each a BYTES string `"value:index"` or `"value:index:label"`.

use bytes::Bytes;
use half::{bf16, f16};

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, push_bytes_element};

/// Replaces a numeric output by its top `k` classes per batch entry.
///
/// `batched` says whether the first dimension is the batch; `labels` are
/// the lines of the output's `label_filename`, if it has one.
pub fn classify(output: &Tensor, k: usize, batched: bool, labels: Option<&[String]>) -> Result<Tensor> {
    let values = to_f64(output)?;
    let (batch, shape_prefix) = if batched && !output.shape.is_empty() {
        let b = usize::try_from(output.shape[0]).unwrap_or(0);
        (b, vec![output.shape[0]])
    } else {
        (1, Vec::new())
    };
    let per_entry = values.len().checked_div(batch).unwrap_or(0);
    let k = k.min(per_entry);
    let mut data = Vec::new();
    for entry in 0..batch {
        let scores = &values[entry * per_entry..(entry + 1) * per_entry];
        let mut order: Vec<usize> = (0..scores.len()).collect();
        // Highest first; ties keep the lower index first, as a stable sort does.
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        for &index in order.iter().take(k) {
            let value = format_value(output.datatype, scores[index]);
            let text = match labels.and_then(|l| l.get(index)) {
                Some(label) => format!("{value}:{index}:{label}"),
                None => format!("{value}:{index}"),
            };
            push_bytes_element(&mut data, text.as_bytes())?;
        }
    }
    let mut shape = shape_prefix;
    shape.push(i64::try_from(k).unwrap_or(i64::MAX));
    Ok(Tensor::new(
        output.name.clone(),
        DataType::Bytes,
        shape,
        Bytes::from(data),
    ))
}

/// Floats print as C's `%f` (what Triton's `std::to_string` gives); integers as integers.
fn format_value(datatype: DataType, value: f64) -> String {
    match datatype {
        DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64 => format!("{value:.6}"),
        _ => format!("{}", value as i128),
    }
}

fn to_f64(t: &Tensor) -> Result<Vec<f64>> {
    macro_rules! read {
        ($ty:ty, $conv:expr) => {
            t.data
                .chunks_exact(size_of::<$ty>())
                .map(|c| {
                    $conv(<$ty>::from_le_bytes(
                        c.try_into().expect("chunk has the element size"),
                    ))
                })
                .collect()
        };
    }
    Ok(match t.datatype {
        DataType::Uint8 => read!(u8, f64::from),
        DataType::Uint16 => read!(u16, f64::from),
        DataType::Uint32 => read!(u32, f64::from),
        DataType::Uint64 => read!(u64, |v: u64| v as f64),
        DataType::Int8 => read!(i8, f64::from),
        DataType::Int16 => read!(i16, f64::from),
        DataType::Int32 => read!(i32, f64::from),
        DataType::Int64 => read!(i64, |v: i64| v as f64),
        DataType::Fp16 => read!(f16, |v: f16| f64::from(v)),
        DataType::Bf16 => read!(bf16, |v: bf16| f64::from(v)),
        DataType::Fp32 => read!(f32, f64::from),
        DataType::Fp64 => read!(f64, |v| v),
        DataType::Bool | DataType::Bytes => {
            return Err(Error::invalid(format!(
                "class result not available for output '{}' due to unsupported type '{}'",
                t.name, t.datatype
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::bytes_elements;

    fn strings(t: &Tensor) -> Vec<String> {
        bytes_elements(&t.data)
            .map(|e| String::from_utf8(e.unwrap().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn top_k_per_batch_entry_with_labels() {
        let values: Vec<u8> = [0.1f32, 0.7, 0.2, 0.9, 0.05, 0.05]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = Tensor::new("OUT", DataType::Fp32, vec![2, 3], Bytes::from(values));
        let labels = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let c = classify(&t, 2, true, Some(&labels)).unwrap();
        assert_eq!(c.shape, vec![2, 2]);
        assert_eq!(c.datatype, DataType::Bytes);
        assert_eq!(
            strings(&c),
            vec!["0.700000:1:b", "0.200000:2:c", "0.900000:0:a", "0.050000:1:b"]
        );
    }

    #[test]
    fn integers_and_k_larger_than_classes() {
        let values: Vec<u8> = [3i32, 9, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new("OUT", DataType::Int32, vec![3], Bytes::from(values));
        let c = classify(&t, 10, false, None).unwrap();
        assert_eq!(c.shape, vec![3]);
        assert_eq!(strings(&c), vec!["9:1", "3:0", "1:2"]);
    }
}
