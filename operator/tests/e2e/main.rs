//! End-to-end tests of the operator and the Helm chart against a real
//! Kubernetes control plane on 127.0.0.1 (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, KWOK nodes; see e2e/cluster.sh),
//! with process-backed nodes (e2e/proc-node) whose pods really run this
//! checkout's `nereid-server` in network namespaces of their own, behind
//! kube-proxy's Services and CoreDNS's names, and an S3 endpoint (moto) for
//! model sources.
//!
//! The whole run happens inside a network namespace of its own: this binary
//! re-runs itself through e2e/netns.sh first (see [`netns`]), so every
//! address it or its cluster sends to is loopback or inside a namespace the
//! run made, and the machine's network is never touched.
//!
//! Mocks prove little about an operator: watch semantics, server-side apply,
//! CRD schemas and CEL, the scale subresource, garbage collection and HPAs
//! only behave truly on a real API server. So this suite installs the chart
//! with `helm` (its operator pods run on the process nodes, with the chart's
//! ServiceAccount and RBAC), drives it with `kubectl` as a user would, and asserts on
//! the objects and statuses the API server holds, and on the answers of the
//! servers in the pods it made.
//!
//! A custom harness (`harness = false`): one control plane is shared by every
//! scenario, started once and torn down at the end, also on failure. The
//! binaries come from `e2e/tools.sh` (NEREID_E2E_BIN, or its cache); the
//! pods' programs from this workspace (brought up to date by cargo first),
//! the ONNX Runtime library from ORT_DYLIB_PATH and moto from the Python
//! test environment (all set up by scripts/setup.sh). Without them the suite
//! says so and passes, unless NEREID_E2E=required (the README's test command
//! sets it, so CI cannot skip it). Arguments work like libtest's: a filter
//! runs the matching scenarios only (the chart and the operator are always
//! set up), and a filter that matches none starts nothing.

mod adapter_rules;
mod autoscaling;
mod chart;
mod cluster;
mod ensembles;
mod env;
mod examples;
mod gateway;
mod gpu;
mod inference;
mod kubectl;
mod leader;
mod lifecycle;
mod models;
mod netns;
mod openai;
mod operator;
mod process_node;
mod procfs;
mod rollout;
mod s3;
mod scale_to_zero;
mod scaling;
mod scoped;
mod scrape_cost;
mod services;
mod serving;
mod simple_model;
mod teardown;
mod traffic;
mod validation;
mod wait;
mod workspace;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cluster::{Cluster, Serving};
use crate::env::{Env, is_executable};

type Run = for<'a> fn(&'a Env) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

/// The scenarios, in the order they run. The leader scenario freezes the
/// leading operator and the scoped one stops the chart's, so they come last.
const SCENARIOS: &[(&str, Run)] = &[
    ("examples_become_ready_workloads", |env| Box::pin(examples::run(env))),
    ("gpu_models_schedule_onto_gpu_nodes_or_say_why_not", |env| {
        Box::pin(gpu::run(env))
    }),
    ("scale_subresource_and_hpa", |env| Box::pin(scaling::run(env))),
    ("spec_change_rolls_pods_and_delete_collects_garbage", |env| {
        Box::pin(lifecycle::run(env))
    }),
    ("cel_rejects_invalid_examples", |env| Box::pin(validation::run(env))),
    ("s3_model_serves_inference_from_process_pods", |env| {
        Box::pin(serving::run(env))
    }),
    ("broken_model_ends_load_failed_with_the_servers_reason", |env| {
        Box::pin(serving::load_failed(env))
    }),
    ("spec_change_rolls_serving_pods_with_no_failed_request", |env| {
        Box::pin(rollout::spec_change(env))
    }),
    ("deleted_pod_under_load_is_replaced_and_serves", |env| {
        Box::pin(rollout::pod_deletion(env))
    }),
    ("pods_listen_apart_behind_a_cluster_ip_and_its_dns_name", |env| {
        Box::pin(services::run(env))
    }),
    ("hpa_scales_on_queue_time_through_the_external_metrics_api", |env| {
        Box::pin(autoscaling::run(env))
    }),
    ("gateway_routes_each_request_to_a_ready_pod_of_its_model", |env| {
        Box::pin(gateway::run(env))
    }),
    ("a_model_at_zero_wakes_on_requests_through_the_gateway", |env| {
        Box::pin(scale_to_zero::run(env))
    }),
    (
        "openai_clients_get_the_same_streamed_text_from_a_pod_and_the_gateway",
        |env| Box::pin(openai::run(env)),
    ),
    ("model_ensembles_in_both_placements_serve_after_their_members", |env| {
        Box::pin(ensembles::run(env))
    }),
    ("kubectl_shows_readiness_reasons_urls_and_few_events", |env| {
        Box::pin(kubectl::run(env))
    }),
    ("process_node_reports_what_it_cannot_run", |env| {
        Box::pin(process_node::run(env))
    }),
    ("sigkilled_harness_leaves_no_process_behind", |env| {
        Box::pin(teardown::run(env))
    }),
    ("only_the_lease_holder_reconciles_and_a_standby_takes_over", |env| {
        Box::pin(leader::run(env))
    }),
    ("watch_namespaces_limit_the_operator_and_its_rights", |env| {
        Box::pin(scoped::run(env))
    }),
];

