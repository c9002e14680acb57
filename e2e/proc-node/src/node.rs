//! The Node objects this runner is the kubelet of, kept alive: a Lease in
//! `kube-node-lease` renewed every 10 s and a Ready condition with a fresh
//! heartbeat, as the node lifecycle controller expects.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec as K8sNodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The label every process node carries; serving examples select it.
pub const PROCESS_NODE_LABEL: &str = "nereid.dev/process-node";
const LEASE_SECONDS: i32 = 40;
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// The Node status is reported every this many renewals (a minute).
const STATUS_EVERY_BEATS: u32 = 6;

/// A node to register, from `--nodes`.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub gpus: u32,
}

impl FromStr for NodeSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None => Ok(NodeSpec {
                name: s.to_string(),
                gpus: 0,
            }),
            Some((name, extra)) => {
                let gpus = extra
                    .strip_prefix("gpu=")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("expected NAME or NAME:gpu=N, got '{s}'"))?;
                Ok(NodeSpec {
                    name: name.to_string(),
                    gpus,
                })
            }
        }
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Creates (or replaces) the Node object, with its capacity and status.
pub async fn register(client: &Client, spec: &NodeSpec, ip: &Ipv4Addr) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), spec.name.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        (PROCESS_NODE_LABEL.to_string(), "true".to_string()),
    ]);
    let mut capacity = BTreeMap::from([
        ("cpu".to_string(), Quantity("16".into())),
        ("memory".to_string(), Quantity("64Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    // Only pods that ask for a process node land here; KWOK's fake nodes take the rest.
    let mut taints = vec![Taint {
        key: PROCESS_NODE_LABEL.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }];
    if spec.gpus > 0 {
        labels.insert("nvidia.com/gpu.present".into(), "true".into());
        labels.insert("nvidia.com/gpu.count".into(), spec.gpus.to_string());
        capacity.insert("nvidia.com/gpu".into(), Quantity(spec.gpus.to_string()));
        taints.push(Taint {
            key: "nvidia.com/gpu".into(),
            value: Some("present".into()),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
    }
    let node = Node {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(K8sNodeSpec {
            taints: Some(taints),
            ..K8sNodeSpec::default()
        }),
        status: None,
    };
    let _ = nodes.delete(&spec.name, &Default::default()).await;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("registering node {}", spec.name))?;
    let status = NodeStatus {
        capacity: Some(capacity.clone()),
        allocatable: Some(capacity),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: spec.name.clone(),
            },
        ]),
        conditions: Some(vec![ready_condition()]),
        ..NodeStatus::default()
    };
    nodes
        .patch_status(
            &spec.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .with_context(|| format!("reporting node {} ready", spec.name))?;
    Ok(())
}

fn ready_condition() -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: Some("KubeletReady".into()),
        message: Some("the process node runs pods as local processes".into()),
        last_heartbeat_time: Some(now()),
        last_transition_time: Some(now()),
    }
}

/// Renews the node's Lease every 10 s and reports its status every minute, forever.
pub async fn heartbeat(client: Client, name: String) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client);
    let mut beats: u32 = 1;
    loop {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.clone()),
                lease_duration_seconds: Some(LEASE_SECONDS),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..LeaseSpec::default()
            }),
        };
        let apply = PatchParams::apply("nereid-proc-node").force();
        if let Err(e) = leases.patch(&name, &apply, &Patch::Apply(&lease)).await {
            tracing::warn!(node = %name, error = %e, "lease renewal failed");
        }
        // The Lease is the heartbeat; the status is re-reported now and then,
        // its Ready condition merged by type so its transition time stays.
        if beats.is_multiple_of(STATUS_EVERY_BEATS) {
            let heartbeat = json!({ "status": { "conditions": [{
                "type": "Ready",
                "status": "True",
                "lastHeartbeatTime": now(),
            }] } });
            if let Err(e) = nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(heartbeat))
                .await
            {
                tracing::warn!(node = %name, error = %e, "status heartbeat failed");
            }
        }
        beats += 1;
        tokio::time::sleep(RENEW_EVERY).await;
    }
}
