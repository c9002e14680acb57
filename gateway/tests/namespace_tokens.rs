//! Per-namespace authorization: a namespace given a `--namespace-token`
//! takes only requests carrying `authorization: Bearer <token>`, on both
//! ports, refused with 401 / UNAUTHENTICATED before their bodies are read;
//! the token never reaches a pod; other namespaces stay open unless
//! `--require-namespace-tokens`; and the repository index lists only what
//! a request's token opens.
//!
//! The pods are fakes that record whether a request came with an
//! `authorization` header, so that it can be seen not to.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nereid_proto::inference::{ModelInferResponse, RepositoryIndexRequest};
use support::raw::{self, read_answer};
use support::{Gateway, request, scratch};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

const ML_TOKEN: &str = "ml-s3cret-4f1c";
const OPS_TOKEN: &str = "ops-s3cret-9a2e";

/// What a fake pod was sent: each request's path, and whether it came
/// with an `authorization` header.
type Seen = Arc<Mutex<Vec<(String, bool)>>>;

/// A pod that answers every request at once, on one address for both
/// protocols: gRPC calls with an empty ModelInferResponse, anything else
/// with `{}`.
async fn fake_pod() -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let recorded = Arc::clone(&seen);
    // Ends with the test's runtime.
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let recorded = Arc::clone(&recorded);
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((call, respond))) = connection.accept().await {
                    recorded.lock().unwrap().push((
                        call.uri().path().to_string(),
                        call.headers().contains_key(http::header::AUTHORIZATION),
                    ));
                    tokio::spawn(answer(call, respond));
                }
            });
        }
    });
    (address, seen)
}

