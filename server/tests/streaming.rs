//! Decoupled models through the real binary: `repeat` streams one response
//! per element over gRPC ModelStreamInfer and HTTP generate_stream, many
//! requests share one stream, errors answer one request and the stream goes
//! on (or end it, with Triton's header), unary calls get Triton's refusal,
//! and a client that goes away frees the instance at once.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::inference::infer_parameter::ParameterChoice;
use nereid_proto::inference::model_infer_request::InferInputTensor;
use nereid_proto::inference::{InferParameter, ModelInferRequest, ModelStreamInferResponse};
use serde_json::{Value, json};
use support::{TestServer, scratch, write_model};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// `repeat` over INT32, one instance, so a request that is not stopped
/// would hold every later one back.
const REPEAT: &str = r#"name: "repeat"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] optional: true } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"#;

fn start() -> TestServer {
    let repo = scratch("streaming");
    write_model(&repo, "repeat", REPEAT);
    TestServer::start(&repo, &[])
}

fn raw<T: Copy>(values: &[T], bytes: fn(T) -> [u8; 4]) -> Vec<u8> {
    values.iter().flat_map(|v| bytes(*v)).collect()
}

fn int(raw: &[u8]) -> i64 {
    i64::from(i32::from_le_bytes(raw.try_into().unwrap()))
}

fn boolean(value: bool) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::BoolParam(value)),
    }
}

/// A repeat request for `values`, waiting `delay_ms` before each.
fn request(id: &str, values: &[i32], delay_ms: u32, empty_final: bool) -> ModelInferRequest {
    let n = values.len() as i64;
    let mut parameters = HashMap::new();
    if empty_final {
        parameters.insert("triton_enable_empty_final_response".to_string(), boolean(true));
    }
    ModelInferRequest {
        model_name: "repeat".into(),
        id: id.into(),
        inputs: vec![
            InferInputTensor {
                name: "IN".into(),
                datatype: "INT32".into(),
                shape: vec![n],
                ..Default::default()
            },
            InferInputTensor {
                name: "DELAY".into(),
                datatype: "UINT32".into(),
                shape: vec![1],
                ..Default::default()
            },
        ],
        raw_input_contents: vec![
            raw(values, i32::to_le_bytes).into(),
            raw(&[delay_ms], u32::to_le_bytes).into(),
        ],
        parameters,
        ..Default::default()
    }
}

fn is_final(response: &ModelStreamInferResponse) -> Option<bool> {
    match response
        .infer_response
        .as_ref()?
        .parameters
        .get("triton_final_response")?
        .parameter_choice
    {
        Some(ParameterChoice::BoolParam(b)) => Some(b),
        _ => None,
    }
}

/// Opens a stream; requests go in through the sender.
async fn open(
    grpc: &mut GrpcInferenceServiceClient<Channel>,
    metadata: &[(&'static str, &'static str)],
) -> (
    mpsc::Sender<ModelInferRequest>,
    tonic::Streaming<ModelStreamInferResponse>,
) {
    let (tx, rx) = mpsc::channel(16);
    let mut call = tonic::Request::new(ReceiverStream::new(rx));
    for (key, value) in metadata {
        call.metadata_mut().insert(*key, value.parse().unwrap());
    }
    let responses = grpc.model_stream_infer(call).await.unwrap().into_inner();
    (tx, responses)
}

async fn next(responses: &mut tonic::Streaming<ModelStreamInferResponse>) -> ModelStreamInferResponse {
    tokio::time::timeout(Duration::from_secs(60), responses.message())
        .await
        .expect("a response within 60 s")
        .unwrap()
        .expect("the stream is still open")
}

