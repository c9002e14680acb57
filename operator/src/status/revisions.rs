//! `status.revisions` and the `CanaryReady` condition of a model with a
//! canary: each revision's readiness, share of the gateway's requests and
//! the requests its pods answered, and why the canary is not ready.
//!
//! Request counts come from the scraper's figures (each ready pod's
//! `nv_inference_request_success` at its last scrape) and are refreshed at
//! most every [`COUNT_EVERY_SECS`] seconds: a status that changed with every
//! scrape would be rewritten, and the model reconciled again, as long as
//! traffic flows.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use nereid_crds::conditions::{CANARY_READY, reason};
use nereid_crds::{InferenceModel, RevisionStatus};

use super::conditions::Conditions;
use super::{Rollout, pods, rollout};
use crate::autoscaling::figures::Figures;
use crate::builders::{canary, deployment};

/// How stale a revision's request count may get, in seconds, before it is
/// counted again.
pub const COUNT_EVERY_SECS: i64 = 30;

/// What the controller saw of one revision.
#[derive(Clone, Copy, Debug, Default)]
pub struct RevisionObserved<'a> {
    pub deployment: Option<&'a Deployment>,
    pub pods: &'a [Pod],
    pub figures: Option<&'a Figures>,
}

/// The revisions of `model` (none without `spec.canary`) and its
/// `CanaryReady` condition, from what was observed of each at `now`.
pub fn revisions(
    model: &InferenceModel,
    stable: &RevisionObserved<'_>,
    canary: &RevisionObserved<'_>,
    now: &Time,
) -> (Vec<RevisionStatus>, Option<Condition>) {
    let Some(spec) = &model.spec.canary else {
        return (Vec::new(), None);
    };
    let previous = model.status.as_ref();
    let previous_revisions = previous.map(|s| s.revisions.as_slice()).unwrap_or_default();
    let revision = |name: &str, source: &str, percent: i32, observed: &RevisionObserved<'_>, wanted: i32| {
        let ready = observed
            .deployment
            .and_then(|d| d.status.as_ref())
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        let mut status = RevisionStatus {
            name: name.into(),
            source: source.into(),
            ready: format!("{ready}/{wanted}"),
            ready_replicas: ready,
            traffic_percent: percent,
            requests: None,
            counted_at: None,
        };
        count(&mut status, previous_revisions, observed.figures, now);
        status
    };
    let canary_model = canary::revision(model, spec);
    let stable_status = revision(
        "stable",
        &model.spec.source.uri,
        100 - spec.traffic_percent,
        stable,
        deployment::replicas(model),
    );
    let canary_wanted = deployment::replicas(&canary_model);
    let canary_status = revision(
        "canary",
        &canary_model.spec.source.uri,
        spec.traffic_percent,
        canary,
        canary_wanted,
    );
    let condition = canary_condition(model, &canary_status, canary, canary_wanted, now);
    (vec![stable_status, canary_status], Some(condition))
}

/// Fills in the revision's request count: the previous one while it is
/// fresh, else the figures' (when a pod was scraped).
fn count(status: &mut RevisionStatus, previous: &[RevisionStatus], figures: Option<&Figures>, now: &Time) {
    let kept = previous
        .iter()
        .find(|p| p.name == status.name && p.source == status.source)
        .filter(|p| {
            p.counted_at.as_ref().is_some_and(|at| {
                let age = now.0.duration_since(at.0);
                !age.is_negative() && age.as_secs() < COUNT_EVERY_SECS
            })
        });
    match kept {
        Some(previous) => {
            status.requests = previous.requests;
            status.counted_at = previous.counted_at.clone();
        }
        None => {
            if let Some(figures) = figures.filter(|f| f.scraped_pods > 0) {
                status.requests = Some(figures.requests as i64);
                status.counted_at = Some(now.clone());
            }
        }
    }
}

