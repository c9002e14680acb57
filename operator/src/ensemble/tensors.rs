//! The ensemble's DAG against what its members serve: every name a step
//! maps is its member's own input or output, every required input is
//! mapped, and where tensors meet (an ensemble input and the step that
//! reads it, one step's output and the next one's input, a step's output
//! and the ensemble output it becomes) the datatypes agree and the shapes
//! fit. The DAG's own structure (cycles, tensors produced twice) is
//! `nereid_proto::ensemble_dag`'s, through `nereid_crds::ensemble_dag`, which
//! also says where each tensor comes from; the ensemble pod's server checks
//! all of it again at load.
//!
//! Shapes are compared as the pods will see them: with a batch dimension
//! in front when every member batches (then the ensemble batches too, up to
//! the smallest member's `max_batch_size`), else as declared.

use std::collections::BTreeMap;

use nereid_crds::ModelEnsembleSpec;
use nereid_proto::ensemble_dag::Producer;

use super::members::MemberConfig;

/// The ensemble's `max_batch_size`: the smallest of its members' when they
/// all batch, else 0.
pub fn max_batch_size(configs: &BTreeMap<String, MemberConfig>) -> i64 {
    let sizes: Vec<i64> = configs.values().map(|c| c.max_batch_size).collect();
    match sizes.iter().all(|&s| s > 0) {
        true => sizes.into_iter().min().unwrap_or(0),
        false => 0,
    }
}

/// A tensor where it is produced: its datatype, shape and producer.
struct Produced {
    datatype: String,
    shape: Vec<i64>,
    by: String,
}

