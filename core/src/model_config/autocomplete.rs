//! Completing a config from what the model file says, and checking that the
//! two agree.
//!
//! Triton lets a model folder hold only `1/model.onnx`: the backend reads the
//! model's inputs and outputs and fills in the config. The rules are Triton's
//! ONNX Runtime backend's: completion runs only when the config lacks its
//! inputs or its outputs; a model whose every input and output has a dynamic
//! first dimension can batch, so an unset `max_batch_size` becomes the
//! default (`--backend-config=default-max-batch-size=N`, 4 unless set; with
//! a warning that says so, as Triton logs it), and the first dimension
//! becomes the batch dimension. A model that can batch with a
//! `max_batch_size` above 1, given or filled in, gets `dynamic_batching {}`
//! unless it chose a scheduler.

use nereid_proto::inference::{ModelConfig, ModelDynamicBatching, ModelInput, ModelOutput, model_config};

use super::{model_dims, sequence};
use crate::datatype::DataType;
use crate::error::{Error, Result};

/// One input or output as the model file declares it (full rank, `-1` for dynamic).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSignature {
    pub name: String,
    /// `None` when the model uses a type Triton has no name for.
    pub datatype: Option<DataType>,
    pub dims: Vec<i64>,
}

/// What a backend can tell about a model file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelSignature {
    pub inputs: Vec<TensorSignature>,
    pub outputs: Vec<TensorSignature>,
}

impl ModelSignature {
    /// Whether every tensor has a dynamic first dimension, so that it can take a batch.
    fn can_batch(&self) -> bool {
        let all = self.inputs.iter().chain(&self.outputs);
        !self.inputs.is_empty() && all.clone().all(|t| t.dims.first() == Some(&-1))
    }
}

/// Fills what the config leaves out from the model's signature; an unset
/// `max_batch_size` of a model that can batch becomes `default_max_batch_size`.
pub fn complete(config: &mut ModelConfig, signature: &ModelSignature, default_max_batch_size: i32) -> Result<()> {
    if !config.input.is_empty() && !config.output.is_empty() {
        return Ok(());
    }
    let can_batch = signature.can_batch();
    if !can_batch && config.max_batch_size != 0 {
        return Err(Error::invalid(format!(
            "autofill failed for model '{}': model does not support batching while non-zero max_batch_size is specified",
            config.name
        )));
    }
    if config.max_batch_size == 0 && can_batch {
        config.max_batch_size = default_max_batch_size.max(0);
        tracing::warn!(
            model = %config.name,
            max_batch_size = config.max_batch_size,
            "autofilled max_batch_size to {} for model '{}' since batching is supported but no max_batch_size is \
             specified in model configuration. Must specify max_batch_size to utilize autofill with a larger max \
             batch size",
            config.max_batch_size,
            config.name
        );
    }
    if can_batch && config.max_batch_size > 1 && config.scheduling_choice.is_none() {
        config.scheduling_choice = Some(model_config::SchedulingChoice::DynamicBatching(
            ModelDynamicBatching::default(),
        ));
    }
    let batch_dims = usize::from(config.max_batch_size > 0);
    // Control and state tensors are the server's to feed and keep, never
    // the client's: they stay out of input and output.
    let implicit_inputs: Vec<String> = sequence::implicit_inputs(config)
        .into_iter()
        .map(String::from)
        .collect();
    let implicit_outputs: Vec<String> = sequence::implicit_outputs(config)
        .into_iter()
        .map(String::from)
        .collect();
    let inputs: Vec<TensorSignature> = signature
        .inputs
        .iter()
        .filter(|t| !implicit_inputs.contains(&t.name))
        .cloned()
        .collect();
    let outputs: Vec<TensorSignature> = signature
        .outputs
        .iter()
        .filter(|t| !implicit_outputs.contains(&t.name))
        .cloned()
        .collect();
    fill(&mut config.input, &inputs, batch_dims);
    fill(&mut config.output, &outputs, batch_dims);
    Ok(())
}

/// What inputs and outputs have in common, so one function completes both.
trait ConfigTensor: Default {
    fn name(&self) -> &str;
    fn set_name(&mut self, name: String);
    fn data_type(&mut self) -> &mut i32;
    fn dims(&mut self) -> &mut Vec<i64>;
    fn has_reshape(&self) -> bool;
}

macro_rules! config_tensor {
    ($t:ty) => {
        impl ConfigTensor for $t {
            fn name(&self) -> &str {
                &self.name
            }
            fn set_name(&mut self, name: String) {
                self.name = name;
            }
            fn data_type(&mut self) -> &mut i32 {
                &mut self.data_type
            }
            fn dims(&mut self) -> &mut Vec<i64> {
                &mut self.dims
            }
            fn has_reshape(&self) -> bool {
                self.reshape.is_some()
            }
        }
    };
}
config_tensor!(ModelInput);
config_tensor!(ModelOutput);

