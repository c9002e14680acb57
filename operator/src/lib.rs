//! # nereid-operator
//!
//! The Kubernetes operator of Nereid: each `InferenceModel` becomes a
//! ConfigMap, a Deployment of `nereid-server` pods, a Service and a
//! PodDisruptionBudget (and, when asked, a NetworkPolicy and an HPA or KEDA
//! ScaledObject), all owned by the model and written with server-side apply,
//! and a status derived from what the pods actually do. Every replica also
//! scrapes the serving pods and serves the figures autoscalers scale on.
//!
//! # Layout
//!
//! - [`command`]: the program: connect, elect, serve health, reconcile.
//! - [`args`]: command-line flags (clap groups, with `env`), turned into settings.
//! - [`context`]: what every reconcile shares: client, metrics, settings, event recorder.
//! - [`leader`]: leader election through a `coordination.k8s.io` Lease.
//! - [`health`]: `/healthz`, `/readyz` and `/metrics` of the operator itself.
//! - [`metrics`]: the operator's own Prometheus metrics.
//! - [`error`]: the one error type, with a stable `kind()` and a retry policy per kind.
//! - [`builders`]: pure functions from an InferenceModel to the objects it owns.
//! - [`status`]: pure derivation of the status from the Deployment and the pods.
//! - [`controller`]: the reconcile (reads in `observe`, decisions in `plan`,
//!   writes in `apply`), the error policy and the watches.
//! - [`ensemble`]: ModelEnsembles: their status from their members, and their
//!   controller, shaped like the InferenceModel's.
//! - [`autoscaling`]: the serving pods' metrics, scraped and turned into per-model figures.
//! - [`external_metrics`]: those figures as `external.metrics.k8s.io`, for the HPA controller.
//! - [`external_scaler`]: the same figures as KEDA's External Scaler gRPC service.
//! - [`pod_http`]: the HTTP client serving pods are called with (no redirects followed).
//!
//! Pure parts (builders, status, validation, event transitions, and each
//! controller's plan: `tests/plan.rs`, `tests/ensemble_plan.rs`) are tested
//! on in-memory objects; the reconcile is tested against a mocked API server
//! (`tests/reconcile.rs`) and is written to run unchanged against a real one.

pub mod args;
pub mod autoscaling;
pub mod builders;
pub mod command;
pub mod context;
pub mod controller;
pub mod ensemble;
pub mod error;
pub mod external_metrics;
pub mod external_scaler;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod pod_http;
pub mod status;
