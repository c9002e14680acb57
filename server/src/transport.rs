//! Connections, before either protocol sees them: the accept loop, the
//! connection cap, TLS, the deadline for a client to say something, and
//! the loop that hands them to hyper.
//!
//! Both front ends take their connections from an [`Acceptor`]:
//!
//! - at most `max_connections` are open at once; one past the cap is closed
//!   at once instead of waiting in the kernel's backlog, so a flood fails
//!   fast and never starves the clients already connected;
//! - TLS (rustls, certificates reloaded when their files change) is
//!   negotiated under the same handshake deadline as the protocol preface;
//! - the first bytes must arrive within that deadline too (HTTP/2's preface
//!   on the gRPC port; on the HTTP port enough to tell HTTP/1.1 from HTTP/2),
//!   so a connection that opens and says nothing, or says it one byte a
//!   second, is closed. HTTP/1.1's own header deadline then covers every
//!   later request on the connection.
//!
//! ```text
//! accept      cap, TCP_NODELAY, handshake deadline, TLS, preface
//! preface     the first bytes, read under the deadline and replayed
//! tls         rustls server config from PEM files, reloaded on change
//! serve       hyper on each connection (HTTP/2 corked), graceful shutdown
//! idle        HTTP/2 connections idle too long drained; the shutdown drain
//! ```

pub mod accept;
pub mod idle;
pub mod preface;
pub mod serve;
pub mod tls;

pub use accept::{Acceptor, Connection, ConnectionLimits, Peer};
pub use serve::{ServeOptions, serve};
pub use tls::TlsSettings;
