//! The HTTP port forwards a model's data plane only (issue 39, finding
//! 12): metadata, ready, config, stats, infer (generate and
//! generate_stream too), with or without a version; Triton's endpoints
//! about one server are refused with 403, as the gRPC port refuses them,
//! and any other path with 404, both with KServe's `{"error": "..."}`.

mod support;

use nereid_proto::inference::TraceSettingRequest;
use support::raw::{self, read_answer};
use support::{Gateway, Pod};
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_models_data_plane_is_forwarded() {
    let pod = Pod::start("paths", 0);
    let gateway = Gateway::start(&[pod.endpoint("identity")], &[]);
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", gateway.http);

    // Forwarded: the pod answers.
    for path in [
        "/v2/models/identity",
        "/v2/models/identity/ready",
        "/v2/models/identity/config",
        "/v2/models/identity/stats",
        "/v2/models/identity/versions/1/ready",
    ] {
        let reply = http.get(url(path)).send().await.unwrap();
        assert_eq!(reply.status().as_u16(), 200, "{path}");
    }
    let body = serde_json::json!({
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]
    });
    let reply = http
        .post(url("/v2/models/identity/infer"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);

    // About one server (a pod would answer 200 to each): refused.
    for (method, path) in [
        ("GET", "/v2/models/identity/trace/setting"),
        ("POST", "/v2/models/identity/trace/setting"),
        ("GET", "/v2/models/identity/versions/1/trace/setting"),
        ("GET", "/v2/trace/setting"),
        ("POST", "/v2/logging"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("GET", "/v2/cudasharedmemory/status"),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let reply = http.request(method, url(path)).body("{}").send().await.unwrap();
        assert_eq!(reply.status().as_u16(), 403, "{path}");
        let error: serde_json::Value = reply.json().await.unwrap();
        assert!(
            error["error"].as_str().unwrap().contains("call a pod directly"),
            "{path}: {error}"
        );
    }
    // Anything else under a model is no endpoint.
    for path in ["/v2/models/identity/unknown", "/v2/models/identity/ready/again"] {
        let reply = http.get(url(path)).send().await.unwrap();
        assert_eq!(reply.status().as_u16(), 404, "{path}");
        let error: serde_json::Value = reply.json().await.unwrap();
        assert!(
            error["error"].as_str().unwrap().contains("no such endpoint"),
            "{path}: {error}"
        );
    }
    // Nor does a path that a pod might read as another one get through
    // (sent by hand: an HTTP client would resolve the dot segments).
    let mut stream = raw::connect(&gateway.http).await;
    stream
        .write_all(b"GET /v2/models/identity/ready/../trace/setting HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answer(&mut stream).await;
    assert_eq!(answer.status, 404, "{answer:?}");

    // The gRPC port refuses the same.
    let mut client = gateway.grpc_client().await;
    let trace = client
        .trace_setting(TraceSettingRequest {
            model_name: "identity".into(),
            ..TraceSettingRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(trace.code(), tonic::Code::Unimplemented, "{trace:?}");
    assert!(trace.message().contains("call a pod directly"), "{trace:?}");
}
