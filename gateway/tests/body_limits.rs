//! The gateway's limits on request bodies (issue 39, finding 7): a body
//! must arrive whole within the body timeout, and the bytes of all the
//! bodies it buffers at once stay within the memory budget, so that
//! uploads held one byte short cannot fill its memory.

mod support;

use std::time::Duration;

use bytes::Bytes;
use support::Gateway;
use support::raw::{self, read_answer};
use tokio::io::AsyncWriteExt;

/// A model whose only pod cannot be reached: a body read whole is then
/// answered 503 "could be reached", told apart from a refusal by its text.
const NO_POD: &str = "identity=127.0.0.1:1,127.0.0.1:1";

/// How long a limit of 1 s may take to act, at most, on a slow machine.
const SLACK: Duration = Duration::from_secs(6);

const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
const MODEL_STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_is_refused() {
    let gateway = Gateway::start(&[NO_POD.into()], &["--body-timeout-secs", "1"]);

    // HTTP/1.1: 100 bytes announced, 10 sent.
    let mut http = raw::connect(&gateway.http).await;
    http.write_all(
        b"POST /v2/models/identity/infer HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"inputs\":",
    )
    .await
    .unwrap();
    let answer = tokio::time::timeout(SLACK, read_answer(&mut http))
        .await
        .expect("answered soon after the body timeout");
    assert_eq!(answer.status, 408, "{answer:?}");
    let error: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert!(
        error["error"].as_str().unwrap().contains("--body-timeout-secs"),
        "{error}"
    );

    // gRPC: a unary message of 100 bytes of which 20 come.
    let grpc = raw::h2_connect(&gateway.grpc).await;
    let (response, _held) = raw::h2_post(
        &grpc,
        MODEL_INFER,
        "application/grpc",
        raw::grpc_frame_start(100, 20),
        false,
    )
    .await;
    let (status, message) = tokio::time::timeout(SLACK, raw::grpc_status(response)).await.unwrap();
    assert_eq!(status, "4", "DEADLINE_EXCEEDED: {message}");
    assert!(message.contains("--body-timeout-secs"), "{message}");

    // A stream whose first message does not come far enough to name its
    // model: the same.
    let (response, _held_stream) = raw::h2_post(
        &grpc,
        MODEL_STREAM_INFER,
        "application/grpc",
        raw::grpc_frame_start(100, 1),
        false,
    )
    .await;
    let (status, message) = tokio::time::timeout(SLACK, raw::grpc_status(response)).await.unwrap();
    assert_eq!(status, "4", "DEADLINE_EXCEEDED: {message}");
}

/// POSTs `bytes` bytes to the model's infer path over HTTP/2 (h2c) and
/// returns the status and the error text.
async fn h2c_infer(sender: &h2::client::SendRequest<Bytes>, bytes: usize) -> (u16, String) {
    let body = Bytes::from(vec![b' '; bytes]);
    let (response, _send) = raw::h2_post(sender, "/v2/models/identity/infer", "application/json", body, true).await;
    let response = response.await.unwrap();
    let status = response.status().as_u16();
    let (body, _) = raw::h2_read_to_end(response.into_body()).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_uploads_cannot_take_more_than_the_memory_budget() {
    let gateway = Gateway::start(
        &[NO_POD.into()],
        &["--max-in-flight-bytes", "1000000", "--max-body-bytes", "4000000"],
    );
    // An upload held short: 800 kB of the 900 kB it announced.
    let mut held = raw::connect(&gateway.http).await;
    held.write_all(b"POST /v2/models/identity/infer HTTP/1.1\r\nhost: gateway\r\ncontent-length: 900000\r\n\r\n")
        .await
        .unwrap();
    held.write_all(&vec![b' '; 800_000]).await.unwrap();

    // Once the gateway holds them, a body that would take the total over
    // the budget is refused, naming the flag.
    gateway
        .wait_for_metric("nereid_gateway_buffered_request_bytes", " 800000")
        .await;
    let h2c = raw::h2_connect(&gateway.http).await;
    let (status, text) = h2c_infer(&h2c, 300_000).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("--max-in-flight-bytes"), "{text}");

    // The same on the gRPC port.
    let grpc = raw::h2_connect(&gateway.grpc).await;
    let (response, _send) = raw::h2_post(
        &grpc,
        MODEL_INFER,
        "application/grpc",
        raw::grpc_frame_start(300_000, 300_000),
        true,
    )
    .await;
    let (status, message) = raw::grpc_status(response).await;
    assert_eq!(status, "8", "RESOURCE_EXHAUSTED: {message}");
    assert!(message.contains("--max-in-flight-bytes"), "{message}");

    // The held upload gone, its bytes are given back, and the same body
    // is read whole and forwarded.
    drop(held);
    gateway
        .wait_for_metric("nereid_gateway_buffered_request_bytes", " 0")
        .await;
    let (status, text) = h2c_infer(&h2c, 300_000).await;
    assert!(
        status == 503 && text.contains("could be reached"),
        "read whole and forwarded: {status} {text}"
    );

    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("nereid_gateway_failures_total{model=\"\",reason=\"overloaded\"}"),
        "{metrics}"
    );
}
