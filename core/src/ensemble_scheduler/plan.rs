//! An ensemble's DAG, checked at load against its members' configs and
//! turned into the plan the scheduler walks. Pure: the members' configs come
//! in through a lookup, so every rule is tested without loading a model.
//!
//! The checks are Triton's: steps name loaded models; every mapped name is
//! an input or output of its model and every required input is mapped;
//! every ensemble tensor is produced exactly once (by the client or by one
//! step) and every tensor a step reads is produced; every ensemble output
//! comes from a step; no cycles; and the tensors agree on datatype and on
//! shape where they meet. Steps have no names in Triton's config, so a
//! problem names the step by position and model: `step 2 (model 'mlp')`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use nereid_proto::ensemble_dag::{self, Dag, DagError, Graph, Producer};
use nereid_proto::inference::{ModelConfig, model_config::SchedulingChoice};

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::model_config::{input_datatype, output_datatype};

/// What the scheduler runs: the steps in an order in which every step comes
/// after the steps it reads from (steps that do not depend on each other
/// still run at the same time).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// One step: a member model and how its tensors map to the ensemble's.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Position in the config's `step` list, from 1, for messages.
    pub number: usize,
    pub model: String,
    /// `None`: the member's latest ready version.
    pub version: Option<i64>,
    /// (member input, ensemble tensor).
    pub inputs: Vec<(String, String)>,
    /// (member output, ensemble tensor).
    pub outputs: Vec<(String, String)>,
    /// The member may answer with any number of responses: the steps
    /// after it run once for each.
    pub decoupled: bool,
}

impl Step {
    /// `step 2 (model 'mlp')`.
    pub fn describe(&self) -> String {
        format!("step {} (model '{}')", self.number, self.model)
    }
}

/// The member models an ensemble config names, in step order, each once.
pub fn members(config: &ModelConfig) -> Vec<String> {
    let mut seen = BTreeSet::new();
    scheduling(config)
        .map(|s| s.step.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|s| seen.insert(s.model_name.clone()))
        .map(|s| s.model_name.clone())
        .collect()
}

fn scheduling(config: &ModelConfig) -> Option<&nereid_proto::inference::ModelEnsembling> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(e)) => Some(e),
        _ => None,
    }
}

/// A tensor of the ensemble as it flows: its type and its full shape (the
/// batch dimension included when its model batches, as `-1`).
#[derive(Debug, Clone, PartialEq)]
struct Flow {
    datatype: DataType,
    shape: Vec<i64>,
    /// Who produces it, for messages.
    by: String,
}

/// Finds a member's config by name and version (`None`: not loaded).
pub type MemberConfig<'a> = &'a dyn Fn(&str, Option<i64>) -> Option<Arc<ModelConfig>>;

