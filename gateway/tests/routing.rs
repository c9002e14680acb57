//! The gateway in front of three nereid-server processes on loopback: one
//! gRPC connection's requests spread over the pods, a slowed pod gets
//! fewer, a pod going away under load fails no request, and bad input gets
//! clear errors while the gateway keeps serving.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::inference::{RepositoryIndexRequest, RepositoryModelLoadRequest};
use support::{Gateway, Pod, request};
use tonic::transport::Channel;

/// Sends `total` identity requests through `client` (one connection), at
/// most `concurrency` at once; calls `after(n)` once `n` have been answered
/// (used to act mid-load). Returns the errors, each with its request.
async fn load(
    client: GrpcInferenceServiceClient<Channel>,
    total: usize,
    concurrency: usize,
    trigger: Option<(usize, Box<dyn FnOnce() + Send>)>,
) -> Vec<String> {
    let next = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let trigger = Arc::new(std::sync::Mutex::new(trigger));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let mut client = client.clone();
        let (next, answered, trigger) = (Arc::clone(&next), Arc::clone(&answered), Arc::clone(&trigger));
        workers.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return errors;
                }
                let value = i as f32;
                match client.model_infer(request("identity", &[value, 1.0])).await {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        let raw = &reply.raw_output_contents[0];
                        let first = f32::from_le_bytes(raw[..4].try_into().unwrap());
                        if first != value {
                            errors.push(format!("request {i}: answered {first}"));
                        }
                    }
                    Err(status) => errors.push(format!("request {i}: {status:?}")),
                }
                let done = answered.fetch_add(1, Ordering::Relaxed) + 1;
                let mut trigger = trigger.lock().unwrap();
                if trigger.as_ref().is_some_and(|(at, _)| done >= *at) {
                    let (_, act) = trigger.take().unwrap();
                    drop(trigger);
                    tokio::task::spawn_blocking(act);
                }
            }
        }));
    }
    let mut errors = Vec::new();
    for worker in workers {
        errors.extend(worker.await.unwrap());
    }
    errors
}

