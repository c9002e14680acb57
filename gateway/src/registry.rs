//! The models the gateway can route to and their endpoints, and how a model
//! name in a request finds one.
//!
//! A model is an InferenceModel (or ModelEnsemble): a namespace and a name.
//! A request may name it as `namespace/name` (percent-encoded as `%2F` in an
//! HTTP path), or by its name alone: then the gateway's default namespace
//! wins if it holds that name, else the one namespace that does; a name held
//! by several namespaces and not the default is an error that lists them,
//! never a silent pick.
//!
//! Endpoint updates keep the load record of every address that stays, so
//! requests in flight and ejections survive an EndpointSlice change.
//!
//! A model with a canary has a second group of endpoints and the percent of
//! its requests that go there ([`CanaryEntry`]); a model that scales to zero
//! has the time its requests may wait for it to wake
//! ([`ModelEntry::activation_timeout`], [`crate::activation`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use thiserror::Error;

use crate::load::EndpointLoad;

/// A model: its namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ModelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where one pod serves each protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Address {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
}

impl std::fmt::Display for Address {
    /// The HTTP address, as endpoints are named in metrics and errors (a
    /// pod's IP alone would not tell apart two pods on one host).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.http)
    }
}

/// One ready pod of a model.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub address: Address,
    pub load: Arc<EndpointLoad>,
    /// The address as metrics name it, formatted once, not per request.
    pub label: Arc<str>,
}

/// What the gateway knows of one model.
#[derive(Clone, Debug, Default)]
pub struct ModelEntry {
    /// `namespace/name`, as metrics and errors name the model, formatted
    /// once, not per request.
    pub label: Arc<str>,
    /// The ready endpoints, in address order.
    pub endpoints: Vec<Endpoint>,
    /// Their loads, in the same order: the slice a picker reads, kept so
    /// that a pick allocates nothing.
    pub loads: Vec<Arc<EndpointLoad>>,
    /// Pods the model has, ready or not (for the error when none is ready).
    pub pods: usize,
    /// The model's canary, when its InferenceModel has one.
    pub canary: Option<CanaryEntry>,
    /// A model that scales to zero (`minReplicas: 0`): how long a request
    /// is held while it wakes (`activationTimeout`).
    pub activation_timeout: Option<Duration>,
}

impl ModelEntry {
    /// Whether any endpoint, the spec's or the canary's, is ready.
    pub fn is_ready(&self) -> bool {
        !self.endpoints.is_empty() || self.canary.as_ref().is_some_and(|c| !c.endpoints.is_empty())
    }

    /// Pods of both revisions, ready or not.
    pub fn all_pods(&self) -> usize {
        self.pods + self.canary.as_ref().map_or(0, |c| c.pods)
    }

    /// Every ready endpoint, the canary's after the spec's.
    pub fn all_endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints
            .iter()
            .chain(self.canary.iter().flat_map(|c| c.endpoints.iter()))
    }
}

/// A model's canary: its own ready pods and its share of the requests.
#[derive(Clone, Debug, Default)]
pub struct CanaryEntry {
    /// Percent of the model's requests the canary gets, 0 to 100.
    pub percent: u32,
    pub endpoints: Vec<Endpoint>,
    pub loads: Vec<Arc<EndpointLoad>>,
    pub pods: usize,
    /// Which requests go to it; kept across endpoint updates.
    pub split: Arc<Split>,
}

/// Spreads a percent of the requests evenly: of every 100 consecutive
/// ones, exactly `percent` (request n goes to the canary when
/// ⌊(n+1)·p/100⌋ > ⌊n·p/100⌋), never a random run of either.
#[derive(Debug, Default)]
pub struct Split {
    sent: AtomicU64,
}

impl Split {
    /// Whether the next request goes to the canary.
    pub fn to_canary(&self, percent: u32) -> bool {
        let n = self.sent.fetch_add(1, Ordering::Relaxed) % 100;
        let p = u64::from(percent.min(100));
        (n + 1) * p / 100 > n * p / 100
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("unknown model {0:?}: no InferenceModel or ModelEnsemble of that name is served by this gateway")]
    Unknown(String),
    #[error(
        "model name {name:?} is ambiguous: namespaces {namespaces:?} each have one; name it as \"<namespace>/{name}\""
    )]
    Ambiguous { name: String, namespaces: Vec<String> },
    #[error("no ready replicas of model {model}: 0/{pods} ready")]
    NoReadyEndpoints { model: String, pods: usize },
}

