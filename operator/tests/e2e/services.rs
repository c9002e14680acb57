//! Pods in network namespaces of their own, behind a Service as in a real
//! cluster: two pods of one model on one node both listen on 0.0.0.0:8001
//! with no conflict, a name under cluster.local resolves to the Service's
//! ClusterIP inside a pod (CoreDNS, through the pod's own resolv.conf),
//! kube-proxy's rules spread fresh connections to the ClusterIP over both
//! pods, and a deleted pod leaves the Service: its namespace is removed,
//! kube-proxy drops it, and every request through the ClusterIP then
//! succeeds on the pods that are left.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use nereid_operator::builders::service::{self, Ports};

use crate::env::{self, Env, checked};
use crate::inference;
use crate::models;
use crate::simple_model::{self, NAMESPACE};
use crate::wait::{self, LONG};

/// The model, its own (the `simple` example again): its counters are this scenario's alone.
const MODEL: &str = "spread";
/// Both pods on one node, so that "no conflict" is about one node's pods.
const ON_PROC_1: &str = "  scheduling:\n    nodeSelector:\n      kubernetes.io/hostname: proc-1\n    \
                         tolerations:\n    - key: nereid.dev/process-node\n      operator: Exists\n      \
                         effect: NoSchedule\n";
/// Requests through the ClusterIP, each on a connection of its own: with
/// two endpoints, all of them landing on one pod has odds of 2^-39.
const REQUESTS: usize = 40;
/// The gRPC port every serving container listens on (Triton's).
const GRPC_PORT: u16 = 8001;

pub async fn run(env: &Env) -> Result<()> {
    simple_model::prepare(env).await?;
    simple_model::upload_as(env, MODEL).await?;
    models::apply(env, NAMESPACE, &simple_model::manifest_placed(MODEL, 2, ON_PROC_1)).await?;
    let model = models::ready(env, NAMESPACE, MODEL, 2).await?;
    let ports = service::ports(&model);
    let pods = models::running_pods(env, NAMESPACE, MODEL, 2).await?;

    // Two pods, one node, two namespaces, each listening on the wildcard address.
    let ips: Vec<IpAddr> = pods.iter().map(models::pod_ip).collect::<Result<_>>()?;
    ensure!(ips[0] != ips[1], "both pods have the IP {}", ips[0]);
    for pod in &pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        ensure!(node == Some("proc-1"), "{} is on {node:?}", pod.name_any());
        let listening = in_pod(pod, &["cat", "/proc/net/tcp"]).await?;
        ensure!(
            listens_on_any_address(&listening, GRPC_PORT),
            "{} does not listen on 0.0.0.0:{GRPC_PORT} in its namespace:\n{listening}",
            pod.name_any()
        );
    }

    // The Service's name resolves to its ClusterIP inside a pod, short and in full.
    let cluster_ip = models::cluster_ip(env, NAMESPACE, MODEL).await?;
    for name in [MODEL.to_string(), format!("{MODEL}.{NAMESPACE}.svc.cluster.local")] {
        let answer = in_pod(&pods[0], &["getent", "hosts", &name]).await?;
        ensure!(
            answer.split_whitespace().next() == Some(cluster_ip.to_string().as_str()),
            "{name} resolves to {answer:?} in a pod, not the ClusterIP {cluster_ip}"
        );
    }

    // Fresh connections to the ClusterIP land on both pods.
    let before = served(&ips, &ports).await?;
    send_through(cluster_ip, &ports).await?;
    let after = served(&ips, &ports).await?;
    let delta: Vec<f64> = ips.iter().map(|ip| after[ip] - before[ip]).collect();
    ensure!(
        delta.iter().all(|d| *d > 0.0) && delta.iter().sum::<f64>() == REQUESTS as f64,
        "{REQUESTS} requests through {cluster_ip} were served {delta:?} by the pods {ips:?}"
    );

    // A deleted pod leaves the Service: no namespace, no rule, no failed request.
    let victim = &pods[0];
    let victim_ip = ips[0];
    let uid = victim.uid().context("a pod UID")?;
    env.kubectl(["delete", "pod", "-n", NAMESPACE, &victim.name_any(), "--wait=false"])
        .await?;
    wait::until("the deleted pod's namespace and proxy rules to go", LONG, || async {
        let gone = Api::<Pod>::namespaced(env.client.clone(), NAMESPACE)
            .get_opt(&victim.name_any())
            .await?
            .is_none();
        ensure!(gone, "the pod object is still there");
        let namespaces = checked(env::run(command("ip", &["netns", "list"]), None).await?)?;
        ensure!(!namespaces.contains(&uid), "its namespace is still there: {namespaces}");
        let rules = checked(env::run(command("iptables-save", &["-t", "nat"]), None).await?)?;
        let target = format!("--to-destination {victim_ip}:");
        ensure!(!rules.contains(&target), "kube-proxy still sends to {victim_ip}");
        Ok(())
    })
    .await?;
    send_through(cluster_ip, &ports).await?;
    env.kubectl(["delete", "inferencemodel", MODEL, "-n", NAMESPACE, "--wait=false"])
        .await?;
    Ok(())
}

/// `REQUESTS` inferences to `cluster_ip`'s HTTP port, each on a new connection; all must succeed.
async fn send_through(cluster_ip: IpAddr, ports: &Ports) -> Result<()> {
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?;
    for seed in 0..REQUESTS {
        inference::add_sub(&fresh, cluster_ip, ports.http, MODEL, seed as i32)
            .await
            .with_context(|| format!("request {seed} through the ClusterIP {cluster_ip}"))?;
    }
    Ok(())
}

/// Each pod's count of served requests, read from its own metrics port.
async fn served(ips: &[IpAddr], ports: &Ports) -> Result<BTreeMap<IpAddr, f64>> {
    let http = inference::client();
    let mut served = BTreeMap::new();
    for ip in ips {
        served.insert(*ip, inference::requests_served(&http, *ip, ports.metrics, MODEL).await?);
    }
    Ok(served)
}

/// Runs `words` in `pod`'s network namespace (named by its UID; see
/// e2e/proc-node), with the pod's own /etc/hosts and resolv.conf.
async fn in_pod(pod: &Pod, words: &[&str]) -> Result<String> {
    let uid = pod.uid().context("a pod UID")?;
    let mut args = vec!["netns", "exec", uid.as_str()];
    args.extend(words);
    checked(env::run(command("ip", &args), None).await?).with_context(|| format!("{words:?} in {}", pod.name_any()))
}

fn command(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    command
}

/// Whether /proc/net/tcp text has a socket listening on 0.0.0.0:`port`.
fn listens_on_any_address(proc_net_tcp: &str, port: u16) -> bool {
    let local = format!("00000000:{port:04X}");
    proc_net_tcp.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "sl local_address rem_address st ...": st 0A is LISTEN.
        fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
    })
}
