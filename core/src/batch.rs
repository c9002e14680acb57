//! Putting requests together into one batch and taking the outputs apart.
//!
//! Inputs are not concatenated here: each becomes a [`BatchInput`] listing
//! the requests' pieces, and the backend copies them once into its own
//! buffer. Outputs come back batched and are cut per request along the
//! batch dimension; for fixed-size types each piece is a zero-copy slice of
//! the batch output.

use bytes::Bytes;

use crate::backend::BatchInput;
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, bytes_elements};

/// What must agree for two requests to share a batch: each input's name,
/// datatype and shape beyond the batch dimension, in config order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BatchKey(Vec<(String, DataType, Vec<i64>)>);

impl BatchKey {
    pub fn of(inputs: &[Tensor]) -> Self {
        BatchKey(
            inputs
                .iter()
                .map(|t| (t.name.clone(), t.datatype, t.shape.iter().skip(1).copied().collect()))
                .collect(),
        )
    }
}

/// The batch inputs for requests with equal [`BatchKey`]s, each of `sizes[i]` rows.
pub fn assemble(requests: Vec<Vec<Tensor>>, sizes: &[usize]) -> Vec<BatchInput> {
    let total: usize = sizes.iter().sum();
    let mut requests = requests.into_iter();
    let Some(first) = requests.next() else {
        return Vec::new();
    };
    let mut batch: Vec<BatchInput> = first.into_iter().map(BatchInput::single).collect();
    // One request's tensors are already in the model's shapes; for a model
    // that does not batch, the first dimension is one of its own.
    if sizes.len() == 1 {
        return batch;
    }
    for request in requests {
        for (input, tensor) in batch.iter_mut().zip(request) {
            input.parts.push(tensor.data);
        }
    }
    for input in &mut batch {
        if let Some(first_dim) = input.shape.first_mut() {
            *first_dim = i64::try_from(total).unwrap_or(i64::MAX);
        }
    }
    batch
}

/// Cuts each batched output into one piece per request, along dimension 0.
pub fn split(outputs: Vec<Tensor>, sizes: &[usize]) -> Result<Vec<Vec<Tensor>>> {
    let total: usize = sizes.iter().sum();
    let mut per_request: Vec<Vec<Tensor>> = sizes.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
    for output in outputs {
        if output.shape.first().copied() != i64::try_from(total).ok() {
            return Err(Error::internal(format!(
                "output '{}' has shape {:?}, which does not start with the batch size {total}",
                output.name, output.shape
            )));
        }
        let pieces = cut(&output, sizes, total)?;
        for ((dest, data), &rows) in per_request.iter_mut().zip(pieces).zip(sizes) {
            let mut shape = output.shape.clone();
            shape[0] = i64::try_from(rows).unwrap_or(i64::MAX);
            dest.push(Tensor::new(output.name.clone(), output.datatype, shape, data));
        }
    }
    Ok(per_request)
}

