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
//! ensemble's, and an error names the step that failed. The DAG runs on
//! its own task, which stops when the client goes away; that drops every
//! step's request, which cancels it wherever it is queued.
//!
//! A decoupled member streams: the steps after it run once for each of its
//! responses, and each pass through the DAG sends the ensemble's outputs
//! as one response, so an ensemble with a decoupled step is decoupled too
//! (as in Triton, where a decoupled step's responses flow on one by one).
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
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use nereid_proto::inference::ModelConfig;

use self::plan::{Plan, Step};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::model::stream::ResponseStream;
use crate::model_repository_manager::Members;
use crate::request::{InferRequest, RequestedOutput};
use crate::response::InferResponse;
use crate::scheduler::{Ran, Runner};
use crate::tensor::Tensor;

pub struct EnsembleScheduler {
    name: String,
    plan: Plan,
    members: Members,
    /// The ensemble's outputs, which its responses carry.
    outputs: Vec<String>,
}

/// The tensors of one pass through the DAG, by ensemble name.
type Tensors = HashMap<String, Tensor>;

impl EnsembleScheduler {
    /// Plans the ensemble `config` against the members loaded now.
    pub fn new(config: &ModelConfig, members: Members) -> Result<Self> {
        let plan = plan::plan(config, &|name, version| members.config(name, version))?;
        Ok(EnsembleScheduler {
            name: config.name.clone(),
            plan,
            members,
            outputs: config.output.iter().map(|o| o.name.clone()).collect(),
        })
    }

