//! Checks a request against its model's config, as Triton's request
//! `Normalize` does, and puts the inputs in the shapes the model expects.
//!
//! The messages keep Triton's wording (and its `[request id: ...]` prefix),
//! since clients and their tests match on them.

use std::fmt;

use nereid_proto::inference::ModelConfig;

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::model_config::input_datatype;
use crate::request::{InferRequest, RequestedOutput};
use crate::tensor::{Tensor, element_count};

/// The request's inputs, checked and reshaped for the model, and the
/// outputs to return in order.
#[derive(Debug)]
pub struct Normalized {
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<RequestedOutput>,
    /// The request's batch size (1 for models that do not batch).
    pub batch_size: usize,
}

/// `id` is the request's id (taken out of `request` by the caller).
pub fn normalize(config: &ModelConfig, model: &str, id: &str, request: InferRequest) -> Result<Normalized> {
    let prefix = Prefix(id);
    let outputs = check_outputs(config, model, prefix, request.outputs)?;
    check_input_names(config, model, prefix, &request.inputs)?;

    let batching = config.max_batch_size > 0;
    let mut batch_size: Option<i64> = None;
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for mut tensor in request.inputs {
        let input = config
            .input
            .iter()
            .find(|i| i.name == tensor.name)
            .expect("input names were checked against the config");
        let expected = input_datatype(input).expect("config datatypes were validated at load");
        if tensor.datatype != expected {
            return Err(Error::invalid(format!(
                "{prefix}inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                tensor.name, tensor.datatype, expected
            )));
        }
        let dims = if batching {
            let Some(&batch) = tensor.shape.first() else {
                return Err(Error::invalid(format!(
                    "{prefix}input '{}' has no shape but model requires batch dimension for '{model}'",
                    tensor.name
                )));
            };
            match batch_size {
                None => batch_size = Some(batch),
                Some(b) if b != batch => {
                    return Err(Error::invalid(format!(
                        "{prefix}input '{}' batch size does not match other inputs for '{model}'",
                        tensor.name
                    )));
                }
                Some(_) => {}
            }
            if batch < 1 || batch > i64::from(config.max_batch_size) {
                return Err(Error::invalid(format!(
                    "{prefix}inference request batch-size must be <= {} for '{model}'",
                    config.max_batch_size
                )));
            }
            &tensor.shape[1..]
        } else {
            &tensor.shape[..]
        };
        if !dims_match(&input.dims, dims) {
            let mut expected_dims = Vec::with_capacity(input.dims.len() + 1);
            if batching {
                expected_dims.push(-1);
            }
            expected_dims.extend_from_slice(&input.dims);
            let note = if batching {
                "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
            } else {
                ""
            };
            return Err(Error::invalid(format!(
                "{prefix}unexpected shape for input '{}' for model '{model}'. Expected {}, got {}. {note}",
                tensor.name,
                show_dims(&expected_dims),
                show_dims(&tensor.shape)
            )));
        }
        if tensor.shape.contains(&-1) || tensor.shape.iter().any(|d| *d < 0) {
            return Err(Error::invalid(format!(
                "{prefix}All input dimensions should be specified for input '{}' for model '{model}', got {}",
                tensor.name,
                show_dims(&tensor.shape)
            )));
        }
        tensor
            .check_data_size()
            .map_err(|e| Error::invalid(format!("{prefix}{} for model '{model}'", e.message())))?;
        if let Some(reshape) = &input.reshape {
            tensor.shape = reshaped(&tensor, batching, &reshape.shape)?;
        }
        inputs.push(tensor);
    }
    // Config order, so that requests which can share a batch line up.
    inputs.sort_by_key(|t| config.input.iter().position(|i| i.name == t.name));
    Ok(Normalized {
        inputs,
        outputs,
        batch_size: usize::try_from(batch_size.unwrap_or(1)).unwrap_or(1),
    })
}

/// Triton's `[request id: ...] ` before a message; written only into an
/// error, so a request that passes costs no formatting.
#[derive(Clone, Copy)]
struct Prefix<'a>(&'a str);

impl fmt::Display for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = if self.0.is_empty() { "<id_unknown>" } else { self.0 };
        write!(f, "[request id: {id}] ")
    }
}

