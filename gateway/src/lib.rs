//! # nereid-gateway
//!
//! One gRPC and HTTP endpoint for the cluster that routes every request, not
//! every connection, to a ready pod of the model it names: a Kubernetes
//! Service balances connections, so a gRPC client's one HTTP/2 connection
//! would otherwise pin all its requests to one pod.
//!
//! The routing core stands on its own so that other front ends (an Envoy
//! ext-proc endpoint picker for the Gateway API Inference Extension) can
//! reuse it:
//!
//! - [`load`]: what the gateway knows of one endpoint: requests it has in
//!   flight there, the queue depth the pod last reported, and whether
//!   repeated failures have ejected it for a while.
//! - [`picker`]: choosing an endpoint per request, behind the [`Picker`]
//!   trait: power of two choices on the load estimate, and round robin for
//!   comparison.
//! - [`model_name`]: which model a request is for, from the HTTP path or the
//!   gRPC message's field 1, without decoding tensors.
//! - [`registry`]: the routable models and their endpoints, and how a name
//!   (plain or `namespace/name`) finds one, ambiguity being an error.
//! - [`router`]: the registry, picker and ejection policy as one call per
//!   request attempt.
//! - [`authorize`]: whether a request may reach the model it names, by the
//!   bearer token its namespace wants ([`namespace_tokens`]), checked once
//!   the name is resolved and before the body is read on.
//!
//! The proxy around it:
//!
//! - [`discovery`]: the registry kept up to date from InferenceModels,
//!   ModelEnsembles and EndpointSlices.
//! - [`activation`]: holding the requests of a model scaled to zero while
//!   [`scale_up`] asks for a replica, bounded per model and in time.
//! - [`forward`]: sending a request to a pod, retries when a pod cannot be
//!   reached; [`pool`]: HTTP/2 connections to each pod (one until it is
//!   full), driven through `h2` ([`h2_body`] says why), over corked
//!   sockets (`nereid_cork`: one write per turn); [`request_body`] and
//!   [`reply_body`]: bodies passed through without copying.
//! - [`grpc_front`] (with [`grpc_answer`] and [`grpc_reply`]), [`http_front`],
//!   [`admin_front`]: the three ports, served by [`listen`] (with [`sniff`]
//!   telling HTTP/1.1 from HTTP/2 on the HTTP port).
//! - [`limits`]: everything a client can make the gateway hold, bounded,
//!   and the flag each refusal names: [`cap`] (connections per port,
//!   streams per connection), [`connection_clock`] (idle and header-read
//!   timeouts), [`memory_budget`] (request bytes buffered at once).
//! - [`metrics`]: `nereid_gateway_*` for Prometheus.
//! - [`command`]: the program: flags, the ports, discovery, shutdown.

pub mod activation;
pub mod admin_front;
pub mod args;
pub mod authorize;
pub mod cap;
pub mod command;
pub mod connection_clock;
pub mod discovery;
pub mod forward;
pub mod grpc_answer;
pub mod grpc_front;
pub mod grpc_reply;
pub mod h2_body;
pub mod http_front;
pub mod limits;
pub mod listen;
pub mod load;
pub mod memory_budget;
pub mod metrics;
pub mod model_name;
pub mod namespace_tokens;
pub mod picker;
pub mod pool;
pub mod registry;
pub mod reply_body;
pub mod request_body;
pub mod router;
pub mod scale_up;
pub mod sniff;
pub mod state;
mod write_through;

pub use load::{Ejection, EndpointLoad, InFlight};
pub use picker::{Picker, PowerOfTwoChoices, RoundRobin};

/// The header (HTTP) or metadata key (gRPC) that names the namespace of the
/// model a request is for, when its plain name is not enough. In an HTTP
/// path, `namespace%2Fname` does the same. Defined with the other wire
/// contracts, since remote ensemble steps of nereid-server send it too.
pub use nereid_proto::contract::NAMESPACE_HEADER;

/// The protocol of a request, which decides the port and connection pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    Http,
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
        }
    }
}
