//! The gateway's limits on client connections (issue 39, finding 7): a cap
//! on open connections per port, and the handshake, header-read and idle
//! timeouts. Each limit is set low; each check allows generous time, and
//! none asserts that anything is fast.

mod support;

use std::time::Duration;

use support::raw::{self, closed_within, read_answer};
use support::{Gateway, Pod};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A model whose only pod cannot be reached: these checks never get as
/// far as a pod.
const NO_POD: &str = "identity=127.0.0.1:1,127.0.0.1:1";

/// How long a limit of 1 s may take to act, at most, on a slow machine.
const SLACK: Duration = Duration::from_secs(6);

const LIVE: &[u8] = b"GET /v2/health/live HTTP/1.1\r\nhost: gateway\r\n\r\n";

/// The HTTP/2 connection preface and an empty SETTINGS frame: a client
/// that then says nothing more.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Whether a new connection to `address` gets an answer to /v2/health/live
/// (false when the gateway closes it instead).
async fn answered(address: &str) -> bool {
    let mut stream = raw::connect(address).await;
    if stream.write_all(LIVE).await.is_err() {
        return false;
    }
    let mut first = [0u8; 12];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut first)).await;
    matches!(read, Ok(Ok(_))) && &first == b"HTTP/1.1 200"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_cap_is_closed_at_once() {
    let gateway = Gateway::start(
        &[NO_POD.into()],
        &["--max-connections", "4", "--handshake-timeout-secs", "60"],
    );
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(raw::connect(&gateway.http).await);
    }
    // The fifth is closed as soon as it is accepted, not at a timeout
    // (the handshake timeout is a minute).
    let mut over = raw::connect(&gateway.http).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(20)).await,
        "the connection over --max-connections is closed"
    );
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("nereid_gateway_connections_closed_total{limit=\"max_connections\",port=\"http\"} 1"),
        "{metrics}"
    );
    // The four are served.
    held[0].write_all(LIVE).await.unwrap();
    assert_eq!(read_answer(&mut held[0]).await.status, 200);
    // One closed makes room for another (once the gateway has seen it go).
    drop(held.pop());
    let mut served = false;
    for _ in 0..100 {
        if answered(&gateway.http).await {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "a connection closed gives its place back");
    // The cap is per port: the gRPC port has its own four.
    let mut client = gateway.grpc_client().await;
    let live = client
        .server_live(nereid_proto::inference::ServerLiveRequest {})
        .await
        .unwrap();
    assert!(live.into_inner().live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_connections_are_closed() {
    let gateway = Gateway::start(
        &[NO_POD.into()],
        &["--handshake-timeout-secs", "1", "--header-read-timeout-secs", "1"],
    );
    // Nothing at all, on either port.
    let mut silent_http = raw::connect(&gateway.http).await;
    let mut silent_grpc = raw::connect(&gateway.grpc).await;
    // Half an HTTP/2 preface, on either port.
    let mut half_preface_http = raw::connect(&gateway.http).await;
    half_preface_http.write_all(&H2_PREFACE[..16]).await.unwrap();
    let mut half_preface_grpc = raw::connect(&gateway.grpc).await;
    half_preface_grpc.write_all(&H2_PREFACE[..16]).await.unwrap();
    // Half an HTTP/1.1 head: the header-read timeout.
    let mut half_head = raw::connect(&gateway.http).await;
    half_head
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nhost: gate")
        .await
        .unwrap();
    // A whole head, then half the next one on the same connection.
    let mut second_head = raw::connect(&gateway.http).await;
    second_head.write_all(LIVE).await.unwrap();
    assert_eq!(read_answer(&mut second_head).await.status, 200);
    second_head
        .write_all(b"GET /v2/health/live HTTP/1.1\r\n")
        .await
        .unwrap();

    for (what, stream) in [
        ("silent, HTTP port", &mut silent_http),
        ("silent, gRPC port", &mut silent_grpc),
        ("half a preface, HTTP port", &mut half_preface_http),
        ("half a preface, gRPC port", &mut half_preface_grpc),
        ("half a head", &mut half_head),
        ("half the second head", &mut second_head),
    ] {
        assert!(closed_within(stream, SLACK).await, "{what}: not closed");
    }
    let metrics = gateway.metrics().await;
    for series in [
        "nereid_gateway_connections_closed_total{limit=\"handshake_timeout\",port=\"http\"} 2",
        "nereid_gateway_connections_closed_total{limit=\"handshake_timeout\",port=\"grpc\"} 2",
        "nereid_gateway_connections_closed_total{limit=\"header_read_timeout\",port=\"http\"} 2",
    ] {
        assert!(metrics.contains(series), "no {series} in\n{metrics}");
    }
    // And the gateway still serves.
    assert!(answered(&gateway.http).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_busy_ones_are_not() {
    // Each inference takes 3 s, three times the idle timeout.
    let pod = Pod::start("idle", 3000);
    let gateway = Gateway::start(
        &[pod.endpoint("identity")],
        &["--idle-timeout-secs", "1", "--handshake-timeout-secs", "1"],
    );
    // HTTP/1.1, kept alive after its answer, then silent.
    let mut kept = raw::connect(&gateway.http).await;
    kept.write_all(LIVE).await.unwrap();
    assert_eq!(read_answer(&mut kept).await.status, 200);
    assert!(
        closed_within(&mut kept, SLACK).await,
        "an idle HTTP/1.1 connection is closed"
    );
    // HTTP/2 with no stream: a GOAWAY, then closed, though this client
    // answers nothing (not the GOAWAY's ping either).
    let mut quiet = raw::connect(&gateway.grpc).await;
    quiet.write_all(H2_PREFACE).await.unwrap();
    assert!(
        closed_within(&mut quiet, SLACK * 2).await,
        "an HTTP/2 connection with no stream is closed"
    );

    // A call open longer than the idle timeout keeps its connection.
    let mut client = gateway.grpc_client().await;
    let reply = client.model_infer(support::request("identity", &[1.0])).await;
    assert!(reply.is_ok(), "{reply:?}");
    let mut slow = raw::connect(&gateway.http).await;
    let body = br#"{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[2.0]}]}"#;
    let head = format!(
        "POST /v2/models/identity/infer HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(body).await.unwrap();
    let answer = read_answer(&mut slow).await;
    assert_eq!(answer.status, 200, "{answer:?}");

    let metrics = gateway.metrics().await;
    for port in ["http", "grpc"] {
        let series = format!("nereid_gateway_connections_closed_total{{limit=\"idle_timeout\",port=\"{port}\"}}");
        assert!(metrics.contains(&series), "no {series} in\n{metrics}");
    }
}
