//! The Service in front of an InferenceModel's pods, and the ports it names.
//!
//! gRPC carries `appProtocol: kubernetes.io/h2c` so that meshes and Gateway
//! implementations speak cleartext HTTP/2 to it instead of guessing HTTP/1.
//! Note that a plain ClusterIP Service balances per connection, and gRPC
//! keeps one connection open: per-request balancing is the gateway's job.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{Served, labels};

/// The ports of the server container and the Service (Triton's defaults
/// unless `spec.server.ports` says otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    pub http: i32,
    pub grpc: i32,
    pub metrics: i32,
}

/// Port names shared by the container and the Service (the Service targets them by name).
pub const HTTP: &str = "http";
pub const GRPC: &str = "grpc";
pub const METRICS: &str = "metrics";

/// `model`'s ports.
pub fn ports<S: Served>(model: &S) -> Ports {
    let given = model.server().and_then(|s| s.ports.as_ref());
    Ports {
        http: given.and_then(|p| p.http).unwrap_or(8000),
        grpc: given.and_then(|p| p.grpc).unwrap_or(8001),
        metrics: given.and_then(|p| p.metrics).unwrap_or(8002),
    }
}

/// The Service named like the model, so its address is `<model>.<namespace>.svc`.
pub fn service<S: Served>(model: &S) -> Service {
    let ports = ports(model);
    let port = |name: &str, number: i32, app_protocol: Option<&str>| ServicePort {
        name: Some(name.to_string()),
        port: number,
        target_port: Some(IntOrString::String(name.to_string())),
        protocol: Some("TCP".into()),
        app_protocol: app_protocol.map(str::to_string),
        ..ServicePort::default()
    };
    Service {
        metadata: labels::object_meta(model, model.name_any()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(labels::selector(model)),
            ports: Some(vec![
                port(HTTP, ports.http, None),
                port(GRPC, ports.grpc, Some("kubernetes.io/h2c")),
                port(METRICS, ports.metrics, None),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
