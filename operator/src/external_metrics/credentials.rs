//! What the external metrics API checks connections and callers with, and
//! keeping it current: the serving certificate and key (a Secret volume,
//! rotated in place) and kube-apiserver's request-header settings (its
//! front-proxy CA rotates too) are re-read every minute and rebuilt when
//! they changed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::ServeSettings;
use super::requestheader::{ConfigError, RequestHeaderConfig};

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

/// What the API reads from outside and may change while it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub request_header: BTreeMap<String, String>,
}

impl Inputs {
    /// Reads the files of `settings` and the cluster's request-header ConfigMap.
    pub async fn read(client: &kube::Client, settings: &ServeSettings) -> Result<Inputs, CredentialsError> {
        let read = |what: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                what,
                path: path.clone(),
                reason: e.to_string(),
            })
        };
        Ok(Inputs {
            cert: read("the serving certificate", &settings.cert)?,
            key: read("the serving key", &settings.key)?,
            request_header: RequestHeaderConfig::fetch(client).await?,
        })
    }
}

/// What each connection and request is checked with, built from [`Inputs`].
#[derive(Debug)]
pub struct Credentials {
    pub tls: Arc<ServerConfig>,
    pub request_header: RequestHeaderConfig,
}

#[derive(Debug, Error)]
pub enum CredentialsError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    RequestHeader(#[from] ConfigError),
}

impl Credentials {
    pub fn build(inputs: &Inputs) -> Result<Credentials, CredentialsError> {
        let request_header = RequestHeaderConfig::from_data(&inputs.request_header)?;
        let tls = tls_config(&inputs.cert, &inputs.key, &request_header.client_ca)?;
        Ok(Credentials {
            tls: Arc::new(tls),
            request_header,
        })
    }
}

/// How often the inputs are read again.
const REFRESH: Duration = Duration::from_secs(60);

/// Re-reads the inputs every minute until `stop`, and publishes new
/// credentials when they changed and build; a half-rotated or unreadable
/// set is logged and the previous credentials stay.
pub async fn keep_fresh(
    client: kube::Client,
    settings: ServeSettings,
    mut last: Inputs,
    credentials: watch::Sender<Arc<Credentials>>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REFRESH) => {}
        }
        let inputs = match Inputs::read(&client, &settings).await {
            Ok(inputs) if inputs == last => continue,
            Ok(inputs) => inputs,
            Err(error) => {
                tracing::warn!(%error, "external metrics API: cannot re-read its credentials; keeping the current ones");
                continue;
            }
        };
        match Credentials::build(&inputs) {
            Ok(fresh) => {
                tracing::info!("external metrics API: certificate or request-header settings changed; reloaded");
                credentials.send_replace(Arc::new(fresh));
                last = inputs;
            }
            Err(error) => {
                tracing::warn!(%error, "external metrics API: the changed credentials do not load; keeping the current ones")
            }
        }
    }
}

/// The TLS configuration: the serving certificate, and client certificates
/// optional but verified against `client_ca` when presented.
pub fn tls_config(cert: &[u8], key: &[u8], client_ca: &[CertificateDer<'static>]) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Setup(format!("the serving certificate: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Setup("no certificate in the serving certificate file".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Setup(format!("the serving key: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed test certificate (CN=front-proxy-client) and its key,
    /// made with openssl for these tests; it serves as the serving
    /// certificate and as the request-header CA at once.
    const CERT: &[u8] = include_bytes!("testdata/front-proxy-client.pem");
    const KEY: &[u8] = include_bytes!("testdata/front-proxy-client.key");
    /// A key that does not go with CERT.
    const OTHER_KEY: &[u8] = include_bytes!("testdata/other.key");

    fn inputs(key: &[u8], with_ca: bool) -> Inputs {
        let mut request_header = BTreeMap::from([(
            "requestheader-allowed-names".to_string(),
            r#"["front-proxy-client"]"#.to_string(),
        )]);
        if with_ca {
            request_header.insert(
                "requestheader-client-ca-file".into(),
                String::from_utf8(CERT.to_vec()).unwrap(),
            );
        }
        Inputs {
            cert: CERT.to_vec(),
            key: key.to_vec(),
            request_header,
        }
    }

    #[test]
    fn credentials_build_from_a_matching_certificate_key_and_ca() {
        let credentials = Credentials::build(&inputs(KEY, true)).unwrap();
        assert_eq!(credentials.request_header.allowed_names, ["front-proxy-client"]);
        assert_eq!(credentials.tls.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn a_half_rotated_or_incomplete_set_does_not_build() {
        assert!(matches!(
            Credentials::build(&inputs(OTHER_KEY, true)),
            Err(CredentialsError::Tls(TlsError::Setup(_)))
        ));
        assert!(matches!(
            Credentials::build(&inputs(KEY, false)),
            Err(CredentialsError::RequestHeader(ConfigError::NoClientCa))
        ));
        let mut empty = inputs(KEY, true);
        empty.cert.clear();
        assert!(matches!(Credentials::build(&empty), Err(CredentialsError::Tls(_))));
    }
}
