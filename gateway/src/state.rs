//! What every connection of the gateway shares.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, Response};

use crate::activation::Activation;
use crate::authorize::{self, Refused};
use crate::forward::{Forward, ForwardError, Upstream};
use crate::limits::Limits;
use crate::memory_budget::{Charge, MemoryBudget};
use crate::metrics::{Failure, Metrics};
use crate::namespace_tokens::{self, NamespaceTokens};
use crate::registry::{IndexEntry, RouteError};
use crate::reply_body::Reply;
use crate::router::{Route, Router};

pub struct Gateway {
    pub router: Arc<Router>,
    pub upstream: Upstream,
    pub metrics: Arc<Metrics>,
    /// Requests held for models waking from zero ([`crate::activation`]).
    pub activation: Arc<Activation>,
    /// What clients can make the gateway hold ([`crate::limits`]).
    pub limits: Limits,
    /// The request bytes buffered at once (`--max-in-flight-bytes`).
    pub budget: Arc<MemoryBudget>,
    /// Which namespaces a request's bearer token opens
    /// (`--namespace-token`, `--require-namespace-tokens`).
    pub tokens: NamespaceTokens,
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

    /// The name to route a request for `requested` by, if its
    /// `authorization` lets it reach that model ([`authorize::admit`]),
    /// refusals counted. Without tokens, every name as it came.
    pub fn admit(&self, requested: String, headers: &HeaderMap) -> Result<String, Refused> {
        if !self.tokens.enforced() {
            return Ok(requested);
        }
        let presented = namespace_tokens::bearer(headers);
        let admitted = self.router.read(|registry| {
            authorize::admit(registry, requested, |namespace| {
                self.tokens.allows(namespace, presented)
            })
        });
        if let Err(refused) = &admitted {
            // The name is the client's text, not yet a model: no label.
            let failure = match refused {
                Refused::Unauthorized(_) => Failure::Unauthorized,
                Refused::Route(RouteError::NoReadyEndpoints { .. }) => Failure::NoReadyEndpoints,
                Refused::Route(_) => Failure::UnknownModel,
            };
            self.metrics.failed("", failure);
        }
        admitted
    }

    /// The repository index, of the namespaces the request's
    /// `authorization` opens (every namespace without tokens).
    pub fn index(&self, headers: &HeaderMap) -> Vec<IndexEntry> {
        let presented = namespace_tokens::bearer(headers);
        let mut index = self.router.read(|registry| registry.index());
        index.retain(|entry| self.tokens.allows(&entry.namespace, presented));
        index
    }

    /// A ready pod of any model the request may reach, for calls about the
    /// server itself (server metadata).
    pub fn any_route(&self, headers: &HeaderMap) -> Option<Route> {
        let presented = namespace_tokens::bearer(headers);
        self.router.any(|namespace| self.tokens.allows(namespace, presented))
    }

    /// Sends a request to a pod of its model ([`Upstream::forward`]).
    pub async fn forward(&self, request: Forward<'_>) -> Result<Response<Reply>, ForwardError> {
        self.upstream
            .forward(&self.router, &self.metrics, &self.activation, request)
            .await
    }
}
