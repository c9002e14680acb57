//! What every connection of the gateway shares.

use std::sync::Arc;

use http::Response;

use crate::forward::{Forward, ForwardError, Upstream};
use crate::metrics::Metrics;
use crate::reply_body::Reply;
use crate::router::Router;

pub struct Gateway {
    pub router: Arc<Router>,
    pub upstream: Upstream,
    pub metrics: Metrics,
    /// The largest request body read before forwarding (a streamed gRPC
    /// body counts only up to its first message).
    pub max_body_bytes: usize,
}

impl Gateway {
    /// Sends a request to a pod of its model ([`Upstream::forward`]).
    pub async fn forward(&self, request: Forward<'_>) -> Result<Response<Reply>, ForwardError> {
        self.upstream.forward(&self.router, &self.metrics, request).await
    }
}
