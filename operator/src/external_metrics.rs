//! The operator as an aggregated API server for `external.metrics.k8s.io`:
//! the HPA controller reads each model's figures ([`crate::autoscaling`])
//! through kube-apiserver, which reaches the operator through an APIService
//! and its Service.
//!
//! TLS is required (the APIService's `caBundle` is the CA of the serving
//! certificate the chart makes); a client certificate is asked for and, when
//! given, verified against the request-header CA, so only kube-apiserver's
//! front proxy can name a user ([`requestheader`]); each read is then
//! authorised with a SubjectAccessReview ([`authorize`]).
//!
//! - [`api`]: the routes and their answers.
//! - [`selector`]: label selectors in their string form.
//! - [`subject`]: the client certificate's common name.

pub mod api;
pub mod authorize;
pub mod requestheader;
pub mod selector;
pub mod subject;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use thiserror::Error;
use tokio_rustls::TlsAcceptor;

/// The client certificate a connection presented (verified), as a request
/// extension for the handlers.
#[derive(Clone, Debug)]
pub struct ClientCert(pub Option<CertificateDer<'static>>);

/// Where to listen and with which serving certificate.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    pub address: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// The TLS configuration: the serving certificate, and client certificates
/// optional but verified against `client_ca` when presented.
pub fn tls_config(settings: &ServeSettings, client_ca: &[CertificateDer<'static>]) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let read = |what: &'static str, path: &PathBuf, reason: String| TlsError::Read {
        what,
        path: path.clone(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(&settings.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| read("the serving certificate", &settings.cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(read(
            "the serving certificate",
            &settings.cert,
            "no certificate in it".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&settings.key)
        .map_err(|e| read("the serving key", &settings.key, e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in client_ca {
        roots
            .add(cert.clone())
            .map_err(|e| TlsError::Setup(format!("the request-header CA: {e}")))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Setup(format!("the client certificate verifier: {e}")))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Setup(format!("the serving certificate and key do not go together: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: ServerConfig,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!(%error, "external metrics API: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(stream));
            let tls = match handshake.await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "external metrics API: TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|c| c.clone().into_owned());
            let service = router.layer(axum::Extension(ClientCert(cert)));
            if let Err(error) = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(service))
                .await
            {
                tracing::debug!(%peer, %error, "external metrics API: connection ended with an error");
            }
        });
    }
}
