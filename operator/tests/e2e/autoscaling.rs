//! Autoscaling on queue time, end to end: the chart's operator pods scrape
//! the serving pods, serve the figures as `external.metrics.k8s.io` through
//! kube-apiserver's aggregation layer, and kube-controller-manager's HPA
//! controller scales the InferenceModel on them.
//!
//! The model is `mlp_small` without dynamic batching, so requests that
//! arrive together wait for one another and queue time grows with the load
//! each pod gets; the load is closed-loop senders spread over the ready
//! endpoints (re-read as pods come and go).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;
use serde_json::Value;

use nereid_operator::builders::service;
use nereid_proto::keda::{GetMetricsRequest, ScaledObjectRef};

use crate::adapter_rules;
use crate::env::{Env, OPERATOR_NAMESPACE};
use crate::inference::MLP_FOLDER;
use crate::models::{self, ON_PROCESS_NODES, SMALL_CPU};
use crate::operator;
use crate::s3;
use crate::traffic::{Load, RequestKind, Traffic};
use crate::wait::{self, LONG};

const NAMESPACE: &str = "autoscaling";
const MODEL: &str = "queued";
const BUCKET: &str = "e2e-autoscaling";
const CREDENTIALS: &str = "s3-credentials";
const METRIC: &str = "nereid_queue_time_microseconds";
/// The queue time the HPA aims for, in microseconds. On the two-core CI
/// machine the load below gives one pod about 1,600-1,750 µs and four pods
/// about 900-1,000 µs (they share the cores, so each pod's executions slow
/// down as pods are added): the target sits between, with room both ways.
const TARGET_MICROS: f64 = 1250.0;
const MAX_REPLICAS: i32 = 4;
/// The HPA waits this long before scaling down (its behavior).
const SCALE_DOWN_WINDOW_SECS: u64 = 10;
const LOAD: Load = Load {
    senders: 6,
    pause: Duration::ZERO,
    request: RequestKind::Mlp { rows: 16 },
};
/// What keeps coming while the replicas go: light enough to scale down on,
/// so a pod removed with requests in flight would show as a failure.
const TRICKLE: Load = Load {
    senders: 2,
    pause: Duration::from_millis(50),
    request: RequestKind::Mlp { rows: 1 },
};

