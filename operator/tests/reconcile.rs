//! The reconcile against a mocked API server: the exact requests it makes,
//! in order, for the create, update, invalid-spec, missing-Secret (never a
//! Secret request: the pods tell) and API-error paths. Each test is bounded by timeouts, so a missing or extra
//! request fails the test instead of hanging it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use nereid_crds::{Autoscaling, AutoscalingMetric, InferenceModel, InferenceModelStatus};
use nereid_operator::autoscaling::scraper::Board;
use nereid_operator::context::Context;
use nereid_operator::controller::{error_policy, reconcile};
use nereid_operator::error::Error;
use nereid_operator::metrics::Metrics;
use serde_json::{Value, json};
use support::*;
use tokio::time::timeout;
use tower_test::mock::{self, Handle, SendResponse};

const STEP: Duration = Duration::from_secs(5);
const APPLY_QUERY: [&str; 2] = ["fieldManager=nereid-operator", "force=true"];

/// The API server side of the mock: answers the reconcile's requests one by
/// one and checks each is the one expected.
struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
}

fn setup() -> (Arc<Context>, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let ctx = Context {
        client: client.clone(),
        metrics: Arc::new(Metrics::new()),
        board: Arc::new(Board::default()),
        config: config(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "nereid-operator".into(),
                instance: None,
            },
        ),
    };
    (Arc::new(ctx), ApiServer { handle })
}

fn respond(send: SendResponse<Response<Body>>, status: StatusCode, body: &Value) {
    let response = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap();
    send.send_response(response);
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": reason, "message": message, "code": code,
    })
}

const MODEL_PATH: &str = "/apis/serving.nereid.dev/v1alpha1/namespaces/ml/inferencemodels/resnet";
const POLICY_PATH: &str = "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/resnet";
const HPA_PATH: &str = "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers/resnet";
/// The Deployment of a canary the model had: looked for when it has none.
const CANARY_PATH: &str = "/apis/apps/v1/namespaces/ml/deployments/resnet-canary";

