//! The control plane under test: `e2e/cluster.sh` as a child process.
//!
//! The script owns the component processes (the process nodes' pods and the
//! S3 endpoint included) and tears them down when its stdin closes; dropping
//! [`Cluster`] closes it, and the operating system closes it too when this
//! harness dies, so no path leaves a cluster behind.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long the control plane may take to come up (etcd, the API server,
/// the controllers, KWOK and its nodes).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long teardown may take before the script is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// What runs the pods that really serve, and the S3 endpoint they fetch from.
pub struct Serving {
    /// Where `nereid-proc-node`, `nereid-server` and `nereid-fetch` are.
    pub workspace_bin: PathBuf,
    /// moto's S3 server.
    pub moto: PathBuf,
    /// The process nodes' pod range (a /16, in the run's own network namespace).
    pub pod_cidr: &'static str,
}

pub struct Cluster {
    script: Child,
    stdin: Option<ChildStdin>,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    /// The S3 endpoint, on proc-0's address so that pods reach it too
    /// (`http://10.244.0.1:PORT`).
    pub s3_endpoint: String,
}

impl Cluster {
    /// Starts the control plane in `dir` with the binaries of `bin`, and
    /// with `serving` the process nodes and the S3 endpoint.
    pub fn start(repo: &Path, bin: &Path, dir: &Path, serving: &Serving) -> Result<Cluster> {
        let mut script = Command::new("bash")
            .arg(repo.join("e2e/cluster.sh"))
            .arg(dir)
            .env("NEREID_E2E_BIN", bin)
            .env("NEREID_PROC_NODE_BIN", serving.workspace_bin.join("nereid-proc-node"))
            .env("NEREID_IMAGE_BIN_DIR", &serving.workspace_bin)
            .env("NEREID_POD_CIDR", serving.pod_cidr)
            .env("NEREID_MOTO_SERVER", &serving.moto)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting e2e/cluster.sh")?;
        let stdin = script.stdin.take();
        let stdout = script.stdout.take().context("the script's stdout")?;
        let mut cluster = Cluster {
            script,
            stdin,
            dir: dir.to_path_buf(),
            kubeconfig: PathBuf::new(),
            s3_endpoint: String::new(),
        };
        let lines = lines(stdout);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(kubeconfig) = line.strip_prefix("ready ") {
                        cluster.kubeconfig = PathBuf::from(kubeconfig);
                        let endpoint = std::fs::read_to_string(dir.join("s3-endpoint"))
                            .context("the S3 endpoint e2e/cluster.sh should have written")?;
                        cluster.s3_endpoint = endpoint.trim().to_string();
                        return Ok(cluster);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("the control plane did not come up within {START_TIMEOUT:?}; logs in {dir:?}/logs")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("e2e/cluster.sh exited before the control plane was ready; logs in {dir:?}/logs")
                }
            }
        }
    }
}

/// The lines `output` writes, read on a thread of their own so that a wait
/// for them can be bounded (`recv_timeout`).
pub fn lines(output: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // EOF on the script's stdin is its signal to tear down.
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.script.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("e2e: the control plane did not stop within {STOP_TIMEOUT:?}; killing its script");
        let _ = self.script.kill();
        let _ = self.script.wait();
    }
}
