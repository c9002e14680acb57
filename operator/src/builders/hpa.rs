//! The HorizontalPodAutoscaler of an InferenceModel (or ModelEnsemble),
//! when its spec asks for autoscaling.
//!
//! The HPA scales the resource itself through its scale subresource
//! (never the Deployment), so `spec.replicas` stays the one number the
//! Deployment follows. Its one metric is an External metric that the
//! operator serves (`external.metrics.k8s.io`, see
//! [`crate::autoscaling`]), selected by a `model` label: external rather
//! than Pods metrics because the figures are computed per model over a
//! window (queue time is an average over requests, not over pods).

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, ExternalMetricSource, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec,
    MetricIdentifier, MetricSpec, MetricTarget,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use nereid_crds::{Autoscaling, TargetKind};

use super::{Served, labels};

/// The label that selects a model's figures in the external metrics API.
pub const MODEL_LABEL: &str = "model";

/// The HPA, named like the model; `None` when the spec has no autoscaling.
pub fn hpa<S: Served>(model: &S) -> Option<HorizontalPodAutoscaler> {
    let autoscaling = model.autoscaling()?;
    Some(HorizontalPodAutoscaler {
        metadata: labels::object_meta(model, model.name_any()),
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some(S::api_version(&()).into_owned()),
                kind: S::kind(&()).into_owned(),
                name: model.name_any(),
            },
            // An HPA cannot scale to zero (without the HPAScaleToZero
            // feature gate); it stands aside while the model is at zero
            // (a scale target at 0 disables it) and owns 1..max above.
            min_replicas: Some(autoscaling.min_replicas.unwrap_or(1).max(1)),
            max_replicas: autoscaling.max_replicas,
            metrics: Some(vec![metric(model, autoscaling)]),
            behavior: autoscaling.behavior.clone(),
        },
        ..HorizontalPodAutoscaler::default()
    })
}

fn metric<S: Served>(model: &S, autoscaling: &Autoscaling) -> MetricSpec {
    let target = Quantity(autoscaling.target.clone());
    let target = match autoscaling.metric.target_kind() {
        TargetKind::Value => MetricTarget {
            type_: "Value".into(),
            value: Some(target),
            ..MetricTarget::default()
        },
        TargetKind::AverageValue => MetricTarget {
            type_: "AverageValue".into(),
            average_value: Some(target),
            ..MetricTarget::default()
        },
    };
    MetricSpec {
        type_: "External".into(),
        external: Some(ExternalMetricSource {
            metric: MetricIdentifier {
                name: autoscaling.metric.external_name().into(),
                selector: Some(LabelSelector {
                    match_labels: Some([(MODEL_LABEL.to_string(), model.name_any())].into()),
                    ..LabelSelector::default()
                }),
            },
            target,
        }),
        ..MetricSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use nereid_crds::{AutoscalingMetric, InferenceModel};

    use super::*;

    fn model(autoscaling: Option<Autoscaling>) -> InferenceModel {
        let mut model = InferenceModel::new("resnet", Default::default());
        model.metadata.namespace = Some("ml".into());
        model.metadata.uid = Some("uid-1".into());
        model.spec.autoscaling = autoscaling;
        model
    }

    fn autoscaling(metric: AutoscalingMetric, target: &str) -> Autoscaling {
        Autoscaling {
            min_replicas: None,
            max_replicas: 4,
            metric,
            target: target.into(),
            ..Autoscaling::default()
        }
    }

    #[test]
    fn no_autoscaling_no_hpa() {
        assert_eq!(hpa(&model(None)), None);
    }

    #[test]
    fn queue_time_is_a_value_target_on_the_models_external_metric() {
        let hpa = hpa(&model(Some(autoscaling(AutoscalingMetric::QueueTimeMicros, "500")))).unwrap();
        assert_eq!(hpa.metadata.name.as_deref(), Some("resnet"));
        assert_eq!(hpa.metadata.owner_references.unwrap()[0].uid, "uid-1");
        let spec = hpa.spec;
        assert_eq!(spec.scale_target_ref.kind, "InferenceModel");
        assert_eq!(
            spec.scale_target_ref.api_version.as_deref(),
            Some("serving.nereid.dev/v1alpha1")
        );
        assert_eq!(spec.scale_target_ref.name, "resnet");
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(1), 4));
        let external = spec.metrics.unwrap().remove(0).external.unwrap();
        assert_eq!(external.metric.name, "nereid_queue_time_microseconds");
        assert_eq!(
            external.metric.selector.unwrap().match_labels.unwrap()["model"],
            "resnet"
        );
        assert_eq!(external.target.type_, "Value");
        assert_eq!(external.target.value, Some(Quantity("500".into())));
    }

    #[test]
    fn totals_are_targets_per_pod() {
        for metric in [AutoscalingMetric::PendingRequests, AutoscalingMetric::InferenceRate] {
            let hpa = hpa(&model(Some(autoscaling(metric, "2k")))).unwrap();
            let target = hpa.spec.metrics.unwrap().remove(0).external.unwrap().target;
            assert_eq!(target.type_, "AverageValue");
            assert_eq!(target.average_value, Some(Quantity("2k".into())));
            assert_eq!(target.value, None);
        }
    }

    #[test]
    fn behavior_and_bounds_pass_through() {
        let mut wanted = autoscaling(AutoscalingMetric::QueueTimeMicros, "1m");
        wanted.min_replicas = Some(2);
        wanted.behavior = Some(Default::default());
        let spec = hpa(&model(Some(wanted.clone()))).unwrap().spec;
        assert_eq!(spec.min_replicas, Some(2));
        assert_eq!(spec.behavior, wanted.behavior);
    }

    #[test]
    fn a_model_that_scales_to_zero_keeps_an_hpa_from_one() {
        let mut wanted = autoscaling(AutoscalingMetric::QueueTimeMicros, "1m");
        wanted.min_replicas = Some(0);
        let spec = hpa(&model(Some(wanted))).unwrap().spec;
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(1), 4));
    }
}
