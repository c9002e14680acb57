//! ModelEnsembles: a DAG of InferenceModels served under one model name,
//! by pods of their own (placement `remote`: the ensemble alone, its steps
//! calling each member's Service; `colocated`: the ensemble and its members
//! in one pod).
//!
//! - [`members`]: what each member serves, asked of its pods.
//! - [`tensors`]: the DAG checked against the members' tensors (pure).
//! - [`repository`]: the ensemble pod's model folders, by placement (pure).
//! - [`objects`]: every object, from the InferenceModel's builders (pure).
//! - [`status`]: the status, from the members, the Deployment and the pods (pure).
//! - [`observe`]: every read of a reconcile, before and after the apply.
//! - [`plan`]: what a reconcile decides from them: objects, status, Events, requeue (pure).
//! - [`controller`]: the reconcile, its error policy and its watches.

pub mod controller;
pub mod members;
pub mod objects;
pub mod observe;
pub mod plan;
pub mod repository;
pub mod status;
pub mod tensors;
