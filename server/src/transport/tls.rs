//! TLS from PEM files, reloaded when the files change.
//!
//! cert-manager (and any rotation job) replaces the certificate and key in
//! place, in a mounted Secret. So the server configuration is not built once:
//! before a handshake, at most once a second, the files' modification times
//! and sizes are compared with the last load, and a change rebuilds the
//! configuration. A broken rotation (a key that does not match, a half-written
//! file) is logged and the previous configuration keeps serving; a connection
//! never fails because of a reload.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// How often the files are looked at, at most.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Triton's TLS flags for one front end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates must chain to.
    pub root: Option<PathBuf>,
    /// Require a client certificate signed by `root`.
    pub mutual: bool,
}

/// A TLS server configuration that follows its files.
#[derive(Debug)]
pub struct ReloadingTls {
    settings: TlsSettings,
    alpn: Vec<Vec<u8>>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    config: Arc<ServerConfig>,
    stamp: Vec<Option<(SystemTime, u64)>>,
    checked: Instant,
}

impl ReloadingTls {
    /// Loads the files once; a failure here is a start-up error.
    pub fn new(settings: TlsSettings, alpn: &[&[u8]]) -> Result<Self, String> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let config = build(&settings, &alpn)?;
        let stamp = stamp(&settings);
        Ok(ReloadingTls {
            settings,
            alpn,
            state: Mutex::new(State {
                config,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The configuration to handshake with, reloaded first if the files changed.
    pub fn config(&self) -> Arc<ServerConfig> {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= CHECK_EVERY {
            state.checked = Instant::now();
            let now = stamp(&self.settings);
            if now != state.stamp {
                match build(&self.settings, &self.alpn) {
                    Ok(config) => {
                        tracing::info!(cert = %self.settings.cert.display(), "TLS certificate reloaded");
                        state.config = config;
                        state.stamp = now;
                    }
                    // Rotations write several files; a half-done one is retried next time.
                    Err(reason) => {
                        tracing::warn!(%reason, "TLS files changed but do not load; keeping the previous ones")
                    }
                }
            }
        }
        Arc::clone(&state.config)
    }
}

fn stamp(settings: &TlsSettings) -> Vec<Option<(SystemTime, u64)>> {
    [Some(&settings.cert), Some(&settings.key), settings.root.as_ref()]
        .into_iter()
        .flatten()
        .map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}

fn build(settings: &TlsSettings, alpn: &[Vec<u8>]) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs = CertificateDer::pem_file_iter(&settings.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the certificate '{}': {e}", settings.cert.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in '{}'", settings.cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&settings.key)
        .map_err(|e| format!("cannot read the private key '{}': {e}", settings.key.display()))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS protocol versions: {e}"))?;
    let builder = match (&settings.root, settings.mutual) {
        (Some(root), true) => builder.with_client_cert_verifier(client_verifier(root, &provider)?),
        (None, true) => return Err("mutual TLS needs the root certificate clients are checked against".into()),
        (_, false) => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        format!(
            "the certificate '{}' and key '{}' do not go together: {e}",
            settings.cert.display(),
            settings.key.display()
        )
    })?;
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
}

fn client_verifier(
    root: &std::path::Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(root)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the root certificate '{}': {e}", root.display()))?;
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("bad root certificate in '{}': {e}", root.display()))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| format!("client verification with '{}': {e}", root.display()))
}
