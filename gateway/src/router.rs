//! The gateway's routing state: the registry discovery keeps up to date,
//! the picker, and the ejection policy, turned into one call per request
//! attempt.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::RwLock;

use crate::load::{Ejection, EndpointLoad};
use crate::picker::Picker;
use crate::registry::{Address, Endpoint, ModelEntry, Registry, RouteError};

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
}

impl Router {
    pub fn new(registry: Registry, picker: Box<dyn Picker>, ejection: Ejection) -> Arc<Self> {
        Arc::new(Router {
            registry: RwLock::new(registry),
            picker,
            ejection,
            synced: AtomicBool::new(false),
        })
    }

    /// Picks an endpoint of the model `requested` names, leaving out the
    /// pods an earlier attempt of the same request could not reach.
    pub fn route(&self, requested: &str, tried: &[Address]) -> Result<Route, RouteError> {
        let registry = self.registry.read();
        let (_, entry) = registry.resolve(requested)?;
        self.pick(entry, tried).ok_or_else(|| RouteError::NoReadyEndpoints {
            model: entry.label.to_string(),
            pods: entry.pods,
        })
    }

    /// A ready endpoint of any model in a namespace `allowed` accepts, for
    /// calls about the server itself.
    pub fn any(&self, allowed: impl Fn(&str) -> bool) -> Option<Route> {
        let registry = self.registry.read();
        let (_, entry) = registry.any_ready(allowed)?;
        self.pick(entry, &[])
    }

    fn pick(&self, entry: &ModelEntry, tried: &[Address]) -> Option<Route> {
        let now = Instant::now();
        let index = if tried.is_empty() {
            self.picker.pick(&entry.loads, now)?
        } else {
            // A retry: the rare path, where a filtered copy is fine.
            let left: Vec<usize> = (0..entry.endpoints.len())
                .filter(|&i| !tried.contains(&entry.endpoints[i].address))
                .collect();
            let loads: Vec<Arc<EndpointLoad>> = left.iter().map(|&i| Arc::clone(&entry.loads[i])).collect();
            left[self.picker.pick(&loads, now)?]
        };
        Some(Route {
            model: Arc::clone(&entry.label),
            endpoint: entry.endpoints[index].clone(),
        })
    }

    pub fn ejection(&self) -> &Ejection {
        &self.ejection
    }

    /// Runs `f` with the registry locked for writing (discovery's updates).
    pub fn update<T>(&self, f: impl FnOnce(&mut Registry) -> T) -> T {
        f(&mut self.registry.write())
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
