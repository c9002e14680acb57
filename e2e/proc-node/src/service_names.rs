//! Service names for the pods, as the cluster's DNS gives a real pod: a
//! file of `<name> <ip>` lines, kept up to date from the EndpointSlices,
//! which the LD_PRELOAD shim reads when a pod's process resolves a name
//! (`NEREID_SERVICE_HOSTS`). There is no kube-proxy here, so a Service's
//! name resolves to one of its ready endpoints (the first, in address
//! order), as a headless Service's would: a client connects straight to a
//! pod, which is what the operator's remote ensemble steps do through
//! `<model>.<namespace>.svc.cluster.local`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};

/// The label that names an EndpointSlice's Service.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// Keeps `path` listing every Service with a ready endpoint, until the
/// watch ends (the process stops). Each name is written in the forms a
/// pod may use: `<svc>.<ns>.svc.<domain>`, `<svc>.<ns>.svc`, `<svc>.<ns>`.
pub async fn keep(client: Client, path: PathBuf, domain: String) {
    let (store, writer) = reflector::store();
    let mut stream = reflector(
        writer,
        watcher(Api::<EndpointSlice>::all(client), watcher::Config::default()),
    )
    .applied_objects()
    .boxed();
    let mut written = String::new();
    while let Some(event) = stream.next().await {
        if let Err(error) = event {
            tracing::debug!(%error, "EndpointSlice watch");
            continue;
        }
        let text = hosts(
            &store.state().iter().map(|s| s.as_ref().clone()).collect::<Vec<_>>(),
            &domain,
        );
        if text != written {
            // Written whole, then renamed: a reader never sees half a file.
            let staged = path.with_extension("new");
            if let Err(error) = std::fs::write(&staged, &text).and_then(|()| std::fs::rename(&staged, &path)) {
                tracing::warn!(%error, path = %path.display(), "cannot write the service names");
                continue;
            }
            written = text;
        }
    }
}

/// The file's text for these slices.
fn hosts(slices: &[EndpointSlice], domain: &str) -> String {
    let mut addresses: BTreeMap<(String, String), Ipv4Addr> = BTreeMap::new();
    for slice in slices {
        let (Some(service), Some(namespace)) = (slice.labels().get(SERVICE_NAME), slice.namespace()) else {
            continue;
        };
        let ready = slice
            .endpoints
            .iter()
            .flatten()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .flat_map(|e| e.addresses.iter())
            .filter_map(|a| a.parse::<Ipv4Addr>().ok())
            .min();
        if let Some(ip) = ready {
            let key = (service.clone(), namespace);
            let best = addresses.entry(key).or_insert(ip);
            *best = (*best).min(ip);
        }
    }
    let mut text = String::new();
    for ((service, namespace), ip) in addresses {
        for name in [
            format!("{service}.{namespace}.svc.{domain}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}"),
        ] {
            text.push_str(&format!("{name} {ip}\n"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

    use super::*;

    fn slice(namespace: &str, service: &str, endpoints: &[(&str, bool)]) -> EndpointSlice {
        let mut slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(
                endpoints
                    .iter()
                    .map(|(ip, ready)| Endpoint {
                        addresses: vec![ip.to_string()],
                        conditions: Some(EndpointConditions {
                            ready: Some(*ready),
                            ..EndpointConditions::default()
                        }),
                        ..Endpoint::default()
                    })
                    .collect(),
            ),
            ..EndpointSlice::default()
        };
        slice.metadata.namespace = Some(namespace.into());
        slice.metadata.labels = Some([(SERVICE_NAME.to_string(), service.to_string())].into());
        slice
    }

    #[test]
    fn a_service_resolves_to_its_first_ready_endpoint_in_every_form() {
        let slices = [
            slice(
                "ml",
                "echo",
                &[("10.244.0.9", true), ("10.244.0.3", false), ("10.244.1.2", true)],
            ),
            slice("ml", "down", &[("10.244.0.4", false)]),
        ];
        assert_eq!(
            hosts(&slices, "cluster.local"),
            "echo.ml.svc.cluster.local 10.244.0.9\necho.ml.svc 10.244.0.9\necho.ml 10.244.0.9\n"
        );
    }
}