/// Checks the ensemble `config` against the configs `member` finds and
/// returns its plan.
pub fn plan(config: &ModelConfig, member: MemberConfig<'_>) -> Result<Plan> {
    let name = &config.name;
    let bad = |message: String| Error::invalid(format!("ensemble '{name}': {message}"));
    let Some(scheduling) = scheduling(config) else {
        return Err(bad("platform 'ensemble' needs ensemble_scheduling".into()));
    };
    if scheduling.step.is_empty() {
        return Err(bad("ensemble_scheduling must contain at least one step".into()));
    }
    let batching = config.max_batch_size > 0;

    // What the client brings.
    let mut tensors: BTreeMap<String, Flow> = BTreeMap::new();
    for input in &config.input {
        let datatype =
            input_datatype(input).ok_or_else(|| bad(format!("input '{}' has no valid data_type", input.name)))?;
        tensors.insert(
            input.name.clone(),
            Flow {
                datatype,
                shape: full_shape(batching, &input.dims),
                by: "an ensemble input".into(),
            },
        );
    }

    let mut steps = Vec::with_capacity(scheduling.step.len());
    let mut member_configs = Vec::with_capacity(scheduling.step.len());
    for (i, s) in scheduling.step.iter().enumerate() {
        let number = i + 1;
        if s.model_name.is_empty() {
            return Err(bad(format!("step {number} names no model")));
        }
        let step_name = format!("step {number} (model '{}')", s.model_name);
        if s.model_name == *name {
            return Err(bad(format!("{step_name} runs the ensemble itself")));
        }
        let version = match s.model_version {
            -1 | 0 => None,
            v if v > 0 => Some(v),
            v => return Err(bad(format!("{step_name} has model_version {v}; use -1 for the latest"))),
        };
        let Some(model) = member(&s.model_name, version) else {
            let which = version.map_or_else(String::new, |v| format!(" version {v}"));
            return Err(Error::unavailable(format!(
                "ensemble '{name}': {step_name} needs model '{}'{which}, which is not loaded",
                s.model_name
            )));
        };
        let decoupled = model.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled);
        if batching && model.max_batch_size < config.max_batch_size {
            return Err(bad(format!(
                "the ensemble allows maximum batch size {}, but {step_name} only allows {}",
                config.max_batch_size, model.max_batch_size
            )));
        }
        for key in s.input_map.keys() {
            if !model.input.iter().any(|i| &i.name == key) {
                return Err(bad(format!(
                    "{step_name} maps '{key}', which is not an input of model '{}'",
                    s.model_name
                )));
            }
        }
        for input in model.input.iter().filter(|i| !i.optional) {
            if !s.input_map.contains_key(&input.name) {
                return Err(bad(format!(
                    "{step_name} does not map the model's input '{}'",
                    input.name
                )));
            }
        }
        for key in s.output_map.keys() {
            if !model.output.iter().any(|o| &o.name == key) {
                return Err(bad(format!(
                    "{step_name} maps '{key}', which is not an output of model '{}'",
                    s.model_name
                )));
            }
        }
        let mut inputs: Vec<(String, String)> = s.input_map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut outputs: Vec<(String, String)> = s.output_map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        inputs.sort();
        outputs.sort();
        steps.push(Step {
            number,
            model: s.model_name.clone(),
            version,
            inputs,
            outputs,
            decoupled,
        });
        member_configs.push(model);
    }

    // The DAG rules the CRD and the operator share: every tensor produced
    // once (reported first: what a tensor is would be ambiguous), every read
    // tensor produced, every output a step's, no cycle (reported below,
    // after the types of the tensors that are produced).
    let dag = check_dag(config, &steps);
    if let Err(problems) = &dag
        && let Some(twice @ DagError::ProducedTwice { .. }) = problems.first()
    {
        return Err(bad(dag_problem(&steps, twice)));
    }

    // Remember what each step produces.
    for (step, model) in steps.iter().zip(&member_configs) {
        let member_batching = model.max_batch_size > 0;
        for (output, tensor) in &step.outputs {
            let declared = model.output.iter().find(|o| &o.name == output).expect("checked above");
            let flow = Flow {
                datatype: output_datatype(declared).expect("member configs are validated"),
                shape: full_shape(member_batching, &declared.dims),
                by: step.describe(),
            };
            tensors.insert(tensor.clone(), flow);
        }
    }

    // Every read tensor exists and agrees with what reads it.
    for (step, model) in steps.iter().zip(&member_configs) {
        let member_batching = model.max_batch_size > 0;
        for (input, tensor) in &step.inputs {
            let Some(flow) = tensors.get(tensor) else {
                continue; // The DAG's problem, reported below.
            };
            let declared = model.input.iter().find(|i| &i.name == input).expect("checked above");
            let want = input_datatype(declared).expect("member configs are validated");
            if flow.datatype != want {
                return Err(bad(format!(
                    "tensor '{tensor}' is {} ({}), but {} reads it as input '{input}' of type {want}",
                    flow.datatype,
                    flow.by,
                    step.describe()
                )));
            }
            let shape = full_shape(member_batching, &declared.dims);
            if !compatible(&flow.shape, &shape) {
                return Err(bad(format!(
                    "tensor '{tensor}' has shape {} ({}), but {} reads it as input '{input}' of shape {}",
                    show(&flow.shape),
                    flow.by,
                    step.describe(),
                    show(&shape)
                )));
            }
        }
    }

    // Every ensemble output comes from a step, with the declared type and shape.
    for output in &config.output {
        let declared_type =
            output_datatype(output).ok_or_else(|| bad(format!("output '{}' has no valid data_type", output.name)))?;
        let Some(flow) = tensors.get(&output.name).filter(|f| f.by != "an ensemble input") else {
            continue; // The DAG's problem, reported below.
        };
        let shape = full_shape(batching, &output.dims);
        if flow.datatype != declared_type || !compatible(&flow.shape, &shape) {
            return Err(bad(format!(
                "output '{}' is declared {declared_type} {}, but {} produces {} {}",
                output.name,
                show(&shape),
                flow.by,
                flow.datatype,
                show(&flow.shape)
            )));
        }
    }

    let steps = match dag {
        Ok(dag) => in_dependency_order(steps, dag.order),
        Err(problems) => return Err(bad(dag_problem(&steps, &problems[0]))),
    };
    decoupled_steps_in_line(name, &steps)?;
    Ok(Plan { steps })
}

