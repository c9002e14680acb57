//! What every connection of the gateway shares.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::Response;

use crate::forward::{Forward, ForwardError, Upstream};
use crate::limits::Limits;
use crate::memory_budget::{Charge, MemoryBudget};
use crate::metrics::Metrics;
use crate::reply_body::Reply;
use crate::router::Router;

pub struct Gateway {
    pub router: Arc<Router>,
    pub upstream: Upstream,
    pub metrics: Metrics,
    /// What clients can make the gateway hold ([`crate::limits`]).
    pub limits: Limits,
    /// The request bytes buffered at once (`--max-in-flight-bytes`).
    pub budget: Arc<MemoryBudget>,
    /// Set on SIGTERM: /readyz fails so no new traffic comes, while the
    /// requests already sent are still served.
    pub draining: AtomicBool,
}

impl Gateway {
    /// Whether this replica should be sent traffic: discovery has listed
    /// the cluster's models and no shutdown has begun.
    pub fn ready(&self) -> bool {
        self.router.synced() && !self.draining.load(Ordering::Relaxed)
    }

    /// A new charge of nothing on the gateway's memory budget, for one
    /// request's buffered bytes.
    pub fn charge(&self) -> Charge {
        Charge::new(&self.budget)
    }

    /// Sends a request to a pod of its model ([`Upstream::forward`]).
    pub async fn forward(&self, request: Forward<'_>) -> Result<Response<Reply>, ForwardError> {
        self.upstream.forward(&self.router, &self.metrics, request).await
    }
}
