//! The External Scaler service over TLS: the serving certificate and, for
//! mutual TLS, the CA whose client certificates alone are answered (the one
//! that signed KEDA's). The files (a Secret volume, rotated in place) are
//! read again every minute; a rotation that builds is used for the next
//! connections, one that does not (a half-written key) is logged and the
//! current configuration stays.
//!
//! gRPC needs HTTP/2, so `h2` is the one protocol offered in ALPN (gRPC-Go,
//! KEDA's client, insists on it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use nereid_proto::keda::external_scaler_server::ExternalScalerServer;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{Scaler, TlsFiles};
use crate::external_metrics::TlsError;

/// How often the files are read again.
const REFRESH: Duration = Duration::from_secs(60);
/// How long a client has to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The files' contents, compared to tell a rotation.
#[derive(Clone, PartialEq)]
struct Inputs {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Inputs {
    fn read(files: &TlsFiles) -> Result<Inputs, TlsError> {
        let read = |what: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                what,
                path: path.clone(),
                reason: e.to_string(),
            })
        };
        Ok(Inputs {
            cert: read("the KEDA scaler's certificate", &files.cert)?,
            key: read("the KEDA scaler's key", &files.key)?,
            client_ca: files
                .client_ca
                .as_ref()
                .map(|path| read("the KEDA scaler's client CA", path))
                .transpose()?,
        })
    }

    fn build(&self) -> Result<ServerConfig, TlsError> {
        server_config(&self.cert, &self.key, self.client_ca.as_deref())
    }
}

/// The TLS configuration: the serving certificate (`cert`, `key`, PEM), and
/// with `client_ca` (PEM) a client certificate it signed is required.
pub fn server_config(cert: &[u8], key: &[u8], client_ca: Option<&[u8]>) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Setup(format!("the serving certificate: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Setup("no certificate in the serving certificate file".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Setup(format!("the serving key: {e}")))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let builder = match client_ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(pem) {
                let ca = ca.map_err(|e| TlsError::Setup(format!("the client CA: {e}")))?;
                roots
                    .add(ca)
                    .map_err(|e| TlsError::Setup(format!("the client CA: {e}")))?;
            }
            if roots.is_empty() {
                return Err(TlsError::Setup("no certificate in the client CA file".into()));
            }
            // No `allow_unauthenticated`: a client without a certificate
            // signed by the CA does not get past the handshake.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Setup(format!("the client certificate verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Setup(format!("the serving certificate and key do not go together: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Reads and builds the configuration, then keeps it fresh until `stop`.
pub fn load(files: TlsFiles, stop: &CancellationToken) -> Result<watch::Receiver<Arc<ServerConfig>>, TlsError> {
    let inputs = Inputs::read(&files)?;
    let (config_tx, config) = watch::channel(Arc::new(inputs.build()?));
    tokio::spawn(keep_fresh(files, inputs, config_tx, stop.clone()));
    Ok(config)
}

async fn keep_fresh(
    files: TlsFiles,
    mut last: Inputs,
    config: watch::Sender<Arc<ServerConfig>>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REFRESH) => {}
        }
        let inputs = match Inputs::read(&files) {
            Ok(inputs) if inputs == last => continue,
            Ok(inputs) => inputs,
            Err(error) => {
                tracing::warn!(%error, "KEDA's External Scaler service: cannot re-read its certificate; keeping the current one");
                continue;
            }
        };
        match inputs.build() {
            Ok(fresh) => {
                tracing::info!("KEDA's External Scaler service: certificate changed; reloaded");
                config.send_replace(Arc::new(fresh));
                last = inputs;
            }
            Err(error) => {
                tracing::warn!(%error, "KEDA's External Scaler service: the changed certificate does not load; keeping the current one")
            }
        }
    }
}

/// Serves `service` over TLS on `listener` until `stop`; each connection is
/// handshaken with the configuration current when it arrives.
pub async fn serve(
    listener: TcpListener,
    config: watch::Receiver<Arc<ServerConfig>>,
    service: ExternalScalerServer<Scaler>,
    stop: CancellationToken,
) {
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!(%error, "KEDA's External Scaler service: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let current: Arc<ServerConfig> = config.borrow().clone();
        let acceptor = TlsAcceptor::from(current);
        let (service, stop) = (service.clone(), stop.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "KEDA's External Scaler service: TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let builder = Builder::new(TokioExecutor::new());
            // StreamIsActive calls last as long as KEDA listens: on stop the
            // connection is dropped rather than drained.
            tokio::select! {
                served = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service)) => {
                    if let Err(error) = served {
                        tracing::debug!(%peer, %error, "KEDA's External Scaler service: connection ended with an error");
                    }
                }
                () = stop.cancelled() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test CA, a certificate it signed for `keda-scaler.test`, and its
    /// key (operator/tests/testdata/keda, made with openssl).
    const CA: &[u8] = include_bytes!("../../tests/testdata/keda/ca.pem");
    const CERT: &[u8] = include_bytes!("../../tests/testdata/keda/server.pem");
    const KEY: &[u8] = include_bytes!("../../tests/testdata/keda/server.key");
    /// A key that does not go with CERT.
    const OTHER_KEY: &[u8] = include_bytes!("../../tests/testdata/keda/client.key");

    #[test]
    fn a_certificate_with_or_without_a_client_ca_builds_for_h2() {
        let plain = server_config(CERT, KEY, None).unwrap();
        assert_eq!(plain.alpn_protocols, [b"h2".to_vec()]);
        assert!(server_config(CERT, KEY, Some(CA)).is_ok());
    }

    #[test]
    fn a_bad_set_does_not_build() {
        assert!(matches!(server_config(CERT, OTHER_KEY, None), Err(TlsError::Setup(_))));
        assert!(matches!(server_config(b"", KEY, None), Err(TlsError::Setup(_))));
        assert!(matches!(
            server_config(CERT, KEY, Some(&b""[..])),
            Err(TlsError::Setup(_))
        ));
    }
}