impl ApiServer {
    async fn next(&mut self, what: &str) -> (Request<Body>, SendResponse<Response<Body>>) {
        timeout(STEP, self.handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap_or_else(|| panic!("the client went away before {what}"))
    }

    async fn body(request: Request<Body>) -> Value {
        let bytes = request.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// Expects a server-side apply of `path`, answers with `answer(body)`, returns the body sent.
    async fn expect_apply(&mut self, path: &str, answer: impl FnOnce(&Value) -> Value) -> Value {
        let (request, send) = self.next(path).await;
        assert_eq!(request.method(), Method::PATCH, "{path}");
        assert_eq!(request.uri().path(), path);
        let query = request.uri().query().unwrap_or_default().to_string();
        for part in APPLY_QUERY {
            assert!(query.contains(part), "{path}: query '{query}' lacks {part}");
        }
        assert_eq!(
            request.headers()["content-type"],
            "application/apply-patch+yaml",
            "{path} is applied server-side"
        );
        let body = Self::body(request).await;
        respond(send, StatusCode::OK, &answer(&body));
        body
    }

    /// Expects the four owned objects, in order, then the look for a
    /// NetworkPolicy, HPA and canary the spec does not ask for (answered:
    /// there are none); the Deployment is answered with `deployment`.
    async fn expect_objects(&mut self, deployment: &Deployment) -> [Value; 4] {
        let objects = self.expect_applies(deployment).await;
        self.expect_lookup(POLICY_PATH, None).await;
        self.expect_lookup(HPA_PATH, None).await;
        self.expect_lookup(CANARY_PATH, None).await;
        objects
    }

    /// Expects the four owned objects, in order; the Deployment is answered
    /// with `deployment`.
    async fn expect_applies(&mut self, deployment: &Deployment) -> [Value; 4] {
        let config_map = self
            .expect_apply("/api/v1/namespaces/ml/configmaps/resnet-config", Value::clone)
            .await;
        let answer = serde_json::to_value(deployment).unwrap();
        let sent_deployment = self
            .expect_apply("/apis/apps/v1/namespaces/ml/deployments/resnet", |_| answer)
            .await;
        let service = self
            .expect_apply("/api/v1/namespaces/ml/services/resnet", Value::clone)
            .await;
        let pdb = self
            .expect_apply(
                "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/resnet",
                Value::clone,
            )
            .await;
        [config_map, sent_deployment, service, pdb]
    }

    /// Expects the look for an optional object (a NetworkPolicy, an HPA)
    /// the spec does not ask for, answered with its metadata or 404.
    async fn expect_lookup(&mut self, path: &str, found: Option<Value>) {
        let (request, send) = self.next(path).await;
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri().path(), path);
        match found {
            Some(metadata) => respond(send, StatusCode::OK, &metadata),
            None => respond(
                send,
                StatusCode::NOT_FOUND,
                &status_body(404, "NotFound", &format!("{path} not found")),
            ),
        }
    }

    async fn expect_list_pods(&mut self, pods: &[Pod]) {
        let (request, send) = self.next("the pod list").await;
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri().path(), "/api/v1/namespaces/ml/pods");
        let query = request.uri().query().unwrap_or_default();
        assert!(
            query.contains(
                "labelSelector=app.kubernetes.io%2Fname%3Dnereid-server%2Cserving.nereid.dev%2Fmodel%3Dresnet"
            ),
            "{query}"
        );
        let list = json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": { "resourceVersion": "7" },
            "items": pods,
        });
        respond(send, StatusCode::OK, &list);
    }

    /// Expects a metadata-only GET of the claim `name`; answers that it exists or not.
    async fn expect_claim(&mut self, name: &str, exists: bool) {
        let (request, send) = self.next("the PersistentVolumeClaim lookup").await;
        assert_eq!(request.method(), Method::GET);
        assert_eq!(
            request.uri().path(),
            format!("/api/v1/namespaces/ml/persistentvolumeclaims/{name}")
        );
        assert!(
            request.headers()["accept"]
                .to_str()
                .unwrap()
                .contains("as=PartialObjectMetadata")
        );
        if exists {
            let meta = json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": { "name": name, "namespace": "ml" },
            });
            respond(send, StatusCode::OK, &meta);
        } else {
            let message = format!("persistentvolumeclaims \"{name}\" not found");
            respond(send, StatusCode::NOT_FOUND, &status_body(404, "NotFound", &message));
        }
    }

    /// Expects a server-side apply of the status subresource; returns the status sent.
    async fn expect_status(&mut self) -> InferenceModelStatus {
        let path = format!("{MODEL_PATH}/status");
        let body = self
            .expect_apply(&path, |body| {
                let mut stored = serde_json::to_value(model()).unwrap();
                stored["status"] = body["status"].clone();
                stored
            })
            .await;
        assert_eq!(body["apiVersion"], "serving.nereid.dev/v1alpha1");
        assert_eq!(body["kind"], "InferenceModel");
        serde_json::from_value(body["status"].clone()).unwrap()
    }

    /// Expects `n` Events about the model; returns their reasons.
    async fn expect_events(&mut self, n: usize) -> Vec<String> {
        let mut reasons = Vec::new();
        for _ in 0..n {
            let (request, send) = self.next("an Event").await;
            assert_eq!(request.method(), Method::POST);
            assert_eq!(request.uri().path(), "/apis/events.k8s.io/v1/namespaces/ml/events");
            let body = Self::body(request).await;
            assert_eq!(body["regarding"]["kind"], "InferenceModel");
            assert_eq!(body["regarding"]["name"], "resnet");
            reasons.push(body["reason"].as_str().unwrap().to_string());
            respond(send, StatusCode::CREATED, &body);
        }
        reasons
    }

    /// Asserts the reconcile made no further request.
    async fn expect_nothing_more(mut self) {
        if let Ok(Some((request, _))) = timeout(Duration::from_millis(200), self.handle.next_request()).await {
            panic!("unexpected request: {} {}", request.method(), request.uri());
        }
    }
}

/// Runs one reconcile of `model` while `script` plays the API server.
async fn run<F, Fut>(model: InferenceModel, script: F) -> (Result<Action, Error>, Arc<Context>)
where
    F: FnOnce(ApiServer) -> Fut,
    Fut: Future<Output = ApiServer> + Send + 'static,
{
    let (ctx, server) = setup();
    let server = tokio::spawn(script(server));
    let result = timeout(Duration::from_secs(20), reconcile(Arc::new(model), ctx.clone()))
        .await
        .expect("the reconcile finished");
    let server = timeout(Duration::from_secs(20), server)
        .await
        .expect("the API server script finished")
        .expect("the API server script passed");
    server.expect_nothing_more().await;
    (result, ctx)
}

