//! What every connection of the gateway shares.

use std::sync::Arc;

use crate::forward::Upstream;
use crate::metrics::Metrics;
use crate::router::Router;

pub struct Gateway {
    pub router: Arc<Router>,
    pub upstream: Upstream,
    pub metrics: Metrics,
    /// The largest request body read before forwarding (a streamed gRPC
    /// body counts only up to its first message).
    pub max_body_bytes: usize,
}