    /// Whether a step may answer with many responses, so the ensemble may.
    pub fn is_decoupled(&self) -> bool {
        self.plan.is_decoupled()
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

    /// Runs the DAG over the request's inputs, sending a response with the
    /// ensemble's outputs for each pass through it: one when no step is
    /// decoupled, one per response of the last decoupled step otherwise.
    pub async fn run(&self, ran: &Ran<'_>) -> Result<()> {
        let tensors: Tensors = ran.inputs.iter().map(|t| (t.name.clone(), t.clone())).collect();
        let given: Vec<String> = tensors.keys().cloned().collect();
        let todo = vec![true; self.plan.steps.len()];
        self.flow(tensors, todo, &given, ran).await
    }

    /// Runs the steps still `todo` over `tensors`, each as soon as what it
    /// reads is there, so independent steps run at the same time. A
    /// decoupled step's responses are read once every step that does not
    /// need them has run; each response then continues the pass on its own
    /// copy of the tensors (the steps after it run once per response, in
    /// turn: a response flows through before the next is read, so the
    /// member's stream is paced by the steps behind it).
    fn flow<'a>(
        &'a self,
        mut tensors: Tensors,
        mut todo: Vec<bool>,
        given: &'a [String],
        ran: &'a Ran<'_>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut running = FuturesUnordered::new();
            let mut streams = Vec::new();
            loop {
                for (i, step) in self.plan.steps.iter().enumerate() {
                    if !todo[i] || !self.can_start(step, &tensors, given) {
                        continue;
                    }
                    todo[i] = false;
                    let model = self.member(step)?;
                    let request = self.step_request(step, &model, &tensors, ran);
                    if model.is_decoupled() {
                        streams.push(self.open_stream(step, &model, request)?);
                    } else {
                        running.push(self.run_step(step, model, request));
                    }
                }
                match running.next().await {
                    Some(produced) => tensors.extend(produced?),
                    None => break,
                }
            }
            // The plan keeps decoupled steps in one line, so at most one is open.
            let Some(mut stream) = streams.pop() else {
                self.check_all_ran(&todo)?;
                let outputs: Vec<Tensor> = self
                    .outputs
                    .iter()
                    .filter_map(|name| tensors.get(name).cloned())
                    .collect();
                ran.responder.send(Ok(outputs.into())).await;
                return Ok(());
            };
            while let Some(response) = stream.next().await {
                let produced = stream
                    .step
                    .renamed(response.map_err(|e| self.step_failed(stream.step, &e))?);
                let mut next = tensors.clone();
                next.extend(produced);
                self.flow(next, todo.clone(), given, ran).await?;
            }
            stream.finish(None);
            Ok(())
        })
    }

    /// A step may start when each tensor it reads is there, or is an
    /// optional ensemble input the client did not send (the member gets
    /// that input left out).
    fn can_start(&self, step: &Step, tensors: &Tensors, given: &[String]) -> bool {
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

    /// A pass ends with every step run; one that could not start read a
    /// tensor nobody gave.
    fn check_all_ran(&self, todo: &[bool]) -> Result<()> {
        match self.plan.steps.iter().zip(todo).find(|(_, left)| **left) {
            Some((step, _)) => Err(Error::invalid(format!(
                "ensemble '{}': {} could not run: an input it reads was not given",
                self.name,
                step.describe()
            ))),
            None => Ok(()),
        }
    }

    fn member(&self, step: &Step) -> Result<Arc<Model>> {
        self.members
            .get(&step.model, step.version)
            .map_err(|e| self.member_missing(step, &e))
    }

    /// The request a step makes of its member: the tensors it reads,
    /// renamed to the member's inputs, and the ensemble request's id,
    /// parameters (priority, timeout, sequence flags) and trace context.
    fn step_request(&self, step: &Step, model: &Model, tensors: &Tensors, ran: &Ran<'_>) -> InferRequest {
        let inputs = step
            .inputs
            .iter()
            .filter_map(|(input, tensor)| {
                let mut t = tensors.get(tensor)?.clone();
                t.name.clone_from(input);
                Some(t)
            })
            .collect();
        let trace = ran
            .trace
            .as_ref()
            .map(|t| Arc::new(t.child_request(model.name(), model.version(), &ran.id)));
        InferRequest {
            model_name: step.model.clone(),
            model_version: step.version,
            id: ran.id.clone(),
            inputs,
            outputs: step.outputs.iter().map(|(o, _)| RequestedOutput::named(o)).collect(),
            parameters: ran.parameters.clone(),
            trace_parent: ran.trace_parent.clone(),
            trace,
            ..Default::default()
        }
    }

    /// One step of an ordinary member: its one response, its outputs
    /// renamed into the ensemble's tensors.
    async fn run_step(&self, step: &Step, model: Arc<Model>, request: InferRequest) -> Result<Vec<(String, Tensor)>> {
        let trace = request.trace.clone();
        let result = model.infer(request).await;
        if let Some(trace) = trace {
            trace.finish(result.as_ref().err());
        }
        let response = result.map_err(|e| self.step_failed(step, &e))?;
        Ok(step.renamed(response))
    }

    /// One step of a decoupled member: its responses, to be read.
    fn open_stream<'s>(&self, step: &'s Step, model: &Arc<Model>, request: InferRequest) -> Result<StepStream<'s>> {
        let trace = request.trace.clone();
        match model.infer_stream(request) {
            Ok(responses) => Ok(StepStream { step, responses, trace }),
            Err(e) => {
                if let Some(trace) = trace {
                    trace.finish(Some(&e));
                }
                Err(self.step_failed(step, &e))
            }
        }
    }

    fn step_failed(&self, step: &Step, e: &Error) -> Error {
        Error::new(
            e.kind(),
            format!(
                "in ensemble '{}', {} failed: {}",
                self.name,
                step.describe(),
                e.message()
            ),
        )
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

impl Runner for EnsembleScheduler {
    fn run<'a>(&'a self, ran: &'a Ran<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(EnsembleScheduler::run(self, ran))
    }
}

impl Step {
    /// A member's response as ensemble tensors: the outputs this step maps,
    /// under their ensemble names.
    fn renamed(&self, response: InferResponse) -> Vec<(String, Tensor)> {
        response
            .outputs
            .into_iter()
            .filter_map(|mut t| {
                let (_, tensor) = self.outputs.iter().find(|(o, _)| *o == t.name)?;
                t.name.clone_from(tensor);
                Some((tensor.clone(), t))
            })
            .collect()
    }
}

/// A decoupled step's responses as the ensemble reads them.
struct StepStream<'s> {
    step: &'s Step,
    responses: ResponseStream,
    trace: Option<Arc<crate::trace::RequestTrace>>,
}

impl StepStream<'_> {
    async fn next(&mut self) -> Option<Result<InferResponse>> {
        let next = self.responses.next().await;
        if let Some(Err(e)) = &next {
            self.finish(Some(e));
        }
        next
    }

    fn finish(&mut self, error: Option<&Error>) {
        if let Some(trace) = self.trace.take() {
            trace.finish(error);
        }
    }
}