#[tokio::test]
async fn create_applies_every_object_then_writes_the_status() {
    let m = model();
    // Just created: the Deployment controller has not acted yet.
    let mut applied = deployment(&m, 0, 0, 0);
    applied.metadata.generation = Some(1);
    applied.status = None;
    let (result, ctx) = run(m, |mut api| async move {
        let [config_map, deployment, service, pdb] = api.expect_objects(&applied).await;
        assert_eq!(config_map["data"]["config.json"], "{}");
        assert_eq!(deployment["spec"]["replicas"], 1);
        assert_eq!(
            deployment["metadata"]["ownerReferences"][0]["uid"],
            "11111111-2222-3333-4444-555555555555"
        );
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["name"],
            "nereid-server"
        );
        assert_eq!(service["spec"]["ports"][1]["appProtocol"], "kubernetes.io/h2c");
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);
        api.expect_list_pods(&[]).await;
        let status = api.expect_status().await;
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(
            status.selector,
            "app.kubernetes.io/name=nereid-server,serving.nereid.dev/model=resnet"
        );
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "RollingOut"));
        assert_eq!(status.ready.as_deref(), Some("0/1"));
        assert_eq!(status.reason.as_deref(), Some("RollingOut"));
        assert_eq!(
            status.url.as_deref(),
            Some("http://resnet.ml.svc.cluster.local:8000/v2/models/resnet/infer")
        );
        assert_eq!(status.address.map(|a| a.url), status.url);
        // Rolling out is no news: no Event until it is Ready.
        api
    })
    .await;
    assert_eq!(
        result.unwrap(),
        Action::requeue(Duration::from_secs(10)),
        "progressing: look again soon"
    );
    let metrics = ctx.metrics.render();
    assert!(
        metrics.contains("nereid_operator_reconcile_total{kind=\"InferenceModel\"} 1"),
        "{metrics}"
    );
}

/// The spec dropped its canary (a rollback or a promotion): the canary's
/// Service, NetworkPolicy (none here) and ConfigMap go, then its Deployment,
/// each only if the model owns it.
#[tokio::test]
async fn a_canary_the_spec_dropped_is_deleted_deployment_last() {
    let m = model();
    let mut applied = deployment(&m, 0, 0, 0);
    applied.status = None;
    let (result, _) = run(m, move |mut api| async move {
        api.expect_applies(&applied).await;
        api.expect_lookup(POLICY_PATH, None).await;
        api.expect_lookup(HPA_PATH, None).await;
        let owned = |name: &str, uid: &str| {
            json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {
                    "name": name, "namespace": "ml", "uid": uid,
                    "ownerReferences": [{
                        "apiVersion": "serving.nereid.dev/v1alpha1", "kind": "InferenceModel",
                        "name": "resnet", "uid": "11111111-2222-3333-4444-555555555555", "controller": true,
                    }],
                },
            })
        };
        api.expect_lookup(CANARY_PATH, Some(owned("resnet-canary", "d-uid")))
            .await;
        let deleted = [
            ("/api/v1/namespaces/ml/services/resnet-canary", Some("s-uid")),
            (
                "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/resnet-canary",
                None,
            ),
            ("/api/v1/namespaces/ml/configmaps/resnet-canary-config", Some("c-uid")),
            (CANARY_PATH, Some("d-uid")),
        ];
        for (path, uid) in deleted {
            let name = path.rsplit('/').next().unwrap();
            api.expect_lookup(path, uid.map(|uid| owned(name, uid))).await;
            let Some(uid) = uid else { continue };
            let (request, send) = api.next("a canary object's removal").await;
            assert_eq!(request.method(), Method::DELETE);
            assert_eq!(request.uri().path(), path);
            let body = ApiServer::body(request).await;
            assert_eq!(body["preconditions"]["uid"], uid, "{body}");
            respond(
                send,
                StatusCode::OK,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            );
        }
        api.expect_list_pods(&[]).await;
        let status = api.expect_status().await;
        assert!(status.revisions.is_empty());
        assert!(!status.conditions.iter().any(|c| c.type_ == "CanaryReady"));
        api
    })
    .await;
    result.unwrap();
}

