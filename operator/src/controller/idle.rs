//! Scale to zero: a model with `spec.autoscaling.minReplicas: 0` that has
//! been quiet for its `scaleToZeroAfter` gets `spec.replicas: 0`.
//!
//! The HPA cannot scale to zero (not without the alpha HPAScaleToZero
//! gate), and a scale target at zero replicas disables it until something
//! else sets replicas again: so the HPA keeps owning 1..max, and the
//! operator owns the step down to 0 here. The step back up is
//! nereid-gateway's: it holds the model's requests and sets one replica
//! through the same scale subresource. With `--autoscaler keda`, KEDA owns
//! both steps (its ScaledObject has `minReplicaCount: 0`, a cooldown of
//! `scaleToZeroAfter`, and the operator's IsActive), and this does nothing.
//!
//! "Quiet" is the scraper's clock ([`Figures::quiet_for`]): no request
//! answered or in flight on any pod, no pod starting, every ready pod
//! answering its scrape. The write goes through the scale subresource with
//! the resourceVersion it read, so an HPA (or a gateway) that changed the
//! replicas meanwhile wins, and the next reconcile looks again.

use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use nereid_crds::InferenceModel;

use super::plan::{PROGRESSING_REQUEUE, SETTLED_REQUEUE};
use crate::autoscaling::figures::Figures;
use crate::builders::deployment;
use crate::context::{Autoscaler, Context};
use crate::error::Error;

/// What scale to zero makes of one model now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Not the operator's to scale to zero: no minReplicas 0, KEDA scales
    /// it, it is at zero already, or nothing is known of its pods.
    NotMine,
    /// Quiet, but not yet for the window: look again after this long.
    LookAgainIn(Duration),
    /// Quiet for the whole window: scale it to zero.
    ScaleToZero,
}

/// The decision for `model`, whose scraper figures are `figures`, at `now`.
pub fn decide(model: &InferenceModel, autoscaler: &Autoscaler, figures: Option<&Figures>, now: Instant) -> Idle {
    let Some(autoscaling) = model.spec.autoscaling.as_ref().filter(|a| a.scales_to_zero()) else {
        return Idle::NotMine;
    };
    if *autoscaler != Autoscaler::Hpa || deployment::replicas(model) == 0 {
        return Idle::NotMine;
    }
    // No ready pod: starting, or broken; either way not idle.
    let Some(figures) = figures.filter(|f| f.ready_pods > 0) else {
        return Idle::NotMine;
    };
    let window = autoscaling.scale_to_zero_after();
    match window.checked_sub(figures.quiet_for(now)) {
        Some(left) if !left.is_zero() => Idle::LookAgainIn(left),
        _ => Idle::ScaleToZero,
    }
}

/// Acts on [`decide`] after a reconcile whose outcome is `next`: scales the
/// model to zero, or brings the next reconcile forward to the end of its
/// window.
pub async fn settle(
    ctx: &Context,
    model: &InferenceModel,
    figures: Option<&Figures>,
    next: Result<Action, Error>,
) -> Result<Action, Error> {
    match decide(model, &ctx.config.autoscaler, figures, Instant::now()) {
        Idle::NotMine => next,
        Idle::LookAgainIn(left) => next.map(|action| sooner(action, left)),
        Idle::ScaleToZero => {
            scale_to_zero(ctx, model).await?;
            Ok(Action::requeue(PROGRESSING_REQUEUE))
        }
    }
}

/// `action`, or a requeue after `left` (plus a scrape's slack) when that
/// comes first. The plan requeues after one of two known delays.
fn sooner(action: Action, left: Duration) -> Action {
    let at = left + Duration::from_secs(1);
    match [PROGRESSING_REQUEUE, SETTLED_REQUEUE]
        .into_iter()
        .find(|delay| action == Action::requeue(*delay))
    {
        Some(delay) if at < delay => Action::requeue(at),
        _ => action,
    }
}

