//! What every scenario gets: the cluster, an admin client and the
//! command-line tools a user would run (`kubectl`, `helm`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cluster::Cluster;

/// The release and namespace the chart is installed as.
pub const RELEASE: &str = "nereid";
pub const OPERATOR_NAMESPACE: &str = "nereid-system";
/// The chart's operator Deployment (and Lease, and ClusterRole) for that release.
pub const OPERATOR_NAME: &str = "nereid-operator";
/// The image the operator is told to run models with: KWOK never pulls it,
/// and the process nodes run this checkout's binaries for it.
pub const SERVER_IMAGE: &str = "nereid-e2e:test";

pub struct Env {
    pub repo: PathBuf,
    pub bin: PathBuf,
    pub cluster: Cluster,
    /// Cluster admin, for looking at objects (the operator runs with its own rights).
    pub client: Client,
}

impl Env {
    pub async fn new(repo: PathBuf, bin: PathBuf, cluster: Cluster) -> Result<Env> {
        let kubeconfig = Kubeconfig::read_from(&cluster.kubeconfig).context("reading the kubeconfig")?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .context("the kubeconfig")?;
        let client = Client::try_from(config).context("the admin client")?;
        Ok(Env {
            repo,
            bin,
            cluster,
            client,
        })
    }

    /// A path in the repository.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.repo.join(relative)
    }

    /// Runs `kubectl` as cluster admin; its stdout, or an error with its stderr.
    pub async fn kubectl<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        checked(self.kubectl_output(args, None).await?)
    }

    /// `kubectl` with `stdin` as its input (for `apply -f -`).
    pub async fn kubectl_stdin<I, S>(&self, args: I, stdin: &str) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        checked(self.kubectl_output(args, Some(stdin)).await?)
    }

    /// `kubectl`'s whole output, failed or not.
    pub async fn kubectl_output<I, S>(&self, args: I, stdin: Option<&str>) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(self.bin.join("kubectl"));
        command.arg("--kubeconfig").arg(&self.cluster.kubeconfig).args(args);
        run(command, stdin).await
    }

    /// Runs `helm` against the cluster.
    pub async fn helm<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(self.bin.join("helm"));
        // Keep helm's caches and settings inside the cluster's folder.
        let home = self.cluster.dir.join("helm");
        command
            .env("KUBECONFIG", &self.cluster.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .args(args);
        checked(run(command, None).await?)
    }

    /// Creates `namespace` (idempotent) and waits for its default ServiceAccount,
    /// without which no pod can be created there. Every namespace enforces
    /// the restricted Pod Security Standard, so a serving pod (or the
    /// chart's operator pod) that asks for more than it needs is refused.
    pub async fn namespace(&self, namespace: &str) -> Result<()> {
        let yaml = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n    pod-security.kubernetes.io/enforce-version: latest\n"
        );
        self.kubectl_stdin(["apply", "-f", "-"], &yaml).await?;
        crate::wait::until("the default ServiceAccount", crate::wait::LONG, || async {
            self.kubectl(["get", "serviceaccount", "default", "-n", namespace])
                .await
        })
        .await?;
        Ok(())
    }

    /// Runs a client program with the test environment's Python (`args`:
    /// `-c SCRIPT` or a file, then its arguments), bounded by coreutils'
    /// `timeout`, never through a proxy; prints its stdout, or fails
    /// naming `what`, with its stderr.
    pub async fn python_client<I, S>(&self, what: &str, seconds: u32, args: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new("timeout");
        command
            .arg(seconds.to_string())
            .arg(self.path(".venv/bin/python"))
            .args(args)
            .env("NO_PROXY", "*");
        let output = run(command, None).await?;
        if !output.status.success() {
            bail!(
                "{what} failed ({}; 124 is the {seconds} s timeout):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        print!("e2e: {}", String::from_utf8_lossy(&output.stdout));
        Ok(())
    }

    /// A file for logs and scratch data in the cluster's folder.
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.cluster.dir.join(name)
    }
}

/// Runs `command` off the async threads, feeding it `stdin`.
pub async fn run(command: Command, stdin: Option<&str>) -> Result<Output> {
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || blocking_run(command, stdin.as_deref())).await?
}

/// Runs `command` to its end, feeding it `stdin`; its whole output.
pub fn blocking_run(mut command: Command, stdin: Option<&str>) -> Result<Output> {
    let shown = format!("{command:?}");
    let mut run = || {
        command
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            std::io::Write::write_all(&mut pipe, input.as_bytes())?;
        }
        child.wait_with_output()
    };
    run().with_context(|| format!("running {shown}"))
}

/// The stdout of a command that succeeded, or an error with its stderr.
pub fn checked(output: Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "exited with {}: {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            if stdout.is_empty() {
                String::new()
            } else {
                format!("\nstdout: {stdout}")
            }
        );
    }
    Ok(stdout)
}

/// Whether `path` names an executable regular file.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