#[tokio::test]
async fn only_a_network_policy_the_model_owns_is_removed() {
    for (owner, removed) in [
        ("someone-elses-uid", false),
        ("11111111-2222-3333-4444-555555555555", true),
    ] {
        let m = model();
        let mut applied = deployment(&m, 0, 0, 0);
        applied.status = None;
        let (result, _) = run(m, move |mut api| async move {
            api.expect_applies(&applied).await;
            api.expect_lookup(
                POLICY_PATH,
                Some(json!({
                    "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                    "metadata": {
                        "name": "resnet", "namespace": "ml", "uid": "policy-uid",
                        "ownerReferences": [{
                            "apiVersion": "serving.nereid.dev/v1alpha1", "kind": "InferenceModel",
                            "name": "resnet", "uid": owner, "controller": true,
                        }],
                    },
                })),
            )
            .await;
            if removed {
                let (request, send) = api.next("the NetworkPolicy removal").await;
                assert_eq!(request.method(), Method::DELETE);
                assert_eq!(request.uri().path(), POLICY_PATH);
                let body = ApiServer::body(request).await;
                assert_eq!(body["preconditions"]["uid"], "policy-uid", "{body}");
                respond(
                    send,
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                );
            }
            api.expect_lookup(HPA_PATH, None).await;
            api.expect_lookup(CANARY_PATH, None).await;
            api.expect_list_pods(&[]).await;
            api.expect_status().await;
            api
        })
        .await;
        result.unwrap();
    }
}

#[tokio::test]
async fn an_unchanged_model_is_reapplied_but_its_status_is_not_rewritten() {
    let mut m = model();
    let serving = deployment(&m, 1, 1, 1);
    let pods = vec![ready_pod("resnet-abc")];
    m.status = Some(status_of(&m, &serving, &pods, at(0)));
    let (result, _) = run(m, |mut api| async move {
        api.expect_objects(&serving).await;
        api.expect_list_pods(&pods).await;
        // No status PATCH and no Events follow.
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(Duration::from_secs(60)));
}

#[tokio::test]
async fn a_status_change_is_written_and_announced() {
    let mut m = model();
    let serving = deployment(&m, 1, 1, 1);
    m.status = Some(status_of(&m, &serving, &[ready_pod("a")], at(0)));
    let crashing = deployment(&m, 1, 1, 0);
    let (result, _) = run(m, |mut api| async move {
        api.expect_objects(&crashing).await;
        api.expect_list_pods(&[crash_looping_pod("a", "panic: out of memory")])
            .await;
        let status = api.expect_status().await;
        assert_eq!(status.ready_replicas, 0);
        assert_eq!(status.last_failure.unwrap().reason, "CrashLoopBackOff");
        assert_eq!(status.reason.as_deref(), Some("CrashLoopBackOff"));
        // Every condition changed, but one problem is one Event: Degraded's.
        assert_eq!(api.expect_events(1).await, ["CrashLoopBackOff"]);
        api
    })
    .await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn an_invalid_spec_gets_a_status_and_nothing_is_applied() {
    let mut m = model();
    m.spec.source.uri = "ftp://models/resnet".into();
    let (result, ctx) = run(m.clone(), |mut api| async move {
        let status = api.expect_status().await;
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "InvalidSpec"));
        assert!(ready.message.contains("ftp://"), "{}", ready.message);
        assert_eq!(status.reason.as_deref(), Some("InvalidSpec"));
        assert_eq!(api.expect_events(1).await, ["InvalidSpec"]);
        api
    })
    .await;
    let error = result.unwrap_err();
    assert!(matches!(error, Error::InvalidSpec(_)), "{error}");
    let action = error_policy(Arc::new(m), &error, ctx.clone());
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    assert!(
        ctx.metrics
            .render()
            .contains("nereid_operator_reconcile_errors_total{error=\"invalid_spec\",kind=\"InferenceModel\"} 1")
    );
}

#[tokio::test]
async fn a_missing_claim_is_missing_pvc_and_retried_soon() {
    let mut m = model();
    m.spec.source.uri = "pvc://models/resnet".into();
    let pending = deployment(&m, 1, 1, 0);
    let (result, ctx) = run(m.clone(), |mut api| async move {
        api.expect_claim("models", false).await;
        api.expect_objects(&pending).await;
        api.expect_list_pods(&[]).await;
        let status = api.expect_status().await;
        assert_eq!(status.reason.as_deref(), Some("MissingPVC"));
        assert_eq!(api.expect_events(1).await, ["MissingPVC"]);
        api
    })
    .await;
    let error = result.unwrap_err();
    assert!(
        matches!(&error, Error::MissingClaim(name) if name == "models"),
        "{error}"
    );
    assert_eq!(
        error_policy(Arc::new(m), &error, ctx),
        Action::requeue(Duration::from_secs(5))
    );
}

