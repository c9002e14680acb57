//! What one Nereid process relies on another to do, written once.
//!
//! The server, the gateway and the operator are separate binaries, often of
//! different builds, that agree only through names and numbers on the wire:
//! a header, an exit status, a Prometheus family. Each is defined here and
//! nowhere else, so that a rename is a compile error on both sides, not a
//! silent mismatch found in a cluster.
//!
//! - headers: gRPC metadata keys and HTTP headers between gateway and server;
//! - [`exit`]: what a server's exit status tells the operator;
//! - [`fetch_progress`]: how far a pod's `nereid-fetch` is, for the operator;
//! - [`metrics`]: the families the server exports and others read (the
//!   operator's scraper, the chart's prometheus-adapter rules).
//!
//! The Helm chart cannot import Rust: a test of the operator crate reads
//! its templates and checks every family they name is one of [`metrics`].

pub mod metrics;

/// The response header (HTTP) and initial metadata (gRPC) in which
/// nereid-server answers an inference with the number of requests of that
/// model still waiting in its queue: nereid-gateway's load signal for the
/// pod, fresher than any scrape and free to read from the proxied answer.
pub const QUEUE_DEPTH_HEADER: &str = "nereid-queue-depth";

/// The response header (HTTP) and metadata key (gRPC) with which
/// nereid-server marks a refusal that ran nothing of the request because the
/// server is starting or shutting down: nereid-gateway then sends the
/// request to another pod, which it does for no other error.
pub const NOT_SERVING_HEADER: &str = "nereid-not-serving";

/// The request header (HTTP) or metadata key (gRPC) that names the
/// namespace of the model a request is for, when its plain name is not
/// enough: clients send it to nereid-gateway, and a remote ensemble step
/// sends it when it calls its member through the gateway.
pub const NAMESPACE_HEADER: &str = "nereid-namespace";

/// Process exit statuses with a meaning across processes.
pub mod exit {
    /// nereid-server's exit status when `--exit-on-error` stops it because
    /// a model failed to load. The operator reads it on a terminated server
    /// container as a failed load (a `LoadFailed` condition), not a crash.
    pub const LOAD_FAILED: u8 = 3;
}

/// How far `nereid-fetch` is, served over HTTP while it runs in a serving
/// pod's init container, and read by the operator into the
/// InferenceModel's status ("fetching 1.2 GiB, 45 %"): no other process
/// can see a download in progress, since the server has not started yet.
pub mod fetch_progress {
    /// The flag that asks `nereid-fetch` to serve its progress on a port.
    pub const FLAG: &str = "--progress-port";
    /// The port the operator asks for: none of the server's (8000-8002),
    /// which is not running while its models are fetched.
    pub const PORT: u16 = 8009;
    /// The path of the JSON document.
    pub const PATH: &str = "/progress";
    /// Its fields: bytes of the model folder in all, and fetched so far
    /// (bytes already in the fetch cache count as fetched).
    pub const BYTES_TOTAL: &str = "bytes_total";
    pub const BYTES_DONE: &str = "bytes_done";
}
