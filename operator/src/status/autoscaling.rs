//! `status.autoscaling`: what the model's HPA and the operator's scrapes say,
//! so that `kubectl get nmodel -o yaml` tells a user why a model does not
//! scale without reading the HPA's conditions.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use nereid_crds::AutoscalingStatus;
use nereid_crds::conditions::reason;

use crate::autoscaling::figures::Figures;
use crate::builders::Served;

/// The autoscaling status of `model`; `None` without `spec.autoscaling`.
///
/// `hpa` is the model's own HPA as applied (with its status), `foreign` the
/// name of another autoscaler that targets the model's pods, `figures` the
/// model's figures from the latest scrape round.
pub fn autoscaling_status<S: Served>(
    model: &S,
    hpa: Option<&HorizontalPodAutoscaler>,
    foreign: Option<&str>,
    figures: Option<&Figures>,
) -> Option<AutoscalingStatus> {
    let wanted = model.autoscaling()?;
    let mut status = AutoscalingStatus {
        metric: wanted.metric.external_name().to_string(),
        pods_scraped: figures.map(|f| f.scraped_pods as i32),
        ..AutoscalingStatus::default()
    };
    if let Some(foreign) = foreign {
        status.reason = Some(reason::FOREIGN_AUTOSCALER.into());
        status.message = Some(format!(
            "HorizontalPodAutoscaler {foreign:?} already scales this model's pods; the operator made none (remove \
             it, or remove spec.autoscaling)"
        ));
        return Some(status);
    }
    if let Some(hpa) = hpa {
        status.horizontal_pod_autoscaler = hpa.metadata.name.clone();
        if let Some(observed) = &hpa.status {
            status.desired_replicas = Some(observed.desired_replicas);
            status.current_value = observed
                .current_metrics
                .iter()
                .flatten()
                .find_map(|m| m.external.as_ref())
                .and_then(|e| e.current.value.clone().or_else(|| e.current.average_value.clone()))
                .map(|q| q.0);
            // The first unhealthy condition, in the order a user should fix them.
            let unhealthy = ["AbleToScale", "ScalingActive"].into_iter().find_map(|type_| {
                observed
                    .conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == type_ && c.status == "False")
            });
            if let Some(condition) = unhealthy {
                status.reason = condition.reason.clone();
                status.message = condition.message.clone();
            }
        }
    }
    // The cause behind the HPA's failure to get the metric, when it is ours.
    if let Some(figures) = figures
        && figures.ready_pods > 0
        && figures.scraped_pods == 0
    {
        status.reason = Some(reason::NO_POD_METRICS.into());
        status.message = Some(format!(
            "none of the {} ready pods answered /metrics at the operator's last scrape",
            figures.ready_pods
        ));
    }
    Some(status)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::autoscaling::v2::{
        ExternalMetricStatus, HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus, MetricStatus,
        MetricValueStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use nereid_crds::InferenceModel;
    use nereid_crds::{Autoscaling, AutoscalingMetric};

    use super::*;

    fn model(autoscaling: bool) -> InferenceModel {
        let mut model = InferenceModel::new("resnet", Default::default());
        model.spec.autoscaling = autoscaling.then(|| Autoscaling {
            max_replicas: 4,
            metric: AutoscalingMetric::QueueTimeMicros,
            target: "500".into(),
            ..Autoscaling::default()
        });
        model
    }

    fn hpa(conditions: &[(&str, &str, &str)]) -> HorizontalPodAutoscaler {
        let mut hpa = HorizontalPodAutoscaler::default();
        hpa.metadata.name = Some("resnet".into());
        hpa.status = Some(HorizontalPodAutoscalerStatus {
            desired_replicas: 3,
            current_metrics: Some(vec![MetricStatus {
                type_: "External".into(),
                external: Some(ExternalMetricStatus {
                    current: MetricValueStatus {
                        value: Some(Quantity("1200".into())),
                        ..MetricValueStatus::default()
                    },
                    ..ExternalMetricStatus::default()
                }),
                ..MetricStatus::default()
            }]),
            conditions: Some(
                conditions
                    .iter()
                    .map(|(type_, status, reason)| HorizontalPodAutoscalerCondition {
                        type_: type_.to_string(),
                        status: status.to_string(),
                        reason: Some(reason.to_string()),
                        message: Some(format!("because {reason}")),
                        ..HorizontalPodAutoscalerCondition::default()
                    })
                    .collect(),
            ),
            ..HorizontalPodAutoscalerStatus::default()
        });
        hpa
    }

    fn figures(ready_pods: u32, scraped_pods: u32) -> Figures {
        Figures {
            ready_pods,
            scraped_pods,
            ..Figures::default()
        }
    }

    #[test]
    fn none_without_autoscaling() {
        assert_eq!(autoscaling_status(&model(false), None, None, None), None);
    }

    #[test]
    fn a_healthy_hpa_reports_its_value_and_replicas() {
        let hpa = hpa(&[
            ("AbleToScale", "True", "ReadyForNewScale"),
            ("ScalingActive", "True", "ValidMetricFound"),
        ]);
        let status = autoscaling_status(&model(true), Some(&hpa), None, Some(&figures(2, 2))).unwrap();
        assert_eq!(status.horizontal_pod_autoscaler.as_deref(), Some("resnet"));
        assert_eq!(status.metric, "nereid_queue_time_microseconds");
        assert_eq!(status.current_value.as_deref(), Some("1200"));
        assert_eq!(status.desired_replicas, Some(3));
        assert_eq!(status.pods_scraped, Some(2));
        assert_eq!((status.reason, status.message), (None, None));
    }

    #[test]
    fn an_unhealthy_hpa_says_why() {
        let hpa = hpa(&[
            ("AbleToScale", "True", "ReadyForNewScale"),
            ("ScalingActive", "False", "FailedGetExternalMetric"),
        ]);
        let status = autoscaling_status(&model(true), Some(&hpa), None, Some(&figures(2, 1))).unwrap();
        assert_eq!(status.reason.as_deref(), Some("FailedGetExternalMetric"));
        assert_eq!(status.message.as_deref(), Some("because FailedGetExternalMetric"));
    }

    #[test]
    fn no_scraped_pod_is_the_cause_reported() {
        let hpa = hpa(&[("ScalingActive", "False", "FailedGetExternalMetric")]);
        let status = autoscaling_status(&model(true), Some(&hpa), None, Some(&figures(3, 0))).unwrap();
        assert_eq!(status.reason.as_deref(), Some(reason::NO_POD_METRICS));
        assert!(status.message.unwrap().contains("none of the 3 ready pods"));
    }

    #[test]
    fn a_foreign_autoscaler_is_named() {
        let status = autoscaling_status(&model(true), None, Some("legacy"), None).unwrap();
        assert_eq!(status.horizontal_pod_autoscaler, None);
        assert_eq!(status.reason.as_deref(), Some(reason::FOREIGN_AUTOSCALER));
        assert!(status.message.unwrap().contains("\"legacy\""));
    }
}
