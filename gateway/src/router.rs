//! The gateway's routing state: the registry discovery keeps up to date,
//! the picker, the ejection policy and a canary's split, turned into one
//! call per request attempt.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::watch;

use crate::load::{Ejection, EndpointLoad};
use crate::picker::Picker;
use crate::registry::{Address, Endpoint, ModelEntry, ModelKey, Registry, RouteError};

/// Where one attempt of a request goes.
#[derive(Clone, Debug)]
pub struct Route {
    /// The model as `namespace/name`.
    pub model: Arc<str>,
    pub endpoint: Endpoint,
}

impl Route {
    /// The address of the pod for a protocol.
    pub fn address(&self, protocol: crate::Protocol) -> SocketAddr {
        match protocol {
            crate::Protocol::Grpc => self.endpoint.address.grpc,
            crate::Protocol::Http => self.endpoint.address.http,
        }
    }
}

pub struct Router {
    registry: RwLock<Registry>,
    picker: Box<dyn Picker>,
    ejection: Ejection,
    /// Discovery has listed everything once: until then "unknown model"
    /// may only mean "not seen yet", so the gateway is not ready.
    synced: AtomicBool,
    /// Told after every registry update, so that requests held for a model
    /// waking from zero look again ([`crate::activation`]).
    updated: watch::Sender<()>,
}

/// What one attempt of a request does.
#[derive(Clone, Debug)]
pub enum Routed {
    To(Route),
    /// Waits for this model, asleep at zero replicas, to wake.
    Hold(Sleeper),
}

/// A model that scales to zero, as a held request needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sleeper {
    pub key: ModelKey,
    /// `namespace/name`, for metrics and errors.
    pub label: Arc<str>,
    /// How long its requests may wait for it to wake.
    pub activation_timeout: Duration,
}

impl Sleeper {
    /// Until when a request first held now may wait.
    pub fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.activation_timeout
    }
}

impl Router {
    pub fn new(registry: Registry, picker: Box<dyn Picker>, ejection: Ejection) -> Arc<Self> {
        Arc::new(Router {
            registry: RwLock::new(registry),
            picker,
            ejection,
            synced: AtomicBool::new(false),
            updated: watch::Sender::new(()),
        })
    }

    /// Whether the model `key` names has a ready endpoint.
    pub fn is_ready(&self, key: &ModelKey) -> bool {
        self.registry.read().entry(key).is_some_and(ModelEntry::is_ready)
    }

    /// A receiver told of every registry update from now on.
    pub fn updates(&self) -> watch::Receiver<()> {
        self.updated.subscribe()
    }

    /// Picks an endpoint of the model `requested` names, leaving out the
    /// pods an earlier attempt of the same request could not reach; or, for
    /// a first attempt at a model that scales to zero and has no ready
    /// endpoint, says to hold the request. Both are decided on one look at
    /// the registry: two looks could see the model turn ready in between,
    /// and fail a request a moment before it could have gone (one in ten
    /// thousand did, in the e2e flood, as the woken pod turned ready).
    pub fn route(&self, requested: &str, tried: &[Address]) -> Result<Routed, RouteError> {
        let registry = self.registry.read();
        let (key, entry) = registry.lookup(requested)?;
        if let Some(route) = self.pick(entry, tried) {
            return Ok(Routed::To(route));
        }
        match entry.activation_timeout {
            Some(activation_timeout) if tried.is_empty() && !entry.is_ready() => Ok(Routed::Hold(Sleeper {
                key: key.clone(),
                label: Arc::clone(&entry.label),
                activation_timeout,
            })),
            _ => Err(RouteError::NoReadyEndpoints {
                model: entry.label.to_string(),
                pods: entry.all_pods(),
            }),
        }
    }

    /// A ready endpoint of any model in a namespace `allowed` accepts, for
    /// calls about the server itself.
    pub fn any(&self, allowed: impl Fn(&str) -> bool) -> Option<Route> {
        let registry = self.registry.read();
        let (_, entry) = registry.any_ready(allowed)?;
        self.pick(entry, &[])
    }

    /// An endpoint of the revision the split chooses, or of the other one
    /// when that has none left.
    fn pick(&self, entry: &ModelEntry, tried: &[Address]) -> Option<Route> {
        let stable = (entry.endpoints.as_slice(), entry.loads.as_slice());
        let endpoint = match &entry.canary {
            None => self.pick_in(stable, tried),
            Some(canary) => {
                let other = (canary.endpoints.as_slice(), canary.loads.as_slice());
                let (first, second) = match canary.split.to_canary(canary.percent) {
                    true => (other, stable),
                    false => (stable, other),
                };
                self.pick_in(first, tried).or_else(|| self.pick_in(second, tried))
            }
        }?;
        Some(Route {
            model: Arc::clone(&entry.label),
            endpoint: endpoint.clone(),
        })
    }

