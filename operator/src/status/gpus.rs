//! The free GPUs of the cluster's nodes, so that an `InsufficientGPU`
//! status says how far the model is from fitting ("asks 4, the most any
//! node has free is 2") instead of only quoting the scheduler's count of
//! nodes that do not fit.
//!
//! Free is a node's allocatable amount of the GPU resource minus what the
//! pods bound to it request (as the scheduler counts: the sum over the
//! containers, or the largest init container's request if that is more).
//! Pure: the controller reads the nodes and their pods, only while a model's
//! pods wait for GPUs.

use k8s_openapi::api::core::v1::{Container, Node, Pod};

/// The GPUs of one resource that the cluster's best node has free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuCapacity {
    /// The extended resource, e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// What each of the model's pods asks for.
    pub wanted: u32,
    /// The node with the most free, if any node offers the resource.
    pub best: Option<NodeGpus>,
}

/// One node's GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGpus {
    pub node: String,
    pub free: i64,
    pub allocatable: i64,
}

/// The capacity for pods asking `wanted` of `resource`, from `nodes` and the
/// `pods` bound to them (pods of other nodes, unbound or finished ones are
/// ignored). Ties go to the node listed first.
pub fn capacity(resource: &str, wanted: u32, nodes: &[Node], pods: &[Pod]) -> GpuCapacity {
    let mut best: Option<NodeGpus> = None;
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(resource))
            .and_then(|q| q.0.parse::<i64>().ok())
            .unwrap_or(0);
        if allocatable <= 0 {
            continue;
        }
        let used: i64 = pods
            .iter()
            .filter(|pod| on_node(pod, name))
            .map(|pod| requested(pod, resource))
            .sum();
        let free = (allocatable - used).max(0);
        if best.as_ref().is_none_or(|b| free > b.free) {
            best = Some(NodeGpus {
                node: name.to_string(),
                free,
                allocatable,
            });
        }
    }
    GpuCapacity {
        resource: resource.to_string(),
        wanted,
        best,
    }
}

impl GpuCapacity {
    /// The sentence the status appends to the scheduler's message.
    pub fn describe(&self) -> String {
        let asks = format!("each pod asks for {} {}", self.wanted, self.resource);
        match &self.best {
            Some(b) => format!(
                "{asks}; the most any node has free is {} (node {}: {} of {} free)",
                b.free, b.node, b.free, b.allocatable
            ),
            None => format!("{asks}; no node offers {}", self.resource),
        }
    }
}

/// Whether `pod` holds resources on `node`.
fn on_node(pod: &Pod, node: &str) -> bool {
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    bound && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// What `pod` requests of `resource`, as the scheduler counts it.
fn requested(pod: &Pod, resource: &str) -> i64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let running: i64 = spec.containers.iter().map(|c| container_request(c, resource)).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_request(c, resource))
        .max()
        .unwrap_or(0);
    running.max(init)
}

/// A container's request of an extended resource: its request, or its limit
/// when only that is given (the API server then defaults one to the other).
fn container_request(container: &Container, resource: &str) -> i64 {
    let resources = container.resources.as_ref();
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get(resource));
    let limit = resources.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(resource));
    request.or(limit).and_then(|q| q.0.parse::<i64>().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{NodeStatus, PodSpec, PodStatus, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    const GPU: &str = "nvidia.com/gpu";

    fn node(name: &str, gpus: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                allocatable: gpus.map(|g| BTreeMap::from([(GPU.to_string(), Quantity(g.into()))])),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn container(requests: Option<&str>, limits: Option<&str>) -> Container {
        let map = |v: Option<&str>| v.map(|v| BTreeMap::from([(GPU.to_string(), Quantity(v.into()))]));
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: map(requests),
                limits: map(limits),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn pod(node: &str, phase: &str, containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers,
                init_containers: Some(init),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn the_node_with_the_most_free_gpus_is_named() {
        let nodes = [node("cpu", None), node("a", Some("8")), node("b", Some("4"))];
        let pods = [
            // a: 3 + 4 in use; b: 1 (limit only).
            pod("a", "Running", vec![container(Some("3"), Some("3"))], vec![]),
            pod("a", "Pending", vec![container(Some("4"), None)], vec![]),
            pod("b", "Running", vec![container(None, Some("1"))], vec![]),
            // Finished pods hold nothing.
            pod("b", "Succeeded", vec![container(Some("3"), None)], vec![]),
        ];
        let c = capacity(GPU, 4, &nodes, &pods);
        assert_eq!(
            c.best,
            Some(NodeGpus {
                node: "b".into(),
                free: 3,
                allocatable: 4
            })
        );
        assert_eq!(
            c.describe(),
            "each pod asks for 4 nvidia.com/gpu; the most any node has free is 3 (node b: 3 of 4 free)"
        );
    }

    #[test]
    fn an_init_container_counts_when_it_asks_more_than_the_containers() {
        let nodes = [node("a", Some("8"))];
        let pods = [pod(
            "a",
            "Running",
            vec![container(Some("1"), None), container(Some("1"), None)],
            vec![container(Some("5"), None)],
        )];
        assert_eq!(capacity(GPU, 4, &nodes, &pods).best.unwrap().free, 3);
    }

    #[test]
    fn no_gpu_node_is_said_plainly() {
        let c = capacity(GPU, 1, &[node("cpu", None), node("zero", Some("0"))], &[]);
        assert_eq!(c.best, None);
        assert_eq!(
            c.describe(),
            "each pod asks for 1 nvidia.com/gpu; no node offers nvidia.com/gpu"
        );
    }
}