pub async fn run(env: &Env) -> Result<()> {
    api_service_available(env).await?;
    deploy(env).await?;
    models::ready(env, NAMESPACE, MODEL, 1).await?;

    // The live value, through kube-apiserver, as kubectl (and the HPA) read it.
    let idle = read_metric(env).await?;
    println!("e2e: {METRIC} of an idle model through the aggregation layer: {idle} µs");
    refusals(env).await?;
    not_found(env).await?;

    // Scale up under load.
    let load_started = Instant::now();
    let traffic = Traffic::start_with(env, NAMESPACE, MODEL, MODEL, LOAD).await?;
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(env.client.clone(), NAMESPACE);
    let peak = std::cell::Cell::new(0.0f64);
    let outcome = wait::until("the HPA to ask for more replicas", Duration::from_secs(120), || async {
        let hpa = hpas.get(MODEL).await?;
        if let Some(value) = hpa_value(&hpa) {
            peak.set(peak.get().max(value));
        }
        let desired = hpa.status.as_ref().map(|s| s.desired_replicas).unwrap_or(0);
        ensure!(
            desired > 1,
            "desiredReplicas {desired}; the HPA saw {METRIC} at most {} µs; {}",
            peak.get(),
            conditions(&hpa)
        );
        Ok(())
    })
    .await;
    let peak = peak.get();
    if let Err(error) = outcome {
        return Err(traffic.fail(error).await);
    }
    let scaled_up = load_started.elapsed();
    println!(
        "e2e: first scale-up {:.1}s after the load started ({METRIC} peaked at {peak:.0} µs, target {TARGET_MICROS})",
        scaled_up.as_secs_f64()
    );
    let scaled = wait::until(
        "the new pods to be ready and take load",
        Duration::from_secs(120),
        || async {
            let model = models::get(env, NAMESPACE, MODEL).await?;
            let replicas = model.spec.replicas.unwrap_or(1);
            let ready = model.status.as_ref().map(|s| s.ready_replicas).unwrap_or(0);
            let served = traffic.served_by().await;
            let serving = served.values().filter(|n| **n > 0).count();
            ensure!(
                replicas > 1 && ready == replicas && serving >= 2,
                "spec.replicas {replicas}, ready {ready}, pods that answered {served:?}"
            );
            Ok(replicas)
        },
    )
    .await;
    // While the pods serve: the chart's prometheus-adapter rules on their
    // real series, and KEDA's protocol against the operator.
    let scaled = match scaled {
        Ok(replicas) => match adapter_rules_on_a_pod(env).await {
            Ok(()) => keda_sees(env, true).await.map(|()| replicas),
            Err(error) => Err(error),
        },
        Err(error) => Err(error),
    };
    let replicas = match scaled {
        Ok(replicas) => replicas,
        Err(error) => return Err(traffic.fail(error).await),
    };
    let relieved = wait::until(
        "queue time to fall below the target",
        Duration::from_secs(120),
        || async {
            let hpa = hpas.get(MODEL).await?;
            let value = hpa_value(&hpa).context("the HPA has no current value")?;
            ensure!(
                value < TARGET_MICROS,
                "the HPA sees {METRIC} at {value} µs; {}",
                conditions(&hpa)
            );
            // The HPA's reading, confirmed through the API.
            let value = read_metric(env).await?;
            ensure!(value < TARGET_MICROS, "{METRIC} {value} µs");
            Ok(value)
        },
    )
    .await;
    let load_stopped = Instant::now();
    let tally = traffic.stop().await;
    let relieved = relieved?;
    println!(
        "e2e: scaled to {replicas} replicas; {METRIC} {relieved:.0} µs; {} requests answered, {} failed, by pod: {:?}",
        tally.ok, tally.failed, tally.served_by
    );
    ensure!(tally.failed == 0, "failed requests under load: {:?}", tally.failures);

    // Scale down once the load is gone, with a trickle still arriving.
    let trickle = Traffic::start_with(env, NAMESPACE, MODEL, MODEL, TRICKLE).await?;
    let down = wait::until("replicas back to minReplicas", Duration::from_secs(120), || async {
        let model = models::get(env, NAMESPACE, MODEL).await?;
        let replicas = model.spec.replicas.unwrap_or(0);
        let pods = models::pods(env, NAMESPACE, MODEL).await?.len();
        ensure!(replicas == 1 && pods == 1, "spec.replicas {replicas}, pods {pods}");
        Ok(())
    })
    .await;
    let scaled_down = load_stopped.elapsed();
    let tally = trickle.stop().await;
    down?;
    println!(
        "e2e: back to 1 replica {:.1}s after the load stopped (scale-down window {SCALE_DOWN_WINDOW_SECS}s); \
         meanwhile {} requests answered, {} failed",
        scaled_down.as_secs_f64(),
        tally.ok,
        tally.failed
    );
    ensure!(
        tally.failed == 0,
        "failed requests while scaling down: {:?}",
        tally.failures
    );
    let model = models::get(env, NAMESPACE, MODEL).await?;
    let status = model
        .status
        .and_then(|s| s.autoscaling)
        .context("no status.autoscaling")?;
    ensure!(
        status.horizontal_pod_autoscaler.as_deref() == Some(MODEL) && status.metric == METRIC,
        "status.autoscaling {status:?}"
    );

    // Without spec.autoscaling the HPA goes and spec.replicas rules again.
    models::apply(env, NAMESPACE, &manifest(false)).await?;
    wait::until("the HPA to be removed", LONG, || async {
        ensure!(hpas.get_opt(MODEL).await?.is_none(), "the HPA is still there");
        Ok(())
    })
    .await?;
    env.kubectl(["scale", "-n", NAMESPACE, &format!("nmodel/{MODEL}"), "--replicas=2"])
        .await?;
    models::ready(env, NAMESPACE, MODEL, 2).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let model = models::get(env, NAMESPACE, MODEL).await?;
    ensure!(
        model.spec.replicas == Some(2) && model.status.and_then(|s| s.autoscaling).is_none(),
        "nothing scales the model back down once autoscaling is off"
    );
    models::apply(env, NAMESPACE, &manifest(false).replace("replicas: 2", "replicas: 1")).await?;
    Ok(())
}

/// KEDA's External Scaler protocol, as KEDA calls it, against an operator
/// pod: the trigger's metric spec, the live value, and whether the model is
/// `active` (has work).
async fn keda_sees(env: &Env, active: bool) -> Result<()> {
    let (replica, mut client) = operator::keda_scaler(env).await?;
    let scaled = ScaledObjectRef {
        name: MODEL.into(),
        namespace: NAMESPACE.into(),
        scaler_metadata: [
            ("metric".to_string(), "queueTimeMicros".to_string()),
            ("target".to_string(), TARGET_MICROS.to_string()),
        ]
        .into(),
    };
    let seen = client.is_active(scaled.clone()).await?.into_inner().result;
    ensure!(seen == active, "KEDA would be told active={seen}");
    let spec = client.get_metric_spec(scaled.clone()).await?.into_inner();
    ensure!(
        spec.metric_specs.len() == 1
            && spec.metric_specs[0].metric_name == METRIC
            && spec.metric_specs[0].target_size_float == TARGET_MICROS,
        "metric spec {spec:?}"
    );
    let values = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(scaled),
            metric_name: format!("s0-{METRIC}"),
        })
        .await?
        .into_inner();
    let value = values.metric_values.first().context("no metric value")?;
    ensure!(
        value.metric_name == format!("s0-{METRIC}") && value.metric_value_float.is_finite(),
        "metric value {value:?}"
    );
    if active {
        println!(
            "e2e: KEDA's GetMetrics from operator pod {}: {METRIC} {:.0} µs, active",
            replica.name, value.metric_value_float
        );
    }
    Ok(())
}