/// Where a requested name leads, ready endpoints or not: what a request's
/// authorization is checked against before its body is read
/// ([`crate::authorize`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Destination<'a> {
    /// `namespace/name`: that namespace, whether it holds the name or not.
    Named { namespace: &'a str },
    /// A plain name, settled: the default namespace's model of that name,
    /// or the one model of that name.
    Resolved(&'a ModelKey),
    /// A plain name several namespaces hold, none of them the default.
    Ambiguous(Vec<&'a str>),
    /// A plain name no namespace holds.
    Unknown,
}

/// How a plain name settles.
enum Plain<'a> {
    One(&'a ModelKey, &'a ModelEntry),
    Many(&'a [(ModelKey, ModelEntry)]),
    None,
}

/// One model as the repository index lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// The namespace that holds it (what the index is filtered by).
    pub namespace: String,
    /// The name a request can use: the plain name unless that is
    /// ambiguous, then `namespace/name`.
    pub name: String,
    pub ready: bool,
    /// Why it is not ready ("0/2 ready"), empty when it is.
    pub reason: String,
}

/// Every routable model, indexed by name (what a request gives) and then
/// by namespace, so a lookup never scans the other models.
#[derive(Debug, Default)]
pub struct Registry {
    default_namespace: Option<String>,
    models: BTreeMap<String, Vec<(ModelKey, ModelEntry)>>,
}

impl Registry {
    /// A registry in which unqualified names prefer `default_namespace`.
    pub fn new(default_namespace: Option<String>) -> Self {
        Registry {
            default_namespace,
            models: BTreeMap::new(),
        }
    }

    /// Sets a model's ready endpoints and pod count, keeping the load of
    /// every address it already had.
    pub fn set_endpoints(&mut self, model: ModelKey, ready: &[Address], pods: usize) {
        let previous = self.take(&model).unwrap_or_default();
        let endpoints = keeping_loads(&previous.endpoints, ready);
        let loads = endpoints.iter().map(|e| Arc::clone(&e.load)).collect();
        let label = if previous.label.is_empty() {
            model.to_string().into()
        } else {
            previous.label
        };
        let namespaces = self.models.entry(model.name.clone()).or_default();
        namespaces.push((
            model,
            ModelEntry {
                label,
                endpoints,
                loads,
                pods,
                canary: previous.canary,
                activation_timeout: previous.activation_timeout,
            },
        ));
        namespaces.sort_by(|(a, _), (b, _)| a.namespace.cmp(&b.namespace));
    }

    /// Sets a model's canary (`None`: it has none), keeping the load of
    /// every address it already had; a model not in the registry is left
    /// alone.
    pub fn set_canary(&mut self, model: &ModelKey, canary: Option<(u32, &[Address], usize)>) {
        let Some(entry) = self.entry_mut(model) else {
            return;
        };
        entry.canary = canary.map(|(percent, ready, pods)| {
            let previous = entry.canary.take().unwrap_or_default();
            let endpoints = keeping_loads(&previous.endpoints, ready);
            CanaryEntry {
                percent,
                loads: endpoints.iter().map(|e| Arc::clone(&e.load)).collect(),
                endpoints,
                pods,
                split: previous.split,
            }
        });
    }

    /// Sets whether a model scales to zero, and how long its requests wait
    /// for it to wake; a model not in the registry is left alone.
    pub fn set_activation_timeout(&mut self, model: &ModelKey, timeout: Option<Duration>) {
        if let Some(entry) = self.entry_mut(model) {
            entry.activation_timeout = timeout;
        }
    }

    /// The model `key` names exactly (not as a request would name it).
    pub fn entry(&self, model: &ModelKey) -> Option<&ModelEntry> {
        let holders = self.models.get(&model.name)?;
        holders.iter().find(|(key, _)| key == model).map(|(_, entry)| entry)
    }

    fn entry_mut(&mut self, model: &ModelKey) -> Option<&mut ModelEntry> {
        let holders = self.models.get_mut(&model.name)?;
        holders.iter_mut().find(|(key, _)| key == model).map(|(_, entry)| entry)
    }

    /// The model `requested` names, ready or not.
    pub fn lookup(&self, requested: &str) -> Result<(&ModelKey, &ModelEntry), RouteError> {
        self.find(requested)
    }

    /// Forgets a model that was deleted.
    pub fn remove(&mut self, model: &ModelKey) {
        self.take(model);
    }

    fn take(&mut self, model: &ModelKey) -> Option<ModelEntry> {
        let namespaces = self.models.get_mut(&model.name)?;
        let index = namespaces.iter().position(|(key, _)| key == model)?;
        let (_, entry) = namespaces.remove(index);
        if namespaces.is_empty() {
            self.models.remove(&model.name);
        }
        Some(entry)
    }

    /// Every model, for the repository index.
    pub fn models(&self) -> impl Iterator<Item = (&ModelKey, &ModelEntry)> {
        self.models.values().flatten().map(|(key, entry)| (key, entry))
    }

    /// Every model, by the name that finds it, for the repository index.
    pub fn index(&self) -> Vec<IndexEntry> {
        let mut entries = Vec::new();
        for holders in self.models.values() {
            for (key, entry) in holders {
                let plain = holders.len() == 1 || Some(&key.namespace) == self.default_namespace.as_ref();
                let ready = entry.is_ready();
                entries.push(IndexEntry {
                    namespace: key.namespace.clone(),
                    name: if plain { key.name.clone() } else { key.to_string() },
                    ready,
                    reason: if ready {
                        String::new()
                    } else {
                        format!("0/{} ready", entry.all_pods())
                    },
                });
            }
        }
        entries
    }

    /// Some model with a ready endpoint in a namespace `allowed` accepts,
    /// for the server-level calls any pod can answer (server metadata).
    pub fn any_ready(&self, allowed: impl Fn(&str) -> bool) -> Option<(&ModelKey, &ModelEntry)> {
        self.models()
            .find(|(key, entry)| entry.is_ready() && allowed(&key.namespace))
    }

    /// Where `requested` leads, without looking at readiness: the same
    /// choice [`Self::lookup`] makes.
    pub fn destination<'a>(&'a self, requested: &'a str) -> Destination<'a> {
        if let Some((namespace, _)) = requested.split_once('/') {
            return Destination::Named { namespace };
        }
        match self.plain(requested) {
            Plain::One(key, _) => Destination::Resolved(key),
            Plain::Many(holders) => Destination::Ambiguous(holders.iter().map(|(k, _)| k.namespace.as_str()).collect()),
            Plain::None => Destination::Unknown,
        }
    }

    fn find(&self, requested: &str) -> Result<(&ModelKey, &ModelEntry), RouteError> {
        let unknown = || RouteError::Unknown(requested.to_string());
        if let Some((namespace, name)) = requested.split_once('/') {
            let holders = self.models.get(name).ok_or_else(unknown)?;
            return holders
                .iter()
                .find(|(key, _)| key.namespace == namespace)
                .map(|(k, e)| (k, e))
                .ok_or_else(unknown);
        }
        match self.plain(requested) {
            Plain::One(key, entry) => Ok((key, entry)),
            Plain::Many(many) => Err(RouteError::Ambiguous {
                name: requested.to_string(),
                namespaces: many.iter().map(|(k, _)| k.namespace.clone()).collect(),
            }),
            Plain::None => Err(unknown()),
        }
    }

    /// A plain name: the default namespace's model of that name if it has
    /// one, else the one namespace's that holds the name.
    fn plain(&self, name: &str) -> Plain<'_> {
        let Some(holders) = self.models.get(name) else {
            return Plain::None;
        };
        let in_default = self
            .default_namespace
            .as_deref()
            .and_then(|wanted| holders.iter().find(|(key, _)| key.namespace == wanted));
        match (in_default, holders.as_slice()) {
            (Some((key, entry)), _) | (None, [(key, entry)]) => Plain::One(key, entry),
            (None, []) => Plain::None,
            (None, many) => Plain::Many(many),
        }
    }
}

