//! Who may reach the serving pods.

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Turns on a NetworkPolicy for the model's pods: only the listed peers may
/// call the model (HTTP and gRPC ports) or scrape its metrics, everything
/// else is refused by the cluster's network plugin. Absent, the pods accept
/// any traffic the namespace allows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelNetworkPolicy {
    /// Who may call the model. Empty: only pods in the model's own namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<NetworkPolicyPeer>,
    /// Who may scrape the metrics port (Prometheus, the autoscaler's
    /// collector) and read a download's progress (port 8009, which the
    /// operator reads while a pod fetches its model). Empty: the same peers
    /// as `from`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics_from: Vec<NetworkPolicyPeer>,
}