/// Every problem of `spec` against the members' `configs` (one per step model).
pub fn check(spec: &ModelEnsembleSpec, configs: &BTreeMap<String, MemberConfig>) -> Result<(), Vec<String>> {
    let batching = max_batch_size(configs) > 0;
    let full = |member_batches: bool, dims: &[i64]| {
        let mut shape = Vec::with_capacity(dims.len() + 1);
        if member_batches {
            shape.push(-1);
        }
        shape.extend_from_slice(dims);
        shape
    };
    let step_name = |name: &str, model: &str| format!("step '{name}' (InferenceModel '{model}')");
    // Who produces each tensor is the DAG's (a broken DAG is the spec
    // validation's to report: then nothing is traced here).
    let dag = nereid_crds::ensemble_dag(spec).ok();
    let producer = |tensor: &str| dag.as_ref()?.producer(tensor);
    // What a tensor is where it is produced: as the ensemble input
    // declares it, or as the producing step's member declares that output.
    let produced = |tensor: &str| -> Option<Produced> {
        match producer(tensor)? {
            Producer::Input => {
                let input = spec.inputs.iter().find(|i| i.name == tensor)?;
                Some(Produced {
                    datatype: input.datatype.clone(),
                    shape: full(batching, &input.dims),
                    by: "the ensemble's input".into(),
                })
            }
            Producer::Step(index) => {
                let step = &spec.steps[index];
                let config = configs.get(&step.model)?;
                let (output, _) = step.output_map.iter().find(|(_, t)| *t == tensor)?;
                let declared = config.outputs.iter().find(|o| &o.name == output)?;
                Some(Produced {
                    datatype: declared.datatype().to_string(),
                    shape: full(config.max_batch_size > 0, &declared.dims),
                    by: step_name(&step.name, &step.model),
                })
            }
        }
    };
    let mut problems = Vec::new();
    for step in &spec.steps {
        let Some(config) = configs.get(&step.model) else {
            continue;
        };
        for output in step.output_map.keys() {
            if !config.outputs.iter().any(|o| &o.name == output) {
                problems.push(format!(
                    "{} maps output '{output}', which the model does not have (its outputs: {})",
                    step_name(&step.name, &step.model),
                    names(config.outputs.iter().map(|o| o.name.as_str()))
                ));
            }
        }
    }
    for step in &spec.steps {
        let Some(config) = configs.get(&step.model) else {
            continue;
        };
        let member_batches = config.max_batch_size > 0;
        let this = step_name(&step.name, &step.model);
        for input in config.inputs.iter().filter(|i| !i.optional) {
            if !step.input_map.contains_key(&input.name) {
                problems.push(format!("{this} does not map the model's input '{}'", input.name));
            }
        }
        for (input, tensor) in &step.input_map {
            let Some(declared) = config.inputs.iter().find(|i| &i.name == input) else {
                problems.push(format!(
                    "{this} maps input '{input}', which the model does not have (its inputs: {})",
                    names(config.inputs.iter().map(|i| i.name.as_str()))
                ));
                continue;
            };
            let Some(source) = produced(tensor) else {
                // An unproduced tensor is the DAG check's to report.
                continue;
            };
            if source.datatype != declared.datatype() {
                problems.push(format!(
                    "{this} reads tensor '{tensor}' as its input '{input}' of type {}, but {} gives it type {}",
                    declared.datatype(),
                    source.by,
                    source.datatype
                ));
            }
            let shape = full(member_batches, &declared.dims);
            if !fits(&source.shape, &shape) {
                problems.push(format!(
                    "{this} reads tensor '{tensor}' as its input '{input}' of shape {}, but {} gives it shape {}",
                    show(&shape),
                    source.by,
                    show(&source.shape)
                ));
            }
        }
    }
    for output in &spec.outputs {
        if let Some(source) = produced(&output.name) {
            if source.datatype != output.datatype {
                problems.push(format!(
                    "ensemble output '{}' is declared {}, but {} gives it type {}",
                    output.name, output.datatype, source.by, source.datatype
                ));
            }
            let shape = full(batching, &output.dims);
            if !fits(&source.shape, &shape) {
                problems.push(format!(
                    "ensemble output '{}' is declared with shape {}, but {} gives it shape {}",
                    output.name,
                    show(&shape),
                    source.by,
                    show(&source.shape)
                ));
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}

fn fits(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| *x == -1 || *y == -1 || x == y)
}

fn show(shape: &[i64]) -> String {
    format!("[{}]", shape.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use nereid_crds::{EnsembleStep, EnsembleTensor};

    use super::super::members::TensorConfig;
    use super::*;

    fn tensor(name: &str, data_type: &str, dims: &[i64]) -> TensorConfig {
        TensorConfig {
            name: name.into(),
            data_type: data_type.into(),
            dims: dims.to_vec(),
            optional: false,
        }
    }

    fn member(max_batch_size: i64, inputs: Vec<TensorConfig>, outputs: Vec<TensorConfig>) -> MemberConfig {
        MemberConfig {
            max_batch_size,
            inputs,
            outputs,
        }
    }

    fn step(name: &str, model: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> EnsembleStep {
        let map = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        EnsembleStep {
            name: name.into(),
            model: model.into(),
            model_version: None,
            input_map: map(inputs),
            output_map: map(outputs),
        }
    }

    fn declared(name: &str, datatype: &str, dims: &[i64]) -> EnsembleTensor {
        EnsembleTensor {
            name: name.into(),
            datatype: datatype.into(),
            dims: dims.to_vec(),
        }
    }

    fn configs() -> BTreeMap<String, MemberConfig> {
        BTreeMap::from([
            (
                "scaler".to_string(),
                member(
                    16,
                    vec![tensor("X", "TYPE_FP32", &[4])],
                    vec![tensor("variable", "TYPE_FP32", &[4])],
                ),
            ),
            (
                "classifier".to_string(),
                member(
                    8,
                    vec![tensor("features", "TYPE_FP32", &[4])],
                    vec![tensor("probabilities", "TYPE_FP32", &[3])],
                ),
            ),
        ])
    }

    fn spec(steps: Vec<EnsembleStep>, output: EnsembleTensor) -> ModelEnsembleSpec {
        ModelEnsembleSpec {
            steps,
            inputs: vec![declared("IN", "FP32", &[4])],
            outputs: vec![output],
            ..ModelEnsembleSpec::default()
        }
    }

    fn pipeline() -> Vec<EnsembleStep> {
        vec![
            step("scale", "scaler", &[("X", "IN")], &[("variable", "scaled")]),
            step(
                "classify",
                "classifier",
                &[("features", "scaled")],
                &[("probabilities", "PROB")],
            ),
        ]
    }

    #[test]
    fn a_matching_pipeline_passes_and_batches_like_its_smallest_member() {
        assert_eq!(
            check(&spec(pipeline(), declared("PROB", "FP32", &[3])), &configs()),
            Ok(())
        );
        assert_eq!(max_batch_size(&configs()), 8);
        let mut one_does_not_batch = configs();
        one_does_not_batch.get_mut("scaler").unwrap().max_batch_size = 0;
        assert_eq!(max_batch_size(&one_does_not_batch), 0);
    }

    #[test]
    fn names_the_member_must_have_are_checked() {
        let steps = vec![
            step("scale", "scaler", &[("Z", "IN")], &[("variable", "scaled")]),
            step(
                "classify",
                "classifier",
                &[("features", "scaled")],
                &[("probs", "PROB")],
            ),
        ];
        let problems = check(&spec(steps, declared("PROB", "FP32", &[3])), &configs()).unwrap_err();
        assert_eq!(
            problems,
            [
                "step 'classify' (InferenceModel 'classifier') maps output 'probs', which the model does not have (its outputs: 'probabilities')",
                "step 'scale' (InferenceModel 'scaler') does not map the model's input 'X'",
                "step 'scale' (InferenceModel 'scaler') maps input 'Z', which the model does not have (its inputs: 'X')",
            ]
        );
    }

    #[test]
    fn datatypes_and_shapes_must_meet() {
        let problems = check(&spec(pipeline(), declared("PROB", "INT64", &[2])), &configs()).unwrap_err();
        assert_eq!(
            problems,
            [
                "ensemble output 'PROB' is declared INT64, but step 'classify' (InferenceModel 'classifier') gives it type FP32",
                "ensemble output 'PROB' is declared with shape [-1,2], but step 'classify' (InferenceModel 'classifier') gives it shape [-1,3]",
            ]
        );
        let mut ints = configs();
        ints.get_mut("classifier").unwrap().inputs[0].data_type = "TYPE_INT32".into();
        let problems = check(&spec(pipeline(), declared("PROB", "FP32", &[3])), &ints).unwrap_err();
        assert_eq!(
            problems,
            [
                "step 'classify' (InferenceModel 'classifier') reads tensor 'scaled' as its input 'features' of type INT32, but step 'scale' (InferenceModel 'scaler') gives it type FP32"
            ]
        );
    }
}