/// `CanaryReady`: True once every wanted canary pod is ready; else why not,
/// from its pods (a failed load, a crash loop, ...) or its rollout.
fn canary_condition(
    model: &InferenceModel,
    status: &RevisionStatus,
    observed: &RevisionObserved<'_>,
    wanted: i32,
    now: &Time,
) -> Condition {
    let previous = model
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut conditions = Conditions::new(previous, model.metadata.generation, now);
    let (_, gpu_resource) = deployment::gpus(model);
    let findings = pods::diagnose(observed.pods, &model.name_any(), &gpu_resource, now);
    let ready = format!("{} canary replicas ready", status.ready);
    match (findings.worst(), rollout(observed.deployment, wanted)) {
        (Some(f), _) => conditions.set(CANARY_READY, false, &f.reason, format!("{ready}; {}", f.message)),
        (None, Rollout::Stalled(message)) => {
            conditions.set(CANARY_READY, false, reason::PROGRESS_DEADLINE_EXCEEDED, message)
        }
        (None, _) if wanted == 0 => {
            conditions.set(CANARY_READY, false, reason::SCALED_TO_ZERO, "spec.canary.replicas is 0")
        }
        (None, _) if status.ready_replicas >= wanted => conditions.set(CANARY_READY, true, reason::AVAILABLE, ready),
        (None, _) => conditions.set(CANARY_READY, false, reason::ROLLING_OUT, ready),
    };
    conditions.into_vec().pop().expect("one condition was set")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use nereid_crds::{Canary, InferenceModelSpec, ModelSource};

    use super::*;

    fn model(canary: Option<Canary>) -> InferenceModel {
        let mut model = InferenceModel::new(
            "resnet",
            InferenceModelSpec {
                source: ModelSource {
                    uri: "s3://models/resnet".into(),
                    ..ModelSource::default()
                },
                replicas: Some(3),
                canary,
                ..InferenceModelSpec::default()
            },
        );
        model.metadata.generation = Some(2);
        model
    }

    fn canary(percent: i32) -> Option<Canary> {
        Some(Canary {
            source: Some(ModelSource {
                uri: "s3://models/resnet-v2".into(),
                ..ModelSource::default()
            }),
            traffic_percent: percent,
            ..Canary::default()
        })
    }

    fn deployment(replicas: i32, ready: i32) -> Deployment {
        let mut deployment = Deployment::default();
        deployment.metadata.generation = Some(1);
        deployment.spec.replicas = Some(replicas);
        deployment.status = Some(DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(replicas),
            updated_replicas: Some(replicas),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            ..DeploymentStatus::default()
        });
        deployment
    }

    fn figures(requests: f64) -> Figures {
        Figures {
            ready_pods: 1,
            scraped_pods: 1,
            requests,
            ..Figures::default()
        }
    }

    fn at(seconds: i64) -> Time {
        Time(Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1_800_000_000 + seconds))
    }

    #[test]
    fn without_a_canary_there_are_no_revisions() {
        let observed = RevisionObserved::default();
        assert_eq!(
            revisions(&model(None), &observed, &observed, &at(0)),
            (Vec::new(), None)
        );
    }

    #[test]
    fn both_revisions_show_their_readiness_share_and_requests() {
        let (stable, canary_deployment) = (deployment(3, 3), deployment(1, 1));
        let (stable_figures, canary_figures) = (figures(800.0), figures(200.0));
        let observed = |d, f| RevisionObserved {
            deployment: Some(d),
            pods: &[],
            figures: Some(f),
        };
        let (found, condition) = revisions(
            &model(canary(20)),
            &observed(&stable, &stable_figures),
            &observed(&canary_deployment, &canary_figures),
            &at(0),
        );
        let summary: Vec<_> = found
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.source.as_str(),
                    r.ready.as_str(),
                    r.traffic_percent,
                    r.requests,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("stable", "s3://models/resnet", "3/3", 80, Some(800)),
                ("canary", "s3://models/resnet-v2", "1/1", 20, Some(200)),
            ]
        );
        let condition = condition.unwrap();
        assert_eq!(
            (condition.type_.as_str(), condition.status.as_str()),
            (CANARY_READY, "True")
        );
    }

    #[test]
    fn request_counts_are_refreshed_every_thirty_seconds_not_every_scrape() {
        let mut model = model(canary(20));
        let stable = deployment(3, 3);
        let observe = |figures: &Figures, now: &Time, model: &InferenceModel| {
            let observed = RevisionObserved {
                deployment: Some(&stable),
                pods: &[],
                figures: Some(figures),
            };
            revisions(model, &observed, &observed, now).0
        };
        let first = observe(&figures(10.0), &at(0), &model);
        model.status = Some(nereid_crds::InferenceModelStatus {
            revisions: first.clone(),
            ..Default::default()
        });
        assert_eq!(observe(&figures(50.0), &at(20), &model), first, "fresh counts are kept");
        let later = observe(&figures(50.0), &at(COUNT_EVERY_SECS), &model);
        assert_eq!(later[0].requests, Some(50));
        assert_eq!(later[0].counted_at, Some(at(COUNT_EVERY_SECS)));
    }

    #[test]
    fn a_canary_without_ready_pods_says_so() {
        let (stable, canary_deployment) = (deployment(3, 3), deployment(2, 0));
        let (_, condition) = revisions(
            &model(canary(50)),
            &RevisionObserved {
                deployment: Some(&stable),
                ..RevisionObserved::default()
            },
            &RevisionObserved {
                deployment: Some(&canary_deployment),
                ..RevisionObserved::default()
            },
            &at(0),
        );
        let condition = condition.unwrap();
        assert_eq!(condition.status, "False");
        assert_eq!(condition.reason, reason::ROLLING_OUT);
        assert_eq!(condition.message, "0/1 canary replicas ready");
    }
}