impl Plan {
    /// Whether a step may answer with many responses, which makes the
    /// ensemble decoupled too.
    pub fn is_decoupled(&self) -> bool {
        self.steps.iter().any(|s| s.decoupled)
    }

    /// Whether step `later` reads, directly or through other steps, what
    /// step `earlier` produces (indices in plan order).
    pub fn feeds(&self, earlier: usize, later: usize) -> bool {
        feeds(&self.steps, earlier, later)
    }
}

/// [`Plan::feeds`] over steps in dependency order.
fn feeds(steps: &[Step], earlier: usize, later: usize) -> bool {
    let mut reached = vec![false; steps.len()];
    reached[earlier] = true;
    for i in earlier + 1..steps.len() {
        reached[i] = steps[i].inputs.iter().any(|(_, tensor)| {
            steps[..i]
                .iter()
                .enumerate()
                .any(|(j, s)| reached[j] && s.outputs.iter().any(|(_, t)| t == tensor))
        });
    }
    reached[later]
}

/// Decoupled steps must lie on one line, each feeding the next: the steps
/// after a decoupled step run once per response, and two streams that do
/// not feed each other have no pairing of their responses to run them on.
fn decoupled_steps_in_line(name: &str, steps: &[Step]) -> Result<()> {
    let decoupled: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].decoupled).collect();
    for pair in decoupled.windows(2) {
        if !feeds(steps, pair[0], pair[1]) {
            return Err(Error::invalid(format!(
                "ensemble '{name}': {} and {} are both decoupled and neither reads what the other produces; \
                 decoupled steps must follow one another",
                steps[pair[0]].describe(),
                steps[pair[1]].describe()
            )));
        }
    }
    Ok(())
}

/// The shared DAG check (`nereid_proto::ensemble_dag`) of the ensemble
/// `config` with its `steps`.
fn check_dag(config: &ModelConfig, steps: &[Step]) -> std::result::Result<Dag, Vec<DagError>> {
    let graph = Graph {
        inputs: config.input.iter().map(|i| i.name.as_str()).collect(),
        steps: steps
            .iter()
            .map(|s| ensemble_dag::Step {
                reads: s.inputs.iter().map(|(i, t)| (i.as_str(), t.as_str())).collect(),
                writes: s.outputs.iter().map(|(_, t)| t.as_str()).collect(),
            })
            .collect(),
        outputs: config.output.iter().map(|o| o.name.as_str()).collect(),
    };
    ensemble_dag::check(&graph)
}

/// A broken DAG rule in this file's words, naming steps by position and model.
fn dag_problem(steps: &[Step], problem: &DagError) -> String {
    let by = |producer: &Producer| match producer {
        Producer::Input => "an ensemble input".to_string(),
        Producer::Step(i) => steps[*i].describe(),
    };
    match problem {
        DagError::ProducedTwice { tensor, first, then } => format!(
            "tensor '{tensor}' is produced more than once (by {} and by {})",
            by(first),
            by(then)
        ),
        DagError::Unproduced { step, input, tensor } => format!(
            "{} reads tensor '{tensor}' (for its input '{input}'), which no ensemble input or step output produces",
            steps[*step].describe()
        ),
        DagError::OutputNotProduced { output } => format!("output '{output}' is not produced by any step"),
        DagError::Cycle { steps: stuck } => {
            let stuck: Vec<String> = stuck.iter().map(|&i| steps[i].describe()).collect();
            format!(
                "the steps form a cycle through {}; an ensemble must be a DAG",
                stuck.join(", ")
            )
        }
    }
}

/// The steps in the DAG check's `order`: producers first.
fn in_dependency_order(steps: Vec<Step>, order: Vec<usize>) -> Vec<Step> {
    let mut slots: Vec<Option<Step>> = steps.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// A tensor's full shape: the batch dimension (`-1`) first when its model batches.
fn full_shape(batching: bool, dims: &[i64]) -> Vec<i64> {
    let mut shape = Vec::with_capacity(dims.len() + 1);
    if batching {
        shape.push(-1);
    }
    shape.extend_from_slice(dims);
    shape
}

/// Same rank, and each dimension equal or variable (`-1`) on either side.
fn compatible(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| *x == -1 || *y == -1 || x == y)
}

