//! Writing to the API server, the controllers' "act": server-side apply of
//! the owned objects ([`apply_all`]) and of the status, with the Events of a
//! plan's report ([`report`]), always as the one field manager.
//!
//! Server-side apply sends the whole desired object every time and lets the
//! API server work out the difference: fields we stop setting are removed,
//! fields others own (an HPA, a mutating webhook, `kubectl edit` of a field we
//! do not set) are left alone. `force` takes fields back from anyone who
//! changed what we own, which is what a controller that owns them should do.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::events;
use super::plan::Report;
use crate::builders::{AutoscalerObject, CanaryState, Desired, Served, canary, config_map, scaled_object};
use crate::context::Context;
use crate::error::Error;

/// What the API server holds after [`apply_all`], with the status the
/// reconcile reports from.
pub struct Applied {
    pub deployment: Deployment,
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// The canary's Deployment, with `spec.canary`.
    pub canary: Option<Deployment>,
}

/// Applies every desired object of `model`, the ConfigMap first (the pods
/// mount it), and returns the Deployment and the model's HPA (KEDA's, with
/// a ScaledObject) as the API server now has them, with their status. A
/// NetworkPolicy, HPA or ScaledObject the spec no longer asks for is
/// removed: unlike the other objects they are optional, so the garbage
/// collector cannot be left to it.
pub async fn apply_all<S: Served>(
    client: &Client,
    namespace: &str,
    model: &S,
    desired: Desired,
    field_manager: &str,
) -> Result<Applied, Error> {
    apply(client, namespace, &desired.config_map, field_manager).await?;
    let deployment = apply(client, namespace, &desired.deployment, field_manager).await?;
    apply(client, namespace, &desired.service, field_manager).await?;
    apply(client, namespace, &desired.pdb, field_manager).await?;
    match &desired.network_policy {
        Some(policy) => {
            apply(client, namespace, policy, field_manager).await?;
        }
        None => remove_owned(&Api::<NetworkPolicy>::namespaced(client.clone(), namespace), model).await?,
    }
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), namespace);
    let hpa = match &desired.autoscaler {
        AutoscalerObject::Hpa(Some(hpa)) => Some(apply(client, namespace, &**hpa, field_manager).await?),
        AutoscalerObject::Hpa(None) => {
            remove_owned(&hpas, model).await?;
            None
        }
        AutoscalerObject::Keda(object) => {
            // An HPA of ours from before the switch to KEDA would fight KEDA's.
            remove_owned(&hpas, model).await?;
            let resource = scaled_object::api_resource();
            let objects: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
            match object {
                Some(object) => {
                    let params = PatchParams::apply(field_manager).force();
                    objects.patch(&model.name_any(), &params, &Patch::Apply(object)).await?;
                }
                None => remove_owned(&objects, model).await?,
            }
            // The HPA KEDA made for it, which the status reports.
            hpas.get_opt(&scaled_object::keda_hpa_name(model)).await?
        }
    };
    let canary = apply_canary(client, namespace, model, desired.canary, field_manager).await?;
    Ok(Applied {
        deployment,
        hpa,
        canary,
    })
}

/// Applies a canary's objects and returns its Deployment; without one,
/// deletes those of a canary the model had. The Deployment is deleted last
/// and read first, so one read tells whether anything is left to delete.
async fn apply_canary<S: Served>(
    client: &Client,
    namespace: &str,
    model: &S,
    canary: CanaryState,
    field_manager: &str,
) -> Result<Option<Deployment>, Error> {
    match canary {
        CanaryState::Unsupported => Ok(None),
        CanaryState::Present(objects) => {
            apply(client, namespace, &objects.config_map, field_manager).await?;
            let deployment = apply(client, namespace, &objects.deployment, field_manager).await?;
            apply(client, namespace, &objects.service, field_manager).await?;
            match &objects.network_policy {
                Some(policy) => {
                    apply(client, namespace, policy, field_manager).await?;
                }
                None => {
                    remove_owned_named(
                        &super::scoped::<NetworkPolicy>(client, Some(namespace)),
                        model,
                        &canary::name(model),
                    )
                    .await?
                }
            }
            Ok(Some(deployment))
        }
        CanaryState::Absent => {
            let name = canary::name(model);
            let deployments = super::scoped::<Deployment>(client, Some(namespace));
            if deployments.get_metadata_opt(&name).await?.is_some() {
                remove_owned_named(&super::scoped::<Service>(client, Some(namespace)), model, &name).await?;
                remove_owned_named(&super::scoped::<NetworkPolicy>(client, Some(namespace)), model, &name).await?;
                remove_owned_named(
                    &super::scoped::<ConfigMap>(client, Some(namespace)),
                    model,
                    &config_map::name_of(&name),
                )
                .await?;
                remove_owned_named(&deployments, model, &name).await?;
            }
            Ok(None)
        }
    }
}

/// Writes a plan's `report` about `object`: its status, when it changed,
/// then its Events (best effort: one that fails to publish is logged, not
/// retried); returns what the reconcile returns.
pub async fn report<K, S>(ctx: &Context, object: &K, report: Report<S>) -> Result<Action, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    S: Serialize,
{
    if let Some(status) = &report.status {
        let namespace = object.namespace().ok_or(Error::MissingField("namespace"))?;
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
        patch_status(&api, &object.name_any(), status, &ctx.config.field_manager).await?;
        events::publish(&ctx.recorder, &object.object_ref(&()), report.events).await;
    }
    report.next
}

/// Deletes the object of `api` named like the model if there is one and
/// the model owns it: an object of the same name that someone else made is
/// not ours to remove. The UID precondition keeps one replaced in between
/// safe too. A kind the cluster does not serve (KEDA not installed) has
/// nothing to remove either.
async fn remove_owned<K, S: Served>(api: &Api<K>, model: &S) -> Result<(), Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    remove_owned_named(api, model, &model.name_any()).await
}

/// [`remove_owned`] of the object `name`.
async fn remove_owned_named<K, S: Served>(api: &Api<K>, model: &S, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let found = match api.get_metadata_opt(name).await {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if !owned_by(&found.metadata, model) {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: found.metadata.uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        // Gone, or replaced by another object, since it was read.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether `model` is the controller owner of the object with `meta`.
pub fn owned_by<S: Served>(meta: &ObjectMeta, model: &S) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|owner| Some(&owner.uid) == model.meta().uid.as_ref() && owner.controller == Some(true))
}

/// Server-side applies one namespaced object.
pub async fn apply<K>(client: &Client, namespace: &str, object: &K, field_manager: &str) -> Result<K, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = object.meta().name.clone().ok_or(Error::MissingField("name"))?;
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams::apply(field_manager).force();
    Ok(api.patch(&name, &params, &Patch::Apply(object)).await?)
}

/// Server-side applies the status subresource of the object `name` of
/// `api`. The manager owns every status field, so a field left out (a
/// cleared failure) is removed.
pub async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl Serialize,
    field_manager: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let status = serde_json::to_value(status).map_err(|source| Error::Serialize {
        what: "a status",
        source,
    })?;
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let params = PatchParams::apply(field_manager).force();
    api.patch_status(name, &params, &Patch::Apply(&body)).await?;
    Ok(())
}
