//! Nereid's benchmark tools: `nereid-perf`, a KServe v2 load generator in
//! the spirit of Triton's perf_analyzer, and three baselines to read its
//! numbers against: `nereid-echo` (the transport alone: a server that
//! answers every infer with its inputs) and `nereid-compute-limit` (the
//! model alone: ONNX Runtime in-process, no network), which bench/run.sh
//! reads nereid-server against, and `nereid-relay` (a proxy that copies
//! bytes and parses nothing), the floor bench/gateway.sh reads
//! nereid-gateway against.
//!
//! # Layout
//!
//! Shared by the tools:
//! - [`error`] — the crate's error type.
//! - [`datatype`], [`tensor`] — KServe datatypes and a tensor's raw / JSON forms.
//! - [`flags`] — `NAME:...` flag values.
//! - [`latency`] — percentiles.
//! - [`process_cpu`] — a process's CPU time, for CPU per request.
//! - [`binary_ext`] — Triton's binary tensor extension, both directions.
//!
//! The load generator:
//! - [`input_data`] — generated or file-provided inputs.
//! - [`metadata`] — model metadata and how inputs are resolved from it.
//! - [`request`] — the request, encoded once.
//! - [`http_client`], [`grpc_client`], [`connection`] — a worker's connection.
//! - [`perf`] — load modes, measurement and reports.
//!
//! The baselines:
//! - [`echo`] — the echo server, HTTP and gRPC.
//! - [`compute_limit`] — in-process ONNX Runtime throughput.
//! - [`relay`] — a byte-for-byte TCP relay, the floor under nereid-gateway.
//!
//! Comparisons:
//! - [`chain`] — an ensemble against its steps called one by one by the client.
//! - [`vad`] — real-time streams against a stateful model, and the model run directly.

pub mod binary_ext;
pub mod chain;
pub mod compute_limit;
pub mod connection;
pub mod datatype;
pub mod echo;
pub mod error;
pub mod flags;
pub mod grpc_client;
pub mod http_client;
pub mod input_data;
pub mod latency;
pub mod metadata;
pub mod perf;
pub mod process_cpu;
pub mod relay;
pub mod request;
pub mod tensor;
pub mod vad;
