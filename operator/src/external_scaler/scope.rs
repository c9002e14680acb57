//! Which triggers the External Scaler service answers: those naming a
//! namespace the operator watches and, in it, a model it serves (an
//! InferenceModel or a ModelEnsemble). Anything else is refused before the
//! figures are looked at, so a caller learns nothing about the namespaces
//! and models beyond the operator's own; a refusal reads the same whether or
//! not the scraper has figures for the name.
//!
//! The served models come from a [`Catalog`]: in the operator, metadata-only
//! watches of InferenceModels and ModelEnsembles over the watched namespaces
//! ([`Watched`]), kept by every replica (KEDA may call any of them); in
//! tests, a fixed set.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use nereid_crds::{InferenceModel, ModelEnsemble};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::autoscaling::figures::ModelKey;
use crate::controller::scoped;

/// The models the operator serves, by namespace and name.
pub trait Catalog: Send + Sync + 'static {
    fn serves(&self, namespace: &str, model: &str) -> bool;
}

/// A fixed set of models.
impl Catalog for BTreeSet<ModelKey> {
    fn serves(&self, namespace: &str, model: &str) -> bool {
        self.contains(&ModelKey {
            namespace: namespace.to_string(),
            model: model.to_string(),
        })
    }
}

/// What the service answers for.
#[derive(Clone)]
pub struct Scope {
    /// The watched namespaces; `None`: every namespace.
    namespaces: Option<BTreeSet<String>>,
    catalog: Arc<dyn Catalog>,
}

impl Scope {
    /// The operator's `namespaces` (`None`: all) and the models it serves there.
    pub fn new(namespaces: Option<Vec<String>>, catalog: Arc<dyn Catalog>) -> Scope {
        Scope {
            namespaces: namespaces.map(|list| list.into_iter().collect()),
            catalog,
        }
    }

    /// `Ok` for a model the operator serves in a namespace it watches;
    /// PERMISSION_DENIED for any other namespace, NOT_FOUND for any other model.
    pub fn admit(&self, namespace: &str, model: &str) -> Result<(), Status> {
        if let Some(namespaces) = &self.namespaces
            && !namespaces.contains(namespace)
        {
            return Err(Status::permission_denied(format!(
                "namespace {namespace:?} is not one this operator watches"
            )));
        }
        if !self.catalog.serves(namespace, model) {
            return Err(Status::not_found(format!(
                "no InferenceModel or ModelEnsemble {model:?} in namespace {namespace:?}"
            )));
        }
        Ok(())
    }
}

/// The InferenceModels and ModelEnsembles of the watched namespaces, by
/// name, kept by metadata-only watches (one per namespace and kind, as the
/// controller's: the operator may have rights in those namespaces only).
#[derive(Clone)]
pub struct Watched {
    models: Vec<Store<PartialObjectMeta<InferenceModel>>>,
    ensembles: Vec<Store<PartialObjectMeta<ModelEnsemble>>>,
}

impl Watched {
    /// Starts the watches over `namespaces` (`None`: all), which run until
    /// `stop`, and waits up to `ready_within` for their first lists. Until a
    /// list arrives its models are unknown, so triggers naming them are
    /// refused (NOT_FOUND) rather than answered on a guess.
    pub async fn start(
        client: &kube::Client,
        namespaces: Option<&[String]>,
        stop: &CancellationToken,
        ready_within: Duration,
    ) -> Watched {
        let scopes: Vec<Option<&str>> = match namespaces {
            None => vec![None],
            Some(list) => list.iter().map(|n| Some(n.as_str())).collect(),
        };
        let mut watched = Watched {
            models: Vec::with_capacity(scopes.len()),
            ensembles: Vec::with_capacity(scopes.len()),
        };
        for scope in scopes {
            watched
                .models
                .push(reflect::<InferenceModel>(scoped(client, scope), stop));
            watched
                .ensembles
                .push(reflect::<ModelEnsemble>(scoped(client, scope), stop));
        }
        let listed = async {
            for store in &watched.models {
                let _ = store.wait_until_ready().await;
            }
            for store in &watched.ensembles {
                let _ = store.wait_until_ready().await;
            }
        };
        if tokio::time::timeout(ready_within, listed).await.is_err() {
            tracing::warn!(
                "KEDA's External Scaler service: the models are not listed yet; \
                 triggers naming them are refused until they are"
            );
        }
        watched
    }
}

impl Catalog for Watched {
    fn serves(&self, namespace: &str, model: &str) -> bool {
        let as_model = ObjectRef::<PartialObjectMeta<InferenceModel>>::new(model).within(namespace);
        let as_ensemble = ObjectRef::<PartialObjectMeta<ModelEnsemble>>::new(model).within(namespace);
        self.models.iter().any(|store| store.get(&as_model).is_some())
            || self.ensembles.iter().any(|store| store.get(&as_ensemble).is_some())
    }
}

/// A store of `api`'s objects (metadata only), kept until `stop`; watch
/// errors are retried with the runtime's default backoff.
fn reflect<K>(api: Api<PartialObjectMeta<K>>, stop: &CancellationToken) -> Store<PartialObjectMeta<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .for_each(|event| {
            if let Err(error) = event {
                tracing::debug!(%error, "KEDA's External Scaler service: watching the models failed; retrying");
            }
            std::future::ready(())
        });
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = stream => {}
        }
    });
    reader
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(namespaces: Option<&[&str]>) -> Scope {
        let served = BTreeSet::from([ModelKey {
            namespace: "ml".into(),
            model: "resnet".into(),
        }]);
        Scope::new(
            namespaces.map(|list| list.iter().map(|n| n.to_string()).collect()),
            Arc::new(served),
        )
    }

    #[test]
    fn a_served_model_in_a_watched_namespace_is_admitted() {
        assert!(scope(None).admit("ml", "resnet").is_ok());
        assert!(scope(Some(&["ml", "other"][..])).admit("ml", "resnet").is_ok());
    }

    #[test]
    fn other_namespaces_are_denied_and_other_models_not_found() {
        let denied = scope(Some(&["ml"][..])).admit("team-b", "resnet").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        // Every namespace watched: a namespace without the model is only "not found".
        let unknown = scope(None).admit("team-b", "resnet").unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
        let unknown = scope(Some(&["ml"][..])).admit("ml", "bert").unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
    }
}
