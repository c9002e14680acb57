//! Which models the gateway serves and where their ready pods are, from
//! the Kubernetes API: reflectors over InferenceModels, ModelEnsembles and
//! the EndpointSlices of the operator's Services, in the namespaces given
//! (all by default).
//!
//! A model exists while its InferenceModel (or ModelEnsemble) does; its
//! endpoints are the slice endpoints of the Service named like it that are
//! ready and not terminating, so a pod that is starting or going away gets
//! no new requests. An InferenceModel with `spec.canary` also has the
//! endpoints of its `<name>-canary` Service, which get
//! `spec.canary.trafficPercent` of its requests; once the spec drops the
//! canary, they get none, before its pods are deleted. An InferenceModel
//! with `spec.autoscaling.minReplicas: 0` scales to zero: its requests are
//! held while it wakes, for its `activationTimeout` at most
//! ([`crate::activation`]). Every change recomputes the registry from the stores:
//! a few hundred objects at most, and the registry keeps the load of every
//! endpoint that stays.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use nereid_crds::{CANARY_SUFFIX, InferenceModel, ModelEnsemble};

use crate::registry::{Address, ModelKey, Registry};
use crate::router::Router;

/// The operator's label on everything it makes; its Services' labels are
/// copied onto their EndpointSlices, so the slice watch filters on it.
const MANAGED: &str = "app.kubernetes.io/managed-by=nereid-operator";
/// The Service an EndpointSlice belongs to.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// The stores discovery reads, one of each per watched namespace.
struct Stores {
    models: Vec<Store<InferenceModel>>,
    ensembles: Vec<Store<ModelEnsemble>>,
    slices: Vec<Store<EndpointSlice>>,
}

/// Watches the cluster and keeps the router's registry up to date until
/// the process ends; marks the router synced once every watch has listed.
pub async fn run(client: Client, namespaces: &[String], router: Arc<Router>) -> Result<()> {
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let mut stores = Stores {
        models: Vec::new(),
        ensembles: Vec::new(),
        slices: Vec::new(),
    };
    let mut streams = Vec::new();
    for scope in &scopes {
        let (store, stream) = watch::<InferenceModel>(&client, *scope, watcher::Config::default());
        stores.models.push(store);
        streams.push(stream);
        let (store, stream) = watch::<ModelEnsemble>(&client, *scope, watcher::Config::default());
        stores.ensembles.push(store);
        streams.push(stream);
        let (store, stream) = watch::<EndpointSlice>(&client, *scope, watcher::Config::default().labels(MANAGED));
        stores.slices.push(store);
        streams.push(stream);
    }
    let watches = streams.len();
    let mut events = stream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(index, events)| events.map(move |event| (index, event))),
    );
    let mut listed = BTreeSet::new();
    while let Some((index, event)) = events.next().await {
        match event {
            Ok(Listed::Done) => {
                listed.insert(index);
            }
            Ok(Listed::Change) => {}
            Err(error) => {
                // The watcher retries with backoff; the stores keep their last state.
                tracing::warn!(%error, "a Kubernetes watch failed; retrying");
                continue;
            }
        }
        if listed.len() < watches {
            continue;
        }
        let snapshot = snapshot(&stores);
        let models = snapshot.models.len();
        router.update(|registry| apply(registry, snapshot));
        if !router.synced() {
            tracing::info!(models, "discovery listed the cluster's models; ready");
            router.set_synced();
        }
    }
    Ok(())
}

/// What a watch event meant for discovery.
enum Listed {
    Done,
    Change,
}

/// A reflector over `K` in `scope` (all namespaces when `None`).
fn watch<K>(
    client: &Client,
    scope: Option<&str>,
    config: watcher::Config,
) -> (Store<K>, BoxStream<'static, Result<Listed, watcher::Error>>)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let api: Api<K> = match scope {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .map(|event| {
            event.map(|event| match event {
                watcher::Event::InitDone => Listed::Done,
                _ => Listed::Change,
            })
        });
    (store, stream.boxed())
}

/// Per model, its ready addresses and how many pods it has.
type Endpoints = BTreeMap<ModelKey, (Vec<Address>, usize)>;

/// The models with a canary, and the percent of requests it gets.
type Canaries = BTreeMap<ModelKey, u32>;

/// The models that scale to zero, and how long their requests may wait.
type Sleepers = BTreeMap<ModelKey, Duration>;

/// What the stores say: every model, the endpoints of those that have any,
/// the canaries and the models that scale to zero.
#[derive(Debug, Default)]
struct Snapshot {
    models: BTreeSet<ModelKey>,
    endpoints: Endpoints,
    canaries: Canaries,
    sleepers: Sleepers,
}

