//! The real binary on 127.0.0.1:0, driven over HTTP and gRPC.

mod support;

use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::inference::model_infer_request::InferInputTensor;
use nereid_proto::inference::{InferTensorContents, ModelInferRequest, RepositoryIndexRequest};
use serde_json::{Value, json};
use support::{TestServer, get_json, post_json, repo_root, scratch, write_model};

fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

const ADD_SUB: &str = r#"
backend: "add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
"#;

#[tokio::test]
async fn simple_over_http_and_grpc() {
    let server = TestServer::start(&repo_root().join("examples/models"), &[]);
    let http = reqwest::Client::new();

    let meta: Value = get_json(format!("{}/v2", server.http)).await;
    assert_eq!(meta["name"], "nereid");
    assert!(
        meta["extensions"]
            .as_array()
            .unwrap()
            .contains(&json!("binary_tensor_data"))
    );
    let ready = http
        .get(format!("{}/v2/health/ready", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    let a: Vec<i32> = (0..16).collect();
    let body = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": vec![1; 16]},
        ]
    });
    let reply = post_json(format!("{}/v2/models/simple/infer", server.http), &body).await;
    let outputs = reply["outputs"].as_array().unwrap();
    let by_name = |name: &str| outputs.iter().find(|o| o["name"] == name).unwrap().clone();
    assert_eq!(by_name("OUTPUT0")["data"], json!((1..17).collect::<Vec<i32>>()));
    assert_eq!(by_name("OUTPUT1")["data"], json!((-1..15).collect::<Vec<i32>>()));
    assert_eq!(by_name("OUTPUT0")["shape"], json!([1, 16]));

    // A bad request gets its error, and the next good one still succeeds.
    let bad = json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a}]});
    let response = http
        .post(format!("{}/v2/models/simple/infer", server.http))
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("missing required input(s) ['INPUT1']"),
        "{error}"
    );

    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc.clone()).await.unwrap();
    let raw = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let tensor = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![2, 16],
        ..Default::default()
    };
    let a2: Vec<i32> = (0..32).collect();
    let b2: Vec<i32> = vec![10; 32];
    let response = grpc
        .model_infer(ModelInferRequest {
            model_name: "simple".into(),
            id: "grpc-1".into(),
            inputs: vec![tensor("INPUT0"), tensor("INPUT1")],
            raw_input_contents: vec![raw(&a2).into(), raw(&b2).into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.id, "grpc-1");
    assert_eq!(response.model_version, "1");
    assert_eq!(response.outputs[0].name, "OUTPUT0");
    assert_eq!(response.outputs[0].shape, vec![2, 16]);
    assert_eq!(
        ints(&response.raw_output_contents[0]),
        a2.iter().map(|x| x + 10).collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&response.raw_output_contents[1]),
        a2.iter().map(|x| x - 10).collect::<Vec<_>>()
    );

    let status = grpc
        .model_infer(ModelInferRequest {
            model_name: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert!(status.message().starts_with("Request for unknown model"));

    // Typed contents for BYTES through the identity backend.
    let response = grpc
        .model_infer(ModelInferRequest {
            model_name: "identity_bytes".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                datatype: "BYTES".into(),
                shape: vec![1, 2],
                contents: Some(InferTensorContents {
                    bytes_contents: vec![b"".to_vec(), b"n\xc3\xa9reid".to_vec()],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&response.raw_output_contents[0][..], b"\0\0\0\0\x07\0\0\0n\xc3\xa9reid");

    assert!(server.terminate().success());
}

#[tokio::test]
async fn repository_api_loads_overrides_and_unloads() {
    let repo = scratch("repository-api");
    write_model(&repo, "add_sub", ADD_SUB);
    let server = TestServer::start(&repo, &["--model-control-mode", "explicit"]);
    let http = reqwest::Client::new();
    let index = |ready: bool| {
        let url = format!("{}/v2/repository/index", server.http);
        async move { post_json(url, &json!({"ready": ready})).await }
    };
    assert_eq!(index(false).await, json!([{"name": "add_sub"}]));
    assert_eq!(index(true).await, json!([]));

    let load = http
        .post(format!("{}/v2/repository/models/add_sub/load", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(load.status(), 200);
    assert_eq!(
        index(true).await,
        json!([{"name": "add_sub", "version": "1", "state": "READY"}])
    );

    // Reload with a config override; /config shows it.
    let mut config: Value = get_json(format!("{}/v2/models/add_sub/config", server.http)).await;
    assert_eq!(config["max_batch_size"], 8);
    config["max_batch_size"] = json!(2);
    let load = http
        .post(format!("{}/v2/repository/models/add_sub/load", server.http))
        .json(&json!({"parameters": {"config": config.to_string()}}))
        .send()
        .await
        .unwrap();
    assert_eq!(load.status(), 200, "{}", load.text().await.unwrap());
    let config: Value = get_json(format!("{}/v2/models/add_sub/config", server.http)).await;
    assert_eq!(config["max_batch_size"], 2);

    // A reload that fails leaves the serving copy in place.
    let bad = http
        .post(format!("{}/v2/repository/models/add_sub/load", server.http))
        .json(&json!({"parameters": {"config": r#"{"backend": "add_sub", "max_batch_size": -3}"#}}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await.unwrap();
    assert!(error["error"].as_str().unwrap().contains("max_batch_size"), "{error}");
    let ready = http
        .get(format!("{}/v2/models/add_sub/ready", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    // The gRPC index agrees.
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc.clone()).await.unwrap();
    let models = grpc
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner()
        .models;
    assert_eq!(models[0].state, "READY");

    let unload = http
        .post(format!("{}/v2/repository/models/add_sub/unload", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(unload.status(), 200);
    assert_eq!(
        index(false).await,
        json!([{"name": "add_sub", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}])
    );
    let ready = http
        .get(format!("{}/v2/models/add_sub/ready", server.http))
        .send()
        .await
        .unwrap();
    assert_ne!(ready.status(), 200);
    assert!(server.terminate().success());
}

#[tokio::test]
async fn broken_models_are_unavailable_and_the_rest_serve() {
    let repo = scratch("broken-models");
    write_model(&repo, "good", ADD_SUB);
    write_model(&repo, "syntax", "name: \"syntax\"\ninput [ { name: ");
    write_model(&repo, "unknown_backend", "backend: \"tensorflow\"");
    write_model(
        &repo,
        "on_gpu",
        &format!("{ADD_SUB}\ninstance_group [ {{ kind: KIND_GPU }} ]"),
    );
    let server = TestServer::start(&repo, &[]);
    let http = reqwest::Client::new();
    let index: Value = http
        .post(format!("{}/v2/repository/index", server.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = |name: &str| {
        index
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(row("good")["state"], "READY");
    assert_eq!(row("syntax")["state"], "UNAVAILABLE");
    assert!(
        row("syntax")["reason"].as_str().unwrap().contains("config.pbtxt"),
        "{index}"
    );
    assert_eq!(row("unknown_backend")["state"], "UNAVAILABLE");
    assert!(
        row("unknown_backend")["reason"]
            .as_str()
            .unwrap()
            .contains("tensorflow"),
        "{index}"
    );
    // A KIND_GPU group where no GPU is visible (or, on a GPU machine, for
    // a backend that runs on the CPU only): the reason names the group.
    assert_eq!(row("on_gpu")["state"], "UNAVAILABLE");
    let reason = row("on_gpu")["reason"].as_str().unwrap().to_string();
    let why = if nereid_gpu::Gpus::discover().is_empty() {
        "this server sees no GPU"
    } else {
        "runs on the CPU only"
    };
    assert!(
        reason.contains("instance group 'on_gpu_0' of model 'on_gpu' has kind KIND_GPU") && reason.contains(why),
        "{reason}"
    );
    // The default group resolves to the CPU for a CPU-only backend.
    let config = get_json(format!("{}/v2/models/good/config", server.http)).await;
    assert_eq!(config["instance_group"][0]["kind"], "KIND_CPU", "{config}");

    let body = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "INT32", "data": [1, 1, 1, 1]},
        ],
        "outputs": [{"name": "OUTPUT1"}]
    });
    let reply = post_json(format!("{}/v2/models/good/infer", server.http), &body).await;
    assert_eq!(reply["outputs"].as_array().unwrap().len(), 1);
    assert_eq!(reply["outputs"][0]["data"], json!([0, 1, 2, 3]));
    let response = http
        .post(format!("{}/v2/models/syntax/infer", server.http))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert!(server.terminate().success());
}

#[tokio::test]
async fn model_without_config_is_completed_from_the_onnx_file() {
    let repo = scratch("autocomplete");
    std::fs::create_dir_all(repo.join("auto/1")).unwrap();
    std::fs::copy(
        repo_root().join("examples/models/simple/1/model.onnx"),
        repo.join("auto/1/model.onnx"),
    )
    .unwrap();
    let server = TestServer::start(&repo, &[]);
    let config: Value = get_json(format!("{}/v2/models/auto/config", server.http)).await;
    assert_eq!(config["name"], "auto", "{}", server.log());
    assert_eq!(config["backend"], "onnxruntime");
    assert_eq!(config["max_batch_size"], 4);
    assert_eq!(config["input"][0]["name"], "INPUT0");
    assert_eq!(config["input"][0]["data_type"], "TYPE_INT32");
    assert_eq!(config["input"][0]["dims"], json!([16]));
    assert_eq!(config["dynamic_batching"]["preferred_batch_size"], json!([4]));
    assert!(server.terminate().success());
}

/// A repository holding `slow`: identity that takes `delay_ms` per execution.
fn slow_identity_repo(tag: &str, delay_ms: u64) -> std::path::PathBuf {
    let repo = scratch(tag);
    let config = format!(
        r#"backend: "identity"
           max_batch_size: 4
           input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
           output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
           parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}"#
    );
    write_model(&repo, "slow", &config);
    repo
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish() {
    let repo = slow_identity_repo("shutdown", 1500);
    let server = TestServer::start(&repo, &[]);
    let url = format!("{}/v2/models/slow/infer", server.http);
    let body = json!({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.5, -2.0]}]});
    let request = tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await });
    // Let the request reach the instance, then ask the server to stop.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let http = server.http.clone();
    let ports = [&server.http, &server.grpc].map(|url| url.trim_start_matches("http://").to_string());
    let stopping = tokio::task::spawn_blocking(move || server.terminate());
    // While it drains, both ports refuse new connections: a client (or
    // nereid-gateway) goes elsewhere at once instead of sending a request
    // into the listen backlog, where the exit would reset it.
    for port in &ports {
        while tokio::net::TcpStream::connect(port).await.is_ok() {
            assert!(
                !request.is_finished(),
                "{port} still took connections while the last request drained"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    assert!(
        !request.is_finished(),
        "the ports closed before the in-flight request was answered"
    );
    let status = stopping.await.unwrap();
    assert!(status.success(), "{status:?}");
    let response = request.await.unwrap().expect("the in-flight request got its answer");
    assert_eq!(response.status(), 200);
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply["outputs"][0]["data"], json!([1.5, -2.0]));
    // And the server is gone.
    assert!(reqwest::get(format!("{http}/v2/health/live")).await.is_err());
}

/// Infer requests are answered by the port's own service, and a few by the
/// router (escaped names): both must behave as one route does.
#[tokio::test]
async fn every_infer_path_is_one_route() {
    let server = TestServer::start(
        &repo_root().join("examples/models"),
        &["--http-restricted-api", "inference:infer-key=open"],
    );
    let http = reqwest::Client::new();
    let body = json!({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.5, -2.0]}]});
    let post = |path: &str, key: Option<&str>| {
        let mut request = http.post(format!("{}{path}", server.http)).json(&body);
        if let Some(key) = key {
            request = request.header("infer-key", key);
        }
        request.send()
    };
    for path in [
        "/v2/models/identity/infer",
        "/v2/models/identity/versions/1/infer",
        "/v2/models/id%65ntity/infer",
    ] {
        let refused = post(path, None).await.unwrap();
        assert_eq!(refused.status(), 403, "{path}");
        let error: Value = refused.json().await.unwrap();
        assert!(
            error["error"]
                .as_str()
                .unwrap()
                .contains("expecting header 'infer-key'"),
            "{path}: {error}"
        );
        assert_eq!(post(path, Some("wrong")).await.unwrap().status(), 403, "{path}");
        let answered = post(path, Some("open")).await.unwrap();
        assert_eq!(answered.status(), 200, "{path}");
        let reply: Value = answered.json().await.unwrap();
        assert_eq!(reply["outputs"][0]["data"], json!([1.5, -2.0]), "{path}");
        assert_eq!(reply["model_name"], "identity", "{path}");
    }
    let unknown = post("/v2/models/nothing/infer", Some("open")).await.unwrap();
    assert_eq!(unknown.status(), 404);
    let version = post("/v2/models/identity/versions/x/infer", Some("open"))
        .await
        .unwrap();
    assert_eq!(version.status(), 400);
    for path in ["/v2/models/identity/infer/", "/v2/models//infer"] {
        assert_eq!(post(path, Some("open")).await.unwrap().status(), 404, "{path}");
    }
    let get = http
        .get(format!("{}/v2/models/identity/infer", server.http))
        .header("infer-key", "open")
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 405);
    // Unrestricted groups stay open.
    let ready = http
        .get(format!("{}/v2/health/ready", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert!(server.terminate().success());
}

/// Sends one gRPC call over a bare HTTP/2 connection, framed by hand, and
/// returns its status code and message (from the trailers, or from the
/// headers of a trailers-only answer).
async fn raw_grpc_call(url: &str, path: &str, extra: &[(&str, &str)], body: Vec<u8>) -> (String, String) {
    let address = url.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let mut request = http::Request::post(format!("http://{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let (response, mut send) = client.send_request(request.body(()).unwrap(), false).unwrap();
    send.send_data(body.into(), true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let (parts, mut body) = response.into_parts();
    let status_of = |headers: &http::HeaderMap| {
        let get = |name: &str| {
            headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        (get("grpc-status"), get("grpc-message"))
    };
    if parts.headers.contains_key("grpc-status") {
        return status_of(&parts.headers);
    }
    while let Some(data) = body.data().await {
        data.unwrap();
    }
    status_of(&body.trailers().await.unwrap().expect("trailers"))
}

/// ModelInfer has its own path past tonic's router: it must answer as
/// tonic would, and leave what it does not handle (compressed messages) to
/// tonic.
#[tokio::test]
async fn grpc_model_infer_answers_as_tonic_does() {
    let server = TestServer::start(&repo_root().join("examples/models"), &[]);
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc.clone()).await.unwrap();
    let values: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let request = ModelInferRequest {
        model_name: "identity".into(),
        id: "fast-1".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![1, 2],
            ..Default::default()
        }],
        raw_input_contents: vec![values.clone().into()],
        ..Default::default()
    };
    let response = grpc.model_infer(request.clone()).await.unwrap();
    // The load signal nereid-gateway balances on rides in the headers.
    assert_eq!(response.metadata().get(nereid_proto::QUEUE_DEPTH_HEADER).unwrap(), "0");
    let response = response.into_inner();
    assert_eq!(
        (response.id.as_str(), response.model_name.as_str()),
        ("fast-1", "identity")
    );
    assert_eq!(response.outputs[0].shape, vec![1, 2]);
    assert_eq!(&response.raw_output_contents[0][..], &values[..]);

    use prost::Message as _;
    let framed = |flag: u8, message: &[u8]| {
        let mut out = nereid_proto::frame::frame(message).unwrap().to_vec();
        out[0] = flag;
        out
    };
    let path = "/inference.GRPCInferenceService/ModelInfer";
    let good = framed(0, &request.encode_to_vec());
    assert_eq!(raw_grpc_call(&server.grpc, path, &[], good.clone()).await.0, "0");
    // A message that is not a ModelInferRequest: INTERNAL, as tonic's decoder says.
    let (code, message) = raw_grpc_call(&server.grpc, path, &[], framed(0, &[0xff; 7])).await;
    assert_eq!(code, "13", "{message}");
    // No message at all (grpc-message is percent-encoded on the wire).
    let (code, message) = raw_grpc_call(&server.grpc, path, &[], Vec::new()).await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("13", "Missing%20request%20message.")
    );
    // A compressed call goes to tonic, which takes no compression here.
    let (code, message) = raw_grpc_call(&server.grpc, path, &[("grpc-encoding", "gzip")], framed(1, b"x")).await;
    assert_eq!(code, "12", "{message}");
    // The server still answers.
    assert_eq!(raw_grpc_call(&server.grpc, path, &[], good).await.0, "0");
    assert!(server.terminate().success());
}

/// A call's `grpc-timeout` ends it where tonic's server would: CANCELLED,
/// "Timeout expired"; a call answered in time, or with a malformed
/// deadline, is unaffected.
#[tokio::test]
async fn grpc_calls_past_their_deadline_are_cancelled() {
    let repo = slow_identity_repo("deadline", 1000);
    let server = TestServer::start(&repo, &[]);
    let request = ModelInferRequest {
        model_name: "slow".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![1, 1],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![0u8; 4].into()],
        ..Default::default()
    };
    let framed = nereid_proto::frame::encode(&request).unwrap().to_vec();
    let infer = "/inference.GRPCInferenceService/ModelInfer";
    let deadline = [("grpc-timeout", "100m")];
    let (code, message) = raw_grpc_call(&server.grpc, infer, &deadline, framed.clone()).await;
    assert_eq!((code.as_str(), message.as_str()), ("1", "Timeout%20expired"));
    // A call answered within its deadline is unaffected (ServerLive: tonic's router).
    let live = "/inference.GRPCInferenceService/ServerLive";
    assert_eq!(raw_grpc_call(&server.grpc, live, &deadline, vec![0; 5]).await.0, "0");
    // A deadline long enough, or a malformed one (ignored), lets the call finish.
    assert_eq!(
        raw_grpc_call(&server.grpc, infer, &[("grpc-timeout", "20S")], framed.clone())
            .await
            .0,
        "0"
    );
    assert_eq!(
        raw_grpc_call(&server.grpc, infer, &[("grpc-timeout", "soon")], framed)
            .await
            .0,
        "0"
    );
    assert!(server.terminate().success());
}

#[tokio::test]
async fn config_patches_merge_over_the_folder_config() {
    let repo = scratch("config-patch");
    write_model(&repo, "add_sub", ADD_SUB);
    let patch = repo.join("add_sub-patch.json");
    std::fs::write(
        &patch,
        r#"{"max_batch_size": 2, "dynamic_batching": {"max_queue_delay_microseconds": 500}}"#,
    )
    .unwrap();
    let flag = format!("add_sub={}", patch.display());
    let server = TestServer::start(&repo, &["--model-config-patch", &flag]);
    let config: Value = get_json(format!("{}/v2/models/add_sub/config", server.http)).await;
    assert_eq!(config["max_batch_size"], 2);
    assert_eq!(config["dynamic_batching"]["max_queue_delay_microseconds"], 500);
    assert_eq!(
        config["input"][0]["dims"],
        json!([4]),
        "fields the patch does not name are kept"
    );
    assert!(server.terminate().success());
}

#[test]
fn exit_on_error_stops_with_the_reason() {
    let repo = scratch("exit-on-error");
    write_model(&repo, "good", ADD_SUB);
    write_model(&repo, "broken", "backend: \"tensorflow\"");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_nereid-server"))
        .arg("--model-repository")
        .arg(&repo)
        .args([
            "--http-address",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ])
        .arg("--exit-on-error")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Status 3 (not 1): the operator tells a failed load from other crashes by it.
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("failed to load 'broken'") && stderr.contains("tensorflow"),
        "{stderr}"
    );
}
