//! No path leaves a cluster behind: a harness killed with SIGKILL (no
//! destructor, no signal handler) takes its control plane, its process
//! nodes, their pods' servers, its S3 endpoint and every network namespace
//! it made (its own, with its bridges and veths, and its pods') with it
//! within a minute.
//!
//! The scenario runs this very binary as a second harness (a child in
//! [`child`] mode, with its own cluster in network namespaces of its own),
//! waits until a pod of it serves, kills it, and watches every process it
//! had started (by parentage, and any naming the child's folder) go away,
//! and every network namespace they were in or had pinned (`ip netns add`
//! pins a pod's with a mount) be held by nothing.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cluster::{self, Cluster};
use crate::env::{Env, SERVER_IMAGE};
use crate::netns;
use crate::procfs::{self, Process};

/// The variable that puts this binary in child mode, naming its folder.
pub const CHILD_DIR: &str = "NEREID_E2E_KILL_PROBE";
/// What the child prints once its pod serves.
const SERVING: &str = "serving";
/// How long everything may take to go once the harness is killed (the bar).
const GONE_WITHIN: Duration = Duration::from_secs(60);
/// The programs that must be running before the kill, and gone after it.
const PROGRAMS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "nereid-proc-node",
    "nereid-server",
    "moto_server",
    "kube-proxy",
    "coredns",
];

pub async fn run(env: &Env) -> Result<()> {
    let dir = env.scratch("kill-probe");
    std::fs::create_dir_all(&dir)?;
    let marker = dir.to_str().context("a UTF-8 path")?.to_string();
    let stderr = std::fs::File::create(dir.join("harness.log"))?;
    let mut child = netns::outside(&mut Command::new(std::env::current_exe()?))
        .env(CHILD_DIR, &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .context("starting the second harness")?;
    let lines = cluster::lines(child.stdout.take().context("its stdout")?);
    let started = tokio::task::spawn_blocking(move || {
        lines
            .recv_timeout(Duration::from_secs(180))
            .ok()
            .filter(|line| line == SERVING)
    })
    .await?;
    if started.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "the second harness did not get a pod serving; see {}/harness.log",
            dir.display()
        );
    }

    // Everything the second harness started, by parentage (its script, the
    // control plane, the S3 server, the process node and its pods' servers)
    // and anything else naming its folder.
    let child_pid = child.id();
    let mut running = procfs::descendants(child_pid);
    for process in procfs::naming(&marker) {
        if !running.contains(&process) {
            running.push(process);
        }
    }
    for program in PROGRAMS {
        ensure!(
            running.iter().any(|p| p.cmdline.contains(program)),
            "{program} is not among the second harness's processes: {running:#?}"
        );
    }
    // The network namespaces the second harness made: those its processes
    // are in (its own, its pods') and those pinned in its mount table, less
    // this run's (its mount table began as a copy of this one's).
    let ours: Vec<String> = procfs::net_namespace(std::process::id())
        .into_iter()
        .chain(procfs::pinned_net_namespaces(std::process::id()))
        .collect();
    let mut namespaces: Vec<String> = running
        .iter()
        .filter_map(|p| procfs::net_namespace(p.pid))
        .chain(procfs::pinned_net_namespaces(child.id()))
        .filter(|ns| !ours.contains(ns))
        .collect();
    namespaces.sort();
    namespaces.dedup();
    // Its own, and at least the serving pod's.
    ensure!(
        namespaces.len() >= 2,
        "the second harness made {namespaces:?}, not its own and its pod's"
    );
    child.kill().context("SIGKILL to the second harness")?;
    child.wait()?;
    let killed = Instant::now();
    loop {
        let left: Vec<&Process> = running.iter().filter(|p| p.alive()).collect();
        let held = procfs::net_namespace_holders(&namespaces);
        if left.is_empty() && held.is_empty() {
            println!(
                "e2e: the {} processes and {} network namespaces of a SIGKILLed harness were gone {:.1}s after the kill",
                running.len(),
                namespaces.len(),
                killed.elapsed().as_secs_f64()
            );
            let _ = std::fs::remove_dir_all(&dir);
            return Ok(());
        }
        if killed.elapsed() > GONE_WITHIN {
            bail!("{GONE_WITHIN:?} after SIGKILL, still there: {left:#?}; namespaces still held: {held:#?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The second harness: a cluster with process nodes, one serving pod, then
/// it waits to be killed (or gives up after a few minutes).
pub fn child(repo: &Path, bin: &Path, dir: &Path) -> ExitCode {
    match serve_until_killed(repo, bin, dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("e2e kill probe: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve_until_killed(repo: &Path, bin: &Path, dir: &Path) -> Result<()> {
    // The parent harness has built the workspace already.
    let serving = crate::workspace::serving(repo, false)?;
    let cluster = Cluster::start(repo, bin, dir, &serving)?;
    let kubectl = |args: &[&str], stdin: Option<&str>| -> Result<()> {
        let mut command = Command::new(bin.join("kubectl"));
        command.arg("--kubeconfig").arg(&cluster.kubeconfig).args(args);
        let output = crate::env::blocking_run(command, stdin)?;
        crate::env::checked(output).map(drop)
    };
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kill-probe\nspec:\n  nodeSelector:\n    \
         nereid.dev/process-node: \"true\"\n  tolerations:\n  - {{key: nereid.dev/process-node, operator: Exists}}\n  \
         containers:\n  - name: server\n    image: {SERVER_IMAGE}\n    \
         command: [nereid-server, --model-repository, /repo]\n    volumeMounts: [{{name: repo, mountPath: /repo}}]\n    \
         readinessProbe: {{httpGet: {{path: /v2/health/ready, port: 8000}}, periodSeconds: 1}}\n  \
         volumes: [{{name: repo, emptyDir: {{}}}}]\n"
    );
    kubectl(&["apply", "-f", "-"], Some(&pod))?;
    kubectl(
        &["wait", "--for=condition=Ready", "pod/kill-probe", "--timeout=120s"],
        None,
    )?;
    println!("{SERVING}");
    std::thread::sleep(Duration::from_secs(300));
    drop(cluster);
    bail!("nobody killed the second harness within 5 minutes")
}
