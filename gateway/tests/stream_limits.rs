//! One client cannot starve the others of a model's streams (issue 39,
//! finding 8): a client connection holds at most
//! `--max-streaming-calls-per-connection` ModelStreamInfer calls, and a pod
//! connection that carries all the streams the pod allows is passed over
//! for a new one, up to `--max-pod-connections`, past which calls fail at
//! once instead of waiting.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use futures::channel::mpsc;
use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::inference::{ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use support::{Gateway, Pod, request};
use tokio::net::TcpListener;
use tonic::Streaming;
use tonic::transport::Channel;

/// An open ModelStreamInfer call: the client's side of both directions.
struct OpenStream {
    _requests: mpsc::Sender<ModelInferRequest>,
    answers: Streaming<ModelStreamInferResponse>,
}

/// Opens a ModelStreamInfer call for `identity` with one message sent (the
/// gateway routes a stream by its first message).
async fn open_stream(client: &mut GrpcInferenceServiceClient<Channel>) -> Result<OpenStream, tonic::Status> {
    let (mut requests, outgoing) = mpsc::channel(1);
    requests.send(request("identity", &[1.0])).await.unwrap();
    let call = tokio::time::timeout(Duration::from_secs(10), client.model_stream_infer(outgoing))
        .await
        .expect("the call is answered or refused at once, not queued");
    call.map(|answers| OpenStream {
        _requests: requests,
        answers: answers.into_inner(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_holds_at_most_its_limit_of_streaming_calls() {
    let pod = Pod::start("streaming-cap", 0);
    let gateway = Gateway::start(
        &[pod.endpoint("identity")],
        &["--max-streaming-calls-per-connection", "2"],
    );
    let mut greedy = gateway.grpc_client().await;
    let mut streams = Vec::new();
    for i in 0..2 {
        let mut stream = open_stream(&mut greedy).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), stream.answers.message()).await;
        assert!(matches!(answer, Ok(Ok(Some(_)))), "stream {i} is open: {answer:?}");
        streams.push(stream);
    }
    let refused = open_stream(&mut greedy).await.err().expect("a third stream is refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--max-streaming-calls-per-connection"),
        "{refused:?}"
    );
    // The same connection's unary calls, and another connection's streams,
    // are not held back.
    let unary = greedy.model_infer(request("identity", &[2.0])).await;
    assert!(unary.is_ok(), "{unary:?}");
    let mut other = gateway.grpc_client().await;
    let mut other_stream = open_stream(&mut other).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), other_stream.answers.message()).await;
    assert!(matches!(answer, Ok(Ok(Some(_)))), "{answer:?}");

    // A stream ended gives its place back (once its end has gone through).
    drop(streams.pop());
    let mut reopened = false;
    for _ in 0..100 {
        if open_stream(&mut greedy).await.is_ok() {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reopened, "an ended stream frees its place");
}

/// A pod that speaks just enough gRPC: it allows `streams` streams per
/// connection, answers ModelInfer with an empty answer, and holds every
/// ModelStreamInfer open without answering any message. Returns its address
/// and the number of connections it has accepted.
async fn fake_pod(streams: u32) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&accepted);
    // Ends with the test's runtime.
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let handshake = h2::server::Builder::new()
                    .max_concurrent_streams(streams)
                    .handshake::<_, Bytes>(socket);
                let Ok(mut connection) = handshake.await else {
                    return;
                };
                while let Some(Ok((call, respond))) = connection.accept().await {
                    tokio::spawn(answer(call, respond));
                }
            });
        }
    });
    (address, accepted)
}

async fn answer(call: http::Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
    let streaming = call.uri().path().ends_with("/ModelStreamInfer");
    let mut body = call.into_body();
    let head = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    if streaming {
        // Open until the client ends it, answering nothing.
        let Ok(_send) = respond.send_response(head, false) else {
            return;
        };
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        return;
    }
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let message = nereid_proto::frame::encode(&ModelInferResponse {
        model_name: "identity".into(),
        ..ModelInferResponse::default()
    })
    .unwrap();
    let _ = send.send_data(message, false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pod_connection_does_not_hold_back_other_clients() {
    // Two streams per pod connection, two connections at most.
    let (pod, connections) = fake_pod(2).await;
    let gateway = Gateway::start(&[format!("identity={pod},{pod}")], &["--max-pod-connections", "2"]);
    let mut greedy = gateway.grpc_client().await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(open_stream(&mut greedy).await.unwrap());
    }
    // The pod's first connection is full: another client's call goes on a
    // second one, and is answered.
    let mut other = gateway.grpc_client().await;
    let answered = tokio::time::timeout(Duration::from_secs(10), other.model_infer(request("identity", &[1.0])))
        .await
        .expect("a call is not queued behind another client's streams");
    assert!(answered.is_ok(), "{answered:?}");
    assert_eq!(connections.load(Ordering::Relaxed), 2, "a second connection to the pod");

    // That call done (its answer gone), the greedy client fills the second
    // connection too.
    gateway
        .wait_for_metric("nereid_gateway_endpoint_outstanding_requests{", " 2")
        .await;
    for _ in 0..2 {
        held.push(open_stream(&mut greedy).await.unwrap());
    }
    // Every connection the gateway may open is full: a call fails at once,
    // naming the limit, rather than waiting for its deadline.
    let refused = tokio::time::timeout(Duration::from_secs(10), other.model_infer(request("identity", &[2.0])))
        .await
        .expect("a call is refused at once, not queued")
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("--max-pod-connections"), "{refused:?}");
    assert_eq!(connections.load(Ordering::Relaxed), 2, "no third connection");

    // A stream ended makes room again.
    drop(held.pop());
    let mut answered = false;
    for _ in 0..100 {
        if other.model_infer(request("identity", &[3.0])).await.is_ok() {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered, "an ended stream frees its place on the pod's connection");
}
