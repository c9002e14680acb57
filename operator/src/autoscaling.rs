//! Autoscaling on the serving pods' own metrics.
//!
//! The operator scrapes every ready serving pod's /metrics ([`scraper`]),
//! reads the few Triton-named families it needs ([`exposition`]), and turns
//! them into per-model figures over a sliding window ([`figures`]): average
//! queue time per request, pending requests, inference rate and GPU
//! utilisation. The figures are served to the HPA controller as external
//! metrics ([`crate::external_metrics`]), exported on the operator's own
//! /metrics, and reported in the InferenceModel's status. The HPA itself is
//! built by [`crate::builders::hpa`].

pub mod exposition;
pub mod figures;
pub mod scraper;
