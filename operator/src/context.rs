//! What every reconcile shares: the client, the metrics, the autoscaling
//! figures, the operator's settings and the event recorder.

use std::sync::Arc;

use kube::runtime::events::Recorder;

use crate::autoscaling::scraper::Board;
use crate::metrics::Metrics;

pub struct Context {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    /// The latest per-model figures, for `status.autoscaling`.
    pub board: Arc<Board>,
    pub config: OperatorConfig,
    pub recorder: Recorder,
}

/// Settings that shape the objects the operator builds.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// The nereid-server image used when an InferenceModel names none.
    pub server_image: String,
    /// The one server-side-apply field manager for everything we write.
    pub field_manager: String,
    /// For the in-cluster addresses in `status.endpoints`.
    pub cluster_domain: String,
    /// What `spec.autoscaling` turns into.
    pub autoscaler: Autoscaler,
    /// The cluster's nereid-gateway, when one is installed: `status.url`
    /// points there for the namespaces it routes.
    pub gateway: Option<Gateway>,
}

/// A nereid-gateway the operator was told of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gateway {
    /// Its HTTP base URL, e.g. `http://nereid-gateway.nereid.svc.cluster.local:8000`.
    pub http: String,
    /// Its gRPC address, `host:port`, for remote ensemble steps.
    pub grpc: String,
    /// The namespaces it routes; `None`: all of them.
    pub namespaces: Option<Vec<String>>,
}

impl Gateway {
    /// Whether it routes models of `namespace`.
    pub fn routes(&self, namespace: &str) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == namespace))
    }
}

/// Who scales an autoscaled model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Autoscaler {
    /// A HorizontalPodAutoscaler on the operator's external metrics.
    #[default]
    Hpa,
    /// A KEDA ScaledObject whose external trigger calls the operator's
    /// External Scaler service at `scaler_address` (`host:port`, as KEDA
    /// dials it), authenticated by the ClusterTriggerAuthentication
    /// `trigger_authentication` when the service is served over TLS.
    Keda {
        scaler_address: String,
        trigger_authentication: Option<String>,
    },
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            server_image: "nereid:latest".into(),
            field_manager: "nereid-operator".into(),
            cluster_domain: "cluster.local".into(),
            autoscaler: Autoscaler::Hpa,
            gateway: None,
        }
    }
}
