//! The operator's one error type, with a stable label and a retry policy per kind.
//!
//! Problems with the user's input (an invalid spec, a missing claim) are
//! written into the InferenceModel's status first and then returned as
//! errors, so that the operator's metrics count them and the controller
//! backs off; they never crash-loop the operator.

use std::time::Duration;

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused a request or could not be reached.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The spec breaks rules the API server could not enforce (see `status.conditions`).
    #[error("invalid spec: {}", .0.join("; "))]
    InvalidSpec(Vec<String>),
    /// A `pvc://` source names a PersistentVolumeClaim that does not exist.
    #[error("PersistentVolumeClaim '{0}' not found")]
    MissingClaim(String),
    /// An object could not be turned into a request body.
    #[error("failed to serialize {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The object lacks what every stored object has (a namespace, a name).
    #[error("the object has no {0}")]
    MissingField(&'static str),
}

impl Error {
    /// A stable, low-cardinality label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::InvalidSpec(_) => "invalid_spec",
            Error::MissingClaim(_) => "missing_pvc",
            Error::Serialize { .. } => "serialize",
            Error::MissingField(_) => "missing_field",
        }
    }

    /// How long to wait before trying again.
    ///
    /// A spec problem only goes away when the spec changes, and a spec change
    /// triggers a reconcile anyway, so those wait long. A missing claim is
    /// not watched (the operator only `get`s claims, never lists or watches
    /// them), so its check is retried soon: creating the claim fixes the
    /// model within seconds. API trouble is usually brief:
    /// a conflict is retried at once-ish, overload and outages a little later.
    pub fn requeue(&self) -> Duration {
        match self {
            Error::InvalidSpec(_) | Error::Serialize { .. } | Error::MissingField(_) => Duration::from_secs(300),
            Error::MissingClaim(_) => Duration::from_secs(5),
            Error::Kube(kube::Error::Api(status)) => match status.code {
                409 => Duration::from_secs(5),
                429 | 500..=599 => Duration::from_secs(15),
                _ => Duration::from_secs(30),
            },
            Error::Kube(_) => Duration::from_secs(15),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api(code: u16) -> Error {
        Error::Kube(kube::Error::Api(
            Status::failure("boom", "Reason").with_code(code).boxed(),
        ))
    }

    #[test]
    fn kinds_are_stable_labels() {
        assert_eq!(api(500).kind(), "kube");
        assert_eq!(Error::InvalidSpec(vec![]).kind(), "invalid_spec");
        assert_eq!(Error::MissingClaim("c".into()).kind(), "missing_pvc");
        assert_eq!(Error::MissingField("namespace").kind(), "missing_field");
    }

    #[test]
    fn spec_problems_wait_long_and_api_errors_short() {
        assert_eq!(Error::InvalidSpec(vec!["x".into()]).requeue(), Duration::from_secs(300));
        assert_eq!(api(409).requeue(), Duration::from_secs(5));
        assert_eq!(api(503).requeue(), Duration::from_secs(15));
        assert_eq!(api(403).requeue(), Duration::from_secs(30));
        assert!(Error::MissingClaim("c".into()).requeue() <= Duration::from_secs(60));
    }

    #[test]
    fn invalid_spec_lists_every_problem() {
        let e = Error::InvalidSpec(vec!["a".into(), "b".into()]);
        assert_eq!(e.to_string(), "invalid spec: a; b");
    }
}
