//! # nereid-crds
//!
//! The custom resources of Nereid's operator, as Rust types that generate
//! their own CRD schemas (kube + schemars), plus the same rules checked in Rust.
//!
//! # Layout
//!
//! - [`inference_model`]: `InferenceModel` (one model, its source, resources,
//!   scheduling, server and autoscaling) and its status.
//! - [`model_ensemble`]: `ModelEnsemble`, a DAG of InferenceModels.
//! - [`conditions`]: condition types and reasons written into status.
//! - [`mod@validate`]: the CEL rules again in Rust, plus the DAG checks CEL cannot
//!   express (`nereid_proto::ensemble_dag`'s, shared with the server); the
//!   operator uses them for friendly status messages.
//! - [`rules`]: each validation rule once, as CEL and as a message.
//! - [`crd_yaml`]: both CRDs as one YAML stream; `src/main.rs` (bin `crds`)
//!   prints it, and `tests/drift.rs` checks the committed copies against it.

pub mod conditions;
pub mod inference_model;
pub mod model_ensemble;
pub mod rules;
pub mod validate;

pub use inference_model::*;
pub use model_ensemble::*;

pub use validate::{ensemble_dag, validate, validate_ensemble};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The first lines of [`crd_yaml`]: where the YAML comes from.
pub const YAML_HEADER: &str = "\
# Generated from the Rust types in crds/ by `cargo run -p nereid-crds --bin crds`.
# Do not edit: change the types and regenerate (crds/tests/drift.rs checks it).
";

/// Both CRDs, InferenceModel first.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![InferenceModel::crd(), ModelEnsemble::crd()]
}

/// Both CRDs as one multi-document YAML stream (InferenceModel first,
/// documents separated by `---`) after [`YAML_HEADER`]. Deterministic: the
/// same types always give the same bytes, so committed copies can be checked
/// for drift.
pub fn crd_yaml() -> String {
    let docs = serde_saphyr::to_string_multiple(&crds()).expect("a CRD always serializes to YAML");
    format!("{YAML_HEADER}{docs}")
}