/// Checks the chart's prometheus-adapter rules against one serving pod.
async fn adapter_rules_on_a_pod(env: &Env) -> Result<()> {
    let model = models::get(env, NAMESPACE, MODEL).await?;
    let pod = models::pods(env, NAMESPACE, MODEL)
        .await?
        .into_iter()
        .find(models::running_and_ready)
        .context("no ready pod")?;
    let address = (models::pod_ip(&pod)?, service::ports(&model).metrics);
    adapter_rules::check(env, NAMESPACE, MODEL, address, Duration::from_secs(3)).await
}

/// The APIService the chart registered, Available (kube-apiserver reached
/// the operator pods through the Service's endpoints and got discovery).
async fn api_service_available(env: &Env) -> Result<()> {
    wait::until("the external metrics APIService to be Available", LONG, || async {
        let json = env
            .kubectl(["get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json"])
            .await?;
        let service: Value = serde_json::from_str(&json)?;
        let available = service["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Available")
            .cloned()
            .unwrap_or_default();
        ensure!(available["status"] == "True", "Available: {available}");
        Ok(())
    })
    .await
}

fn manifest(autoscaling: bool) -> String {
    let source = format!("    uri: s3://{BUCKET}/{MODEL}\n    credentialsSecret: {CREDENTIALS}\n");
    let mut extra = ON_PROCESS_NODES.to_string();
    if autoscaling {
        extra.push_str(&format!(
            "  autoscaling:\n    minReplicas: 1\n    maxReplicas: {MAX_REPLICAS}\n    metric: queueTimeMicros\n    \
             target: \"{TARGET_MICROS}\"\n    behavior:\n      scaleUp:\n        stabilizationWindowSeconds: 0\n      \
             scaleDown:\n        stabilizationWindowSeconds: {SCALE_DOWN_WINDOW_SECS}\n        policies:\n        \
             - type: Percent\n          value: 100\n          periodSeconds: 1\n"
        ));
    }
    models::manifest_of(MODEL, 1, &source, SMALL_CPU, &extra)
}

/// The model folder without dynamic batching (so requests queue one behind
/// another), in the bucket, and the InferenceModel with autoscaling.
async fn deploy(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    s3::bucket(env, BUCKET).await?;
    models::apply(env, NAMESPACE, &s3::credentials_secret(env, CREDENTIALS)).await?;
    let folder = env.scratch("mlp-unbatched");
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(folder.join("1"))?;
    let source = env.path(MLP_FOLDER);
    std::fs::copy(source.join("1/model.onnx"), folder.join("1/model.onnx"))?;
    let config = std::fs::read_to_string(source.join("config.pbtxt"))?;
    let config: String = config
        .lines()
        .filter(|line| !line.contains("dynamic_batching") && !line.contains("run together"))
        .map(|line| line.replace("\"mlp_small\"", &format!("\"{MODEL}\"")) + "\n")
        .collect();
    ensure!(!config.contains("dynamic_batching"), "{config}");
    std::fs::write(folder.join("config.pbtxt"), config)?;
    s3::upload_folder(env, &folder, BUCKET, MODEL).await?;
    models::apply(env, NAMESPACE, &manifest(true)).await
}

/// The model's queue time, read with `kubectl get --raw` through kube-apiserver.
async fn read_metric(env: &Env) -> Result<f64> {
    let path =
        format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/{METRIC}?labelSelector=model%3D{MODEL}");
    let list: Value = serde_json::from_str(&env.kubectl(["get", "--raw", &path]).await?)?;
    let item = &list["items"][0];
    ensure!(
        list["kind"] == "ExternalMetricValueList"
            && item["metricName"] == METRIC
            && item["metricLabels"]["model"] == MODEL,
        "unexpected answer {list}"
    );
    quantity(item["value"].as_str().context("a quantity")?)
}

