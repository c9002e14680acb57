//! The operator as an aggregated API server for `external.metrics.k8s.io`:
//! the HPA controller reads each model's figures ([`crate::autoscaling`])
//! through kube-apiserver, which reaches the operator through an APIService
//! and its Service.
//!
//! TLS is required (the APIService's `caBundle` is the CA of the serving
//! certificate the chart makes); a client certificate is asked for and, when
//! given, verified against the request-header CA, so only kube-apiserver's
//! front proxy can name a user ([`requestheader`]); each read is then
//! authorised with a SubjectAccessReview ([`authorize`]). Both the serving
//! certificate and the request-header settings are re-read every minute, so
//! rotations need no restart.
//!
//! - [`api`]: the routes and their answers.
//! - [`credentials`]: the certificate and request-header settings, kept fresh.
//! - [`selector`]: label selectors in their string form.
//! - [`subject`]: the client certificate's common name.

pub mod api;
pub mod authorize;
pub mod credentials;
pub mod requestheader;
pub mod selector;
pub mod subject;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::CertificateDer;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use self::api::ApiState;
pub use self::credentials::{Credentials, CredentialsError, Inputs, TlsError};
use crate::autoscaling::scraper::Board;

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

/// Reads the certificate and the request-header settings, builds the TLS
/// configuration, keeps both fresh, binds `settings.address` and serves the
/// API until `stop`. Asked for but impossible (no certificate, no
/// request-header CA in the cluster) is an error at start, not an
/// autoscaler that silently never gets a metric.
pub async fn start(
    client: &kube::Client,
    settings: ServeSettings,
    board: Arc<Board>,
    window_secs: u64,
    stop: &CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let inputs = Inputs::read(client, &settings)
        .await
        .context("the external metrics API needs its certificate and kube-apiserver's request-header settings")?;
    let current = Credentials::build(&inputs).context("the external metrics API's credentials")?;
    let (credentials_tx, credentials) = watch::channel(Arc::new(current));
    let listener = tokio::net::TcpListener::bind(settings.address)
        .await
        .with_context(|| format!("cannot listen on {} for the external metrics API", settings.address))?;
    tracing::info!(address = %settings.address, "serving external.metrics.k8s.io");
    tokio::spawn(credentials::keep_fresh(
        client.clone(),
        settings,
        inputs,
        credentials_tx,
        stop.clone(),
    ));
    let state = Arc::new(ApiState {
        client: client.clone(),
        board,
        credentials: credentials.clone(),
        window_secs,
    });
    let shutdown = stop.clone().cancelled_owned();
    Ok(tokio::spawn(async move {
        if let Err(error) = serve(listener, credentials, api::router(state), shutdown).await {
            tracing::error!(%error, "the external metrics API stopped");
        }
    }))
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves; each
/// connection is handshaken with the credentials current when it arrives.
pub async fn serve(
    listener: tokio::net::TcpListener,
    credentials: watch::Receiver<Arc<Credentials>>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
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
        let acceptor = TlsAcceptor::from(Arc::clone(&credentials.borrow().tls));
        let router = router.clone();
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