/// Sets `spec.replicas: 0` through the scale subresource, if the replicas
/// are still what the model's spec said (the resourceVersion read is the
/// precondition).
async fn scale_to_zero(ctx: &Context, model: &InferenceModel) -> Result<(), Error> {
    let namespace = model.namespace().unwrap_or_default();
    let name = model.name_any();
    let api: Api<InferenceModel> = Api::namespaced(ctx.client.clone(), &namespace);
    let scale = api.get_scale(&name).await?;
    let replicas = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    if replicas == 0 {
        return Ok(());
    }
    let asleep = Scale {
        metadata: scale.metadata.clone(),
        spec: Some(ScaleSpec { replicas: Some(0) }),
        status: None,
    };
    match api.replace_scale(&name, &PostParams::default(), &asleep).await {
        Ok(_) => {
            tracing::info!(model = %name, %namespace, from = replicas, "scaled to zero: quiet for its window");
            ctx.metrics.scaled_to_zero(&namespace, &name);
            Ok(())
        }
        // Someone changed the replicas since: theirs stands.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use nereid_crds::{Autoscaling, InferenceModelSpec};

    use super::*;

    fn model(min: i32, replicas: Option<i32>) -> InferenceModel {
        let mut model = InferenceModel::new(
            "m",
            InferenceModelSpec {
                replicas,
                autoscaling: Some(Autoscaling {
                    min_replicas: Some(min),
                    max_replicas: 3,
                    target: "500".into(),
                    scale_to_zero_after: Some("60s".into()),
                    ..Autoscaling::default()
                }),
                ..InferenceModelSpec::default()
            },
        );
        model.metadata.namespace = Some("ml".into());
        model
    }

    fn quiet(now: Instant, for_secs: u64) -> Figures {
        Figures {
            ready_pods: 1,
            scraped_pods: 1,
            quiet_since: Some(now - Duration::from_secs(for_secs)),
            ..Figures::default()
        }
    }

    #[test]
    fn a_model_quiet_for_its_window_sleeps() {
        let now = Instant::now();
        let hpa = Autoscaler::Hpa;
        let sleeper = model(0, Some(2));
        assert_eq!(decide(&sleeper, &hpa, Some(&quiet(now, 60)), now), Idle::ScaleToZero);
        assert_eq!(
            decide(&sleeper, &hpa, Some(&quiet(now, 45)), now),
            Idle::LookAgainIn(Duration::from_secs(15))
        );
        // Not quiet at all.
        let busy = Figures {
            quiet_since: Some(now),
            ..quiet(now, 0)
        };
        assert_eq!(
            decide(&sleeper, &hpa, Some(&busy), now),
            Idle::LookAgainIn(Duration::from_secs(60))
        );
    }

    #[test]
    fn what_is_not_the_operators_to_put_to_sleep() {
        let now = Instant::now();
        let hpa = Autoscaler::Hpa;
        let figures = quiet(now, 600);
        // minReplicas 1: never.
        assert_eq!(decide(&model(1, Some(1)), &hpa, Some(&figures), now), Idle::NotMine);
        // At zero already.
        assert_eq!(decide(&model(0, Some(0)), &hpa, Some(&figures), now), Idle::NotMine);
        // No ready pod (starting or broken), or no figures at all.
        let starting = Figures {
            ready_pods: 0,
            starting_pods: 1,
            ..figures.clone()
        };
        assert_eq!(decide(&model(0, Some(1)), &hpa, Some(&starting), now), Idle::NotMine);
        assert_eq!(decide(&model(0, Some(1)), &hpa, None, now), Idle::NotMine);
        // KEDA scales to zero itself.
        let keda = Autoscaler::Keda {
            scaler_address: "op:9090".into(),
            trigger_authentication: None,
        };
        assert_eq!(decide(&model(0, Some(1)), &keda, Some(&figures), now), Idle::NotMine);
    }

    #[test]
    fn the_next_look_comes_at_the_end_of_the_window_at_the_latest() {
        let soon = sooner(Action::requeue(SETTLED_REQUEUE), Duration::from_secs(20));
        assert_eq!(soon, Action::requeue(Duration::from_secs(21)));
        let kept = sooner(Action::requeue(PROGRESSING_REQUEUE), Duration::from_secs(20));
        assert_eq!(kept, Action::requeue(PROGRESSING_REQUEUE));
    }
}
