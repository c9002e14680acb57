//! Every read of the ModelEnsemble controller, in two rounds around the
//! apply, as for an InferenceModel ([`crate::controller::observe`]): what
//! decides the objects ([`before_apply`]: the members, what their pods
//! serve, whether the name is free, another autoscaler), and what the
//! objects became ([`after_apply`]). Nothing here decides anything; the
//! plan ([`super::plan`]) does.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use nereid_crds::{InferenceModel, ModelEnsemble};

use super::members::{self, MemberConfig};
use super::plan;
use super::status;
use crate::autoscaling::figures::Figures;
use crate::builders::{labels, service};
use crate::context::Context;
use crate::controller::apply::{self, Applied};
use crate::controller::observe::foreign_autoscaler;
use crate::error::Error;

/// One member InferenceModel as read.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberRead {
    /// The InferenceModel's name.
    pub name: String,
    /// The steps that run it.
    pub steps: Vec<String>,
    /// The object, when it exists.
    pub model: Option<InferenceModel>,
    /// What one of its ready pods told it serves; `None` while it is not
    /// Ready, or when no pod answered.
    pub config: Option<MemberConfig>,
}

/// What decides an ensemble's objects, read before anything is written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BeforeApply {
    /// Every member, once, in step order.
    pub members: Vec<MemberRead>,
    /// An InferenceModel holds the ensemble's name (its Service and pods need it).
    pub name_taken: bool,
    /// Another HPA that scales the ensemble's pods, by name; only looked
    /// for when the objects are to be applied.
    pub foreign_autoscaler: Option<String>,
}

/// What the cluster shows of an ensemble's own objects.
#[derive(Clone, Debug, Default)]
pub struct AfterApply {
    /// The Deployment as the apply answered or, when nothing was applied
    /// (a member is not ready), as it was left before, if the ensemble owns it.
    pub deployment: Option<Deployment>,
    /// The ensemble's HPA, the same way.
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// The ensemble's pods.
    pub pods: Vec<Pod>,
    /// The ensemble's figures from the scraper's latest round.
    pub figures: Option<Figures>,
}

/// Reads the members of `ensemble` (and, from one ready pod of each, the
/// config it serves), whether its name is taken and, when its objects are
/// to be applied ([`plan::deploy`]), whether another autoscaler scales its pods.
pub async fn before_apply(ctx: &Context, namespace: &str, ensemble: &ModelEnsemble) -> Result<BeforeApply, Error> {
    let models: Api<InferenceModel> = Api::namespaced(ctx.client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let mut read = Vec::new();
    for (member, steps) in status::member_names(ensemble) {
        let model = models.get_opt(&member).await?;
        let config = match model.as_ref().filter(|m| status::is_ready(m)) {
            Some(model) => {
                let member_pods = pods
                    .list(&ListParams::default().labels(&labels::selector_string(model)))
                    .await?
                    .items;
                members::query(&member_pods, &member, service::ports(model).http).await
            }
            None => None,
        };
        read.push(MemberRead {
            name: member,
            steps,
            model,
            config,
        });
    }
    let name_taken = models.get_metadata_opt(&ensemble.name_any()).await?.is_some();
    let foreign_autoscaler = match plan::deploy(ensemble, &read, name_taken) {
        plan::Deploy::Now(_) => foreign_autoscaler(&ctx.client, namespace, ensemble, &ctx.config.autoscaler).await?,
        _ => None,
    };
    Ok(BeforeApply {
        members: read,
        name_taken,
        foreign_autoscaler,
    })
}

/// Reads what `ensemble`'s objects became: the apply's answers (or, when
/// nothing was `applied`, the Deployment and HPA it owns), its pods and
/// the scraper's figures.
pub async fn after_apply(
    ctx: &Context,
    namespace: &str,
    ensemble: &ModelEnsemble,
    applied: Option<Applied>,
) -> Result<AfterApply, Error> {
    let (deployment, hpa) = match applied {
        Some(applied) => (Some(applied.deployment), applied.hpa),
        None => owned_deployment_and_hpa(ctx, namespace, ensemble).await?,
    };
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default().labels(&labels::selector_string(ensemble)))
        .await?
        .items;
    Ok(AfterApply {
        deployment,
        hpa,
        pods,
        figures: ctx.board.get(namespace, &ensemble.name_any()),
    })
}

/// What was applied before, when nothing is applied now (a member is not
/// ready): the ensemble's Deployment and HPA, if it owns them.
async fn owned_deployment_and_hpa(
    ctx: &Context,
    namespace: &str,
    ensemble: &ModelEnsemble,
) -> Result<(Option<Deployment>, Option<HorizontalPodAutoscaler>), Error> {
    let name = ensemble.name_any();
    let owned = |meta: &kube::api::ObjectMeta| apply::owned_by(meta, ensemble);
    let deployment = Api::<Deployment>::namespaced(ctx.client.clone(), namespace)
        .get_opt(&name)
        .await?
        .filter(|d| owned(&d.metadata));
    let hpa = Api::<HorizontalPodAutoscaler>::namespaced(ctx.client.clone(), namespace)
        .get_opt(&name)
        .await?
        .filter(|h| owned(&h.metadata));
    Ok((deployment, hpa))
}
