//! Validation of a ModelEnsemble: the CEL rules, then the DAG itself
//! (Triton's ensemble checks): every tensor produced exactly once, every
//! step input and ensemble output produced by something, and no cycles.
//! The DAG rules are `nereid_proto::ensemble_dag`'s, which the server
//! checks again at load; here they become messages that name the steps.

use std::collections::BTreeSet;

use nereid_proto::ensemble_dag::{self, Dag, DagError, Graph, Producer, Step};

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
        errors.check(!autoscaling.scales_to_zero(), rules::ENSEMBLE_MIN_REPLICAS);
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
    check_dag(&mut errors, spec);
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

/// The DAG of `spec`, checked by the rules the server and the operator
/// share (`nereid_proto::ensemble_dag`): each tensor's producer and an
/// order of the steps, or every broken rule (steps by index in `spec.steps`).
pub fn ensemble_dag(spec: &ModelEnsembleSpec) -> Result<Dag, Vec<DagError>> {
    let graph = Graph {
        inputs: spec.inputs.iter().map(|t| t.name.as_str()).collect(),
        steps: spec
            .steps
            .iter()
            .map(|step| Step {
                reads: step.input_map.iter().map(|(i, t)| (i.as_str(), t.as_str())).collect(),
                writes: step.output_map.values().map(String::as_str).collect(),
            })
            .collect(),
        outputs: spec.outputs.iter().map(|t| t.name.as_str()).collect(),
    };
    ensemble_dag::check(&graph)
}

/// Every tensor produced once, every step input and ensemble output
/// produced, no cycle: each broken rule as a message naming steps by name.
fn check_dag(errors: &mut Errors, spec: &ModelEnsembleSpec) {
    let step_name = |i: usize| spec.steps[i].name.as_str();
    let describe = |producer: Producer| match producer {
        Producer::Input => "an ensemble input".to_string(),
        Producer::Step(i) => format!("step {:?}", step_name(i)),
    };
    for problem in ensemble_dag(spec).err().unwrap_or_default() {
        errors.push(match problem {
            DagError::ProducedTwice { tensor, first, then } => format!(
                "tensor {tensor:?} is produced more than once (by {} and by {})",
                describe(first),
                describe(then)
            ),
            DagError::Unproduced { step, input, tensor } => format!(
                "step {:?} reads tensor {tensor:?} (for its input {input:?}), \
                 which no ensemble input or step output produces",
                step_name(step)
            ),
            DagError::OutputNotProduced { output } => {
                format!("ensemble output {output:?} is not produced by any step")
            }
            DagError::Cycle { steps } => {
                let stuck: Vec<&str> = steps.into_iter().map(step_name).collect();
                format!("spec.steps form a cycle through steps {stuck:?}; an ensemble must be a DAG")
            }
        });
    }
}
