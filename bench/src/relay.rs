//! nereid-relay: the floor under any proxy. A TCP relay that opens one
//! upstream connection per client connection and copies bytes both ways,
//! parsing nothing, so it balances connections, not requests. What it costs
//! per request, in front of the same server, is the least a per-request
//! router such as nereid-gateway could cost on this machine: the gateway
//! reads and writes at least what the relay does, and routes besides.

use std::io;
use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A byte-for-byte TCP relay to one upstream address.
#[derive(Debug, Clone, Parser)]
#[command(name = "nereid-relay", version)]
pub struct RelayArgs {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,

    /// Address every connection is relayed to.
    #[arg(long)]
    pub upstream: SocketAddr,
}

/// Binds, prints `listening ADDR`, and relays until `shutdown`.
pub async fn run(args: RelayArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (client, _) = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted.context("accepting a connection")?,
        };
        let upstream = args.upstream;
        tokio::spawn(async move {
            if let Err(e) = relay(client, upstream).await {
                eprintln!("nereid-relay: connection ended: {e}");
            }
        });
    }
}

/// What each direction reads and writes at a time: the socket buffer's
/// order, so a large tensor crosses in few system calls.
const BUFFER: usize = 64 << 10;

/// Connects to `upstream` and copies both directions until both end; the
/// end of one side's bytes is passed on as the end of the other's writes.
async fn relay(mut client: TcpStream, upstream: SocketAddr) -> io::Result<()> {
    let mut server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, BUFFER, BUFFER).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Bytes go through both ways, and the end of the client's side reaches
    /// the server and comes back as the end of the answers.
    #[tokio::test]
    async fn relays_both_ways_and_the_end() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        // An echo server for one connection: answers what it reads, closes at EOF.
        let echo = tokio::spawn(async move {
            let (stream, _) = upstream.accept().await.unwrap();
            let (mut read, mut write) = stream.into_split();
            tokio::io::copy(&mut read, &mut write).await.unwrap();
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = listener.local_addr().unwrap();
        let front = tokio::spawn(async move {
            let (client, _) = listener.accept().await.unwrap();
            relay(client, upstream_addr).await
        });

        let client = TcpStream::connect(relay_addr).await.unwrap();
        let (mut read, mut write) = client.into_split();
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let sender = {
            let payload = payload.clone();
            tokio::spawn(async move {
                write.write_all(&payload).await.unwrap();
                // `write` dropped here: the client's end.
            })
        };
        let mut received = Vec::new();
        read.read_to_end(&mut received).await.unwrap();
        sender.await.unwrap();
        assert_eq!(received, payload);
        front.await.unwrap().unwrap();
        echo.await.unwrap();
    }

    #[tokio::test]
    async fn an_unreachable_upstream_is_an_error() {
        // A port bound then released: nothing listens there.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(relay(accepted, closed).await.is_err());
    }
}
