//! Continuous inference traffic to a model's ready endpoints, the way a
//! Service's proxy sends it: the client follows the model's EndpointSlices
//! (the real endpointslice controller's view of the pods' readiness, which
//! the process nodes' probes drive) and spreads requests over the endpoints
//! that are ready, so "zero failed requests" means the pods, the PDB and the
//! readiness signals did their part, not that the client was lenient.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::env::Env;
use crate::inference;

/// Concurrent senders, each pausing between requests: a steady load that
/// leaves the two cores to the servers and the control plane.
const SENDERS: usize = 2;
const PAUSE: Duration = Duration::from_millis(20);
/// Failures kept verbatim for the report.
const KEPT_FAILURES: usize = 10;

/// What the traffic saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub ok: u64,
    pub failed: u64,
    /// The first failures, verbatim.
    pub failures: Vec<String>,
    /// Successful requests per pod IP.
    pub served_by: BTreeMap<IpAddr, u64>,
}

pub struct Traffic {
    stop: CancellationToken,
    senders: Vec<JoinHandle<()>>,
    watch: JoinHandle<()>,
    tally: Arc<Mutex<Tally>>,
}

impl Traffic {
    /// Starts sending to the ready endpoints of `service` in `namespace`
    /// (its `http` port), once the endpoints are known.
    pub async fn start(env: &Env, namespace: &str, service: &str, model: &str) -> Result<Traffic> {
        let api: Api<EndpointSlice> = Api::namespaced(env.client.clone(), namespace);
        let config = watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
        let (store, writer) = reflector::store();
        let stop = CancellationToken::new();
        let watch = tokio::spawn({
            let stop = stop.clone();
            let stream = watcher(api, config).default_backoff().reflect(writer).applied_objects();
            async move {
                let mut stream = std::pin::pin!(stream);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        next = stream.next() => if next.is_none() { return },
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready())
            .await
            .context("the EndpointSlice watch did not sync within 30 s")??;
        let tally = Arc::new(Mutex::new(Tally::default()));
        let next = Arc::new(AtomicUsize::new(0));
        let senders = (0..SENDERS)
            .map(|sender| {
                tokio::spawn(send(
                    store.clone(),
                    model.to_string(),
                    Arc::clone(&next),
                    Arc::clone(&tally),
                    stop.clone(),
                    sender as i32,
                ))
            })
            .collect();
        Ok(Traffic {
            stop,
            senders,
            watch,
            tally,
        })
    }

    /// What has been seen so far.
    pub async fn served_by(&self) -> BTreeMap<IpAddr, u64> {
        self.tally.lock().await.served_by.clone()
    }

    /// Stops sending (requests in flight finish) and returns the tally.
    pub async fn stop(self) -> Tally {
        self.stop.cancel();
        for sender in self.senders {
            let _ = sender.await;
        }
        let _ = self.watch.await;
        std::mem::take(&mut *self.tally.lock().await)
    }
}

/// The ready endpoints' addresses and `http` ports, as a proxy would use them.
fn ready_endpoints(store: &Store<EndpointSlice>) -> Vec<(IpAddr, i32)> {
    let mut ready = Vec::new();
    for slice in store.state() {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("http"))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(true) {
                continue;
            }
            ready.extend(
                endpoint
                    .addresses
                    .iter()
                    .filter_map(|a| a.parse().ok())
                    .map(|ip| (ip, port)),
            );
        }
    }
    ready.sort();
    ready
}

async fn send(
    store: Store<EndpointSlice>,
    model: String,
    next: Arc<AtomicUsize>,
    tally: Arc<Mutex<Tally>>,
    stop: CancellationToken,
    sender: i32,
) {
    let http = inference::client();
    let mut seed = sender * 100_000;
    while !stop.is_cancelled() {
        seed += 1;
        let endpoints = ready_endpoints(&store);
        let outcome = match endpoints.get(next.fetch_add(1, Ordering::Relaxed) % endpoints.len().max(1)) {
            Some(&(ip, port)) => inference::add_sub(&http, ip, port, &model, seed).await.map(|()| ip),
            None => Err(anyhow::anyhow!("no ready endpoint")),
        };
        {
            let mut tally = tally.lock().await;
            match outcome {
                Ok(ip) => {
                    tally.ok += 1;
                    *tally.served_by.entry(ip).or_default() += 1;
                }
                Err(e) => {
                    tally.failed += 1;
                    if tally.failures.len() < KEPT_FAILURES {
                        tally.failures.push(format!("{e:#}"));
                    }
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(PAUSE) => {}
        }
    }
}
