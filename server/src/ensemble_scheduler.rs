//! Triton's ensemble scheduler: one request to an ensemble walks its DAG of
//! member models.
//!
//! A step starts as soon as every tensor it reads is there, so steps that
//! do not depend on each other run at the same time. Each step is an
//! ordinary request to its member through the member's own `Model::infer`:
//! its own checks, its own scheduler (so it batches with the member's other
//! callers, direct or from other ensembles), its own statistics and
//! metrics. Tensors pass from step to step as `Bytes` handles, never copied.
//! The ensemble's parameters (priority, timeout, ...) go to every step, each
//! step of a traced request gets its own `InferRequest` span under the
//! ensemble's, and an error names the step that failed. Dropping the
//! ensemble's future (the client went away) drops every step's request,
//! which cancels it wherever it is queued.
//!
//! Members are looked up for every request, so a member reloaded since the
//! ensemble was loaded is the one called, and a member that was unloaded is
//! reported by name.
//!
//! - [`plan`]: the DAG checked against the members' configs at load (pure).

pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use nereid_proto::inference::ModelConfig;

use self::plan::{Plan, Step};
use crate::error::{Error, Result};
use crate::model_repository_manager::Members;
use crate::request::{InferRequest, RequestedOutput};
use crate::scheduler::Work;
use crate::tensor::Tensor;

pub struct EnsembleScheduler {
    name: String,
    plan: Plan,
    members: Members,
}

impl EnsembleScheduler {
    /// Plans the ensemble `config` against the members loaded now.
    pub fn new(config: &ModelConfig, members: Members) -> Result<Self> {
        let plan = plan::plan(config, &|name, version| members.config(name, version))?;
        Ok(EnsembleScheduler {
            name: config.name.clone(),
            plan,
            members,
        })
    }

    /// Whether every member can be called now (each has a ready version).
    pub fn members_ready(&self) -> Result<()> {
        for step in &self.plan.steps {
            self.members
                .get(&step.model, step.version)
                .map_err(|e| self.member_missing(step, &e))?;
        }
        Ok(())
    }

    /// Runs the DAG over the ensemble's inputs; returns every tensor the
    /// steps produced that the ensemble declares as an output (the model
    /// picks the requested ones by name).
    pub async fn run(&self, inputs: Vec<Tensor>, work: &Work<'_>) -> Result<Vec<Tensor>> {
        let mut tensors: HashMap<String, Tensor> = inputs.into_iter().map(|t| (t.name.clone(), t)).collect();
        let given: Vec<String> = tensors.keys().cloned().collect();
        let mut started = vec![false; self.plan.steps.len()];
        let mut running = FuturesUnordered::new();
        loop {
            for (i, step) in self.plan.steps.iter().enumerate() {
                if started[i] || !self.can_start(step, &tensors, &given) {
                    continue;
                }
                started[i] = true;
                let inputs = step
                    .inputs
                    .iter()
                    .filter_map(|(input, tensor)| {
                        let mut t = tensors.get(tensor)?.clone();
                        t.name.clone_from(input);
                        Some(t)
                    })
                    .collect();
                running.push(self.run_step(step, inputs, work));
            }
            match running.next().await {
                Some(produced) => {
                    for tensor in produced? {
                        tensors.insert(tensor.name.clone(), tensor);
                    }
                }
                None => break,
            }
        }
        if let Some(step) = self
            .plan
            .steps
            .iter()
            .zip(&started)
            .find(|(_, s)| !**s)
            .map(|(step, _)| step)
        {
            return Err(Error::invalid(format!(
                "ensemble '{}': {} could not run: an input it reads was not given",
                self.name,
                step.describe()
            )));
        }
        Ok(tensors.into_values().collect())
    }

    /// A step may start when each tensor it reads is there, or is an
    /// optional ensemble input the client did not send (the member gets
    /// that input left out).
    fn can_start(&self, step: &Step, tensors: &HashMap<String, Tensor>, given: &[String]) -> bool {
        step.inputs.iter().all(|(_, tensor)| {
            tensors.contains_key(tensor) || (!self.produced_by_a_step(tensor) && !given.contains(tensor))
        })
    }

    fn produced_by_a_step(&self, tensor: &str) -> bool {
        self.plan
            .steps
            .iter()
            .any(|s| s.outputs.iter().any(|(_, t)| t == tensor))
    }

    /// One step: a request to its member, its outputs renamed into the
    /// ensemble's tensors.
    async fn run_step(&self, step: &Step, inputs: Vec<Tensor>, work: &Work<'_>) -> Result<Vec<Tensor>> {
        let model = self
            .members
            .get(&step.model, step.version)
            .map_err(|e| self.member_missing(step, &e))?;
        let trace = work
            .trace
            .as_ref()
            .map(|t| Arc::new(t.child_request(model.name(), model.version(), work.id)));
        let request = InferRequest {
            model_name: step.model.clone(),
            model_version: step.version,
            id: work.id.to_string(),
            inputs,
            outputs: step.outputs.iter().map(|(o, _)| RequestedOutput::named(o)).collect(),
            parameters: work.parameters.clone(),
            trace_parent: work.trace_parent.to_vec(),
            trace: trace.clone(),
            ..Default::default()
        };
        let result = model.infer(request).await;
        if let Some(trace) = trace {
            trace.finish(result.as_ref().err());
        }
        let response = result.map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "in ensemble '{}', {} failed: {}",
                    self.name,
                    step.describe(),
                    e.message()
                ),
            )
        })?;
        Ok(response
            .outputs
            .into_iter()
            .filter_map(|mut t| {
                let (_, tensor) = step.outputs.iter().find(|(o, _)| *o == t.name)?;
                t.name.clone_from(tensor);
                Some(t)
            })
            .collect())
    }

    fn member_missing(&self, step: &Step, cause: &Error) -> Error {
        Error::unavailable(format!(
            "ensemble '{}': {} cannot run: {}",
            self.name,
            step.describe(),
            cause.message()
        ))
    }
}