#[tokio::test]
async fn repeat_streams_over_grpc_and_http() {
    let server = start();
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc.clone()).await.unwrap();

    // N responses, each its element and position, then the empty final.
    let (tx, mut responses) = open(&mut grpc, &[]).await;
    tx.send(request("a", &[10, 20, 30, 40], 0, true)).await.unwrap();
    for i in 0..4 {
        let r = next(&mut responses).await;
        assert_eq!(r.error_message, "");
        assert_eq!(is_final(&r), Some(false));
        let infer = r.infer_response.unwrap();
        assert_eq!(infer.id, "a");
        assert_eq!(infer.outputs[0].name, "OUT");
        assert_eq!(int(&infer.raw_output_contents[0]), 10 * (i + 1));
        assert_eq!(int(&infer.raw_output_contents[1]), i);
    }
    let last = next(&mut responses).await;
    assert_eq!(is_final(&last), Some(true));
    let last = last.infer_response.unwrap();
    assert_eq!((last.id.as_str(), last.outputs.len()), ("a", 0));

    // Garbage between valid requests answers that one only.
    tx.send(ModelInferRequest {
        model_name: "nope".into(),
        id: "bad".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = next(&mut responses).await;
    assert!(r.error_message.contains("unknown model"), "{}", r.error_message);
    assert_eq!(r.infer_response.unwrap().id, "bad");
    // Without the empty final, the last response is the last element.
    tx.send(request("b", &[7], 0, false)).await.unwrap();
    let r = next(&mut responses).await;
    assert_eq!(r.infer_response.as_ref().unwrap().id, "b");
    assert_eq!(int(&r.infer_response.unwrap().raw_output_contents[0]), 7);
    // Closing the sending side ends the stream once everything is answered.
    drop(tx);
    assert!(responses.message().await.unwrap().is_none());

    // Unary calls get Triton's refusal.
    let status = grpc.model_infer(request("u", &[1], 0, false)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    assert_eq!(
        status.message(),
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    );
    let http = reqwest::Client::new();
    let infer = json!({"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]});
    let reply = http
        .post(format!("{}/v2/models/repeat/infer", server.http))
        .json(&infer)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 501);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(
        body["error"],
        "HTTP end point doesn't support models with decoupled transaction policy"
    );

    // generate_stream: one event per response.
    let reply = http
        .post(format!("{}/v2/models/repeat/generate_stream", server.http))
        .json(&json!({"IN": [5, 6, 7], "id": "g"}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["content-type"], "text/event-stream; charset=utf-8");
    let text = reply.text().await.unwrap();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").expect("an SSE data line")).unwrap())
        .collect();
    assert_eq!(
        events,
        [5, 6, 7]
            .iter()
            .enumerate()
            .map(|(i, v)| json!({"model_name": "repeat", "model_version": "1", "id": "g", "OUT": v, "IDX": i}))
            .collect::<Vec<_>>()
    );
    // generate answers one response, and says so when there are more.
    let one: Value = support::post_json(format!("{}/v2/models/repeat/generate", server.http), &json!({"IN": 9})).await;
    assert_eq!(one["OUT"], 9);
    let many = support::post_json(
        format!("{}/v2/models/repeat/generate", server.http),
        &json!({"IN": [1, 2]}),
    )
    .await;
    assert!(
        many["error"].as_str().unwrap().contains("use /generate_stream"),
        "{many}"
    );
    let bad = support::post_json(
        format!("{}/v2/models/repeat/generate", server.http),
        &json!({"NOPE": 1}),
    )
    .await;
    assert!(
        bad["error"].as_str().unwrap().contains("unexpected key 'NOPE'"),
        "{bad}"
    );
}

#[tokio::test]
async fn requests_on_one_stream_run_together_and_errors_can_close_it() {
    let server = start();
    let repo = scratch("streaming-two");
    // A second instance group lets two requests stream at once.
    write_model(&repo, "repeat", &REPEAT.replace("count: 1", "count: 2"));
    let two = TestServer::start(&repo, &[]);
    let mut grpc = GrpcInferenceServiceClient::connect(two.grpc.clone()).await.unwrap();
    let (tx, mut responses) = open(&mut grpc, &[]).await;
    tx.send(request("slow", &[1, 2, 3], 200, true)).await.unwrap();
    tx.send(request("fast", &[4, 5], 0, true)).await.unwrap();
    let mut finals = Vec::new();
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    while finals.len() < 2 {
        let r = next(&mut responses).await;
        let infer = r.infer_response.as_ref().unwrap();
        if is_final(&r) == Some(true) {
            finals.push(infer.id.clone());
        } else {
            seen.entry(infer.id.clone())
                .or_default()
                .push(int(&infer.raw_output_contents[0]));
        }
    }
    // The fast one did not wait for the slow one.
    assert_eq!(finals, ["fast", "slow"]);
    assert_eq!(seen["slow"], [1, 2, 3]);
    assert_eq!(seen["fast"], [4, 5]);
    drop(two);

    // With Triton's header, the first error ends the stream with its status.
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc.clone()).await.unwrap();
    let (tx, mut responses) = open(&mut grpc, &[("triton_grpc_error", "true")]).await;
    tx.send(request("ok", &[1], 0, false)).await.unwrap();
    assert_eq!(next(&mut responses).await.infer_response.unwrap().id, "ok");
    tx.send(ModelInferRequest {
        model_name: "nope".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let status = responses.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn a_client_that_goes_away_frees_the_instance() {
    let server = start();
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc.clone()).await.unwrap();
    // 100000 elements 10 ms apart: about 17 minutes if nothing stopped it.
    let endless: Vec<i32> = (0..100_000).collect();
    let (tx, mut responses) = open(&mut grpc, &[]).await;
    tx.send(request("endless", &endless, 10, false)).await.unwrap();
    for _ in 0..2 {
        next(&mut responses).await;
    }
    drop((tx, responses));
    // The one instance answers the next request: the first was stopped.
    let (tx, mut responses) = open(&mut grpc, &[]).await;
    tx.send(request("after", &[1], 0, true)).await.unwrap();
    assert_eq!(next(&mut responses).await.infer_response.unwrap().id, "after");

    // The same over HTTP: a generate_stream client that hangs up.
    let http = reqwest::Client::new();
    let mut reply = http
        .post(format!("{}/v2/models/repeat/generate_stream", server.http))
        .json(&json!({"IN": endless, "DELAY": 10}))
        .send()
        .await
        .unwrap();
    assert!(reply.chunk().await.unwrap().is_some());
    drop(reply);
    let one = support::post_json(format!("{}/v2/models/repeat/generate", server.http), &json!({"IN": 3})).await;
    assert_eq!(one["OUT"], 3);
    // Both abandoned requests count as cancelled.
    let stats = support::get_json(format!("{}/v2/models/repeat/stats", server.http)).await;
    let stats = &stats["model_stats"][0]["inference_stats"];
    assert!(stats["fail"]["count"].as_u64().unwrap() >= 2, "{stats}");
}