/// Lists every tensor of the model when the config lists none; otherwise
/// fills the datatype and dims each listed tensor leaves out.
fn fill<T: ConfigTensor>(tensors: &mut Vec<T>, model: &[TensorSignature], batch_dims: usize) {
    let complete = |tensor: &mut T, t: &TensorSignature| {
        if *tensor.data_type() == 0 {
            *tensor.data_type() = t.datatype.map_or(0, DataType::to_config);
        }
        if tensor.dims().is_empty() && !tensor.has_reshape() {
            *tensor.dims() = t.dims.iter().skip(batch_dims).copied().collect();
        }
    };
    if tensors.is_empty() {
        for t in model {
            let mut tensor = T::default();
            tensor.set_name(t.name.clone());
            complete(&mut tensor, t);
            tensors.push(tensor);
        }
        return;
    }
    for tensor in tensors.iter_mut() {
        if let Some(t) = model.iter().find(|t| t.name == tensor.name()) {
            complete(tensor, t);
        }
    }
}

/// Checks that the (completed) config agrees with the model file.
pub fn check_against(config: &ModelConfig, signature: &ModelSignature) -> Result<()> {
    let batch = config.max_batch_size > 0;
    for input in &config.input {
        let t = signature.inputs.iter().find(|t| t.name == input.name).ok_or_else(|| {
            Error::invalid(format!(
                "unexpected inference input '{}', allowed inputs are: {}",
                input.name,
                names(&signature.inputs)
            ))
        })?;
        check_tensor("input", &input.name, input.data_type, model_dims(input), t, batch)?;
    }
    let implicit = sequence::implicit_inputs(config);
    for t in &signature.inputs {
        if !config.input.iter().any(|i| i.name == t.name) && !implicit.contains(&t.name.as_str()) {
            return Err(Error::invalid(format!(
                "model file has input '{}' that the configuration does not list",
                t.name
            )));
        }
    }
    for output in &config.output {
        let t = signature
            .outputs
            .iter()
            .find(|t| t.name == output.name)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unexpected inference output '{}', allowed outputs are: {}",
                    output.name,
                    names(&signature.outputs)
                ))
            })?;
        let dims = output
            .reshape
            .as_ref()
            .map_or(output.dims.as_slice(), |r| r.shape.as_slice());
        check_tensor("output", &output.name, output.data_type, dims, t, batch)?;
    }
    for name in implicit {
        if !signature.inputs.iter().any(|t| t.name == name) {
            return Err(Error::invalid(format!(
                "sequence_batching feeds input '{name}', which the model file does not have; its inputs are: {}",
                names(&signature.inputs)
            )));
        }
    }
    if let Some(batching) = sequence::of(config) {
        for state in &batching.state {
            let Some(t) = signature.outputs.iter().find(|t| t.name == state.output_name) else {
                return Err(Error::invalid(format!(
                    "state output '{}' is not an output of the model file; its outputs are: {}",
                    state.output_name,
                    names(&signature.outputs)
                )));
            };
            let model = signature
                .inputs
                .iter()
                .find(|t| t.name == state.input_name)
                .and_then(|t| t.datatype);
            let config_type = DataType::from_config(state.data_type);
            for (what, file) in [("input", model), ("output", t.datatype)] {
                if let (Some(file), Some(config_type)) = (file, config_type)
                    && file != config_type
                {
                    return Err(Error::invalid(format!(
                        "state '{}' is {config_type} in the configuration but its {what} is {file} in the model file",
                        state.input_name
                    )));
                }
            }
        }
    }
    Ok(())
}

fn check_tensor(
    what: &str,
    name: &str,
    data_type: i32,
    config_dims: &[i64],
    model: &TensorSignature,
    batch: bool,
) -> Result<()> {
    let config_type = DataType::from_config(data_type);
    if config_type != model.datatype {
        let show = |t: Option<DataType>| t.map_or("unsupported".to_string(), |t| format!("TYPE_{}", config_name(t)));
        return Err(Error::invalid(format!(
            "unexpected datatype {} for {what} '{name}', model provides {}",
            show(config_type),
            show(model.datatype)
        )));
    }
    let mut expected: Vec<i64> = Vec::with_capacity(config_dims.len() + 1);
    if batch {
        expected.push(-1);
    }
    expected.extend_from_slice(config_dims);
    let compatible = expected.len() == model.dims.len()
        && expected
            .iter()
            .zip(&model.dims)
            .all(|(&c, &m)| c == m || c == -1 || m == -1);
    if !compatible {
        return Err(Error::invalid(format!(
            "{what} '{name}' has shape {:?} in the model file but the configuration implies {:?} (max_batch_size {})",
            model.dims,
            expected,
            if batch { "> 0 adds a batch dimension" } else { "0" }
        )));
    }
    Ok(())
}

/// The config spelling of a datatype (`TYPE_STRING` for BYTES).
fn config_name(t: DataType) -> &'static str {
    match t {
        DataType::Bytes => "STRING",
        other => other.as_wire(),
    }
}

