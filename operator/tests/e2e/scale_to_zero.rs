//! Issue 46's scale to zero on the real control plane: a model with
//! `minReplicas: 0` and a 10 s `scaleToZeroAfter` reaches zero pods once
//! quiet (a ScaledToZero condition, KEDA's IsActive false); 50 concurrent
//! requests through the chart's gateway, half gRPC and half HTTP, are held
//! while it wakes (IsActive true meanwhile) and all answered, with the cold
//! start's p50 and max printed; asleep again, of a flood of 10,000
//! requests no more than the gateway's bound are held at once and those
//! over it are refused at once as "waking up", while the gateway's memory
//! stays under its documented bound and another model keeps answering.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use nereid_operator::builders::{labels, service};
use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::keda::ScaledObjectRef;
use tonic::transport::Channel;

use crate::env::Env;
use crate::models::{self, ON_PROCESS_NODES, SMALL_CPU};
use crate::simple_model::{self, BUCKET, NAMESPACE};
use crate::{gateway, inference, operator, procfs, wait};

const MODEL: &str = "sleeper";
/// Short, so that the scenario sleeps twice in seconds.
const QUIET_SECS: u64 = 10;
/// Requests of the first wake-up: half over gRPC, half over HTTP.
const CONCURRENT: usize = 50;
/// The flood, on this many gRPC connections.
const FLOOD: usize = 10_000;
const FLOOD_CONNECTIONS: usize = 10;
/// The chart's default `gateway.maxHeldRequestsPerModel`.
const MAX_HELD: usize = 1000;
/// The gateway's resident memory bound during the flood, as
/// docs/hardening.md states it.
const GATEWAY_RSS_BOUND_MIB: u64 = 256;

pub async fn run(env: &Env) -> Result<()> {
    // `simple` is the other model, which must keep answering meanwhile.
    simple_model::deployed(env).await?;
    simple_model::upload_as(env, MODEL).await?;
    let source = format!("    uri: s3://{BUCKET}/{MODEL}\n    credentialsSecret: s3-credentials\n");
    let autoscaling = format!(
        "  autoscaling:\n    minReplicas: 0\n    maxReplicas: 2\n    metric: pendingRequests\n    target: \"100\"\n    \
         scaleToZeroAfter: {QUIET_SECS}s\n    activationTimeout: 90s\n"
    );
    let manifest = models::manifest_of(
        MODEL,
        1,
        &source,
        SMALL_CPU,
        &format!("{ON_PROCESS_NODES}{autoscaling}"),
    );
    models::apply(env, NAMESPACE, &manifest).await?;
    models::ready(env, NAMESPACE, MODEL, 1).await?;
    let gateway = gateway::pod_ip(env).await?;

    let result = async {
        let slept = asleep(env).await?;
        println!("e2e: {MODEL} scaled to zero {slept:.1?} after it was ready ({QUIET_SECS} s window)");
        ensure!(!keda_active(env).await?, "KEDA is told a sleeping model is active");
        service_refuses(env).await?;
        wake_with_concurrent_requests(env, gateway).await?;
        let slept = asleep(env).await?;
        println!("e2e: {MODEL} asleep again {slept:.1?} after its last request");
        flood(gateway).await
    }
    .await;
    env.kubectl(["delete", "nmodel", MODEL, "-n", NAMESPACE, "--wait=false"])
        .await?;
    result
}

/// Waits for `spec.replicas` 0, the ScaledToZero condition and no pod at
/// all, the last one done draining; how long it took.
async fn asleep(env: &Env) -> Result<Duration> {
    let started = Instant::now();
    let all_pods = Api::<Pod>::namespaced(env.client.clone(), NAMESPACE);
    let selector = format!("{}={MODEL}", labels::MODEL);
    wait::until("the model to scale to zero", Duration::from_secs(120), || async {
        let model = models::get(env, NAMESPACE, MODEL).await?;
        let pods = all_pods.list(&ListParams::default().labels(&selector)).await?.items;
        let condition = models::condition(&model, "ScaledToZero").map(|c| (c.status.clone(), c.reason.clone()));
        ensure!(
            model.spec.replicas == Some(0) && pods.is_empty() && condition.as_ref().is_some_and(|(s, _)| s == "True"),
            "spec.replicas {:?}, {} pods, ScaledToZero {condition:?}",
            model.spec.replicas,
            pods.len()
        );
        Ok(())
    })
    .await?;
    Ok(started.elapsed())
}