/// The stores, read once.
fn snapshot(stores: &Stores) -> Snapshot {
    let key = |namespace: Option<String>, name: String| ModelKey {
        namespace: namespace.unwrap_or_default(),
        name,
    };
    let mut models = BTreeSet::new();
    let mut canaries = Canaries::new();
    let mut sleepers = Sleepers::new();
    for store in &stores.models {
        for model in store.state() {
            let model_key = key(model.namespace(), model.name_any());
            if let Some(canary) = &model.spec.canary {
                let percent = u32::try_from(canary.traffic_percent.clamp(0, 100)).unwrap_or(0);
                canaries.insert(model_key.clone(), percent);
            }
            if let Some(autoscaling) = model.spec.autoscaling.as_ref().filter(|a| a.scales_to_zero()) {
                sleepers.insert(model_key.clone(), autoscaling.activation_timeout());
            }
            models.insert(model_key);
        }
    }
    for store in &stores.ensembles {
        models.extend(store.state().iter().map(|m| key(m.namespace(), m.name_any())));
    }
    let mut endpoints = Endpoints::new();
    for store in &stores.slices {
        for slice in store.state() {
            let Some(service) = slice.labels().get(SERVICE_NAME) else {
                continue;
            };
            let model = key(slice.namespace(), service.clone());
            let (ready, pods) = endpoints.entry(model).or_default();
            let (found, total) = slice_endpoints(&slice);
            ready.extend(found);
            *pods += total;
        }
    }
    Snapshot {
        models,
        endpoints,
        canaries,
        sleepers,
    }
}

/// The ready, not terminating addresses of one slice, and how many
/// endpoints it lists in all.
fn slice_endpoints(slice: &EndpointSlice) -> (Vec<Address>, usize) {
    let port = |name: &str| {
        slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
    };
    let listed = slice.endpoints.as_deref().unwrap_or_default();
    let (Some(http), Some(grpc)) = (port("http"), port("grpc")) else {
        return (Vec::new(), listed.len());
    };
    let ready = listed
        .iter()
        .filter(|e| {
            let conditions = e.conditions.as_ref();
            // An absent `ready` means ready (the API's convention).
            conditions.and_then(|c| c.ready).unwrap_or(true) && !conditions.and_then(|c| c.terminating).unwrap_or(false)
        })
        .filter_map(|e| e.addresses.first()?.parse::<IpAddr>().ok())
        .map(|ip| Address {
            http: SocketAddr::new(ip, http),
            grpc: SocketAddr::new(ip, grpc),
        })
        .collect();
    (ready, listed.len())
}