/// Who may not read the metrics: an identity without RBAC for them is refused
/// by kube-apiserver, and, called directly as the front proxy on that
/// identity's behalf, by the operator's own SubjectAccessReview; a caller
/// without the front-proxy certificate is not believed at all.
async fn refusals(env: &Env) -> Result<()> {
    env.kubectl(["create", "serviceaccount", "-n", NAMESPACE, "nobody"])
        .await
        .or_else(|e| {
            if format!("{e:#}").contains("AlreadyExists") {
                Ok(String::new())
            } else {
                Err(e)
            }
        })?;
    let token = env.kubectl(["create", "token", "-n", NAMESPACE, "nobody"]).await?;
    let path = format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/{METRIC}");
    // The account's token alone (kubectl would also present the admin's
    // client certificate from the kubeconfig, and that wins).
    let server = env
        .kubectl([
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
        .await?;
    let (code, body) = curl(vec![
        "-H".into(),
        format!("Authorization: Bearer {}", token.trim()),
        format!("{}{path}", server.trim()),
    ])
    .await?;
    ensure!(
        code == "403",
        "an account without rights, through kube-apiserver: HTTP {code} {body}"
    );

    let replica = operator::replicas(env, OPERATOR_NAMESPACE, crate::env::RELEASE)
        .await?
        .into_iter()
        .next()
        .context("no operator pod")?;
    let url = format!("https://{}:6443{path}", replica.ip);
    let pki = env.cluster.dir.join("pki");
    let cert = pki.join("front-proxy-client.crt");
    let key = pki.join("front-proxy-client.key");
    let as_front_proxy = |user: &str| {
        vec![
            "--cert".to_string(),
            cert.display().to_string(),
            "--key".to_string(),
            key.display().to_string(),
            "-H".to_string(),
            format!("X-Remote-User: {user}"),
            url.clone(),
        ]
    };
    let nobody = format!("system:serviceaccount:{NAMESPACE}:nobody");
    let (code, body) = curl(as_front_proxy(&nobody)).await?;
    ensure!(
        code == "403" && body.contains("cannot list resource") && body.contains(&nobody),
        "the operator let {nobody} read {METRIC}: HTTP {code} {body}"
    );
    let mut admin = as_front_proxy("e2e-admin");
    admin.splice(6..6, ["-H".to_string(), "X-Remote-Group: system:masters".to_string()]);
    let (code, body) = curl(admin).await?;
    ensure!(
        code == "200" && body.contains("ExternalMetricValueList"),
        "as a cluster admin: HTTP {code} {body}"
    );
    let (code, body) = curl(vec!["-H".into(), "X-Remote-User: e2e-admin".into(), url.clone()]).await?;
    ensure!(code == "401", "without the front-proxy certificate: HTTP {code} {body}");
    Ok(())
}

/// An unknown metric, a model with no pods and a malformed selector are the
/// API's NotFound and BadRequest, through kube-apiserver.
async fn not_found(env: &Env) -> Result<()> {
    let base = format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}");
    for (path, wanted) in [
        (
            format!("{base}/nereid_made_up?labelSelector=model%3D{MODEL}"),
            "NotFound",
        ),
        (
            format!("{base}/{METRIC}?labelSelector=model%3Dno-such-model"),
            "NotFound",
        ),
        (format!("{base}/{METRIC}?labelSelector=model%20in%20oops"), "BadRequest"),
    ] {
        let output = env.kubectl_output(["get", "--raw", &path], None).await?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let reason = match wanted {
            "NotFound" => "(NotFound)",
            _ => "(BadRequest)",
        };
        ensure!(
            !output.status.success() && stderr.contains(reason),
            "{path}: wanted {wanted}, kubectl said: {stderr}"
        );
    }
    Ok(())
}

/// Runs curl (TLS unverified: these checks are about who the server lets in)
/// and returns the HTTP status and the body.
async fn curl(args: Vec<String>) -> Result<(String, String)> {
    let mut command = std::process::Command::new("curl");
    command
        .args(["-sS", "-k", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args);
    let output = crate::env::checked(crate::env::run(command, None).await?)?;
    let (body, code) = output.trim_end().rsplit_once('\n').context("curl's status line")?;
    Ok((code.to_string(), body.to_string()))
}

/// The metric's value at the HPA's last read.
fn hpa_value(hpa: &HorizontalPodAutoscaler) -> Option<f64> {
    let current = hpa
        .status
        .as_ref()?
        .current_metrics
        .as_ref()?
        .first()?
        .external
        .as_ref()?;
    quantity(&current.current.value.as_ref()?.0).ok()
}

/// A quantity as the metrics API writes them (`1234` or `1234567m`).
fn quantity(text: &str) -> Result<f64> {
    Ok(match text.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>()? / 1000.0,
        None => text.parse()?,
    })
}

fn conditions(hpa: &HorizontalPodAutoscaler) -> String {
    hpa.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| format!("{}={} {}", c.type_, c.status, c.message.as_deref().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("; ")
}