/// A client calling the sleeping model's own Service, not the gateway, is
/// refused at once (kube-proxy rejects a Service with no endpoint), not
/// left hanging.
async fn service_refuses(env: &Env) -> Result<()> {
    let cluster_ip = models::cluster_ip(env, NAMESPACE, MODEL).await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?;
    let port = service::ports(&models::get(env, NAMESPACE, MODEL).await?).http;
    let started = Instant::now();
    let answer = http
        .get(format!("http://{cluster_ip}:{port}/v2/models/{MODEL}/ready"))
        .send()
        .await;
    match answer {
        Err(error) if error.is_connect() => {
            println!(
                "e2e: the sleeping model's own Service refused the connection in {:.0?}",
                started.elapsed()
            );
            Ok(())
        }
        other => {
            let slices = env
                .kubectl([
                    "get",
                    "endpointslices",
                    "-n",
                    NAMESPACE,
                    "-l",
                    &format!("kubernetes.io/service-name={MODEL}"),
                    "-o",
                    "yaml",
                ])
                .await?;
            let replicas = models::get(env, NAMESPACE, MODEL).await?.spec.replicas;
            bail!(
                "a call to the sleeping model's Service {cluster_ip} got {other:?}, not a refusal; \
                 spec.replicas now {replicas:?}; its EndpointSlices: {slices}"
            )
        }
    }
}

/// KEDA's IsActive for the model, asked of an operator pod as KEDA asks.
async fn keda_active(env: &Env) -> Result<bool> {
    let (_, mut client) = operator::keda_scaler(env).await?;
    let scaled = ScaledObjectRef {
        name: MODEL.into(),
        namespace: NAMESPACE.into(),
        scaler_metadata: [("metric".to_string(), "pendingRequests".to_string())].into(),
    };
    Ok(client.is_active(scaled).await?.into_inner().result)
}