fn cut(output: &Tensor, sizes: &[usize], total: usize) -> Result<Vec<Bytes>> {
    let mut pieces = Vec::with_capacity(sizes.len());
    match output.datatype.byte_size() {
        Some(size) => {
            if output.data.len() != output.element_count()? * size {
                return Err(Error::internal(format!(
                    "output '{}' holds {} bytes but its shape {:?} needs {}",
                    output.name,
                    output.data.len(),
                    output.shape,
                    output.element_count()? * size
                )));
            }
            let row = output.data.len().checked_div(total).unwrap_or(0);
            let mut at = 0;
            for &rows in sizes {
                pieces.push(output.data.slice(at..at + rows * row));
                at += rows * row;
            }
        }
        None => {
            // BYTES: walk the elements to find where each request's rows end.
            let elements = output.element_count()?;
            let per_row = elements.checked_div(total).unwrap_or(0);
            let mut offsets = Vec::with_capacity(elements + 1);
            let mut at = 0usize;
            offsets.push(0);
            for element in bytes_elements(&output.data) {
                at += 4 + element?.len();
                offsets.push(at);
            }
            if offsets.len() != elements + 1 || per_row * total != elements {
                return Err(Error::internal(format!(
                    "output '{}' holds {} strings but its shape {:?} says {elements}",
                    output.name,
                    offsets.len() - 1,
                    output.shape
                )));
            }
            let mut row_start = 0;
            for &rows in sizes {
                let row_end = row_start + rows * per_row;
                pieces.push(output.data.slice(offsets[row_start]..offsets[row_end]));
                row_start = row_end;
            }
        }
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::push_bytes_element;

    fn int32(name: &str, rows: &[[i32; 2]]) -> Tensor {
        let data: Vec<u8> = rows.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(name, DataType::Int32, vec![rows.len() as i64, 2], Bytes::from(data))
    }

    #[test]
    fn assembles_and_splits_fixed_size_tensors() {
        let a = vec![int32("X", &[[1, 2]])];
        let b = vec![int32("X", &[[3, 4], [5, 6]])];
        assert_eq!(BatchKey::of(&a), BatchKey::of(&b));
        let batch = assemble(vec![a, b], &[1, 2]);
        assert_eq!(batch[0].shape, vec![3, 2]);
        assert_eq!(batch[0].contiguous(), int32("X", &[[1, 2], [3, 4], [5, 6]]).data);

        // A model without a batch dimension: one request of "1 row" keeps
        // its first dimension (4 here), which is the model's own.
        let unbatched = assemble(vec![vec![int32("X", &[[1, 2], [3, 4], [5, 6], [7, 8]])]], &[1]);
        assert_eq!(unbatched[0].shape, vec![4, 2]);

        let out = int32("Y", &[[10, 20], [30, 40], [50, 60]]);
        let split = split(vec![out], &[1, 2]).unwrap();
        assert_eq!(split[0][0], int32("Y", &[[10, 20]]));
        assert_eq!(split[1][0], int32("Y", &[[30, 40], [50, 60]]));
    }

    #[test]
    fn splits_bytes_by_elements() {
        let mut data = Vec::new();
        for e in [&b"a"[..], b"bb", b"", b"dddd"] {
            push_bytes_element(&mut data, e).unwrap();
        }
        let out = Tensor::new("S", DataType::Bytes, vec![2, 2], Bytes::from(data));
        let split = split(vec![out], &[1, 1]).unwrap();
        let back = |t: &Tensor| bytes_elements(&t.data).map(|e| e.unwrap().to_vec()).collect::<Vec<_>>();
        assert_eq!(back(&split[0][0]), vec![b"a".to_vec(), b"bb".to_vec()]);
        assert_eq!(back(&split[1][0]), vec![b"".to_vec(), b"dddd".to_vec()]);
        assert_eq!(split[1][0].shape, vec![1, 2]);
    }

    #[test]
    fn different_shapes_do_not_share_a_key() {
        let a = vec![int32("X", &[[1, 2]])];
        let c = vec![Tensor::new(
            "X",
            DataType::Int32,
            vec![1, 3],
            Bytes::from(vec![0u8; 12]),
        )];
        assert_ne!(BatchKey::of(&a), BatchKey::of(&c));
    }

    #[test]
    fn rejects_outputs_whose_data_disagrees_with_their_shape() {
        let short = Tensor::new("Y", DataType::Int32, vec![2, 2], Bytes::from(vec![0u8; 12]));
        assert!(split(vec![short], &[1, 1]).is_err());
        let mut data = Vec::new();
        push_bytes_element(&mut data, b"only one").unwrap();
        let strings = Tensor::new("S", DataType::Bytes, vec![2, 1], Bytes::from(data));
        assert!(split(vec![strings], &[1, 1]).is_err());
    }

    #[test]
    fn rejects_outputs_without_the_batch_dimension() {
        let out = Tensor::new("Y", DataType::Int32, vec![2], Bytes::from(vec![0u8; 8]));
        assert!(split(vec![out], &[1, 2]).is_err());
    }
}