#[tokio::test]
async fn a_missing_secret_is_read_from_the_pods_and_the_objects_still_apply() {
    let mut m = model();
    m.spec.source.credentials_secret = Some("s3-creds".into());
    let pending = deployment(&m, 1, 1, 0);
    let (result, _) = run(m, |mut api| async move {
        // No Secret is looked up: the first request is the first apply.
        let [_, deployment, _, _] = api.expect_objects(&pending).await;
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["initContainers"][0]["envFrom"][0]["secretRef"]["name"], "s3-creds");
        assert!(
            pod["containers"][0]["envFrom"].is_null(),
            "the server gets no credentials"
        );
        api.expect_list_pods(&[missing_secret_pod("resnet-abc", r#"secret "s3-creds" not found"#)])
            .await;
        let status = api.expect_status().await;
        let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "MissingSecret")
        );
        assert!(degraded.message.contains("'s3-creds'"), "{}", degraded.message);
        assert_eq!(api.expect_events(1).await, ["MissingSecret"]);
        api
    })
    .await;
    // The pods' watch brings the controller back once the kubelet can start
    // them; meanwhile the rollout is in progress, looked at again soon.
    assert_eq!(result.unwrap(), Action::requeue(Duration::from_secs(10)));
}

#[tokio::test]
async fn a_model_with_a_credentials_secret_reads_no_secret() {
    let mut m = model();
    m.spec.source.credentials_secret = Some("s3-creds".into());
    let serving = deployment(&m, 1, 1, 1);
    let pods = vec![ready_pod("a")];
    m.status = Some(status_of(&m, &serving, &pods, at(0)));
    let (result, _) = run(m, |mut api| async move {
        // Every request is checked by path: a Secret GET here would fail the test.
        api.expect_objects(&serving).await;
        api.expect_list_pods(&pods).await;
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(Duration::from_secs(60)));
}

#[tokio::test]
async fn an_api_error_stops_the_reconcile_and_is_retried_soon() {
    let m = model();
    let (result, ctx) = run(m.clone(), |mut api| async move {
        let (request, send) = api.next("the ConfigMap apply").await;
        assert_eq!(request.uri().path(), "/api/v1/namespaces/ml/configmaps/resnet-config");
        respond(
            send,
            StatusCode::INTERNAL_SERVER_ERROR,
            &status_body(500, "InternalError", "etcdserver: request timed out"),
        );
        api
    })
    .await;
    let error = result.unwrap_err();
    assert!(matches!(error, Error::Kube(_)), "{error}");
    assert_eq!(error.kind(), "kube");
    assert_eq!(
        error_policy(Arc::new(m), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(15))
    );
    let metrics = ctx.metrics.render();
    assert!(
        metrics.contains("nereid_operator_reconcile_errors_total{error=\"kube\",kind=\"InferenceModel\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_model_being_deleted_is_left_to_the_garbage_collector() {
    let mut m = model();
    m.metadata.deletion_timestamp = Some(at(0));
    let (result, _) = run(m, |api| async move { api }).await;
    assert_eq!(result.unwrap(), Action::await_change());
}

#[tokio::test]
async fn a_foreign_hpa_over_the_pods_is_reported_and_none_is_made() {
    let mut m = model();
    m.spec.autoscaling = Some(Autoscaling {
        max_replicas: 3,
        metric: AutoscalingMetric::QueueTimeMicros,
        target: "500".into(),
        ..Autoscaling::default()
    });
    let mut applied = deployment(&m, 0, 0, 0);
    applied.status = None;
    let (result, _) = run(m, move |mut api| async move {
        let (request, send) = api.next("the look for other HPAs").await;
        assert_eq!(request.method(), Method::GET);
        assert_eq!(
            request.uri().path(),
            "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers"
        );
        let legacy = json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "legacy", "namespace": "ml"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "resnet"},
                "maxReplicas": 5,
            },
        });
        let list = json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscalerList",
            "metadata": {"resourceVersion": "9"}, "items": [legacy],
        });
        respond(send, StatusCode::OK, &list);
        api.expect_applies(&applied).await;
        api.expect_lookup(POLICY_PATH, None).await;
        // Ours is not applied; one from before would be removed.
        api.expect_lookup(HPA_PATH, None).await;
        api.expect_lookup(CANARY_PATH, None).await;
        api.expect_list_pods(&[]).await;
        let status = api.expect_status().await;
        let autoscaling = status.autoscaling.expect("status.autoscaling");
        assert_eq!(autoscaling.reason.as_deref(), Some("ForeignAutoscaler"));
        assert!(autoscaling.message.unwrap().contains("\"legacy\""));
        assert_eq!(autoscaling.horizontal_pod_autoscaler, None);
        api
    })
    .await;
    result.unwrap();
}
