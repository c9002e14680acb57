//! The KEDA ScaledObject of an InferenceModel (or ModelEnsemble), when the operator runs with
//! `--autoscaler keda` and the spec asks for autoscaling: KEDA then makes and
//! drives the HPA, calling the operator's External Scaler service
//! ([`crate::external_scaler`]) for the metric. When that service is served
//! over TLS, the trigger names the ClusterTriggerAuthentication that gives
//! KEDA the CA (and, for mutual TLS, its client certificate).
//!
//! Built as a dynamic object: KEDA's types are not a dependency, and its CRD
//! need not exist unless this mode is chosen.

use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use nereid_crds::TargetKind;
use serde_json::json;

use super::{Served, labels};

/// KEDA's ScaledObject, `keda.sh/v1alpha1`.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"))
}

/// The ScaledObject, named like the model; `None` without `spec.autoscaling`.
/// `authentication` names a ClusterTriggerAuthentication for the trigger.
pub fn scaled_object<S: Served>(
    model: &S,
    scaler_address: &str,
    authentication: Option<&str>,
) -> Option<DynamicObject> {
    let autoscaling = model.autoscaling()?;
    let metric_type = match autoscaling.metric.target_kind() {
        TargetKind::Value => "Value",
        TargetKind::AverageValue => "AverageValue",
    };
    let mut spec = json!({
        "scaleTargetRef": {
            "apiVersion": S::api_version(&()),
            "kind": S::kind(&()),
            "name": model.name_any(),
        },
        "minReplicaCount": autoscaling.min_replicas.unwrap_or(1),
        "maxReplicaCount": autoscaling.max_replicas,
        "triggers": [{
            "type": "external",
            "metricType": metric_type,
            "metadata": {
                "scalerAddress": scaler_address,
                "model": model.name_any(),
                "metric": autoscaling.metric.external_name(),
                "target": autoscaling.target,
            },
        }],
    });
    if let Some(name) = authentication {
        spec["triggers"][0]["authenticationRef"] = json!({"kind": "ClusterTriggerAuthentication", "name": name});
    }
    if autoscaling.scales_to_zero() {
        // KEDA scales to zero once IsActive has said false for this long.
        spec["cooldownPeriod"] = json!(autoscaling.scale_to_zero_after().as_secs().max(1));
    }
    if let Some(behavior) = &autoscaling.behavior {
        spec["advanced"] = json!({"horizontalPodAutoscalerConfig": {"behavior": behavior}});
    }
    let mut object = DynamicObject::new(&model.name_any(), &api_resource()).data(json!({ "spec": spec }));
    object.metadata = labels::object_meta(model, model.name_any());
    Some(object)
}

/// The name KEDA gives the HPA it makes for a ScaledObject.
pub fn keda_hpa_name<S: Served>(model: &S) -> String {
    format!("keda-hpa-{}", model.name_any())
}

#[cfg(test)]
mod tests {
    use nereid_crds::{Autoscaling, AutoscalingMetric, InferenceModel};

    use super::*;

    fn model(metric: AutoscalingMetric) -> InferenceModel {
        let mut model = InferenceModel::new("resnet", Default::default());
        model.metadata.namespace = Some("ml".into());
        model.metadata.uid = Some("uid-1".into());
        model.spec.autoscaling = Some(Autoscaling {
            min_replicas: Some(0),
            max_replicas: 5,
            metric,
            target: "500".into(),
            behavior: Some(Default::default()),
            scale_to_zero_after: Some("90s".into()),
            ..Autoscaling::default()
        });
        model
    }

    #[test]
    fn an_external_trigger_on_the_operators_scaler() {
        let object = scaled_object(
            &model(AutoscalingMetric::QueueTimeMicros),
            "op-keda.nereid-system:9090",
            None,
        )
        .unwrap();
        assert_eq!(object.types.as_ref().unwrap().api_version, "keda.sh/v1alpha1");
        assert_eq!(object.types.as_ref().unwrap().kind, "ScaledObject");
        assert_eq!(object.metadata.name.as_deref(), Some("resnet"));
        assert_eq!(object.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        let spec = &object.data["spec"];
        assert_eq!(spec["scaleTargetRef"]["kind"], "InferenceModel");
        assert_eq!(spec["scaleTargetRef"]["name"], "resnet");
        assert_eq!(
            (spec["minReplicaCount"].as_i64(), spec["maxReplicaCount"].as_i64()),
            (Some(0), Some(5))
        );
        // KEDA's own scale to zero waits the model's idle window.
        assert_eq!(spec["cooldownPeriod"].as_u64(), Some(90));
        let trigger = &spec["triggers"][0];
        assert_eq!(trigger["type"], "external");
        assert_eq!(trigger["metricType"], "Value");
        assert_eq!(trigger["metadata"]["scalerAddress"], "op-keda.nereid-system:9090");
        assert_eq!(trigger["metadata"]["model"], "resnet");
        assert_eq!(trigger["metadata"]["metric"], "nereid_queue_time_microseconds");
        assert_eq!(trigger["metadata"]["target"], "500");
        assert!(
            trigger["authenticationRef"].is_null(),
            "plaintext: nothing to authenticate with"
        );
        assert!(spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"].is_object());
    }

    #[test]
    fn over_tls_the_trigger_names_its_cluster_trigger_authentication() {
        let object = scaled_object(
            &model(AutoscalingMetric::QueueTimeMicros),
            "op-keda.nereid-system:9090",
            Some("nereid-keda-scaler"),
        )
        .unwrap();
        let reference = &object.data["spec"]["triggers"][0]["authenticationRef"];
        assert_eq!(reference["kind"], "ClusterTriggerAuthentication");
        assert_eq!(reference["name"], "nereid-keda-scaler");
        // KEDA sends the trigger's metadata to the scaler: no secret there.
        let metadata = object.data["spec"]["triggers"][0]["metadata"].as_object().unwrap();
        assert!(
            metadata.keys().all(|k| !k.starts_with("tls") && k != "caCert"),
            "{metadata:?}"
        );
    }

    #[test]
    fn totals_are_average_values() {
        let object = scaled_object(&model(AutoscalingMetric::PendingRequests), "a:1", None).unwrap();
        assert_eq!(object.data["spec"]["triggers"][0]["metricType"], "AverageValue");
    }

    #[test]
    fn no_autoscaling_no_scaled_object() {
        let mut plain = model(AutoscalingMetric::QueueTimeMicros);
        plain.spec.autoscaling = None;
        assert!(scaled_object(&plain, "a:1", None).is_none());
    }
}
