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

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use nereid_operator::builders::service;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::env::Env;
use crate::inference;
use crate::wait::{self, LONG};

/// How much traffic, and of what kind.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Concurrent senders, each waiting for its answer before the next request.
    pub senders: usize,
    /// Each sender's pause between requests.
    pub pause: Duration,
    pub request: RequestKind,
}

#[derive(Clone, Copy, Debug)]
pub enum RequestKind {
    /// `inference::add_sub` (the `simple` example).
    AddSub,
    /// `inference::mlp` with this many rows (the `mlp_small` example).
    Mlp { rows: usize },
}

impl Load {
    /// A steady load that leaves the two cores to the servers and the control plane.
    pub const STEADY: Load = Load {
        senders: 2,
        pause: Duration::from_millis(20),
        request: RequestKind::AddSub,
    };
}
/// Failures kept verbatim for the report.
const KEPT_FAILURES: usize = 10;

/// What the traffic saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub ok: u64,
    pub failed: u64,
    /// The first failures, verbatim.
    pub failures: Vec<String>,
    /// Successful requests per pod (by name: a pod IP can be reused).
    pub served_by: BTreeMap<String, u64>,
}

impl Tally {
    /// Prints what the traffic saw `during` something, and fails unless
    /// every request was answered correctly (and some were).
    pub fn no_failures(&self, during: &str) -> Result<()> {
        println!(
            "e2e: during {during}: {} requests answered correctly, {} failed, by pod: {:?}",
            self.ok, self.failed, self.served_by
        );
        ensure!(
            self.failed == 0,
            "{} of {} requests failed during {during}; the first: {:#?}",
            self.failed,
            self.ok + self.failed,
            self.failures
        );
        ensure!(self.ok > 0, "no request was answered during {during}");
        Ok(())
    }
}

/// One ready endpoint of a Service's `http` port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub pod: String,
    pub ip: IpAddr,
    pub port: i32,
}

pub struct Traffic {
    stop: CancellationToken,
    senders: Vec<JoinHandle<()>>,
    watch: JoinHandle<()>,
    tally: Arc<Mutex<Tally>>,
}

impl Traffic {
    /// Starts sending [`Load::STEADY`] to the ready endpoints of `service`
    /// in `namespace` (its `http` port), once the endpoints are known.
    pub async fn start(env: &Env, namespace: &str, service: &str, model: &str) -> Result<Traffic> {
        Self::start_with(env, namespace, service, model, Load::STEADY).await
    }

    /// Starts sending `load`, as [`Traffic::start`] does.
    pub async fn start_with(env: &Env, namespace: &str, service: &str, model: &str, load: Load) -> Result<Traffic> {
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
        // A proxy with no endpoint refuses; so would the first requests here.
        wait::until("a ready endpoint to send to", LONG, || async {
            ensure!(
                !ready_endpoints(store.state().iter().map(|s| &**s)).is_empty(),
                "no ready endpoint yet"
            );
            Ok(())
        })
        .await?;
        let tally = Arc::new(Mutex::new(Tally::default()));
        let next = Arc::new(AtomicUsize::new(0));
        let senders = (0..load.senders)
            .map(|sender| {
                tokio::spawn(send(
                    load,
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
    pub async fn served_by(&self) -> BTreeMap<String, u64> {
        self.tally.lock().await.served_by.clone()
    }

    /// Stops sending and returns `error` with what the traffic saw, for a
    /// scenario that fails while the traffic runs.
    pub async fn fail(self, error: anyhow::Error) -> anyhow::Error {
        let tally = self.stop().await;
        error.context(format!(
            "traffic: {} ok, {} failed {:?}",
            tally.ok, tally.failed, tally.failures
        ))
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

/// The ready endpoints of `slices` on their `http` port, as a proxy would use them.
pub fn ready_endpoints<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> Vec<Endpoint> {
    let mut ready = Vec::new();
    for slice in slices {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(service::HTTP))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(true) {
                continue;
            }
            let pod = endpoint
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default();
            ready.extend(
                endpoint
                    .addresses
                    .iter()
                    .filter_map(|a| a.parse().ok())
                    .map(|ip| Endpoint {
                        pod: pod.clone(),
                        ip,
                        port,
                    }),
            );
        }
    }
    ready.sort();
    ready
}

async fn send(
    load: Load,
    store: reflector::Store<EndpointSlice>,
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
        let endpoints = ready_endpoints(store.state().iter().map(|s| &**s));
        let outcome = match endpoints.get(next.fetch_add(1, Ordering::Relaxed) % endpoints.len().max(1)) {
            Some(e) => match load.request {
                RequestKind::AddSub => inference::add_sub(&http, e.ip, e.port, &model, seed).await,
                RequestKind::Mlp { rows } => inference::mlp(&http, e.ip, e.port, &model, rows).await,
            }
            .map(|()| e.pod.clone()),
            None => Err(anyhow::anyhow!("no ready endpoint")),
        };
        {
            let mut tally = tally.lock().await;
            match outcome {
                Ok(pod) => {
                    tally.ok += 1;
                    *tally.served_by.entry(pod).or_default() += 1;
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
            () = tokio::time::sleep(load.pause) => {}
        }
    }
}
