//! An ensemble's steps as a graph of tensors, checked once for everyone:
//! the CRD validation (`nereid_crds::validate_ensemble`), the operator (which
//! follows each tensor to its producer to compare types) and the server
//! (which walks the steps in the order found here) all call [`check`].
//!
//! The rules are Triton's ensemble rules that need no model config:
//!
//! 1. every tensor is produced once, by the client (an ensemble input) or
//!    by one step (one of its outputs);
//! 2. every tensor a step reads is produced;
//! 3. every ensemble output is produced by a step (an input passed
//!    straight through is not an output);
//! 4. no step waits, through the tensors it reads, on itself: a DAG.
//!
//! Plain data in (tensor names, steps by position), typed errors out: each
//! caller names steps its own way (the CRD by step name, the server by
//! position and model) when it turns a [`DagError`] into a message.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

/// The tensors of one step, as far as the graph cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step<'a> {
    /// What it reads: (its model's input, the ensemble tensor fed to it).
    pub reads: Vec<(&'a str, &'a str)>,
    /// The ensemble tensors it produces (from its model's outputs).
    pub writes: Vec<&'a str>,
}

/// An ensemble: what the client brings, the steps, what the client gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph<'a> {
    /// The ensemble's inputs.
    pub inputs: Vec<&'a str>,
    /// The steps, by position: errors and the order name steps by index here.
    pub steps: Vec<Step<'a>>,
    /// The ensemble's outputs.
    pub outputs: Vec<&'a str>,
}

/// Who produces a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Producer {
    /// The client: it is an ensemble input.
    Input,
    /// The step at this index.
    Step(usize),
}

/// A graph that passed [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dag {
    /// Each tensor's one producer.
    pub producers: BTreeMap<String, Producer>,
    /// Every step index, each after the steps it reads from: round by
    /// round (all steps whose producers are done), by index within a round.
    pub order: Vec<usize>,
}

impl Dag {
    /// The producer of `tensor`, if anything produces it.
    pub fn producer(&self, tensor: &str) -> Option<Producer> {
        self.producers.get(tensor).copied()
    }
}

/// One broken rule.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum DagError {
    /// Rule 1: `tensor` has a second producer, `then`, after `first`.
    #[error("tensor '{tensor}' is produced more than once ({first:?} and {then:?})")]
    ProducedTwice {
        tensor: String,
        first: Producer,
        then: Producer,
    },
    /// Rule 2: the step at `step` reads `tensor` for its model's `input`,
    /// and nothing produces it.
    #[error("step {step} reads tensor '{tensor}' (for its input '{input}'), which nothing produces")]
    Unproduced { step: usize, input: String, tensor: String },
    /// Rule 3: no step produces the ensemble output `output`.
    #[error("ensemble output '{output}' is not produced by any step")]
    OutputNotProduced { output: String },
    /// Rule 4: these steps (by index, ascending) are on a cycle or wait on one.
    #[error("steps {steps:?} form a cycle or wait on one")]
    Cycle { steps: Vec<usize> },
}

/// Checks every rule; on failure, every broken one: first each tensor
/// produced twice (inputs, then steps in order), then each unproduced read
/// (steps in order), then each output no step produces, then the cycle.
/// Where a tensor has two producers, the later one is the one the other
/// rules see.
pub fn check(graph: &Graph<'_>) -> Result<Dag, Vec<DagError>> {
    let mut errors = Vec::new();
    let mut producers: BTreeMap<&str, Producer> = BTreeMap::new();
    let inputs = graph.inputs.iter().map(|&tensor| (tensor, Producer::Input));
    let writes = graph
        .steps
        .iter()
        .enumerate()
        .flat_map(|(i, step)| step.writes.iter().map(move |&tensor| (tensor, Producer::Step(i))));
    for (tensor, producer) in inputs.chain(writes) {
        if let Some(first) = producers.insert(tensor, producer) {
            errors.push(DagError::ProducedTwice {
                tensor: tensor.to_string(),
                first,
                then: producer,
            });
        }
    }
    for (step, reads) in graph.steps.iter().enumerate() {
        for &(input, tensor) in &reads.reads {
            if !producers.contains_key(tensor) {
                errors.push(DagError::Unproduced {
                    step,
                    input: input.to_string(),
                    tensor: tensor.to_string(),
                });
            }
        }
    }
    for &output in &graph.outputs {
        if !matches!(producers.get(output), Some(Producer::Step(_))) {
            errors.push(DagError::OutputNotProduced {
                output: output.to_string(),
            });
        }
    }
    let (order, stuck) = topological_order(graph, &producers);
    if !stuck.is_empty() {
        errors.push(DagError::Cycle { steps: stuck });
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Dag {
        producers: producers.into_iter().map(|(t, p)| (t.to_string(), p)).collect(),
        order,
    })
}

