//! `kubectl scale` through the InferenceModel's scale subresource, and an
//! HPA that targets the InferenceModel: the HPA controller reads the scale
//! subresource and its selector.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;

use crate::env::Env;
use crate::models;
use crate::wait::{self, LONG};

const NAMESPACE: &str = "scaling";

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    models::apply(env, NAMESPACE, &models::manifest("scaled", 1, models::SMALL_CPU)).await?;
    models::ready(env, NAMESPACE, "scaled", 1).await?;

    env.kubectl(["scale", "-n", NAMESPACE, "nmodel/scaled", "--replicas=3"])
        .await
        .context("kubectl scale")?;
    let model = models::ready(env, NAMESPACE, "scaled", 3).await?;
    ensure!(
        model.spec.replicas == Some(3),
        "spec.replicas {:?}",
        model.spec.replicas
    );
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .get("scaled")
        .await?;
    ensure!(deployment.spec.replicas == Some(3), "the Deployment did not follow");
    models::running_pods(env, NAMESPACE, "scaled", 3).await?;

    // The scale subresource as the HPA controller reads it.
    let scale: serde_json::Value = serde_json::from_str(
        &env.kubectl([
            "get",
            "--raw",
            "/apis/serving.nereid.dev/v1alpha1/namespaces/scaling/inferencemodels/scaled/scale",
        ])
        .await?,
    )?;
    ensure!(scale["kind"] == "Scale", "{scale}");
    ensure!(
        scale["spec"]["replicas"] == 3 && scale["status"]["replicas"] == 3,
        "{scale}"
    );
    let selector = scale["status"]["selector"].as_str().unwrap_or_default();
    ensure!(
        selector.contains("serving.nereid.dev/model=scaled"),
        "scale selector {selector:?}"
    );

    // An HPA on the InferenceModel: accepted, and the controller gets the
    // scale (AbleToScale) and lists the pods through its selector before it
    // asks for their CPU metrics. No metrics API runs here, so that last step
    // fails with FailedGetResourceMetric, and it must not be InvalidSelector.
    let hpa = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: scaled\nspec:\n  \
               scaleTargetRef:\n    apiVersion: serving.nereid.dev/v1alpha1\n    kind: InferenceModel\n    \
               name: scaled\n  minReplicas: 1\n  maxReplicas: 5\n  metrics:\n  - type: Resource\n    \
               resource:\n      name: cpu\n      target:\n        type: Utilization\n        \
               averageUtilization: 80\n";
    models::apply(env, NAMESPACE, hpa).await?;
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(env.client.clone(), NAMESPACE);
    wait::until(
        "the HPA controller to read the InferenceModel's scale",
        LONG,
        || async {
            let hpa = hpas.get("scaled").await?;
            let status = hpa.status.context("no HPA status yet")?;
            let conditions = status.conditions.unwrap_or_default();
            let find = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
            let able = find("AbleToScale").context("no AbleToScale condition yet")?;
            ensure!(
                able.status == "True" && able.reason.as_deref() == Some("SucceededGetScale"),
                "AbleToScale {able:?}"
            );
            let active = find("ScalingActive").context("no ScalingActive condition yet")?;
            if active.reason.as_deref() != Some("FailedGetResourceMetric") {
                bail!("ScalingActive {active:?}");
            }
            ensure!(
                status.current_replicas == Some(3),
                "currentReplicas {:?}",
                status.current_replicas
            );
            Ok(())
        },
    )
    .await?;
    // Nothing scaled behind our back.
    ensure!(models::get(env, NAMESPACE, "scaled").await?.spec.replicas == Some(3));
    Ok(())
}
