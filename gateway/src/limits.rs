//! The gateway's limits: every resource a client can make it hold, the flag
//! that bounds it, and what a client over it is told.
//!
//! The rule: each resource a request or connection can make the process
//! hold (connections, streams, buffered bytes, time) has a documented limit
//! that is checked before the resource is taken, and a refusal names the
//! flag that sets it, so that whoever reads the client's error knows what to
//! raise. The defaults, and why each is what it is, are in [`crate::args`].
//!
//! | resource | flag | past it |
//! |---|---|---|
//! | open client connections, per port | `--max-connections` | the connection is closed at once |
//! | time from accept to the first bytes (HTTP port) or the HTTP/2 preface (gRPC port) | `--handshake-timeout-secs` | closed |
//! | time from an HTTP/1.1 head's first byte to its end | `--header-read-timeout-secs` | closed |
//! | time with no request (HTTP/1) or stream (HTTP/2) open | `--idle-timeout-secs` | closed; HTTP/2 gets GOAWAY first |
//! | time for a request body to arrive whole | `--body-timeout-secs` | 408 / DEADLINE_EXCEEDED |
//! | one request body | `--max-body-bytes` | 413 / RESOURCE_EXHAUSTED |
//! | request bytes buffered at once, all requests | `--max-in-flight-bytes` | 503 / RESOURCE_EXHAUSTED |
//! | ModelStreamInfer calls open on one client connection | `--max-streaming-calls-per-connection` | RESOURCE_EXHAUSTED |
//! | HTTP/2 connections to one pod | `--max-pod-connections` | 503 / UNAVAILABLE once they are all full |
//! | requests held for one model waking from zero | `--max-held-requests-per-model` | 503 / UNAVAILABLE, "waking up" |
//! | their body bytes | `--max-held-bytes-per-model` | 503 / UNAVAILABLE, "waking up" |
//! | time a request is held for a model waking from zero | the model's `spec.autoscaling.activationTimeout` | 503 / UNAVAILABLE, "waking up" |
//!
//! Fixed bounds, not flags: HTTP/2 streams per client connection (1024,
//! the pods' own limit), an HTTP/2 header list (16 KiB, gRPC C-core's hard
//! limit and hyper's default), an HTTP/1.1 connection's buffers and so its
//! head (64 KiB), and a control request's body (64 KiB).

use std::time::Duration;

use crate::request_body::BodyLimits;

/// The flags, as a refusal names them (and as `args.rs` spells them: a
/// test there checks that each is a real flag).
pub mod flag {
    pub const MAX_CONNECTIONS: &str = "--max-connections";
    pub const HANDSHAKE_TIMEOUT: &str = "--handshake-timeout-secs";
    pub const HEADER_READ_TIMEOUT: &str = "--header-read-timeout-secs";
    pub const IDLE_TIMEOUT: &str = "--idle-timeout-secs";
    pub const BODY_TIMEOUT: &str = "--body-timeout-secs";
    pub const MAX_BODY_BYTES: &str = "--max-body-bytes";
    pub const MAX_IN_FLIGHT_BYTES: &str = "--max-in-flight-bytes";
    pub const MAX_STREAMING_CALLS: &str = "--max-streaming-calls-per-connection";
    pub const MAX_POD_CONNECTIONS: &str = "--max-pod-connections";
    pub const MAX_HELD_REQUESTS: &str = "--max-held-requests-per-model";
    pub const MAX_HELD_BYTES: &str = "--max-held-bytes-per-model";

    pub const ALL: [&str; 11] = [
        MAX_CONNECTIONS,
        HANDSHAKE_TIMEOUT,
        HEADER_READ_TIMEOUT,
        IDLE_TIMEOUT,
        BODY_TIMEOUT,
        MAX_BODY_BYTES,
        MAX_IN_FLIGHT_BYTES,
        MAX_STREAMING_CALLS,
        MAX_POD_CONNECTIONS,
        MAX_HELD_REQUESTS,
        MAX_HELD_BYTES,
    ];
}

/// The body of a request the gateway answers itself (the repository
/// index): small, whatever `--max-body-bytes` says.
pub const CONTROL_BODY_BYTES: usize = 64 << 10;

/// The largest HTTP/2 header list (headers or trailers of one request) the
/// gRPC port takes: gRPC C-core's hard limit, and hyper's default on the
/// HTTP port. h2's own default, 16 MiB, would let one stream's headers
/// outweigh the whole body budget.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

/// The most an HTTP/1.1 connection's read (and write) buffer holds, and so
/// the largest request head (a larger one gets 431). hyper's default,
/// about 400 KiB, would let each of `--max-connections` idle connections
/// hold that much; 64 KiB is twice nginx's largest default head (4 x 8k)
/// and still reads a body in large pieces.
pub const HTTP1_BUFFER_BYTES: usize = 64 << 10;

/// The limits on what clients can make the gateway hold, read from the
/// flags ([`crate::args::Args::limits`]). `--max-pod-connections` belongs to
/// the pool ([`crate::forward::UpstreamOptions`]).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Open client connections per listening port.
    pub max_connections: usize,
    /// From accept to the first bytes (HTTP port) or the HTTP/2 preface
    /// (gRPC port).
    pub handshake_timeout: Duration,
    /// From the first byte of an HTTP/1.1 request head to its end.
    pub header_read_timeout: Duration,
    /// How long a connection may stay with no request (HTTP/1) or stream
    /// (HTTP/2) open.
    pub idle_timeout: Duration,
    /// How long a request body (a stream: its first message) may take to
    /// arrive whole.
    pub body_timeout: Duration,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// The request bytes buffered at once, all requests together.
    pub max_in_flight_bytes: usize,
    /// ModelStreamInfer calls one client connection may have open.
    pub max_streaming_calls_per_connection: usize,
}

impl Limits {
    /// The bounds on reading a request body that is forwarded.
    pub fn body(&self) -> BodyLimits {
        BodyLimits {
            max_bytes: self.max_body_bytes,
            max_bytes_flag: flag::MAX_BODY_BYTES,
            timeout: self.body_timeout,
        }
    }

    /// The bounds on reading the body of a request the gateway answers
    /// itself.
    pub fn control_body(&self) -> BodyLimits {
        BodyLimits {
            max_bytes: CONTROL_BODY_BYTES.min(self.max_body_bytes),
            max_bytes_flag: "the gateway's fixed limit for control requests",
            timeout: self.body_timeout,
        }
    }
}
