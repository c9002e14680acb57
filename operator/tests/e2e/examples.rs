//! The examples in deploy/examples, applied with kubectl, become Deployments,
//! Services, ConfigMaps and PDBs; KWOK runs their pods; the status goes Ready.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use kube::{Api, Resource, ResourceExt};
use nereid_crds::InferenceModel;
use nereid_operator::builders::config_map::CONFIG_KEY;
use nereid_operator::builders::deployment::{FETCH_CONTAINER, SERVER_CONTAINER};

use crate::env::{Env, SERVER_IMAGE};
use crate::models;

const NAMESPACE: &str = "examples";

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    // The namespace really enforces the restricted Pod Security Standard, so
    // the serving pods below becoming Ready means they comply.
    let insecure = env
        .kubectl_output(
            [
                "run",
                "insecure",
                "-n",
                NAMESPACE,
                "--image",
                SERVER_IMAGE,
                "--restart",
                "Never",
            ],
            None,
        )
        .await?;
    let refusal = String::from_utf8_lossy(&insecure.stderr);
    ensure!(
        !insecure.status.success() && refusal.contains("violates PodSecurity \"restricted:latest\""),
        "a pod without a securityContext was not refused: {refusal}"
    );
    for example in [
        "cpu-mlp.yaml",
        "s3-with-secret.yaml",
        "ensemble.yaml",
        "locked-down.yaml",
    ] {
        let path = env.path(&format!("deploy/examples/{example}"));
        env.kubectl(["apply", "-n", NAMESPACE, "-f", path.to_str().unwrap_or_default()])
            .await
            .with_context(|| format!("kubectl apply {example}"))?;
    }

    // cpu-mlp.yaml: two replicas of mlp-small with a dynamic batching override.
    let model = models::ready(env, NAMESPACE, "mlp-small", 2).await?;
    models::running_pods(env, NAMESPACE, "mlp-small", 2).await?;
    let status = model.status.as_ref().context("status")?;
    let endpoints = status.endpoints.as_ref().context("status.endpoints")?;
    ensure!(
        endpoints.http == "http://mlp-small.examples.svc.cluster.local:8000",
        "{endpoints:?}"
    );
    ensure!(
        endpoints.grpc == "mlp-small.examples.svc.cluster.local:8001",
        "{endpoints:?}"
    );
    ensure!(
        status.selector.contains("serving.nereid.dev/model=mlp-small"),
        "{}",
        status.selector
    );
    check_owned_objects(env, &model).await?;

    // s3-with-secret.yaml: the Secret's keys reach the model-fetch init container.
    let private = models::ready(env, NAMESPACE, "private-mlp", 1).await?;
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .get(&private.name_any())
        .await?;
    let pod = deployment.spec.template.spec.context("pod template")?;
    let fetch = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == FETCH_CONTAINER)
        .context("the s3 model has no model-fetch init container")?;
    let from_secret = fetch
        .env_from
        .iter()
        .flatten()
        .any(|e| e.secret_ref.as_ref().is_some_and(|s| s.name == "s3-credentials"));
    ensure!(
        from_secret,
        "model-fetch does not read Secret s3-credentials: {:?}",
        fetch.env_from
    );

    check_locked_down(env).await?;

    // ensemble.yaml: its two step models serve, and the ModelEnsemble is stored.
    models::ready(env, NAMESPACE, "preprocess", 1).await?;
    models::ready(env, NAMESPACE, "classifier", 1).await?;
    let ensembles = ApiResource {
        group: "serving.nereid.dev".into(),
        version: "v1alpha1".into(),
        api_version: "serving.nereid.dev/v1alpha1".into(),
        kind: "ModelEnsemble".into(),
        plural: "modelensembles".into(),
    };
    let ensemble = Api::<DynamicObject>::namespaced_with(env.client.clone(), NAMESPACE, &ensembles)
        .get("classify-image")
        .await?;
    let steps = ensemble.data["spec"]["steps"].as_array().map_or(0, Vec::len);
    ensure!(steps == 2, "the stored ensemble has {steps} steps");
    Ok(())
}

