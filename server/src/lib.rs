//! # nereid-server
//!
//! A Triton-compatible inference server: KServe v2 over HTTP/REST and gRPC,
//! Triton model repositories, ONNX Runtime and built-in backends.
//!
//! ## Layout
//!
//! The transport-free core (requests, models, schedulers, instances,
//! repositories, statistics) is nereid-core; ONNX Runtime, remote models
//! and object storage are their own crates, plugged in by `command`. This
//! crate is the front ends and the programs:
//!
//! ```text
//! transport                       accept loop, connection cap, TLS, handshake deadline
//! http, grpc                      front ends: decode, call InferenceServer, encode (streams too)
//! restricted_api                  Triton's restricted API groups, for both front ends
//! local_control                   settings and shared memory changes only from this host
//! in_flight                       counts requests so shutdown drains exactly them
//! metrics_endpoint                GET /metrics on the metrics port
//! trace_export                    the OTLP pipeline traces are exported through
//! allocator                       glibc's malloc tuned for a server
//! command                         nereid-server (flags, start-up, shutdown); command::fetch is nereid-fetch
//! ```
//!
//! The core's modules are re-exported under their own names, so the front
//! ends say `crate::model` as the core does.
//!
//! `allocator` (glibc's `mallopt`) holds this crate's only `unsafe` code.
//!
//! `command` wires it: flags into options, the backends and object storage
//! into the core, the front ends onto their listeners, and the shutdown
//! sequence.

pub use nereid_core::{
    backend, batch, datatype, dynamic_batch_scheduler, ensemble_scheduler, error, instance_pool, logging,
    memory_budget, metrics, model, model_config, model_lifecycle, model_repository_manager, parameter, repository,
    request, request_limits, response, scheduler, sequence_batcher, server, shared_memory, statistics, tensor, trace,
    wire,
};

pub mod allocator;
pub mod command;
pub mod grpc;
pub mod http;
pub mod in_flight;
pub mod local_control;
pub mod metrics_endpoint;
pub mod restricted_api;
pub mod trace_export;
pub mod transport;
