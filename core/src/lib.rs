//! # nereid-core
//!
//! What a Triton-compatible server is, without how requests reach it:
//! requests and tensors, model configs and repositories, the schedulers
//! and batchers, model instances, ensembles, the model lifecycle, and
//! Triton's statistics and metrics. No transport (HTTP, gRPC), no ONNX
//! Runtime and no object storage: this crate's dependencies prove it, and
//! those parts plug in (`backend::plug_in`, `repository::plug_in`).
//!
//! ## Layout
//!
//! A request flows top to bottom:
//!
//! ```text
//! server                          the transport-free API the front ends call
//! model_repository_manager        which model versions are loaded, the repository API
//!   model_lifecycle               folder -> completed config -> loaded versions
//!   repository                    Triton's folder layout, version policies
//!   model_config                  config.pbtxt, JSON, auto-complete, validation
//! model                           one loaded version: normalize -> submit -> shape responses
//!   model/normalize               request checks against the config (Triton's wording)
//!   model/classification          the classification extension
//!   model/stream                  a decoupled request's responses
//! scheduler                       one request message (Request) and its responder; the default
//!                                 scheduler, dynamic or sequence batcher in front of the
//!                                 instances, an ensemble's DAG, or a runner (a remote model)
//!   dynamic_batch_scheduler       the batcher actor; policy (pure) and queue (priorities, timeouts)
//!   sequence_batcher              stateful models: sequences on their instance, controls, implicit state
//!   ensemble_scheduler            Triton's ensembles: the DAG planned at load, its steps run as ready
//!   scheduler/ordering            preserve_ordering
//! batch                           requests into one batch, outputs back per request
//! staging                         a batch's inputs gathered and copied to a device once each
//!                                 (the device behind a trait; nereid-gpu's is CUDA)
//! instance_pool                   one thread per instance, executing batches through one sink
//! backend                         the Backend trait and its registry; builtin (identity, add_sub,
//!                                 repeat, accumulate); settings (--backend-config)
//! statistics                      Triton's statistics extension
//! metrics                         Prometheus metrics with Triton's names, recorded with the statistics
//! logging                         tracing with Triton's log settings, changeable at run time
//! trace                           OpenTelemetry request traces, Triton's trace settings
//! wire                            the KServe v2 protobuf messages to and from the core's types
//! request, response, tensor,      the protocol-free types
//!   datatype, parameter
//! error                           one error type with Triton's kinds
//! shared_memory                   Triton's system shared memory regions (read and written in place),
//!                                 and CUDA's (device memory shared through IPC handles)
//! memory_budget                   the global cap on request bytes held at once
//! ```
//!
//! `shared_memory::object` (`geteuid`) holds this crate's only `unsafe` code; the GPU's is in
//! `nereid-gpu`.

pub mod backend;
pub mod batch;
pub mod datatype;
pub mod dynamic_batch_scheduler;
pub mod ensemble_scheduler;
pub mod error;
pub mod instance_pool;
pub mod logging;
pub mod memory_budget;
pub mod metrics;
pub mod model;
pub mod model_config;
pub mod model_lifecycle;
pub mod model_repository_manager;
pub mod parameter;
pub mod repository;
pub mod request;
pub mod request_limits;
pub mod response;
pub mod scheduler;
pub mod sequence_batcher;
pub mod server;
pub mod shared_memory;
pub mod staging;
pub mod statistics;
pub mod tensor;
pub mod trace;
pub mod warmup;
pub mod wire;