/// The endpoints at `ready` (sorted, once each), each with the load record
/// it had in `previous`, if it was there.
fn keeping_loads(previous: &[Endpoint], ready: &[Address]) -> Vec<Endpoint> {
    let mut addresses = ready.to_vec();
    addresses.sort();
    addresses.dedup();
    addresses
        .into_iter()
        .map(|address| match previous.iter().find(|e| e.address == address) {
            Some(kept) => kept.clone(),
            None => Endpoint {
                address,
                load: EndpointLoad::new(),
                label: address.to_string().into(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> ModelKey {
        ModelKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn address(last: u8) -> Address {
        Address {
            http: SocketAddr::from(([10, 0, 0, last], 8000)),
            grpc: SocketAddr::from(([10, 0, 0, last], 8001)),
        }
    }

    fn registry(default: Option<&str>) -> Registry {
        let mut registry = Registry::new(default.map(str::to_string));
        registry.set_endpoints(key("ml", "resnet"), &[address(1), address(2)], 2);
        registry.set_endpoints(key("team", "resnet"), &[address(3)], 1);
        registry.set_endpoints(key("ml", "bert"), &[], 2);
        registry
    }

    #[test]
    fn qualified_names_and_unique_names_resolve() {
        let registry = registry(None);
        let (found, entry) = registry.lookup("team/resnet").unwrap();
        assert_eq!((found, entry.endpoints.len()), (&key("team", "resnet"), 1));
        assert_eq!(
            registry.lookup("ml/missing").unwrap_err(),
            RouteError::Unknown("ml/missing".into())
        );
        assert_eq!(registry.lookup("gpt").unwrap_err(), RouteError::Unknown("gpt".into()));
    }

    #[test]
    fn a_name_in_two_namespaces_needs_the_default_or_a_namespace() {
        assert_eq!(
            registry(None).lookup("resnet").unwrap_err(),
            RouteError::Ambiguous {
                name: "resnet".into(),
                namespaces: vec!["ml".into(), "team".into()],
            }
        );
        assert_eq!(
            registry(Some("team")).lookup("resnet").unwrap().0,
            &key("team", "resnet")
        );
        // A default that does not hold the name does not settle it.
        assert!(matches!(
            registry(Some("other")).lookup("resnet"),
            Err(RouteError::Ambiguous { .. })
        ));
    }

    #[test]
    fn a_names_destination_is_the_namespace_resolution_picks() {
        let registry = registry(None);
        assert_eq!(
            registry.destination("team/resnet"),
            Destination::Named { namespace: "team" }
        );
        // A namespace is named whether it holds the model or not.
        assert_eq!(
            registry.destination("other/resnet"),
            Destination::Named { namespace: "other" }
        );
        assert_eq!(
            registry.destination("resnet"),
            Destination::Ambiguous(vec!["ml", "team"])
        );
        // Ready endpoints or not.
        assert_eq!(registry.destination("bert"), Destination::Resolved(&key("ml", "bert")));
        assert_eq!(registry.destination("gpt"), Destination::Unknown);
        let with_default = self::registry(Some("team"));
        assert_eq!(
            with_default.destination("resnet"),
            Destination::Resolved(&key("team", "resnet"))
        );
        assert_eq!(with_default.lookup("resnet").unwrap().0, &key("team", "resnet"));
    }

    #[test]
    fn any_ready_model_in_an_allowed_namespace() {
        let registry = registry(None);
        assert_eq!(registry.any_ready(|_| true).unwrap().0, &key("ml", "resnet"));
        assert_eq!(
            registry.any_ready(|namespace| namespace == "team").unwrap().0,
            &key("team", "resnet")
        );
        // ml/bert has no ready endpoint.
        assert!(registry.any_ready(|namespace| namespace == "other").is_none());
    }

    #[test]
    fn the_index_names_each_model_so_that_the_name_finds_it() {
        let names = |registry: &Registry| {
            registry
                .index()
                .into_iter()
                .map(|e| (e.name, e.ready, e.reason))
                .collect::<Vec<_>>()
        };
        let entry = |name: &str, ready: bool, reason: &str| (name.to_string(), ready, reason.to_string());
        assert_eq!(
            names(&registry(None)),
            [
                entry("bert", false, "0/2 ready"),
                entry("ml/resnet", true, ""),
                entry("team/resnet", true, "")
            ]
        );
        assert_eq!(
            names(&registry(Some("team"))),
            [
                entry("bert", false, "0/2 ready"),
                entry("ml/resnet", true, ""),
                entry("resnet", true, "")
            ]
        );
        let registry = registry(Some("team"));
        for (name, _, _) in names(&registry).into_iter().filter(|(_, ready, _)| *ready) {
            assert!(registry.lookup(&name).is_ok(), "{name}");
        }
    }

    #[test]
    fn updates_keep_the_load_of_addresses_that_stay() {
        let mut registry = registry(None);
        let kept = Arc::clone(&registry.lookup("ml/resnet").unwrap().1.endpoints[1].load);
        let _in_flight = kept.start();
        registry.set_endpoints(key("ml", "resnet"), &[address(9), address(2), address(2)], 3);
        let entry = registry.lookup("ml/resnet").unwrap().1;
        let addresses: Vec<_> = entry.endpoints.iter().map(|e| e.address).collect();
        assert_eq!(addresses, [address(2), address(9)]);
        assert!(Arc::ptr_eq(&entry.endpoints[0].load, &kept));
        assert_eq!(entry.endpoints[0].load.outstanding(), 1);
        assert_eq!(entry.endpoints[1].load.outstanding(), 0);
        registry.remove(&key("ml", "resnet"));
        assert!(matches!(registry.lookup("ml/resnet"), Err(RouteError::Unknown(_))));
    }
}
