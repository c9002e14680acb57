//! The kubelet's gRPC probe: `grpc.health.v1.Health/Check` over plaintext
//! HTTP/2 on the pod's IP, SERVING is a success. The two messages are small
//! enough to encode by hand (one field each), which keeps protobuf code
//! generation out of the test harness.

use std::net::Ipv4Addr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// `HealthCheckResponse.ServingStatus` names, by number.
const STATUS_NAMES: [&str; 4] = ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"];

/// One check of `service` ("" for the server as a whole) at `ip:port`.
pub async fn check(ip: Ipv4Addr, port: u16, service: &str, limit: Duration) -> Result<(), String> {
    let target = format!("{ip}:{port}");
    match tokio::time::timeout(limit, call(&target, service)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!(
            "timeout: health rpc did not complete within {}s",
            limit.as_secs()
        )),
    }
}

async fn call(target: &str, service: &str) -> Result<(), String> {
    let stream = tokio::net::TcpStream::connect(target)
        .await
        .map_err(|e| format!("failed to connect service \"{target}\": {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .map_err(|e| format!("failed to connect service \"{target}\": {e}"))?;
    tokio::spawn(connection);
    let request = hyper::Request::post(format!("http://{target}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(frame(&request_message(service))))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("health rpc failed: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("health rpc failed: HTTP status {}", response.status()));
    }
    let trailers_only = grpc_status(response.headers());
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("health rpc failed: {e}"))?;
    let status = trailers_only.or_else(|| body.trailers().and_then(grpc_status));
    if let Some((code, message)) = status.filter(|(code, _)| *code != 0) {
        return Err(format!("rpc error: code = {code} desc = {message}"));
    }
    let body = body.to_bytes();
    let serving = body
        .get(5..)
        .and_then(response_status)
        .ok_or_else(|| "health rpc failed: no HealthCheckResponse in the answer".to_string())?;
    if serving == 1 {
        Ok(())
    } else {
        let name = STATUS_NAMES.get(serving as usize).copied().unwrap_or("UNKNOWN");
        Err(format!("service unhealthy (responded with \"{name}\")"))
    }
}

/// `HealthCheckRequest { string service = 1; }`.
fn request_message(service: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a);
        varint(service.len() as u64, &mut message);
        message.extend_from_slice(service.as_bytes());
    }
    message
}

/// A gRPC length-prefixed message, uncompressed.
fn frame(message: &[u8]) -> Bytes {
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `HealthCheckResponse { ServingStatus status = 1; }`: the status, 0 when absent.
fn response_status(mut message: &[u8]) -> Option<u64> {
    let mut status = 0;
    while let Some((&tag, rest)) = message.split_first() {
        let (value, rest) = read_varint(rest)?;
        match tag {
            0x08 => {
                status = value;
                message = rest;
            }
            // Another length-delimited field: skip it.
            t if t & 7 == 2 => message = rest.get(value as usize..)?,
            t if t & 7 == 0 => message = rest,
            _ => return None,
        }
    }
    Some(status)
}

fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

fn grpc_status(headers: &http::HeaderMap) -> Option<(i32, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Some((code, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_encode_and_decode_like_protobuf() {
        assert_eq!(request_message(""), b"");
        assert_eq!(request_message("m"), b"\x0a\x01m");
        assert_eq!(&frame(b"ab")[..], b"\x00\x00\x00\x00\x02ab");
        assert_eq!(response_status(b"\x08\x01"), Some(1));
        assert_eq!(response_status(b""), Some(0));
        assert_eq!(response_status(b"\x08\x02"), Some(2));
        assert_eq!(response_status(b"\x12\x01x\x08\x01"), Some(1));
        assert_eq!(response_status(b"\x08"), None);
    }
}