/// Requested outputs must exist and appear once; none requested means all.
fn check_outputs(
    config: &ModelConfig,
    model: &str,
    prefix: Prefix<'_>,
    requested: Vec<RequestedOutput>,
) -> Result<Vec<RequestedOutput>> {
    if requested.is_empty() {
        return Ok(config.output.iter().map(|o| RequestedOutput::named(&o.name)).collect());
    }
    let mut seen = Marks::new(config.output.len());
    for output in &requested {
        let Some(position) = config.output.iter().position(|o| o.name == output.name) else {
            return Err(Error::invalid(format!(
                "unexpected inference output '{}' for model '{model}'",
                output.name
            )));
        };
        let config_output = &config.output[position];
        if seen.mark(position) {
            return Err(Error::invalid(format!(
                "{prefix}output '{}' already exists in request",
                output.name
            )));
        }
        if output.classification.is_some() {
            let numeric = DataType::from_config(config_output.data_type)
                .is_some_and(|t| t.byte_size().is_some() && t != DataType::Bool);
            if !numeric {
                return Err(Error::invalid(format!(
                    "class result not available for output '{}' due to unsupported type",
                    output.name
                )));
            }
        }
    }
    Ok(requested)
}

fn check_input_names(config: &ModelConfig, model: &str, prefix: Prefix<'_>, inputs: &[Tensor]) -> Result<()> {
    // By position in the config: every name must be there, so a name seen
    // twice is a position seen twice.
    let mut seen = Marks::new(config.input.len());
    for tensor in inputs {
        let Some(position) = config.input.iter().position(|i| i.name == tensor.name) else {
            return Err(Error::invalid(format!(
                "unexpected inference input '{}' for model '{model}'",
                tensor.name
            )));
        };
        if seen.mark(position) {
            return Err(Error::invalid(format!(
                "{prefix}input '{}' already exists in request",
                tensor.name
            )));
        }
    }
    let complete = config
        .input
        .iter()
        .enumerate()
        .all(|(at, i)| i.optional || seen.is_marked(at));
    if !complete {
        let required: Vec<&str> = config
            .input
            .iter()
            .filter(|i| !i.optional)
            .map(|i| i.name.as_str())
            .collect();
        let missing: Vec<&str> = config
            .input
            .iter()
            .enumerate()
            .filter(|(at, i)| !i.optional && !seen.is_marked(*at))
            .map(|(_, i)| i.name.as_str())
            .collect();
        let list = |names: &mut dyn Iterator<Item = &str>| {
            format!("[{}]", names.map(|n| format!("'{n}'")).collect::<Vec<_>>().join(","))
        };
        let got = list(&mut inputs.iter().map(|t| t.name.as_str()));
        let missing = list(&mut missing.into_iter());
        let expected = if required.len() == config.input.len() {
            format!("expected {} inputs", required.len())
        } else {
            format!(
                "expected number of inputs between {} and {}",
                required.len(),
                config.input.len()
            )
        };
        return Err(Error::invalid(format!(
            "{prefix}{expected} but got {} inputs for model '{model}'. Got input(s) {got}, but missing required input(s) {missing}. Please provide all required input(s).",
            inputs.len()
        )));
    }
    Ok(())
}

/// Which of a config's inputs (or outputs) a request named: bits of a word
/// for the usual handful, so checking a request allocates nothing.
enum Marks {
    Few(u64),
    Many(Vec<bool>),
}

impl Marks {
    fn new(count: usize) -> Self {
        if count <= 64 {
            Marks::Few(0)
        } else {
            Marks::Many(vec![false; count])
        }
    }

    /// Marks `at`; whether it was marked already.
    fn mark(&mut self, at: usize) -> bool {
        match self {
            Marks::Few(bits) => {
                let was = *bits & (1 << at) != 0;
                *bits |= 1 << at;
                was
            }
            Marks::Many(marks) => std::mem::replace(&mut marks[at], true),
        }
    }

    fn is_marked(&self, at: usize) -> bool {
        match self {
            Marks::Few(bits) => *bits & (1 << at) != 0,
            Marks::Many(marks) => marks[at],
        }
    }
}

/// Whether request dims fit config dims (`-1` in the config matches anything).
fn dims_match(config: &[i64], request: &[i64]) -> bool {
    config.len() == request.len() && config.iter().zip(request).all(|(&c, &r)| c == -1 || c == r)
}

/// The shape the model sees for an input with `reshape`, resolving one `-1`
/// from the element count.
fn reshaped(tensor: &Tensor, batching: bool, shape: &[i64]) -> Result<Vec<i64>> {
    let mut out = Vec::with_capacity(shape.len() + 1);
    let mut count = element_count(&tensor.shape)?;
    if batching {
        out.push(tensor.shape[0]);
        count /= usize::try_from(tensor.shape[0]).unwrap_or(1).max(1);
    }
    let known: usize = shape.iter().filter(|d| **d > 0).map(|d| *d as usize).product();
    for &d in shape {
        if d == -1 {
            let rest = count.checked_div(known).unwrap_or(0);
            out.push(i64::try_from(rest).unwrap_or(i64::MAX));
        } else {
            out.push(d);
        }
    }
    Ok(out)
}

