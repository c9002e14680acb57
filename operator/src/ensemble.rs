//! ModelEnsembles: a DAG of InferenceModels under one model name.
//!
//! - [`status`]: the status, derived purely from the spec and the members.
//! - [`controller`]: the reconcile, its error policy and its watches.
//!
//! The ensemble's pods (placement `remote` or `colocated`) are not built
//! yet: the status says so (`NotServed`) instead of looking accepted.

pub mod controller;
pub mod status;
