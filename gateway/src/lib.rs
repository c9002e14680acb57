//! # nereid-gateway
//!
//! One gRPC and HTTP endpoint for the cluster that routes every request, not
//! every connection, to a ready pod of the model it names: a Kubernetes
//! Service balances connections, so a gRPC client's one HTTP/2 connection
//! would otherwise pin all its requests to one pod.
//!
//! This is the routing core, built first and on its own so that other front
//! ends (an Envoy ext-proc endpoint picker for the Gateway API Inference
//! Extension) can reuse it; the proxy, discovery and chart come next.
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

pub mod load;
pub mod model_name;
pub mod picker;
pub mod registry;

pub use load::{Ejection, EndpointLoad, InFlight};
pub use picker::{Picker, PowerOfTwoChoices, RoundRobin};
