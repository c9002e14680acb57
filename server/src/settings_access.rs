//! Who may change the server's log and trace settings.
//!
//! Triton lets any client change them, and by default so did this server:
//! an unauthenticated client anywhere could turn error logging off (hiding
//! what it does next) or verbose logging on (a line per request, on the
//! node's disk). A change is now taken only from a client on the server's
//! own host (a sidecar, `tritonclient` on the machine, an operator's
//! `kubectl exec`), unless the API group is restricted to a header (then
//! the header decides, as Triton's `--http-restricted-api`) or the server
//! runs with `--allow-remote-settings-updates`. Reading them is not limited.

use crate::error::{Error, Result};
use crate::transport::Peer;

#[derive(Debug, Clone, Copy, Default)]
pub struct SettingsUpdates {
    /// `--allow-remote-settings-updates`.
    pub from_anywhere: bool,
}

impl SettingsUpdates {
    /// Lets a change of `what` ("log settings", "trace settings") through,
    /// or refuses it. `restricted`: the API group needs a header (checked
    /// already). `peer`: where the request came from (none in-process).
    pub fn check(&self, what: &str, restricted: bool, peer: Option<&Peer>) -> Result<()> {
        if self.from_anywhere || restricted || peer.is_none_or(Peer::is_local) {
            return Ok(());
        }
        Err(Error::permission_denied(format!(
            "the {what} can be changed only from the server's own host, unless their API group is restricted to a header (--http-restricted-api, --grpc-restricted-protocol) or the server runs with --allow-remote-settings-updates"
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
        let default = SettingsUpdates::default();
        assert!(default.check("log settings", false, Some(&peer("127.0.0.1:5000"))).is_ok());
        assert!(default.check("log settings", false, Some(&peer("[::1]:5000"))).is_ok());
        assert!(default.check("log settings", false, Some(&peer("[::ffff:127.0.0.2]:5000"))).is_ok());
        assert!(default.check("log settings", false, None).is_ok());
        let remote = peer("10.244.1.7:41000");
        let e = default.check("log settings", false, Some(&remote)).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::PermissionDenied);
        assert!(e.message().contains("--allow-remote-settings-updates"), "{e}");
        assert!(default.check("trace settings", true, Some(&remote)).is_ok(), "restricted: the header decided");
        let open = SettingsUpdates { from_anywhere: true };
        assert!(open.check("log settings", false, Some(&remote)).is_ok());
    }
}