/// Kahn's algorithm in rounds: the steps in an order where each comes after
/// those it reads from, and the steps left over (on or behind a cycle).
fn topological_order(graph: &Graph<'_>, producers: &BTreeMap<&str, Producer>) -> (Vec<usize>, Vec<usize>) {
    let waits_for: Vec<BTreeSet<usize>> = graph
        .steps
        .iter()
        .map(|step| {
            step.reads
                .iter()
                .filter_map(|(_, tensor)| match producers.get(tensor) {
                    Some(Producer::Step(j)) => Some(*j),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut done = vec![false; graph.steps.len()];
    let mut order = Vec::with_capacity(graph.steps.len());
    loop {
        let ready: Vec<usize> = (0..graph.steps.len())
            .filter(|&i| !done[i] && waits_for[i].iter().all(|&j| done[j]))
            .collect();
        if ready.is_empty() {
            break;
        }
        for i in ready {
            done[i] = true;
            order.push(i);
        }
    }
    let stuck = (0..graph.steps.len()).filter(|&i| !done[i]).collect();
    (order, stuck)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step<'a>(reads: &[(&'a str, &'a str)], writes: &[&'a str]) -> Step<'a> {
        Step {
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        }
    }

    /// IN -> a -> mid -> b -> OUT, the steps listed consumer first.
    fn chain() -> Graph<'static> {
        Graph {
            inputs: vec!["IN"],
            steps: vec![step(&[("x", "mid")], &["OUT"]), step(&[("x", "IN")], &["mid"])],
            outputs: vec!["OUT"],
        }
    }

    #[test]
    fn a_chain_is_ordered_producers_first() {
        let dag = check(&chain()).unwrap();
        assert_eq!(dag.order, [1, 0]);
        assert_eq!(dag.producer("IN"), Some(Producer::Input));
        assert_eq!(dag.producer("mid"), Some(Producer::Step(1)));
        assert_eq!(dag.producer("nowhere"), None);
    }

    #[test]
    fn independent_steps_share_a_round_in_index_order() {
        let diamond = Graph {
            inputs: vec!["IN"],
            steps: vec![
                step(&[("x", "IN")], &["l"]),
                step(&[("x", "l"), ("y", "r")], &["OUT"]),
                step(&[("x", "IN")], &["r"]),
            ],
            outputs: vec!["OUT"],
        };
        assert_eq!(check(&diamond).unwrap().order, [0, 2, 1]);
    }

    #[test]
    fn a_tensor_produced_twice_names_both_producers() {
        let mut graph = chain();
        graph.steps.push(step(&[], &["mid", "IN"]));
        assert_eq!(
            check(&graph).unwrap_err(),
            [
                DagError::ProducedTwice {
                    tensor: "mid".into(),
                    first: Producer::Step(1),
                    then: Producer::Step(2),
                },
                DagError::ProducedTwice {
                    tensor: "IN".into(),
                    first: Producer::Input,
                    then: Producer::Step(2),
                },
            ]
        );
    }

    #[test]
    fn unproduced_reads_and_outputs_are_each_reported() {
        let graph = Graph {
            inputs: vec!["IN"],
            steps: vec![step(&[("x", "IN"), ("y", "nowhere")], &["mid"])],
            outputs: vec!["mid", "IN", "missing"],
        };
        assert_eq!(
            check(&graph).unwrap_err(),
            [
                DagError::Unproduced {
                    step: 0,
                    input: "y".into(),
                    tensor: "nowhere".into(),
                },
                // An input passed straight through is not produced by a step.
                DagError::OutputNotProduced { output: "IN".into() },
                DagError::OutputNotProduced {
                    output: "missing".into()
                },
            ]
        );
    }

    #[test]
    fn a_cycle_names_the_steps_on_it_and_behind_it() {
        let graph = Graph {
            inputs: vec!["IN"],
            steps: vec![
                step(&[("x", "IN")], &["ok"]),
                step(&[("x", "b")], &["a"]),
                step(&[("x", "a")], &["b"]),
                step(&[("x", "b")], &["OUT"]),
            ],
            outputs: vec!["OUT"],
        };
        assert_eq!(check(&graph).unwrap_err(), [DagError::Cycle { steps: vec![1, 2, 3] }]);
        let own = Graph {
            inputs: vec![],
            steps: vec![step(&[("x", "self")], &["self"])],
            outputs: vec!["self"],
        };
        assert_eq!(check(&own).unwrap_err(), [DagError::Cycle { steps: vec![0] }]);
    }
}