/// locked-down.yaml: a NetworkPolicy owned by the model (gone when the spec
/// drops it), the repository API behind the Secret's header, TLS from a
/// Secret; and its pods still pass the namespace's restricted standard.
async fn check_locked_down(env: &Env) -> Result<()> {
    let model = models::ready(env, NAMESPACE, "locked-mlp", 1).await?;
    let policies = Api::<NetworkPolicy>::namespaced(env.client.clone(), NAMESPACE);
    let policy = policies.get("locked-mlp").await?;
    controlled_by(&policy, &model)?;
    let rules = policy.spec.and_then(|s| s.ingress).unwrap_or_default();
    ensure!(rules.len() == 2, "{rules:?}");
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .get("locked-mlp")
        .await?;
    let pod = deployment.spec.template.spec.context("pod template")?;
    let server = pod
        .containers
        .iter()
        .find(|c| c.name == SERVER_CONTAINER)
        .context("no server container")?;
    let args = server.args.clone().unwrap_or_default();
    for wanted in [
        "--http-restricted-api-from-env=model-repository:nereid-repository-key=NEREID_REPOSITORY_API_KEY",
        "--grpc-use-ssl",
        "--http-server-cert=/etc/nereid/tls/tls.crt",
    ] {
        ensure!(args.iter().any(|a| a == wanted), "{wanted} not in {args:?}");
    }
    env.kubectl([
        "patch",
        "inferencemodel",
        "locked-mlp",
        "-n",
        NAMESPACE,
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/spec/networkPolicy"}]"#,
    ])
    .await?;
    crate::wait::until("the NetworkPolicy to go", crate::wait::LONG, || async {
        match policies.get_opt("locked-mlp").await? {
            None => Ok(()),
            Some(_) => anyhow::bail!("still there"),
        }
    })
    .await?;
    Ok(())
}

/// The Deployment, Service, ConfigMap and PDB of `model`: controlled by it,
/// with the fields its spec asks for.
async fn check_owned_objects(env: &Env, model: &InferenceModel) -> Result<()> {
    let name = model.name_any();
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .get(&name)
        .await?;
    controlled_by(&deployment, model)?;
    let spec = &deployment.spec;
    ensure!(spec.replicas == Some(2), "Deployment replicas {:?}", spec.replicas);
    let pod = spec.template.spec.as_ref().context("pod template")?;
    let server = pod
        .containers
        .iter()
        .find(|c| c.name == SERVER_CONTAINER)
        .context("no server container")?;
    ensure!(
        server.image.as_deref() == Some(SERVER_IMAGE),
        "image {:?}",
        server.image
    );
    let cpu = server
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("cpu"))
        .map(|q| q.0.clone());
    ensure!(cpu.as_deref() == Some("2"), "cpu request {cpu:?}");

    let service = Api::<Service>::namespaced(env.client.clone(), NAMESPACE)
        .get(&name)
        .await?;
    controlled_by(&service, model)?;
    let ports: Vec<(String, i32, Option<IntOrString>)> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.port, p.target_port))
        .collect();
    for (port_name, number) in [("http", 8000), ("grpc", 8001), ("metrics", 8002)] {
        ensure!(
            ports.iter().any(|(n, p, t)| n == port_name
                && *p == number
                && t.as_ref() == Some(&IntOrString::String(port_name.into()))),
            "Service ports {ports:?} lack {port_name}:{number}"
        );
    }

    let config_map = Api::<ConfigMap>::namespaced(env.client.clone(), NAMESPACE)
        .get(&format!("{name}-config"))
        .await?;
    controlled_by(&config_map, model)?;
    let config = config_map
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIG_KEY))
        .context("no config.json")?;
    let config: serde_json::Value = serde_json::from_str(config)?;
    ensure!(config["max_batch_size"] == 32, "config.json {config}");
    ensure!(
        config["dynamic_batching"]["preferred_batch_size"] == serde_json::json!([8, 16, 32]),
        "config.json {config}"
    );

    let pdb = Api::<PodDisruptionBudget>::namespaced(env.client.clone(), NAMESPACE)
        .get(&name)
        .await?;
    controlled_by(&pdb, model)?;
    let selector = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .and_then(|s| s.match_labels.clone());
    ensure!(
        selector.is_some_and(|l| l.get("serving.nereid.dev/model").map(String::as_str) == Some("mlp-small")),
        "the PDB does not select the model's pods"
    );
    Ok(())
}

/// Fails unless `model` is `object`'s controller (so the garbage collector
/// deletes it with the model, and nothing else adopts it).
fn controlled_by<K: Resource<DynamicType = ()>>(object: &K, model: &InferenceModel) -> Result<()> {
    let what = format!("{} {}", K::kind(&()), object.name_any());
    let owner = object
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .with_context(|| format!("{what} has no controller owner"))?;
    ensure!(
        owner.kind == "InferenceModel" && owner.name == model.name_any() && Some(&owner.uid) == model.uid().as_ref(),
        "{what} is controlled by {owner:?}"
    );
    Ok(())
}