async fn inferences_per_pod(pods: &[Pod]) -> Vec<u64> {
    let mut counts = Vec::new();
    for pod in pods {
        counts.push(pod.inferences().await);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connections_requests_spread_over_every_pod() {
    let pods: Vec<Pod> = (0..3).map(|i| Pod::start(&format!("spread-{i}"), 2)).collect();
    let endpoints: Vec<String> = pods.iter().map(|p| p.endpoint("identity")).collect();
    let gateway = Gateway::start(&endpoints, &[]);
    let errors = load(gateway.grpc_client().await, 600, 12, None).await;
    assert!(errors.is_empty(), "{errors:?}");
    let counts = inferences_per_pod(&pods).await;
    assert_eq!(counts.iter().sum::<u64>(), 600, "{counts:?}");
    // Every pod takes a real share (a third would be 200).
    assert!(counts.iter().all(|&c| c >= 100), "{counts:?}");

    // HTTP/REST too, with the answer checked.
    let client = reqwest::Client::new();
    for i in 0..30 {
        let body = serde_json::json!({
            "id": format!("r{i}"),
            "inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [i as f32, 2.0]}]
        });
        let reply: serde_json::Value = client
            .post(format!("http://{}/v2/models/identity/infer", gateway.http))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(reply["id"], format!("r{i}"), "the request id is preserved");
        assert_eq!(reply["outputs"][0]["data"], serde_json::json!([i as f32, 2.0]));
    }
    let counts = inferences_per_pod(&pods).await;
    assert_eq!(counts.iter().sum::<u64>(), 630);
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains(&format!(
            "nereid_gateway_requests_total{{endpoint=\"{}\",model=\"default/identity\",protocol=\"grpc\"}}",
            pods[0].http
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowed_pod_gets_fewer_requests() {
    // Two pods at 2 ms per request, one ten times slower.
    let pods: Vec<Pod> = [2, 2, 20]
        .iter()
        .enumerate()
        .map(|(i, delay)| Pod::start(&format!("slowed-{i}"), *delay))
        .collect();
    let endpoints: Vec<String> = pods.iter().map(|p| p.endpoint("identity")).collect();
    let gateway = Gateway::start(&endpoints, &[]);
    let errors = load(gateway.grpc_client().await, 600, 12, None).await;
    assert!(errors.is_empty(), "{errors:?}");
    let counts = inferences_per_pod(&pods).await;
    assert!(counts[2] * 2 < counts[0].min(counts[1]), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_going_away_under_load_fails_no_request() {
    let mut pods: Vec<Pod> = (0..3).map(|i| Pod::start(&format!("away-{i}"), 2)).collect();
    let endpoints: Vec<String> = pods.iter().map(|p| p.endpoint("identity")).collect();
    let gateway = Gateway::start(&endpoints, &[]);
    let leaving = pods.remove(0);
    let stopped = Arc::new(std::sync::Mutex::new(None));
    let act = {
        let stopped = Arc::clone(&stopped);
        Box::new(move || {
            let mut leaving = leaving;
            let status = leaving.process.terminate();
            *stopped.lock().unwrap() = Some(status);
        }) as Box<dyn FnOnce() + Send>
    };
    let errors = load(gateway.grpc_client().await, 900, 12, Some((150, act))).await;
    assert!(errors.is_empty(), "{} failed: {errors:?}", errors.len());
    // The pod did stop mid-load, and the other two answered the rest.
    for _ in 0..100 {
        if stopped.lock().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stopped.lock().unwrap().is_some_and(|s| s.success()));
    let counts = inferences_per_pod(&pods).await;
    assert!(counts.iter().sum::<u64>() >= 750 - 150, "{counts:?}");
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("nereid_gateway_retries_total{model=\"default/identity\"}")
            || metrics.contains("nereid_gateway_failures_total{model=\"default/identity\",reason=\"connect\"}"),
        "the gone pod was tried and left: {metrics}"
    );
}

/// A pod that takes connections and resets them unread, saying nothing (as
/// one does that exits with connections still in its listen backlog), ran
/// none of their requests: they go to the other pod, and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_pod_never_spoke_on_is_retried_elsewhere() {
    use tokio::io::AsyncReadExt;

    let pod = Pod::start("unheard", 0);
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_address = silent.local_addr().unwrap();
    let taken = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&taken);
    // Ends with the test's runtime.
    tokio::spawn(async move {
        while let Ok((mut connection, _)) = silent.accept().await {
            // One byte of the gateway's preface read, the rest left unread:
            // closing now resets the connection.
            let mut first = [0u8; 1];
            let _ = connection.read(&mut first).await;
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    let endpoints = [
        pod.endpoint("identity"),
        format!("identity={silent_address},{silent_address}"),
    ];
    // Round robin, so the silent pod is tried whatever its load looks like.
    let gateway = Gateway::start(&endpoints, &["--picker", "round-robin"]);
    let errors = load(gateway.grpc_client().await, 20, 1, None).await;
    assert!(errors.is_empty(), "{} failed: {errors:?}", errors.len());
    assert!(taken.load(Ordering::Relaxed) > 0, "the silent pod was tried");
    assert_eq!(pod.inferences().await, 20);
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("nereid_gateway_retries_total{model=\"default/identity\"}"),
        "{metrics}"
    );
}

/// SIGTERM (a rollout or a scale-down of the gateway): it turns unready,
/// still serves what comes during its drain delay, and exits only after
/// every request it took has been answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_gateway_answers_every_request_it_took() {
    let pod = Pod::start("drain", 200);
    let mut gateway = Gateway::start(&[pod.endpoint("identity")], &["--drain-delay-ms", "500"]);
    let client = gateway.grpc_client().await;
    let in_flight: Vec<_> = (0..4)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.model_infer(request("identity", &[i as f32])).await })
        })
        .collect();
    gateway
        .wait_for_metric("nereid_gateway_endpoint_outstanding_requests{", " 4")
        .await;

    let readyz = format!("http://{}/readyz", gateway.metrics);
    assert_eq!(reqwest::get(&readyz).await.unwrap().status(), 200);
    gateway.process.signal_term();
    let mut unready = false;
    for _ in 0..100 {
        if reqwest::get(&readyz).await.unwrap().status() == 503 {
            unready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(unready, "/readyz fails once the gateway is shutting down");
    // Still in its drain delay: a new request on the open connection is served.
    let late = client.clone().model_infer(request("identity", &[9.0])).await;
    assert!(late.is_ok(), "{late:?}");
    for (i, answer) in in_flight.into_iter().enumerate() {
        let answer = answer.await.unwrap();
        assert!(answer.is_ok(), "request {i}: {answer:?}");
    }
    let status = tokio::task::block_in_place(|| gateway.process.wait_exit());
    assert!(status.success(), "{status}");
}

/// A ModelStreamInfer stream, pinned to one pod, carries each message both
/// ways as it comes: the client sends the next only after the previous
/// answer, so nothing may wait for the stream's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_passes_each_message_through_as_it_comes() {
    use futures::SinkExt;
    use nereid_proto::inference::ModelStreamInferResponse;

    let pod = Pod::start("pass-through", 0);
    let gateway = Gateway::start(&[pod.endpoint("identity")], &[]);
    let mut client = gateway.grpc_client().await;
    let (mut requests, outgoing) = futures::channel::mpsc::channel(1);
    requests.send(request("identity", &[0.0])).await.unwrap();
    let mut answers = client.model_stream_infer(outgoing).await.unwrap().into_inner();
    for i in 0..20 {
        let answer: ModelStreamInferResponse = tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .expect("each answer comes before the next request is sent")
            .unwrap()
            .expect("the stream is open");
        assert_eq!(answer.error_message, "", "message {i}");
        let reply = answer.infer_response.unwrap();
        let first = f32::from_le_bytes(reply.raw_output_contents[0][..4].try_into().unwrap());
        assert_eq!(first, i as f32, "message {i}");
        if i < 19 {
            requests.send(request("identity", &[(i + 1) as f32])).await.unwrap();
        }
    }
    drop(requests);
    let end = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None)), "the stream ends with the client's: {end:?}");

    assert_eq!(pod.inferences().await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_gateway_keeps_serving() {
    let pod = Pod::start("bad-input", 200);
    let gateway = Gateway::start(
        &[pod.endpoint("identity"), "ml/offline=127.0.0.1:1,127.0.0.1:1".into()],
        &["--max-body-bytes", "4096"],
    );
    let mut client = gateway.grpc_client().await;

    let unknown = client.model_infer(request("nope", &[1.0])).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains("\"nope\""), "{unknown:?}");

    // A model whose only pod cannot be reached: UNAVAILABLE naming it.
    let offline = client.model_infer(request("offline", &[1.0])).await.unwrap_err();
    assert_eq!(offline.code(), tonic::Code::Unavailable, "{offline:?}");
    assert!(offline.message().contains("ml/offline"), "{offline:?}");

    let large = client.model_infer(request("identity", &[0.5; 2048])).await.unwrap_err();
    assert_eq!(large.code(), tonic::Code::ResourceExhausted, "{large:?}");

    let load = client
        .repository_model_load(RepositoryModelLoadRequest {
            model_name: "identity".into(),
            ..RepositoryModelLoadRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(load.code(), tonic::Code::FailedPrecondition);
    assert!(load.message().contains("InferenceModel"), "{load:?}");

    let index = client
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    let states: Vec<(String, String)> = index.models.into_iter().map(|m| (m.name, m.state)).collect();
    assert_eq!(
        states,
        [("identity".into(), "READY".into()), ("offline".into(), "READY".into())]
    );

    // HTTP: unknown model, outside /v2, too large, load refused.
    let http = reqwest::Client::new();
    let status = |response: reqwest::Response| response.status().as_u16();
    let url = |path: &str| format!("http://{}{path}", gateway.http);
    let reply = http.post(url("/v2/models/nope/infer")).body("{}").send().await.unwrap();
    assert_eq!(status(reply), 404);
    let reply = http.get(url("/metrics")).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 404);
    let error: serde_json::Value = reply.json().await.unwrap();
    assert!(error["error"].as_str().unwrap().contains("/v2"), "{error}");
    let reply = http
        .post(url("/v2/models/identity/infer"))
        .body(vec![b' '; 10_000])
        .send()
        .await
        .unwrap();
    assert_eq!(status(reply), 413);
    let reply = http
        .post(url("/v2/repository/models/identity/unload"))
        .send()
        .await
        .unwrap();
    assert_eq!(status(reply), 403);

    // A malformed gRPC message: INVALID_ARGUMENT, not a hang or a crash.
    let garbage = raw_grpc(&gateway.grpc, b"\x00\x00\x00\x00\x03\x0a\x7fa").await;
    assert_eq!(garbage.as_deref(), Some("3"), "grpc-status");

    // A client that gives up mid-request: the upstream request is dropped
    // and nothing stays counted in flight.
    let impatient = tokio::time::timeout(
        Duration::from_millis(50),
        client.model_infer(request("identity", &[1.0])),
    )
    .await;
    assert!(impatient.is_err(), "the 200 ms model cannot answer in 50 ms");
    // Polled, not slept on: the reset reaches the gateway when it does.
    let mut outstanding = Vec::new();
    for _ in 0..200 {
        let metrics = gateway.metrics().await;
        outstanding = metrics
            .lines()
            .filter(|l| l.starts_with("nereid_gateway_endpoint_outstanding_requests{"))
            .map(str::to_string)
            .collect();
        if !outstanding.is_empty() && outstanding.iter().all(|l| l.ends_with(" 0")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !outstanding.is_empty() && outstanding.iter().all(|l| l.ends_with(" 0")),
        "{outstanding:?}"
    );

    // And it still serves.
    let reply = client
        .model_infer(request("identity", &[7.0]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.model_name, "identity");
}

/// POSTs a raw gRPC body to ModelInfer over HTTP/2 and returns the
/// grpc-status it got (from the headers or the trailers).
async fn raw_grpc(address: &str, body: &'static [u8]) -> Option<String> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let request = http::Request::post(format!("http://{address}/inference.GRPCInferenceService/ModelInfer"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(bytes::Bytes::from_static(body)))
        .unwrap();
    let response = client.request(request).await.unwrap();
    if let Some(status) = response.headers().get("grpc-status") {
        return Some(status.to_str().unwrap().to_string());
    }
    let collected = response.into_body().collect().await.unwrap();
    collected
        .trailers()?
        .get("grpc-status")
        .map(|s| s.to_str().unwrap().to_string())
}
