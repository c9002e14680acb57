//! # nereid-server
//!
//! A Triton-compatible inference server: KServe v2 over HTTP/REST and gRPC,
//! Triton model repositories, ONNX Runtime and built-in backends.
//!
//! ## Layout
//!
//! A request flows top to bottom:
//!
//! ```text
//! transport                       accept loop, connection cap, TLS, handshake deadline
//! http, grpc                      front ends: decode, call InferenceServer, encode (streams too)
//! restricted_api                  Triton's restricted API groups, for both front ends
//! server                          the transport-free API both front ends call
//! model_repository_manager        which model versions are loaded, the repository API
//!   model_lifecycle               folder -> completed config -> loaded versions
//!   repository                    Triton's folder layout, version policies
//!   model_config                  config.pbtxt, JSON, auto-complete, validation
//! model                           one loaded version: normalize -> schedule -> shape outputs
//!   model/normalize               request checks against the config (Triton's wording)
//!   model/classification          the classification extension
//! scheduler                       default scheduler, dynamic or sequence batcher in front of the
//!                                 instances, an ensemble's DAG, or a remote model's calls
//!   dynamic_batch_scheduler       the batcher actor; policy (pure) and queue (priorities, timeouts)
//!   sequence_batcher              stateful models: sequences on their instance, controls, implicit state
//!   ensemble_scheduler            Triton's ensembles: the DAG planned at load, its steps run as ready
//!   scheduler/ordering            preserve_ordering
//! batch                           requests into one batch, outputs back per request
//! instance_pool                   one thread per instance, executing batches
//! statistics                      Triton's statistics extension
//! metrics                         Prometheus metrics with Triton's names, recorded with the statistics
//! logging                         tracing with Triton's log settings, changeable at run time
//! trace                           OpenTelemetry request traces, Triton's trace settings
//! backend                         the Backend trait and its registry; onnx (ort), builtin (identity,
//!                                 add_sub, repeat, accumulate), and remote (another server's model);
//!                                 settings (--backend-config)
//! request, response, tensor,      the protocol-free types
//!   datatype, parameter
//! error                           one error type with Triton's kinds
//! shared_memory                   Triton's system shared memory regions (read and written in place), and
//!                                 CUDA's (none without a GPU)
//! in_flight                       counts requests so shutdown drains exactly them
//! memory_budget                   the global cap on request bytes held at once
//! ```
//!
//! `allocator` (glibc's `mallopt`) and `shared_memory::object` (`geteuid`)
//! hold the server's only `unsafe` code.
//!
//! `main.rs` wires it: flags into options, the front ends onto their
//! listeners, and the shutdown sequence.

pub mod allocator;
pub mod backend;
pub mod batch;
pub mod datatype;
pub mod dynamic_batch_scheduler;
pub mod ensemble_scheduler;
pub mod error;
pub mod grpc;
pub mod http;
pub mod in_flight;
pub mod instance_pool;
pub mod local_control;
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
pub mod restricted_api;
pub mod scheduler;
pub mod sequence_batcher;
pub mod server;
pub mod shared_memory;
pub mod statistics;
pub mod tensor;
pub mod trace;
pub mod transport;