fn show(shape: &[i64]) -> String {
    format!("[{}]", shape.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::text::parse;

    fn config(text: &str) -> Arc<ModelConfig> {
        Arc::new(parse(text).unwrap())
    }

    /// scale: FP32 [4] -> [4], batching 8; classify: FP32 [4] -> FP32 [3], batching 8.
    fn members(name: &str, _: Option<i64>) -> Option<Arc<ModelConfig>> {
        match name {
            "scale" => Some(config(
                r#"name: "scale" max_batch_size: 8
                   input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
                   output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]"#,
            )),
            "classify" => Some(config(
                r#"name: "classify" max_batch_size: 8
                   input [ { name: "FEATURES" data_type: TYPE_FP32 dims: [ 4 ] } ]
                   output [ { name: "PROB" data_type: TYPE_FP32 dims: [ 3 ] } ]"#,
            )),
            "small" => Some(config(
                r#"name: "small" max_batch_size: 2
                   input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
                   output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]"#,
            )),
            "stream" => Some(config(
                r#"name: "stream" max_batch_size: 8 model_transaction_policy { decoupled: true }
                   input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
                   output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]"#,
            )),
            "ints" => Some(config(
                r#"name: "ints" max_batch_size: 8
                   input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] } ]
                   output [ { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] } ]"#,
            )),
            _ => None,
        }
    }

    fn ensemble(steps: &str) -> ModelConfig {
        parse(&format!(
            r#"name: "pipe" platform: "ensemble" max_batch_size: 8
               input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
               output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] }} ]
               ensemble_scheduling {{ step [ {steps} ] }}"#
        ))
        .unwrap()
    }

    const SCALE: &str = r#"{ model_name: "scale" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "scaled" } }"#;
    const CLASSIFY: &str = r#"{ model_name: "classify" model_version: -1 input_map { key: "FEATURES" value: "scaled" } output_map { key: "PROB" value: "OUT" } }"#;

    fn error(steps: &str) -> String {
        plan(&ensemble(steps), &members).unwrap_err().message().to_string()
    }

    #[test]
    fn a_chain_plans_its_steps_producers_first() {
        // Listed consumer first: the plan still runs the scaler first.
        let plan = plan(&ensemble(&format!("{CLASSIFY}, {SCALE}")), &members).unwrap();
        let order: Vec<&str> = plan.steps.iter().map(|s| s.model.as_str()).collect();
        assert_eq!(order, ["scale", "classify"]);
        assert_eq!(plan.steps[0].number, 2);
        assert_eq!(plan.steps[0].inputs, [("X".to_string(), "IN".to_string())]);
        assert_eq!(plan.steps[1].version, None);
    }

    #[test]
    fn decoupled_steps_make_a_decoupled_ensemble_and_must_follow_one_another() {
        let stream = SCALE.replace("\"scale\"", "\"stream\"");
        let planned = plan(&ensemble(&format!("{stream}, {CLASSIFY}")), &members).unwrap();
        assert!(planned.is_decoupled() && planned.steps[0].decoupled && !planned.steps[1].decoupled);
        assert!(planned.feeds(0, 1) && !planned.feeds(1, 0));
        let unary = plan(&ensemble(&format!("{SCALE}, {CLASSIFY}")), &members).unwrap();
        assert!(!unary.is_decoupled());

        // Two streams side by side: nothing pairs their responses.
        let beside = stream.replace("\"scaled\"", "\"other\"");
        let e = error(&format!("{stream}, {beside}, {CLASSIFY}"));
        assert!(
            e.contains("are both decoupled and neither reads what the other produces"),
            "{e}"
        );
        // One after the other: each response of the first runs the second.
        let after =
            r#"{ model_name: "stream" input_map { key: "X" value: "scaled" } output_map { key: "Y" value: "again" } }"#;
        let classify_again = CLASSIFY.replace("\"scaled\"", "\"again\"");
        let chained = plan(&ensemble(&format!("{stream}, {after}, {classify_again}")), &members).unwrap();
        assert!(chained.feeds(0, 1) && chained.feeds(0, 2) && chained.feeds(1, 2));
    }

    #[test]
    fn a_member_that_is_not_loaded_is_named() {
        let e = plan(&ensemble(&SCALE.replace("\"scale\"", "\"gone\"")), &members).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Unavailable);
        assert_eq!(
            e.message(),
            "ensemble 'pipe': step 1 (model 'gone') needs model 'gone', which is not loaded"
        );
    }

    #[test]
    fn names_must_be_the_members_own() {
        let e = error(&format!("{}, {CLASSIFY}", SCALE.replace("key: \"X\"", "key: \"Z\"")));
        assert_eq!(
            e,
            "ensemble 'pipe': step 1 (model 'scale') maps 'Z', which is not an input of model 'scale'"
        );
        let e = error(&format!("{}, {CLASSIFY}", SCALE.replace("key: \"Y\"", "key: \"W\"")));
        assert_eq!(
            e,
            "ensemble 'pipe': step 1 (model 'scale') maps 'W', which is not an output of model 'scale'"
        );
        let unmapped = r#"{ model_name: "scale" output_map { key: "Y" value: "scaled" } }"#;
        let e = error(&format!("{unmapped}, {CLASSIFY}"));
        assert_eq!(
            e,
            "ensemble 'pipe': step 1 (model 'scale') does not map the model's input 'X'"
        );
    }

    #[test]
    fn tensors_are_produced_once_and_read_only_when_produced() {
        let twice = format!("{SCALE}, {SCALE}, {CLASSIFY}");
        assert_eq!(
            error(&twice),
            "ensemble 'pipe': tensor 'scaled' is produced more than once (by step 1 (model 'scale') and by step 2 (model 'scale'))"
        );
        let missing = CLASSIFY.replace("\"scaled\"", "\"nowhere\"");
        assert_eq!(
            error(&format!("{SCALE}, {missing}")),
            "ensemble 'pipe': step 2 (model 'classify') reads tensor 'nowhere' (for its input 'FEATURES'), which no ensemble input or step output produces"
        );
        assert_eq!(
            error(SCALE),
            "ensemble 'pipe': output 'OUT' is not produced by any step"
        );
    }

    #[test]
    fn a_cycle_is_refused_with_its_steps() {
        // scale reads classify's... no: two scale steps feeding each other.
        let a = r#"{ model_name: "scale" input_map { key: "X" value: "b" } output_map { key: "Y" value: "a" } }"#;
        let b = r#"{ model_name: "small" input_map { key: "X" value: "a" } output_map { key: "Y" value: "b" } }"#;
        let config = parse(&format!(
            r#"name: "loop" platform: "ensemble" max_batch_size: 2
                   input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
                   output [ {{ name: "a" data_type: TYPE_FP32 dims: [ 4 ] }} ]
                   ensemble_scheduling {{ step [ {a}, {b} ] }}"#
        ))
        .unwrap();
        assert_eq!(
            plan(&config, &members).unwrap_err().message(),
            "ensemble 'loop': the steps form a cycle through step 1 (model 'scale'), step 2 (model 'small'); an ensemble must be a DAG"
        );
    }

    #[test]
    fn datatypes_shapes_and_batch_sizes_must_agree() {
        let ints = r#"{ model_name: "ints" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "i" } }"#;
        let e = error(&format!("{ints}, {CLASSIFY}"));
        assert!(
            e.starts_with("ensemble 'pipe': tensor 'IN' is FP32 (an ensemble input), but step 1 (model 'ints') reads it as input 'X' of type INT32"),
            "{e}"
        );
        // classify's PROB [3] fed into scale's X [4].
        let wrong = r#"{ model_name: "scale" input_map { key: "X" value: "OUT" } output_map { key: "Y" value: "z" } }"#;
        let e = error(&format!("{SCALE}, {CLASSIFY}, {wrong}"));
        assert_eq!(
            e,
            "ensemble 'pipe': tensor 'OUT' has shape [-1,3] (step 2 (model 'classify')), but step 3 (model 'scale') reads it as input 'X' of shape [-1,4]"
        );
        let small = SCALE.replace("\"scale\"", "\"small\"");
        assert_eq!(
            error(&format!("{small}, {CLASSIFY}")),
            "ensemble 'pipe': the ensemble allows maximum batch size 8, but step 1 (model 'small') only allows 2"
        );
    }

    #[test]
    fn members_are_listed_once_in_step_order() {
        let config = ensemble(&format!("{CLASSIFY}, {SCALE}, {SCALE}"));
        assert_eq!(super::members(&config), ["classify", "scale"]);
    }
}