/// Measurements: they assert nothing about the product and run only when
/// the filter names them.
const MEASUREMENTS: &[(&str, Run)] = &[("measure_operator_scraping_20_pods", |env| {
    Box::pin(scrape_cost::run(env))
})];

/// The control plane binaries the suite needs.
const TOOLS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
    "helm",
    "kube-proxy",
    "coredns",
];

fn main() -> ExitCode {
    if let Some(dir) = std::env::var_os(teardown::CHILD_DIR) {
        let repo = repo();
        if !netns::inside() {
            return netns::enter(&repo);
        }
        return match tools(&repo) {
            Ok(bin) => teardown::child(&repo, &bin, Path::new(&dir)),
            Err(e) => {
                eprintln!("e2e kill probe: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if std::env::args().any(|a| a == "--list") {
        for (name, _) in SCENARIOS {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let mut selected: Vec<_> = SCENARIOS
        .iter()
        .filter(|(name, _)| filter.as_deref().is_none_or(|f| name.contains(f)))
        .collect();
    selected.extend(
        MEASUREMENTS
            .iter()
            .filter(|(name, _)| filter.as_deref().is_some_and(|f| name.contains(f))),
    );
    if selected.is_empty() {
        println!("running 0 tests (no e2e scenario matches the filter)");
        return ExitCode::SUCCESS;
    }
    let repo = repo();
    // Inside, the outer run has built the workspace already.
    let tools = tools(&repo)
        .and_then(|bin| Ok((bin, workspace::serving(&repo, !netns::inside())?)))
        .and_then(|found| netns::can_enter().map(|()| found));
    let (bin, serving) = match tools {
        Ok(found) => found,
        Err(why) if std::env::var("NEREID_E2E").as_deref() != Ok("required") => {
            println!(
                "e2e: skipped: {why:#}\n(run e2e/tools.sh once to build them; NEREID_E2E=required makes this a failure)"
            );
            return ExitCode::SUCCESS;
        }
        Err(why) => {
            eprintln!("e2e: {why:#}");
            return ExitCode::FAILURE;
        }
    };
    if !netns::inside() {
        return netns::enter(&repo);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let failed = runtime.block_on(run(repo, bin, serving, &selected));
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The workspace folder.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// Where the binaries are: NEREID_E2E_BIN, or e2e/tools.sh's cache when it is complete.
fn tools(repo: &Path) -> Result<PathBuf> {
    let bin = match std::env::var_os("NEREID_E2E_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => {
            let output = std::process::Command::new("bash")
                .arg(repo.join("e2e/tools.sh"))
                .arg("--installed")
                .output()
                .context("running e2e/tools.sh --installed")?;
            if !output.status.success() {
                bail!("the control plane binaries are not built");
            }
            PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        }
    };
    for tool in TOOLS {
        if !is_executable(&bin.join(tool)) {
            bail!("{tool} is missing from {}", bin.display());
        }
    }
    Ok(bin)
}

/// Starts the cluster, sets up the chart and the operator, runs `selected`;
/// returns how many failed.
async fn run(repo: PathBuf, bin: PathBuf, serving: Serving, selected: &[&(&str, Run)]) -> usize {
    let dir = std::env::temp_dir().join(format!("nereid-e2e-{}", std::process::id()));
    println!(
        "running {} e2e scenarios (control plane in {})",
        selected.len(),
        dir.display()
    );
    let started = Instant::now();
    let setup = async {
        let cluster = Cluster::start(&repo, &bin, &dir, &serving)?;
        println!("e2e: control plane up in {:.1}s", started.elapsed().as_secs_f64());
        let env = Env::new(repo.clone(), bin.clone(), cluster).await?;
        chart::install(&env).await.context("setting up the chart")?;
        chart::operator_leads(&env).await.context("the chart's operator pods")?;
        anyhow::Ok(env)
    };
    let env = match setup.await {
        Ok(env) => env,
        Err(e) => {
            println!("test e2e setup ... FAILED\n{e:#}");
            return selected.len();
        }
    };
    println!("test chart_lints_renders_and_installs ... ok");
    let mut failed = Vec::new();
    for (name, scenario) in selected {
        let at = Instant::now();
        match scenario(&env).await {
            Ok(()) => println!("test {name} ... ok ({:.1}s)", at.elapsed().as_secs_f64()),
            Err(e) => {
                println!("test {name} ... FAILED ({:.1}s)\n{e:#}", at.elapsed().as_secs_f64());
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        print!("{}", operator::log_tails(&env, 40));
        println!(
            "failures: {failed:?}; the control plane's logs are in {}/logs",
            dir.display()
        );
    }
    let passed = selected.len() - failed.len();
    drop(env);
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!(
        "e2e result: {}. {passed} passed; {} failed; finished in {:.1}s",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    failed.len()
}
