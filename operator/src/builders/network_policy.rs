//! The NetworkPolicy of an InferenceModel's pods, when its spec asks for one.
//!
//! Ingress only: the HTTP and gRPC ports from `spec.networkPolicy.from` (the
//! model's namespace when empty), the metrics port and the port on which a
//! pod's `nereid-fetch` reports its download from `metricsFrom` (the same
//! peers when empty; the operator reads both). Egress is left alone: pods fetch models from
//! object storage and remote ensemble steps call other models.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use nereid_proto::contract::fetch_progress;

use super::{Served, labels, service};

/// The policy, named like the model; `None` when the spec has none.
pub fn network_policy<S: Served>(model: &S) -> Option<NetworkPolicy> {
    let wanted = model.network_policy()?;
    let ports = service::ports(model);
    let port = |number: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(number)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    };
    // An empty pod selector without a namespace selector: every pod of the
    // policy's own namespace.
    let same_namespace = || {
        vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector::default()),
            ..NetworkPolicyPeer::default()
        }]
    };
    let callers = if wanted.from.is_empty() {
        same_namespace()
    } else {
        wanted.from.clone()
    };
    let scrapers = if wanted.metrics_from.is_empty() {
        callers.clone()
    } else {
        wanted.metrics_from.clone()
    };
    Some(NetworkPolicy {
        metadata: labels::object_meta(model, model.name_any()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(labels::label_selector(model)),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(callers),
                    ports: Some(vec![port(ports.http), port(ports.grpc)]),
                },
                // The operator reads the metrics, and a fetch's progress
                // while a pod downloads its model.
                NetworkPolicyIngressRule {
                    from: Some(scrapers),
                    ports: Some(vec![port(ports.metrics), port(i32::from(fetch_progress::PORT))]),
                },
            ]),
            ..NetworkPolicySpec::default()
        }),
    })
}