async fn answer(call: http::Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
    let grpc = call
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
    let mut body = call.into_body();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let content_type = if grpc { "application/grpc" } else { "application/json" };
    let head = http::Response::builder()
        .header("content-type", content_type)
        .body(())
        .unwrap();
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    if !grpc {
        let _ = send.send_data(Bytes::from_static(b"{}"), true);
        return;
    }
    let message = nereid_proto::frame::encode(&ModelInferResponse::default()).unwrap();
    let _ = send.send_data(message, false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

/// `--endpoint` for `model` at a fake pod.
fn endpoint(model: &str, pod: SocketAddr) -> String {
    format!("{model}={pod},{pod}")
}

/// A token file holding `token` and a newline, as `kubectl create secret`
/// from a file written by `echo` would.
fn token_file(folder: &std::path::Path, namespace: &str, token: &str) -> PathBuf {
    let path = folder.join(namespace);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

/// `--namespace-token NAMESPACE=FILE`.
fn token_flag(namespace: &str, file: &std::path::Path) -> String {
    format!("{namespace}={}", file.display())
}

/// An HTTP infer call's status, `www-authenticate` header and error text.
async fn http_infer(gateway: &Gateway, model: &str, token: Option<&str>) -> (u16, Option<String>, String) {
    let body = serde_json::json!({
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]
    });
    let mut call = reqwest::Client::new()
        .post(format!("http://{}/v2/models/{model}/infer", gateway.http))
        .json(&body);
    if let Some(token) = token {
        call = call.bearer_auth(token);
    }
    let reply = call.send().await.unwrap();
    let status = reply.status().as_u16();
    let challenge = reply
        .headers()
        .get("www-authenticate")
        .map(|value| value.to_str().unwrap().to_string());
    let body: serde_json::Value = reply.json().await.unwrap();
    let error = body["error"].as_str().unwrap_or_default().to_string();
    (status, challenge, error)
}

/// A gRPC ModelInfer call for `model`, with a bearer token and a
/// `nereid-namespace` if given.
async fn grpc_infer(
    gateway: &Gateway,
    model: &str,
    namespace: Option<&str>,
    token: Option<&str>,
) -> Result<(), tonic::Status> {
    let mut call = tonic::Request::new(request(model, &[1.0]));
    if let Some(namespace) = namespace {
        call.metadata_mut()
            .insert("nereid-namespace", namespace.parse().unwrap());
    }
    if let Some(token) = token {
        call.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut client = gateway.grpc_client().await;
    client.model_infer(call).await.map(|_| ())
}

fn no_pod_saw_a_token(seen: &Seen) {
    let seen = seen.lock().unwrap();
    assert!(seen.iter().all(|(_, authorization)| !authorization), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_namespace_takes_only_requests_with_its_token() {
    let (pod, seen) = fake_pod().await;
    let folder = scratch("namespace-tokens");
    let ml = token_file(&folder, "ml", ML_TOKEN);
    let gateway = Gateway::start(
        &[endpoint("ml/identity", pod), endpoint("team/gpt", pod)],
        &["--namespace-token", &token_flag("ml", &ml)],
    );

    // HTTP: no token and a wrong one read the same: 401, a bearer
    // challenge, and words that name the route asked for.
    let missing = http_infer(&gateway, "ml%2Fidentity", None).await;
    let wrong = http_infer(&gateway, "ml%2Fidentity", Some("ml-s3cret-4f1d")).await;
    assert_eq!(missing.0, 401, "{missing:?}");
    assert_eq!(missing.1.as_deref(), Some("Bearer"), "{missing:?}");
    assert!(missing.2.contains("\"ml/identity\""), "{missing:?}");
    assert_eq!(missing, wrong);
    // Another scheme is no token either.
    let reply = reqwest::Client::new()
        .get(format!("http://{}/v2/models/ml%2Fidentity/ready", gateway.http))
        .basic_auth("ml", Some(ML_TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 401);
    // A plain name that leads there: refused, without naming the namespace.
    let plain = http_infer(&gateway, "identity", None).await;
    assert_eq!(plain.0, 401, "{plain:?}");
    assert!(!plain.2.contains("ml/") && !plain.2.contains("\"ml\""), "{plain:?}");
    assert!(seen.lock().unwrap().is_empty(), "nothing refused reached a pod");

    // The right token: forwarded, without it.
    for model in ["ml%2Fidentity", "identity"] {
        let (status, _, error) = http_infer(&gateway, model, Some(ML_TOKEN)).await;
        assert_eq!(status, 200, "{model}: {error}");
    }
    // The open namespace, as before.
    let (status, _, error) = http_infer(&gateway, "gpt", None).await;
    assert_eq!(status, 200, "{error}");
    assert_eq!(seen.lock().unwrap().len(), 3);
    no_pod_saw_a_token(&seen);

    // Refused before the body is read: a body larger than the gateway
    // takes gets 401, not 413.
    let mut stream = raw::connect(&gateway.http).await;
    stream
        .write_all(
            b"POST /v2/models/identity/infer HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
              content-length: 1000000000\r\n\r\n",
        )
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut stream))
        .await
        .expect("answered at once");
    assert_eq!(answer.status, 401, "{answer:?}");

    // gRPC: UNAUTHENTICATED, in the same words for no token and a wrong one.
    let missing = grpc_infer(&gateway, "ml/identity", None, None).await.unwrap_err();
    let wrong = grpc_infer(&gateway, "ml/identity", None, Some("nope"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated, "{missing:?}");
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    assert_eq!(missing.message(), wrong.message());
    assert!(missing.message().contains("\"ml/identity\""), "{missing:?}");
    let header = grpc_infer(&gateway, "identity", Some("ml"), None).await.unwrap_err();
    assert_eq!(header.code(), tonic::Code::Unauthenticated, "{header:?}");
    let plain = grpc_infer(&gateway, "identity", None, Some("nope")).await.unwrap_err();
    assert_eq!(plain.code(), tonic::Code::Unauthenticated, "{plain:?}");
    assert!(!plain.message().contains("\"ml\""), "{plain:?}");
    assert_eq!(seen.lock().unwrap().len(), 3, "nothing refused reached a pod");

    for (model, namespace) in [("ml/identity", None), ("identity", Some("ml")), ("identity", None)] {
        let answered = grpc_infer(&gateway, model, namespace, Some(ML_TOKEN)).await;
        assert!(answered.is_ok(), "{model} {namespace:?}: {answered:?}");
    }
    let open = grpc_infer(&gateway, "gpt", None, None).await;
    assert!(open.is_ok(), "{open:?}");
    assert_eq!(seen.lock().unwrap().len(), 7);
    no_pod_saw_a_token(&seen);

    // A unary call is refused once its first message names the model, not
    // when the rest of it comes (it never does here).
    let grpc = raw::h2_connect(&gateway.grpc).await;
    let (response, _held) = raw::h2_post(
        &grpc,
        "/inference.GRPCInferenceService/ModelInfer",
        "application/grpc",
        raw::grpc_frame_start(1000, 20),
        false,
    )
    .await;
    let (status, message) = tokio::time::timeout(Duration::from_secs(10), raw::grpc_status(response))
        .await
        .expect("answered before the body timeout");
    assert_eq!(status, "16", "UNAUTHENTICATED: {message}");

    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("nereid_gateway_failures_total{model=\"\",reason=\"unauthorized\"}"),
        "{metrics}"
    );
    // Never a token in the gateway's log.
    assert!(!gateway.process.log().contains(ML_TOKEN), "{}", gateway.process.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_name_names_its_namespaces_only_to_whom_may_reach_them() {
    let (pod, seen) = fake_pod().await;
    let folder = scratch("namespace-tokens-ambiguous");
    let ml = token_file(&folder, "ml", ML_TOKEN);
    let gateway = Gateway::start(
        &[endpoint("ml/identity", pod), endpoint("team/identity", pod)],
        &["--namespace-token", &token_flag("ml", &ml)],
    );
    // Without ml's token: refused, not "ambiguous between ml and team".
    let (status, _, error) = http_infer(&gateway, "identity", None).await;
    assert_eq!(status, 401, "{error}");
    assert!(!error.contains("\"ml\"") && !error.contains("team"), "{error}");
    // With it, the usual error, which lists them.
    let (status, _, error) = http_infer(&gateway, "identity", Some(ML_TOKEN)).await;
    assert_eq!(status, 400, "{error}");
    assert!(error.contains("ambiguous") && error.contains("\"ml\""), "{error}");
    // Named, the open one is reached without a token.
    let (status, _, error) = http_infer(&gateway, "team%2Fidentity", None).await;
    assert_eq!(status, 200, "{error}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tokens_close_the_namespaces_without_one() {
    let (pod, seen) = fake_pod().await;
    let folder = scratch("namespace-tokens-required");
    let ml = token_file(&folder, "ml", ML_TOKEN);
    let gateway = Gateway::start(
        &[endpoint("ml/identity", pod), endpoint("team/gpt", pod)],
        &[
            "--namespace-token",
            &token_flag("ml", &ml),
            "--require-namespace-tokens",
        ],
    );
    for token in [None, Some(ML_TOKEN)] {
        let (status, challenge, error) = http_infer(&gateway, "team%2Fgpt", token).await;
        assert_eq!(
            (status, challenge.as_deref()),
            (401, Some("Bearer")),
            "{token:?}: {error}"
        );
        let refused = grpc_infer(&gateway, "gpt", None, token).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    }
    let (status, _, error) = http_infer(&gateway, "identity", Some(ML_TOKEN)).await;
    assert_eq!(status, 200, "{error}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    no_pod_saw_a_token(&seen);
}

/// The names the HTTP repository index lists for a request with `token`.
async fn http_index(gateway: &Gateway, token: Option<&str>) -> Vec<String> {
    let mut call = reqwest::Client::new()
        .post(format!("http://{}/v2/repository/index", gateway.http))
        .body("{}");
    if let Some(token) = token {
        call = call.bearer_auth(token);
    }
    let reply = call.send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    let models: serde_json::Value = reply.json().await.unwrap();
    let mut names: Vec<String> = models
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// The names the gRPC repository index lists for a request with `token`.
async fn grpc_index(gateway: &Gateway, token: Option<&str>) -> Vec<String> {
    let mut call = tonic::Request::new(RepositoryIndexRequest::default());
    if let Some(token) = token {
        call.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut client = gateway.grpc_client().await;
    let models = client.repository_index(call).await.unwrap().into_inner().models;
    let mut names: Vec<String> = models.into_iter().map(|model| model.name).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_repository_index_lists_only_what_a_token_opens() {
    let (pod, _) = fake_pod().await;
    let folder = scratch("namespace-tokens-index");
    let ml = token_file(&folder, "ml", ML_TOKEN);
    let ops = token_file(&folder, "ops", OPS_TOKEN);
    let endpoints = [
        endpoint("ml/identity", pod),
        endpoint("ops/bert", pod),
        endpoint("team/gpt", pod),
    ];
    let (ml_flag, ops_flag) = (token_flag("ml", &ml), token_flag("ops", &ops));
    let gateway = Gateway::start(
        &endpoints,
        &["--namespace-token", &ml_flag, "--namespace-token", &ops_flag],
    );
    for (token, listed) in [
        (None, &["gpt"][..]),
        (Some("wrong"), &["gpt"][..]),
        (Some(ML_TOKEN), &["gpt", "identity"][..]),
        (Some(OPS_TOKEN), &["bert", "gpt"][..]),
    ] {
        assert_eq!(http_index(&gateway, token).await, listed, "HTTP, {token:?}");
        assert_eq!(grpc_index(&gateway, token).await, listed, "gRPC, {token:?}");
    }

    // Deny by default: nothing for a request without a token.
    let required = Gateway::start(
        &endpoints,
        &["--namespace-token", &ml_flag, "--require-namespace-tokens"],
    );
    assert!(http_index(&required, None).await.is_empty());
    assert!(grpc_index(&required, None).await.is_empty());
    assert_eq!(http_index(&required, Some(ML_TOKEN)).await, ["identity"]);
}
