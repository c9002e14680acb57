//! Clients that speak HTTP/1.1 and HTTP/2 by hand, on loopback, to send
//! what a well-behaved client would not: nothing, half a head, half a body.

use std::time::Duration;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

pub async fn connect(address: &str) -> TcpStream {
    TcpStream::connect(address).await.unwrap()
}

/// Whether the peer closes `stream` within `limit`, reading and dropping
/// whatever it sends first (a reset counts as closed).
pub async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buffer = [0u8; 4096];
    let closed = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, closed).await.is_ok()
}

/// An HTTP answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// Reads one HTTP/1.1 answer (its body sized by Content-Length).
pub async fn read_answer(stream: &mut TcpStream) -> Answer {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let read = stream.read(&mut buffer).await.unwrap();
        assert!(
            read > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&received)
        );
        received.extend_from_slice(&buffer[..read]);
    };
    let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let body_start = head_end + 4;
    while received.len() < body_start + length {
        let read = stream.read(&mut buffer).await.unwrap();
        assert!(
            read > 0,
            "the answer ended early: {:?}",
            String::from_utf8_lossy(&received)
        );
        received.extend_from_slice(&buffer[..read]);
    }
    Answer {
        status,
        body: String::from_utf8_lossy(&received[body_start..body_start + length]).into_owned(),
    }
}

/// An HTTP/2 connection by prior knowledge (as gRPC and h2c clients make
/// them), driven on its own task.
pub async fn h2_connect(address: &str) -> SendRequest<Bytes> {
    let stream = TcpStream::connect(address).await.unwrap();
    let (sender, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

/// Starts a POST of `path` whose body begins with `first`, and ends there
/// when `end`; otherwise the body goes on for as long as the caller holds
/// the stream returned, sending nothing more.
pub async fn h2_post(
    sender: &SendRequest<Bytes>,
    path: &str,
    content_type: &str,
    first: Bytes,
    end: bool,
) -> (ResponseFuture, SendStream<Bytes>) {
    let mut sender = sender.clone().ready().await.unwrap();
    let request = http::Request::post(format!("http://127.0.0.1{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = sender.send_request(request, false).unwrap();
    send.send_data(first, end).unwrap();
    (response, send)
}

/// The rest of a received body, and its trailers: what came before the
/// stream ended or was reset (a server that answers before reading the
/// whole request resets the rest of it).
pub async fn h2_read_to_end(mut body: RecvStream) -> (Vec<u8>, Option<http::HeaderMap>) {
    let mut data = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.ok().flatten();
    (data, trailers)
}

/// A gRPC answer's status and message, from its headers (trailers-only)
/// or its trailers.
pub async fn grpc_status(response: ResponseFuture) -> (String, String) {
    let response = response.await.unwrap();
    let (parts, body) = response.into_parts();
    let headers = if parts.headers.contains_key("grpc-status") {
        parts.headers
    } else {
        h2_read_to_end(body).await.1.unwrap_or_default()
    };
    let text = |name: &str| {
        headers
            .get(name)
            .map(|value| {
                percent_encoding::percent_decode_str(value.to_str().unwrap())
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default()
    };
    (text("grpc-status"), text("grpc-message"))
}

/// A gRPC frame of `length` message bytes, of which only the first
/// `sent` come (a message held short).
pub fn grpc_frame_start(length: usize, sent: usize) -> Bytes {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(length as u32).to_be_bytes());
    // Field 1 (the model name) first, then filler.
    frame.extend_from_slice(&[0x0a, 8]);
    frame.extend_from_slice(b"identity");
    frame.resize(5 + sent, 0);
    Bytes::from(frame)
}
