//! Probes against the real process: httpGet (HTTP or HTTPS, certificates
//! not verified, as the kubelet does), tcpSocket, grpc and exec. A status from 200
//! to 399 is a success, as for the kubelet.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::plan::ContainerPlan;

/// One probe attempt's outcome; a failure says why, for the Event.
pub type Outcome = Result<(), String>;

fn port(value: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    match value {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("port {n} is out of range")),
        IntOrString::String(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("no container port named \"{name}\"")),
    }
}

pub fn timeout(probe: &Probe) -> Duration {
    Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64)
}

pub async fn run(
    probe: &Probe,
    ip: Ipv4Addr,
    ports: &[ContainerPort],
    plan: &ContainerPlan,
    http: &reqwest::Client,
) -> Outcome {
    let limit = timeout(probe);
    if let Some(get) = &probe.http_get {
        let port = port(&get.port, ports)?;
        let scheme = get.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
        let host = get.host.clone().unwrap_or_else(|| ip.to_string());
        let path = get.path.clone().unwrap_or_else(|| "/".into());
        let url = format!("{scheme}://{host}:{port}{path}");
        let mut request = http.get(&url).timeout(limit);
        for header in get.http_headers.iter().flatten() {
            request = request.header(&header.name, &header.value);
        }
        return match request.send().await {
            Ok(r) if (200..400).contains(&r.status().as_u16()) => Ok(()),
            Ok(r) => Err(format!("HTTP probe failed with statuscode: {}", r.status().as_u16())),
            Err(e) => Err(format!("Get \"{url}\": {}", describe(&e))),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = port(&tcp.port, ports)?;
        let addr = format!("{}:{port}", tcp.host.clone().unwrap_or_else(|| ip.to_string()));
        return match tokio::time::timeout(limit, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {addr}: {e}")),
            Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
        };
    }
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        let Some((program, args)) = command.split_first() else {
            return Err("exec probe without a command".into());
        };
        // The command names paths as the container sees them.
        let program = crate::plan::rewrite(program, &plan.mounts);
        let args: Vec<String> = args.iter().map(|a| crate::plan::rewrite(a, &plan.mounts)).collect();
        let run = crate::process::command(plan, &program, &args).output();
        return match tokio::time::timeout(limit, run).await {
            Ok(Ok(out)) if out.status.success() => Ok(()),
            Ok(Ok(out)) => Err(format!("command {command:?} exited with {}", out.status)),
            Ok(Err(e)) => Err(format!("command {command:?}: {e}")),
            Err(_) => Err(format!("command {command:?} timed out")),
        };
    }
    if let Some(grpc) = &probe.grpc {
        let port = u16::try_from(grpc.port).map_err(|_| format!("port {} is out of range", grpc.port))?;
        return crate::grpc_probe::check(ip, port, grpc.service.as_deref().unwrap_or_default(), limit).await;
    }
    Err("the probe has no action".into())
}

/// An HTTP error down to its cause (connection refused, timeout).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}
