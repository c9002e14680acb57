//! Validation of a ModelEnsemble: the CEL rules, then the DAG itself
//! (Triton's ensemble checks): every tensor produced exactly once, every
//! step input and ensemble output produced by something, and no cycles.

use std::collections::{BTreeMap, BTreeSet};

use super::{Errors, check_autoscaling, check_ports};
use crate::ModelEnsembleSpec;
use crate::rules::{self, DATATYPES};

/// Checks a ModelEnsemble spec; returns every problem found.
pub fn validate_ensemble(spec: &ModelEnsembleSpec) -> Result<(), Vec<String>> {
    let mut errors = Errors::default();
    errors.check(!spec.steps.is_empty(), rules::STEPS_NOT_EMPTY);
    check_names(&mut errors, spec);
    errors.check(spec.replicas.is_none_or(|r| r >= 0), rules::ENSEMBLE_REPLICAS);
    if let Some(autoscaling) = &spec.autoscaling {
        check_autoscaling(&mut errors, autoscaling);
    }
    if let Some(ports) = spec.server.as_ref().and_then(|s| s.ports.as_ref()) {
        check_ports(&mut errors, ports);
    }
    let tensors = spec
        .inputs
        .iter()
        .map(|t| ("inputs", t))
        .chain(spec.outputs.iter().map(|t| ("outputs", t)));
    for (list, tensor) in tensors {
        if !DATATYPES.contains(&tensor.datatype.as_str()) {
            errors.push(format!(
                "spec.{list}: tensor {:?} has unknown datatype {:?} (one of {})",
                tensor.name,
                tensor.datatype,
                DATATYPES.join(", ")
            ));
        }
    }
    let producers = producers(&mut errors, spec);
    check_consumers(&mut errors, spec, &producers);
    check_acyclic(&mut errors, spec, &producers);
    errors.into_result()
}

/// Step names are present and unique; each step names a model.
fn check_names(errors: &mut Errors, spec: &ModelEnsembleSpec) {
    let mut seen = BTreeSet::new();
    for (i, step) in spec.steps.iter().enumerate() {
        if step.name.is_empty() {
            errors.push(format!("spec.steps[{i}].name must not be empty"));
        } else if !seen.insert(step.name.as_str()) {
            errors.push(format!(
                "{}: {:?} appears more than once",
                rules::STEP_NAMES_UNIQUE.message,
                step.name
            ));
        }
        if step.model.is_empty() {
            errors.push(format!("spec.steps[{i}].model must name an InferenceModel"));
        }
    }
}

/// Who produces a tensor: the client (an ensemble input) or a step (by index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Producer {
    Input,
    Step(usize),
}

/// Maps each tensor to its one producer; reports tensors produced twice.
fn producers<'a>(errors: &mut Errors, spec: &'a ModelEnsembleSpec) -> BTreeMap<&'a str, Producer> {
    let mut producers = BTreeMap::new();
    let inputs = spec.inputs.iter().map(|t| (t.name.as_str(), Producer::Input));
    let outputs = spec.steps.iter().enumerate().flat_map(|(i, step)| {
        step.output_map
            .values()
            .map(move |tensor| (tensor.as_str(), Producer::Step(i)))
    });
    for (tensor, producer) in inputs.chain(outputs) {
        if let Some(first) = producers.insert(tensor, producer) {
            errors.push(format!(
                "tensor {tensor:?} is produced more than once (by {} and by {})",
                describe(spec, first),
                describe(spec, producer)
            ));
        }
    }
    producers
}

fn describe(spec: &ModelEnsembleSpec, producer: Producer) -> String {
    match producer {
        Producer::Input => "an ensemble input".to_string(),
        Producer::Step(i) => format!("step {:?}", spec.steps[i].name),
    }
}

/// Every step input and every ensemble output has a producer.
fn check_consumers(errors: &mut Errors, spec: &ModelEnsembleSpec, producers: &BTreeMap<&str, Producer>) {
    for step in &spec.steps {
        for (model_input, tensor) in &step.input_map {
            if !producers.contains_key(tensor.as_str()) {
                errors.push(format!(
                    "step {:?} reads tensor {tensor:?} (for its input {model_input:?}), \
                     which no ensemble input or step output produces",
                    step.name
                ));
            }
        }
    }
    for output in &spec.outputs {
        if !matches!(producers.get(output.name.as_str()), Some(Producer::Step(_))) {
            errors.push(format!("ensemble output {:?} is not produced by any step", output.name));
        }
    }
}

/// The steps form a DAG: Kahn's algorithm leaves exactly the steps on or
/// behind a cycle unscheduled.
fn check_acyclic(errors: &mut Errors, spec: &ModelEnsembleSpec, producers: &BTreeMap<&str, Producer>) {
    // For each step, the steps it waits for (deduplicated).
    let waits_for: Vec<BTreeSet<usize>> = spec
        .steps
        .iter()
        .map(|step| {
            step.input_map
                .values()
                .filter_map(|tensor| match producers.get(tensor.as_str()) {
                    Some(Producer::Step(j)) => Some(*j),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut done = vec![false; spec.steps.len()];
    loop {
        let ready: Vec<usize> = (0..spec.steps.len())
            .filter(|&i| !done[i] && waits_for[i].iter().all(|&j| done[j]))
            .collect();
        if ready.is_empty() {
            break;
        }
        for i in ready {
            done[i] = true;
        }
    }
    let stuck: Vec<&str> = spec
        .steps
        .iter()
        .zip(&done)
        .filter(|(_, done)| !**done)
        .map(|(step, _)| step.name.as_str())
        .collect();
    if !stuck.is_empty() {
        errors.push(format!(
            "spec.steps form a cycle through steps {stuck:?}; an ensemble must be a DAG"
        ));
    }
}
