//! Who may change the server's log and trace settings.
//!
//! Triton lets any client change them, and by default so did this server:
//! an unauthenticated client anywhere could turn error logging off (hiding
//! what it does next) or verbose logging on (a line per request, on the
//! node's disk). A change is now taken only from a client on the server's
//! own host (a sidecar, `tritonclient` on the machine, an operator's
//! `kubectl exec`), unless the API group is restricted to a header (then
//! the header decides, as Triton's `--http-restricted-api`) or the server
//! runs with `--allow-remote-control`. Reading them is not limited.

use crate::error::{Error, Result};
use crate::transport::Peer;

#[derive(Debug, Clone, Copy, Default)]
pub struct LocalControl {
    /// `--allow-remote-control`.
    pub from_anywhere: bool,
}

/// What a refused change was, for its message.
pub const LOG_SETTINGS: &str = "a change of the log settings";
pub const TRACE_SETTINGS: &str = "a change of the trace settings";
pub const SHARED_MEMORY: &str = "a shared memory registration";

impl LocalControl {
    /// Lets a change (`what`, one of the constants above) through, or
    /// refuses it. `restricted`: the API group needs a header (checked
    /// already). `peer`: where the request came from (none in-process).
    pub fn check(&self, what: &str, restricted: bool, peer: Option<&Peer>) -> Result<()> {
        if self.from_anywhere || restricted || peer.is_none_or(Peer::is_local) {
            return Ok(());
        }
        Err(Error::permission_denied(format!(
            "the {what} can be changed only from the server's own host, unless their API group is restricted to a header (--http-restricted-api, --grpc-restricted-protocol) or the server runs with --allow-remote-control"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(address: &str) -> Peer {
        Peer(address.parse().unwrap())
    }

    #[test]
    fn only_local_clients_change_unrestricted_settings() {
        let default = LocalControl::default();
        assert!(
            default
                .check(LOG_SETTINGS, false, Some(&peer("127.0.0.1:5000")))
                .is_ok()
        );
        assert!(default.check(LOG_SETTINGS, false, Some(&peer("[::1]:5000"))).is_ok());
        assert!(
            default
                .check(LOG_SETTINGS, false, Some(&peer("[::ffff:127.0.0.2]:5000")))
                .is_ok()
        );
        assert!(default.check(LOG_SETTINGS, false, None).is_ok());
        let remote = peer("10.244.1.7:41000");
        let e = default.check(LOG_SETTINGS, false, Some(&remote)).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::PermissionDenied);
        assert!(e.message().contains("--allow-remote-control"), "{e}");
        assert!(
            default.check(TRACE_SETTINGS, true, Some(&remote)).is_ok(),
            "restricted: the header decided"
        );
        let open = LocalControl { from_anywhere: true };
        assert!(open.check(LOG_SETTINGS, false, Some(&remote)).is_ok());
    }
}