/// Makes the registry hold exactly the snapshot's models, with their
/// endpoints, canaries and activation timeouts.
fn apply(registry: &mut Registry, snapshot: Snapshot) {
    let Snapshot {
        models,
        mut endpoints,
        canaries,
        sleepers,
    } = snapshot;
    let gone: Vec<ModelKey> = registry
        .models()
        .map(|(key, _)| key.clone())
        .filter(|key| !models.contains(key))
        .collect();
    for key in &gone {
        registry.remove(key);
    }
    for model in &models {
        let (ready, pods) = endpoints.remove(model).unwrap_or_default();
        registry.set_endpoints(model.clone(), &ready, pods);
        let canary = canaries.get(model).map(|&percent| {
            let service = ModelKey {
                namespace: model.namespace.clone(),
                name: format!("{}{CANARY_SUFFIX}", model.name),
            };
            let (ready, pods) = endpoints.get(&service).cloned().unwrap_or_default();
            (percent, ready, pods)
        });
        registry.set_canary(
            model,
            canary.as_ref().map(|(p, ready, pods)| (*p, ready.as_slice(), *pods)),
        );
        registry.set_activation_timeout(model, sleepers.get(model).copied());
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use kube::api::ObjectMeta;

    use super::*;

    fn endpoint(ip: &str, ready: Option<bool>, terminating: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready,
                terminating,
                ..EndpointConditions::default()
            }),
            ..Endpoint::default()
        }
    }

    fn slice(endpoints: Vec<Endpoint>) -> EndpointSlice {
        let port = |name: &str, port: i32| EndpointPort {
            name: Some(name.into()),
            port: Some(port),
            ..EndpointPort::default()
        };
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some("resnet-abcde".into()),
                namespace: Some("ml".into()),
                labels: Some([(SERVICE_NAME.to_string(), "resnet".to_string())].into()),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            ports: Some(vec![port("http", 8000), port("grpc", 8001), port("metrics", 8002)]),
        }
    }

    #[test]
    fn only_ready_endpoints_that_are_not_terminating_take_requests() {
        let (ready, pods) = slice_endpoints(&slice(vec![
            endpoint("10.0.0.1", Some(true), Some(false)),
            endpoint("10.0.0.2", None, None),
            endpoint("10.0.0.3", Some(false), None),
            endpoint("10.0.0.4", Some(true), Some(true)),
        ]));
        assert_eq!(pods, 4);
        let ips: Vec<String> = ready.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.0.0.1:8000", "10.0.0.2:8000"]);
        assert_eq!(ready[0].grpc, "10.0.0.1:8001".parse().unwrap());
    }

    #[test]
    fn a_slice_without_the_named_ports_offers_nothing() {
        let mut unnamed = slice(vec![endpoint("10.0.0.1", Some(true), None)]);
        unnamed.ports = Some(vec![EndpointPort {
            port: Some(8000),
            ..EndpointPort::default()
        }]);
        assert_eq!(slice_endpoints(&unnamed), (Vec::new(), 1));
    }

    #[test]
    fn the_registry_follows_the_cluster() {
        let key = |name: &str| ModelKey {
            namespace: "ml".into(),
            name: name.into(),
        };
        let mut registry = Registry::new(None);
        let address = slice_endpoints(&slice(vec![endpoint("10.0.0.1", None, None)])).0;
        let models = BTreeSet::from([key("resnet"), key("bert")]);
        apply(
            &mut registry,
            Snapshot {
                models,
                endpoints: BTreeMap::from([(key("resnet"), (address, 1)), (key("orphan"), (Vec::new(), 1))]),
                ..Snapshot::default()
            },
        );
        assert!(registry.lookup("resnet").unwrap().1.is_ready());
        let (_, bert) = registry.lookup("bert").unwrap();
        assert_eq!((bert.is_ready(), bert.all_pods()), (false, 0));
        assert!(
            registry.lookup("orphan").is_err(),
            "a Service without its model is not served"
        );
        apply(
            &mut registry,
            Snapshot {
                models: BTreeSet::from([key("bert")]),
                ..Snapshot::default()
            },
        );
        assert!(matches!(
            registry.lookup("resnet"),
            Err(crate::registry::RouteError::Unknown(_))
        ));
    }

    #[test]
    fn a_canary_takes_the_endpoints_of_its_canary_service() {
        let key = |name: &str| ModelKey {
            namespace: "ml".into(),
            name: name.into(),
        };
        let stable = slice_endpoints(&slice(vec![endpoint("10.0.0.1", None, None)])).0;
        let canary = slice_endpoints(&slice(vec![endpoint("10.0.0.9", None, None)])).0;
        let endpoints = || {
            BTreeMap::from([
                (key("resnet"), (stable.clone(), 1)),
                (key("resnet-canary"), (canary.clone(), 2)),
            ])
        };
        let models = BTreeSet::from([key("resnet")]);
        let mut registry = Registry::new(None);
        apply(
            &mut registry,
            Snapshot {
                models: models.clone(),
                endpoints: endpoints(),
                canaries: Canaries::from([(key("resnet"), 25)]),
                ..Snapshot::default()
            },
        );
        let (_, entry) = registry.lookup("resnet").unwrap();
        let served = entry.canary.as_ref().expect("a canary");
        assert_eq!((served.percent, served.pods), (25, 2));
        assert_eq!(served.endpoints[0].address, canary[0]);
        assert!(
            registry.lookup("resnet-canary").is_err(),
            "the canary's Service is not a model of its own"
        );
        // The spec drops the canary: its endpoints take no more requests.
        apply(
            &mut registry,
            Snapshot {
                models,
                endpoints: endpoints(),
                ..Snapshot::default()
            },
        );
        assert!(registry.lookup("resnet").unwrap().1.canary.is_none());
    }

    #[test]
    fn a_model_that_scales_to_zero_keeps_its_activation_timeout_across_updates() {
        let key = ModelKey {
            namespace: "ml".into(),
            name: "sleepy".into(),
        };
        let models = BTreeSet::from([key.clone()]);
        let sleepers = Sleepers::from([(key.clone(), Duration::from_secs(60))]);
        let mut registry = Registry::new(None);
        apply(
            &mut registry,
            Snapshot {
                models: models.clone(),
                sleepers: sleepers.clone(),
                ..Snapshot::default()
            },
        );
        let (_, entry) = registry.lookup("sleepy").unwrap();
        assert_eq!(entry.activation_timeout, Some(Duration::from_secs(60)));
        assert!(!entry.is_ready());
        // Its pod comes up: still a model that scales to zero.
        let ready = slice_endpoints(&slice(vec![endpoint("10.0.0.1", None, None)])).0;
        registry.set_endpoints(key.clone(), &ready, 1);
        assert_eq!(
            registry.lookup("sleepy").unwrap().1.activation_timeout,
            Some(Duration::from_secs(60))
        );
        // minReplicas back to 1: no longer.
        apply(
            &mut registry,
            Snapshot {
                models,
                ..Snapshot::default()
            },
        );
        assert_eq!(registry.lookup("sleepy").unwrap().1.activation_timeout, None);
    }
}
