//! Who is asking: the API server's front proxy, on behalf of a user.
//!
//! kube-apiserver calls an aggregated API with its front-proxy client
//! certificate (`--proxy-client-cert-file`) and names the end user in
//! request headers (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-*`).
//! Those headers are trusted only on a connection whose client certificate
//! chains to the request-header CA and, when the cluster lists allowed
//! names, has one of them as its common name: exactly what Kubernetes' own
//! aggregated servers check. The CA, the names and the header names are read
//! from `kube-system/extension-apiserver-authentication`, which kube-apiserver
//! publishes for this purpose.

use std::collections::BTreeMap;

use http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use thiserror::Error;

use super::subject;

pub const CONFIG_MAP: &str = "extension-apiserver-authentication";
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";

/// The request-header settings kube-apiserver publishes.
#[derive(Clone, Debug)]
pub struct RequestHeaderConfig {
    /// The CA that signs front-proxy client certificates.
    pub client_ca: Vec<CertificateDer<'static>>,
    /// Common names a front-proxy certificate may have; empty means any.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefixes: Vec<String>,
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP}: {0}")]
    Read(#[from] kube::Error),
    #[error(
        "{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP} has no requestheader-client-ca-file: kube-apiserver runs without \
         --requestheader-client-ca-file, so it cannot call aggregated APIs"
    )]
    NoClientCa,
    #[error("{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP}: {key} is not {what}")]
    Malformed { key: &'static str, what: &'static str },
}

impl RequestHeaderConfig {
    /// The settings' raw form, as the cluster publishes them.
    pub async fn fetch(client: &kube::Client) -> Result<BTreeMap<String, String>, ConfigError> {
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), CONFIG_MAP_NAMESPACE);
        Ok(config_maps.get(CONFIG_MAP).await?.data.unwrap_or_default())
    }

    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let ca = data
            .get("requestheader-client-ca-file")
            .ok_or(ConfigError::NoClientCa)?;
        let client_ca = CertificateDer::pem_slice_iter(ca.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ConfigError::Malformed {
                key: "requestheader-client-ca-file",
                what: "PEM certificates",
            })?;
        if client_ca.is_empty() {
            return Err(ConfigError::NoClientCa);
        }
        let list = |key: &'static str| -> Result<Vec<String>, ConfigError> {
            match data.get(key) {
                None => Ok(Vec::new()),
                Some(text) => serde_json::from_str(text).map_err(|_| ConfigError::Malformed {
                    key,
                    what: "a JSON list of strings",
                }),
            }
        };
        Ok(RequestHeaderConfig {
            client_ca,
            allowed_names: list("requestheader-allowed-names")?,
            username_headers: list("requestheader-username-headers")?,
            group_headers: list("requestheader-group-headers")?,
            extra_headers_prefixes: list("requestheader-extra-headers-prefix")?,
        })
    }

    /// The user a request speaks for, given the client certificate its
    /// connection presented (already verified against [`Self::client_ca`]
    /// by the TLS layer). `None` when the request is not from the front
    /// proxy: no certificate, a name not allowed, or no user header.
    pub fn user(&self, client_cert: Option<&CertificateDer<'_>>, headers: &HeaderMap) -> Option<User> {
        let cert = client_cert?;
        if !self.allowed_names.is_empty() {
            let name = subject::common_name(cert)?;
            if !self.allowed_names.contains(&name) {
                return None;
            }
        }
        let name = self
            .username_headers
            .iter()
            .find_map(|h| headers.get(h.as_str())?.to_str().ok())
            .filter(|name| !name.is_empty())?
            .to_string();
        let groups = self
            .group_headers
            .iter()
            .flat_map(|h| headers.get_all(h.as_str()))
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let Some(key) = self
                .extra_headers_prefixes
                .iter()
                .find_map(|prefix| strip_prefix_ignore_case(header.as_str(), prefix))
            else {
                continue;
            };
            if let Ok(value) = value.to_str() {
                extra.entry(unescape(key)).or_default().push(value.to_string());
            }
        }
        Some(User { name, groups, extra })
    }
}

/// The end user the front proxy vouches for.
#[derive(Clone, Debug, PartialEq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

fn strip_prefix_ignore_case<'a>(header: &'a str, prefix: &str) -> Option<&'a str> {
    let head = header.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &header[prefix.len()..])
}

/// Extra keys are percent-encoded in header names (Kubernetes' convention).
fn unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let decoded = (bytes[index] == b'%')
            .then(|| key.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match decoded {
            Some(byte) => {
                out.push(byte);
                index += 3;
            }
            None => {
                out.push(bytes[index].to_ascii_lowercase());
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    /// A certificate with CN=front-proxy-client (made with openssl for this test).
    const FRONT_PROXY_CERT: &str = include_str!("testdata/front-proxy-client.pem");

    fn config(allowed: &[&str]) -> RequestHeaderConfig {
        RequestHeaderConfig {
            client_ca: Vec::new(),
            allowed_names: allowed.iter().map(|s| s.to_string()).collect(),
            username_headers: vec!["X-Remote-User".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_headers_prefixes: vec!["X-Remote-Extra-".into()],
        }
    }

    fn cert() -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(FRONT_PROXY_CERT.as_bytes()).unwrap()
    }

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-remote-user", HeaderValue::from_static("alice"));
        headers.append("x-remote-group", HeaderValue::from_static("devs"));
        headers.append("x-remote-group", HeaderValue::from_static("system:authenticated"));
        headers.insert("x-remote-extra-scopes%2fone", HeaderValue::from_static("a"));
        headers
    }

    #[test]
    fn the_front_proxy_speaks_for_the_user_in_its_headers() {
        let user = config(&["front-proxy-client"]).user(Some(&cert()), &headers()).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["devs", "system:authenticated"]);
        assert_eq!(user.extra["scopes/one"], ["a"]);
        assert!(
            config(&[]).user(Some(&cert()), &headers()).is_some(),
            "any name when none are listed"
        );
    }

    #[test]
    fn headers_without_the_front_proxy_certificate_are_not_trusted() {
        assert_eq!(config(&["front-proxy-client"]).user(None, &headers()), None);
        assert_eq!(config(&["someone-else"]).user(Some(&cert()), &headers()), None);
        assert_eq!(
            config(&[]).user(Some(&cert()), &HeaderMap::new()),
            None,
            "no user named"
        );
    }

    #[test]
    fn settings_are_read_from_the_published_config_map() {
        let data = BTreeMap::from([
            ("requestheader-client-ca-file".to_string(), FRONT_PROXY_CERT.to_string()),
            (
                "requestheader-allowed-names".to_string(),
                r#"["front-proxy-client"]"#.to_string(),
            ),
            (
                "requestheader-username-headers".to_string(),
                r#"["X-Remote-User"]"#.to_string(),
            ),
        ]);
        let config = RequestHeaderConfig::from_data(&data).unwrap();
        assert_eq!(config.client_ca.len(), 1);
        assert_eq!(config.allowed_names, ["front-proxy-client"]);
        assert!(config.group_headers.is_empty());
        assert!(matches!(
            RequestHeaderConfig::from_data(&BTreeMap::new()),
            Err(ConfigError::NoClientCa)
        ));
        let bad = BTreeMap::from([
            ("requestheader-client-ca-file".to_string(), FRONT_PROXY_CERT.to_string()),
            (
                "requestheader-allowed-names".to_string(),
                "front-proxy-client".to_string(),
            ),
        ]);
        assert!(matches!(
            RequestHeaderConfig::from_data(&bad),
            Err(ConfigError::Malformed { .. })
        ));
    }
}