/// Triton's dims formatting: `[-1,16]`.
fn show_dims(dims: &[i64]) -> String {
    format!("[{}]", dims.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::text::parse;
    use bytes::Bytes;

    fn simple() -> ModelConfig {
        parse(
            r#"name: "simple" max_batch_size: 8
               input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
               output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]"#,
        )
        .unwrap()
    }

    fn int32(name: &str, shape: &[i64]) -> Tensor {
        let n = element_count(shape).unwrap();
        Tensor::new(name, DataType::Int32, shape.to_vec(), Bytes::from(vec![0u8; n * 4]))
    }

    fn request(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest {
            model_name: "simple".into(),
            inputs,
            ..Default::default()
        }
    }

    fn error(mut req: InferRequest) -> String {
        let id = std::mem::take(&mut req.id);
        normalize(&simple(), "simple", &id, req)
            .unwrap_err()
            .message()
            .to_string()
    }

    #[test]
    fn accepts_a_valid_batch() {
        let n = normalize(
            &simple(),
            "simple",
            "",
            request(vec![int32("INPUT0", &[3, 16]), int32("INPUT1", &[3, 16])]),
        )
        .unwrap();
        assert_eq!(n.batch_size, 3);
        assert_eq!(n.outputs.len(), 2);
    }

    #[test]
    fn reports_each_mistake_in_tritons_words() {
        let e = error(request(vec![int32("INPUT0", &[1, 16])]));
        assert_eq!(
            e,
            "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."
        );
        let e = error(request(vec![int32("INPUT0", &[1, 16]), int32("INPUTX", &[1, 16])]));
        assert_eq!(e, "unexpected inference input 'INPUTX' for model 'simple'");
        let e = error(request(vec![int32("INPUT0", &[1, 16]), int32("INPUT0", &[1, 16])]));
        assert!(e.ends_with("input 'INPUT0' already exists in request"), "{e}");
        let e = error(request(vec![int32("INPUT0", &[1, 15]), int32("INPUT1", &[1, 16])]));
        assert!(
            e.contains("unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]."),
            "{e}"
        );
        let e = error(request(vec![int32("INPUT0", &[9, 16]), int32("INPUT1", &[9, 16])]));
        assert!(e.contains("batch-size must be <= 8"), "{e}");
        let e = error(request(vec![int32("INPUT0", &[1, 16]), int32("INPUT1", &[2, 16])]));
        assert!(e.contains("batch size does not match"), "{e}");
        let mut wrong_type = int32("INPUT1", &[1, 16]);
        wrong_type.datatype = DataType::Fp32;
        let e = error(request(vec![int32("INPUT0", &[1, 16]), wrong_type]));
        assert!(
            e.contains("inference input 'INPUT1' data-type is 'FP32', but model 'simple' expects 'INT32'"),
            "{e}"
        );
        let mut short = int32("INPUT1", &[1, 16]);
        short.data = short.data.slice(4..);
        let e = error(request(vec![int32("INPUT0", &[1, 16]), short]));
        assert!(e.contains("'INPUT1'"), "{e}");
    }

    #[test]
    fn checks_requested_outputs() {
        let req = |outputs: &[&str]| InferRequest {
            id: "r1".into(),
            outputs: outputs.iter().map(|n| RequestedOutput::named(*n)).collect(),
            ..request(vec![int32("INPUT0", &[1, 16]), int32("INPUT1", &[1, 16])])
        };
        assert_eq!(
            error(req(&["OUTPUT1", "OUTPUT1"])),
            "[request id: r1] output 'OUTPUT1' already exists in request"
        );
        assert_eq!(
            error(req(&["NOPE"])),
            "unexpected inference output 'NOPE' for model 'simple'"
        );
        let n = normalize(&simple(), "simple", "r1", req(&["OUTPUT1"])).unwrap();
        assert_eq!(n.outputs, vec![RequestedOutput::named("OUTPUT1")]);
    }

    #[test]
    fn marks_count_each_place_once_however_many() {
        for count in [1, 64, 65, 200] {
            let mut marks = Marks::new(count);
            let places: std::collections::BTreeSet<usize> = [0, count / 2, count - 1].into();
            for &at in &places {
                assert!(!marks.mark(at), "{count}: {at} is new");
                assert!(marks.mark(at), "{count}: {at} was marked");
            }
            let marked: Vec<usize> = (0..count).filter(|at| marks.is_marked(*at)).collect();
            assert_eq!(marked, places.into_iter().collect::<Vec<_>>(), "{count}");
        }
    }

    #[test]
    fn applies_reshape() {
        let config = parse(
            r#"max_batch_size: 4
               input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, -1 ] } } ]
               output [ { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] } ]"#,
        )
        .unwrap();
        let n = normalize(&config, "m", "", request(vec![int32("X", &[3, 4])])).unwrap();
        assert_eq!(n.inputs[0].shape, vec![3, 2, 2]);
    }
}
