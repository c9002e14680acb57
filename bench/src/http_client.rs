//! One HTTP/1.1 keep-alive connection, driven by hyper's low-level client.
//!
//! A load-generator worker owns exactly one of these, so the server sees as
//! many concurrent connections as there are workers, and nothing (no pool,
//! no shared lock) sits between a worker and its socket.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::error::{Error, Result};

/// Strips an optional `http://` so `-u` takes `host:port` or a URL.
pub fn authority(url: &str) -> &str {
    let url = url.strip_prefix("http://").unwrap_or(url);
    url.trim_end_matches('/')
}

/// An answered request: status, headers and the whole body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub struct HttpConnection {
    sender: SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

impl HttpConnection {
    /// Opens a TCP connection (Nagle off: requests are small and latency
    /// matters) and runs the HTTP/1 handshake; the connection's I/O is
    /// driven by a task that ends when this value is dropped.
    pub async fn connect(url: &str) -> Result<Self> {
        let authority = authority(url);
        let stream = TcpStream::connect(authority)
            .await
            .map_err(|e| Error::Transport(format!("connect to {authority}: {e}")))?;
        stream.set_nodelay(true).map_err(|e| Error::Transport(e.to_string()))?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Error::Transport(format!("HTTP handshake with {authority}: {e}")))?;
        tokio::spawn(async move {
            // Errors surface on the next send; nothing to do with them here.
            let _ = conn.await;
        });
        let host =
            HeaderValue::from_str(authority).map_err(|_| Error::Invalid(format!("invalid host '{authority}'")))?;
        Ok(HttpConnection { sender, host })
    }

    /// Builds a request with this connection's `Host`. `extra` headers are
    /// pre-built values, so sending costs no header parsing.
    pub fn build(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        extra: &[(&'static str, HeaderValue)],
    ) -> Result<Request<Full<Bytes>>> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone());
        if !body.is_empty() {
            builder = builder
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .header(CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        for (name, value) in extra {
            builder = builder.header(*name, value.clone());
        }
        builder
            .body(Full::new(body))
            .map_err(|e| Error::Invalid(format!("invalid request: {e}")))
    }

    /// Sends one request and reads the whole answer.
    pub async fn send(&mut self, request: Request<Full<Bytes>>) -> Result<HttpResponse> {
        let transport = |e: hyper::Error| Error::Transport(format!("HTTP: {e}"));
        self.sender.ready().await.map_err(transport)?;
        let response = self.sender.send_request(request).await.map_err(transport)?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(transport)?.to_bytes();
        Ok(HttpResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// GET `path`, expecting 2xx; returns the body.
    pub async fn get(&mut self, path: &str) -> Result<Bytes> {
        let request = self.build(Method::GET, path, Bytes::new(), &[])?;
        let response = self.send(request).await?;
        if !response.status.is_success() {
            return Err(status_error(&response));
        }
        Ok(response.body)
    }
}

/// An error for a non-2xx answer: the status and the start of the body
/// (KServe's `{"error": "..."}`).
pub fn status_error(response: &HttpResponse) -> Error {
    let text = String::from_utf8_lossy(&response.body[..response.body.len().min(300)]);
    Error::Status(format!("HTTP {}: {}", response.status.as_u16(), text.trim()))
}

#[cfg(test)]
mod tests {
    use super::authority;

    #[test]
    fn authority_accepts_urls() {
        assert_eq!(authority("localhost:8000"), "localhost:8000");
        assert_eq!(authority("http://127.0.0.1:8000/"), "127.0.0.1:8000");
    }
}