fn names(tensors: &[TensorSignature]) -> String {
    tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::DEFAULT_MAX_BATCH_SIZE;

    fn sig(name: &str, dims: &[i64]) -> TensorSignature {
        TensorSignature {
            name: name.into(),
            datatype: Some(DataType::Fp32),
            dims: dims.to_vec(),
        }
    }

    fn mlp() -> ModelSignature {
        ModelSignature {
            inputs: vec![sig("X", &[-1, 256])],
            outputs: vec![sig("Y", &[-1, 10])],
        }
    }

    #[test]
    fn empty_config_is_completed_with_batching() {
        let mut config = ModelConfig::default();
        complete(&mut config, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
        assert_eq!(config.input[0].name, "X");
        assert_eq!(config.input[0].dims, vec![256]);
        assert_eq!(config.input[0].data_type, DataType::Fp32.to_config());
        assert_eq!(config.output[0].dims, vec![10]);
        assert!(matches!(
            config.scheduling_choice,
            Some(model_config::SchedulingChoice::DynamicBatching(_))
        ));
        check_against(&config, &mlp()).unwrap();
    }

    #[test]
    fn fixed_first_dimension_means_no_batching() {
        let signature = ModelSignature {
            inputs: vec![sig("X", &[1, 256])],
            outputs: vec![sig("Y", &[1, 10])],
        };
        let mut config = ModelConfig::default();
        complete(&mut config, &signature, DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, 0);
        assert_eq!(config.input[0].dims, vec![1, 256]);
        check_against(&config, &signature).unwrap();

        let mut batching = ModelConfig {
            max_batch_size: 8,
            ..Default::default()
        };
        let err = complete(&mut batching, &signature, DEFAULT_MAX_BATCH_SIZE).unwrap_err();
        assert!(err.message().contains("does not support batching"), "{err}");
    }

    #[test]
    fn the_default_max_batch_size_is_the_backends_setting() {
        let mut config = ModelConfig::default();
        complete(&mut config, &mlp(), 8).unwrap();
        assert_eq!(config.max_batch_size, 8);
        let mut unbatched = ModelConfig::default();
        complete(&mut unbatched, &mlp(), 0).unwrap();
        assert_eq!(unbatched.max_batch_size, 0);
        assert_eq!(unbatched.scheduling_choice, None);
        assert_eq!(unbatched.input[0].dims, vec![-1, 256]);
    }

    /// Triton's ONNX Runtime backend adds the dynamic batcher to a model
    /// that can batch also when the config gave `max_batch_size` itself.
    #[test]
    fn a_given_max_batch_size_above_one_gets_the_dynamic_batcher() {
        let mut config = ModelConfig {
            max_batch_size: 2,
            ..Default::default()
        };
        complete(&mut config, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, 2);
        assert!(matches!(
            config.scheduling_choice,
            Some(model_config::SchedulingChoice::DynamicBatching(_))
        ));
        let mut one = ModelConfig {
            max_batch_size: 1,
            ..Default::default()
        };
        complete(&mut one, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(one.scheduling_choice, None);
        let mut sequence = ModelConfig {
            max_batch_size: 2,
            scheduling_choice: Some(model_config::SchedulingChoice::SequenceBatching(Default::default())),
            ..Default::default()
        };
        complete(&mut sequence, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert!(matches!(
            sequence.scheduling_choice,
            Some(model_config::SchedulingChoice::SequenceBatching(_))
        ));
    }

    #[test]
    fn partial_config_keeps_its_inputs_and_gains_outputs() {
        let mut config = ModelConfig {
            max_batch_size: 2,
            input: vec![ModelInput {
                name: "X".into(),
                dims: vec![256],
                ..Default::default()
            }],
            ..Default::default()
        };
        complete(&mut config, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, 2);
        assert_eq!(config.input[0].data_type, DataType::Fp32.to_config());
        assert_eq!(config.output[0].name, "Y");
        assert_eq!(config.output[0].dims, vec![10]);
        check_against(&config, &mlp()).unwrap();
    }

    #[test]
    fn complete_config_is_left_alone() {
        let mut config = ModelConfig::default();
        complete(&mut config, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        let mut explicit = config.clone();
        explicit.max_batch_size = 0;
        explicit.scheduling_choice = None;
        let before = explicit.clone();
        complete(&mut explicit, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(explicit, before);
    }

    #[test]
    fn disagreements_are_reported() {
        let mut config = ModelConfig::default();
        complete(&mut config, &mlp(), DEFAULT_MAX_BATCH_SIZE).unwrap();
        let mut wrong_type = config.clone();
        wrong_type.input[0].data_type = DataType::Int32.to_config();
        let err = check_against(&wrong_type, &mlp()).unwrap_err();
        assert!(
            err.message().contains("TYPE_INT32") && err.message().contains("'X'"),
            "{err}"
        );

        let mut wrong_dims = config.clone();
        wrong_dims.input[0].dims = vec![128];
        let err = check_against(&wrong_dims, &mlp()).unwrap_err();
        assert!(err.message().contains("'X'"), "{err}");

        let mut wrong_name = config.clone();
        wrong_name.input[0].name = "Z".into();
        let err = check_against(&wrong_name, &mlp()).unwrap_err();
        assert!(err.message().contains("'Z'"), "{err}");

        let mut wrong_output = config;
        wrong_output.output[0].name = "Q".into();
        assert!(check_against(&wrong_output, &mlp()).is_err());
    }
}