async fn grpc(gateway: IpAddr) -> Result<GrpcInferenceServiceClient<Channel>> {
    let channel = Channel::from_shared(format!("http://{gateway}:8001"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .context("connecting to the gateway's gRPC port")?;
    Ok(GrpcInferenceServiceClient::new(channel))
}

/// 50 requests at once to the sleeping model through the gateway: every one
/// answered, KEDA told the model is active while they wait, and the cold
/// start's figures printed.
async fn wake_with_concurrent_requests(env: &Env, gateway: IpAddr) -> Result<()> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()?;
    let client = grpc(gateway).await?;
    let base = format!("http://{gateway}:8000");
    let requests = (0..CONCURRENT).map(|i| {
        let (http, mut client, base) = (http.clone(), client.clone(), base.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let seed = i as i32;
            let answered = if i % 2 == 0 {
                gateway::add_sub(&mut client, MODEL, seed).await.map(|_| ())
            } else {
                inference::add_sub_at(&http, &base, MODEL, seed).await
            };
            answered.map(|()| started.elapsed())
        })
    });
    let requests: Vec<_> = requests.collect();
    // While they are held: KEDA must hear the model is active.
    wait::until(
        "KEDA's IsActive to be true while requests wait",
        Duration::from_secs(60),
        || async {
            ensure!(keda_active(env).await?, "IsActive false");
            Ok(())
        },
    )
    .await?;
    let mut latencies = Vec::new();
    for request in requests {
        latencies.push(request.await?.context("a request held while the model woke")?);
    }
    latencies.sort();
    println!(
        "e2e: {CONCURRENT} concurrent requests (gRPC and HTTP) to a model at zero, all answered: cold start p50 {:.2?}, \
         max {:.2?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    let metrics = http
        .get(format!("http://{gateway}:8002/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let label = format!("model=\"{NAMESPACE}/{MODEL}\"");
    let sample = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    ensure!(
        sample("nereid_gateway_activations_total") >= 1.0,
        "no activation counted"
    );
    ensure!(
        sample("nereid_gateway_cold_start_seconds_count") >= CONCURRENT as f64 / 2.0,
        "cold starts counted: {}",
        sample("nereid_gateway_cold_start_seconds_count")
    );
    let events = env
        .kubectl([
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            &format!("involvedObject.name={MODEL}"),
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .await?;
    ensure!(
        events.contains("ScaledToZero") && events.contains("Activated"),
        "events of {MODEL}: {events}"
    );
    Ok(())
}

/// How one request of the flood ended.
enum Outcome {
    Answered,
    /// Over the held bound, or past the activation timeout.
    Waking,
    /// Sent once the model was awake, past its pod's streams.
    PodStreams,
    /// Past the awake pod's queue.
    PodQueue,
    Failed(String),
}

/// 10,000 requests at once to the sleeping model: at most the held bound is
/// held at once, those over it are refused at once as waking up; the
/// gateway's memory stays under its bound and `simple` answers throughout.
///
/// On two cores the harness takes longer to send them all than the model
/// (probed every second) takes to wake: those sent once it is awake go to
/// its one pod, which takes 4 x 1024 streams from the gateway
/// (`--max-pod-connections`); past that they are refused as such, another
/// documented bound, not a failure. The held requests, released together
/// when it wakes, may also meet the pod's own queue (256 jobs per instance
/// without a batcher): refused as "Exceeds maximum queue size", a third
/// documented bound.
async fn flood(gateway: IpAddr) -> Result<()> {
    let mut clients = Vec::new();
    for _ in 0..FLOOD_CONNECTIONS {
        clients.push(grpc(gateway).await?);
    }
    let requests: Vec<_> = (0..FLOOD)
        .map(|i| {
            let mut client = clients[i % FLOOD_CONNECTIONS].clone();
            tokio::spawn(async move {
                match gateway::add_sub(&mut client, MODEL, i as i32).await {
                    Ok(_) => Outcome::Answered,
                    Err(error) => match error.downcast_ref::<tonic::Status>() {
                        Some(s) if s.code() == tonic::Code::Unavailable && s.message().contains("waking up") => {
                            Outcome::Waking
                        }
                        Some(s)
                            if s.code() == tonic::Code::Unavailable
                                && s.message().contains("--max-pod-connections") =>
                        {
                            Outcome::PodStreams
                        }
                        Some(s)
                            if s.code() == tonic::Code::Unavailable && s.message() == "Exceeds maximum queue size" =>
                        {
                            Outcome::PodQueue
                        }
                        _ => Outcome::Failed(format!("{error:#}")),
                    },
                }
            })
        })
        .collect();
    // Meanwhile: the gateway's memory and its held requests, and another
    // model through it.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let done = Arc::clone(&done);
        async move {
            let (mut peak_kib, mut peak_held) = (0, 0.0f64);
            let http = inference::client();
            let held_series = format!("nereid_gateway_held_requests{{model=\"{NAMESPACE}/{MODEL}\"}}");
            while !done.load(Ordering::Relaxed) {
                // The gateway's own processes, not those naming it (the
                // operator's --gateway-url).
                let gateways = procfs::naming("nereid-gateway").into_iter().filter(|p| {
                    p.cmdline
                        .split(' ')
                        .next()
                        .is_some_and(|exe| exe.ends_with("nereid-gateway"))
                });
                for process in gateways {
                    if let Some((rss, _)) = procfs::memory_kib(process.pid) {
                        peak_kib = peak_kib.max(rss);
                    }
                }
                let metrics = http.get(format!("http://{gateway}:8002/metrics")).send().await;
                if let Ok(text) = async { metrics?.text().await }.await {
                    let held = text
                        .lines()
                        .find_map(|l| l.strip_prefix(&held_series)?.trim().parse::<f64>().ok());
                    peak_held = peak_held.max(held.unwrap_or(0.0));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (peak_kib, peak_held)
        }
    });
    let http = inference::client();
    let mut other = Vec::new();
    for seed in 0..20 {
        let started = Instant::now();
        inference::add_sub_at(&http, &format!("http://{gateway}:8000"), simple_model::MODEL, seed)
            .await
            .context("the other model, during the flood")?;
        other.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    other.sort();
    let (mut ok, mut waking, mut pod_streams, mut pod_queue, mut others) = (0, 0, 0, 0, Vec::new());
    for request in requests {
        match request.await? {
            Outcome::Answered => ok += 1,
            Outcome::Waking => waking += 1,
            Outcome::PodStreams => pod_streams += 1,
            Outcome::PodQueue => pod_queue += 1,
            Outcome::Failed(error) => others.push(error),
        }
    }
    done.store(true, Ordering::Relaxed);
    let (peak_kib, peak_held) = watcher.await?;
    println!(
        "e2e: flood of {FLOOD} requests to a model at zero: {ok} answered (held, or sent once it was awake), \
         {waking} refused as waking up, {pod_streams} refused at the awake pod's stream limit, \
         {pod_queue} at its queue limit, {} otherwise; \
         at most {peak_held} held at once (seen every 50 ms); gateway RSS peak {} MiB; {} answered meanwhile \
         in {:.1?} at p50, {:.1?} at most",
        others.len(),
        peak_kib / 1024,
        simple_model::MODEL,
        other[other.len() / 2],
        other[other.len() - 1]
    );
    if !others.is_empty() {
        bail!(
            "{} requests failed otherwise, e.g. {:?}",
            others.len(),
            &others[..others.len().min(3)]
        );
    }
    ensure!(
        ok + waking + pod_streams + pod_queue == FLOOD,
        "{ok} + {waking} + {pod_streams} + {pod_queue} of {FLOOD}"
    );
    ensure!(
        ok > 0 && waking > 0,
        "{ok} answered, {waking} refused: the bound should do both"
    );
    ensure!(
        peak_held > 0.0 && peak_held <= MAX_HELD as f64,
        "{peak_held} requests held at once; the bound is {MAX_HELD}"
    );
    ensure!(peak_kib > 0, "no gateway process was found to measure");
    ensure!(
        peak_kib / 1024 < GATEWAY_RSS_BOUND_MIB,
        "gateway RSS peaked at {} MiB, over its {GATEWAY_RSS_BOUND_MIB} MiB bound",
        peak_kib / 1024
    );
    Ok(())
}