    /// An endpoint of one revision, leaving out those tried.
    fn pick_in<'a>(
        &self,
        (endpoints, loads): (&'a [Endpoint], &[Arc<EndpointLoad>]),
        tried: &[Address],
    ) -> Option<&'a Endpoint> {
        let now = Instant::now();
        let index = if tried.is_empty() {
            self.picker.pick(loads, now)?
        } else {
            // A retry: the rare path, where a filtered copy is fine.
            let left: Vec<usize> = (0..endpoints.len())
                .filter(|&i| !tried.contains(&endpoints[i].address))
                .collect();
            let loads: Vec<Arc<EndpointLoad>> = left.iter().map(|&i| Arc::clone(&loads[i])).collect();
            left[self.picker.pick(&loads, now)?]
        };
        Some(&endpoints[index])
    }

    pub fn ejection(&self) -> &Ejection {
        &self.ejection
    }

    /// Runs `f` with the registry locked for writing (discovery's updates),
    /// then tells whoever waits for an update.
    pub fn update<T>(&self, f: impl FnOnce(&mut Registry) -> T) -> T {
        let result = f(&mut self.registry.write());
        self.updated.send_replace(());
        result
    }

    /// Runs `f` with the registry locked for reading (index, metrics).
    pub fn read<T>(&self, f: impl FnOnce(&Registry) -> T) -> T {
        f(&self.registry.read())
    }

    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::picker::RoundRobin;
    use crate::registry::ModelKey;

    fn address(last: u8) -> Address {
        Address {
            http: SocketAddr::from(([10, 0, 0, last], 8000)),
            grpc: SocketAddr::from(([10, 0, 0, last], 8001)),
        }
    }

    fn key() -> ModelKey {
        ModelKey {
            namespace: "ml".into(),
            name: "resnet".into(),
        }
    }

    /// A router over `resnet` with the `stable` endpoints and, when given,
    /// a canary of `percent` with its endpoints.
    fn router(stable: &[Address], canary: Option<(u32, &[Address])>) -> Arc<Router> {
        let mut registry = Registry::new(None);
        registry.set_endpoints(key(), stable, stable.len());
        registry.set_canary(&key(), canary.map(|(percent, ready)| (percent, ready, ready.len())));
        Router::new(registry, Box::<RoundRobin>::default(), Ejection::default())
    }

    /// The route of an attempt that must have one.
    fn to(routed: Result<Routed, RouteError>) -> Route {
        match routed {
            Ok(Routed::To(route)) => route,
            other => panic!("no route: {other:?}"),
        }
    }

    /// Which addresses `n` routes of `resnet` went to.
    fn routes(router: &Router, n: usize) -> BTreeMap<Address, usize> {
        let mut counts = BTreeMap::new();
        for _ in 0..n {
            *counts
                .entry(to(router.route("resnet", &[])).endpoint.address)
                .or_default() += 1;
        }
        counts
    }

    #[test]
    fn a_canary_gets_its_percent_of_every_hundred_requests() {
        let router = router(&[address(1), address(2)], Some((20, &[address(9)])));
        let counts = routes(&router, 1000);
        assert_eq!(counts[&address(9)], 200);
        assert_eq!(counts[&address(1)] + counts[&address(2)], 800);
        // Evenly spread: any 10 consecutive requests hold exactly 2 of the canary's.
        let window: usize = (0..10)
            .filter(|_| to(router.route("resnet", &[])).endpoint.address == address(9))
            .count();
        assert_eq!(window, 2);
    }

    #[test]
    fn zero_and_a_hundred_percent_send_nothing_and_everything() {
        let none = routes(&router(&[address(1)], Some((0, &[address(9)]))), 100);
        assert_eq!(none.get(&address(9)), None);
        let all = routes(&router(&[address(1)], Some((100, &[address(9)]))), 100);
        assert_eq!(all.get(&address(1)), None);
    }

    #[test]
    fn a_revision_without_ready_pods_leaves_its_share_to_the_other() {
        let no_canary_pod = routes(&router(&[address(1)], Some((50, &[]))), 100);
        assert_eq!(no_canary_pod[&address(1)], 100);
        let no_stable_pod = routes(&router(&[], Some((10, &[address(9)]))), 100);
        assert_eq!(no_stable_pod[&address(9)], 100);
        let neither = router(&[], Some((10, &[])));
        assert_eq!(
            neither.route("resnet", &[]).unwrap_err().to_string(),
            "no ready replicas of model ml/resnet: 0/0 ready"
        );
    }

    #[test]
    fn a_first_attempt_at_a_model_asleep_is_held_and_a_retry_is_not() {
        let router = router(&[], None);
        let refused = router.route("resnet", &[]).unwrap_err();
        assert_eq!(refused.to_string(), "no ready replicas of model ml/resnet: 0/0 ready");
        router.update(|registry| registry.set_activation_timeout(&key(), Some(Duration::from_secs(60))));
        match router.route("resnet", &[]) {
            Ok(Routed::Hold(sleeper)) => {
                assert_eq!((sleeper.key, &*sleeper.label), (key(), "ml/resnet"));
                assert_eq!(sleeper.activation_timeout, Duration::from_secs(60));
            }
            other => panic!("not held: {other:?}"),
        }
        // Awake, every pod tried: a retry fails rather than waits.
        router.update(|registry| registry.set_endpoints(key(), &[address(1)], 1));
        assert!(matches!(
            router.route("resnet", &[address(1)]),
            Err(RouteError::NoReadyEndpoints { .. })
        ));
        assert_eq!(to(router.route("resnet", &[])).endpoint.address, address(1));
    }

    #[test]
    fn a_retry_may_cross_to_the_other_revision() {
        let router = router(&[address(1)], Some((100, &[address(9)])));
        let retried = to(router.route("resnet", &[address(9)]));
        assert_eq!(retried.endpoint.address, address(1));
    }

    #[test]
    fn removing_the_canary_stops_its_traffic_and_its_split_survives_updates() {
        let router = router(&[address(1)], Some((50, &[address(9)])));
        to(router.route("resnet", &[]));
        router.update(|registry| {
            registry.set_endpoints(key(), &[address(1), address(2)], 2);
            registry.set_canary(&key(), Some((50, &[address(9)], 1)));
        });
        // The split goes on from the request before the update: of the
        // first 100, the stable one took the 1st, the canary 50 of the next 99.
        let counts = routes(&router, 99);
        assert_eq!(counts[&address(9)], 50);
        router.update(|registry| registry.set_canary(&key(), None));
        assert_eq!(routes(&router, 10).get(&address(9)), None);
    }
}
