//! The HTTP client the operator calls serving pods with: the scrapes of
//! their `/metrics` ([`crate::autoscaling::scraper`]) and the model
//! metadata behind `status.loadedVersions`
//! ([`crate::controller::loaded_versions`]).
//!
//! A serving pod runs whatever image and sidecars its InferenceModel names,
//! so what it answers is not to be trusted. Redirects are never followed: a
//! pod answering `302 Location: http://169.254.169.254/...` (or the API
//! server, or another tenant's pods) would otherwise have the operator fetch
//! any address the operator can reach and feed the answer into figures and
//! status. A redirect is an unsuccessful answer like any other non-2xx one.
//! No proxy from the environment is used either: pod IPs are reached directly.

use std::time::Duration;

/// A client for serving pods that gives up on a call after `timeout`.
pub fn client(timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
}
