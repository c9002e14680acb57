//! Starts the real `nereid-server` binary on ephemeral loopback ports and
//! stops it by PID when the test is done.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct TestServer {
    child: Child,
    pub http: String,
    pub grpc: String,
    /// The metrics endpoint's base URL, unless the test turned metrics off.
    pub metrics: Option<String>,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// The repository root (the workspace folder).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The ONNX Runtime library: `ORT_DYLIB_PATH`, else the one the setup script
/// installs into the repository's `.venv`.
pub fn onnxruntime_library() -> PathBuf {
    if let Ok(path) = std::env::var("ORT_DYLIB_PATH") {
        return PathBuf::from(path);
    }
    let lib = repo_root().join(".venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|pythons| {
        pythons.flatten().find_map(|python| {
            let capi = python.path().join("site-packages/onnxruntime/capi");
            std::fs::read_dir(capi).ok()?.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libonnxruntime.so."))
            })
        })
    });
    found.unwrap_or_else(|| {
        panic!(
            "no ONNX Runtime library: set ORT_DYLIB_PATH or run scripts/setup.sh (looked under {})",
            lib.display()
        )
    })
}

impl TestServer {
    pub fn start(repository: &Path, extra: &[&str]) -> TestServer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nereid-server"))
            .arg("--model-repository")
            .arg(repository)
            .args(["--http-address", "127.0.0.1", "--http-port", "0"])
            .args(["--grpc-address", "127.0.0.1", "--grpc-port", "0"])
            .args(["--metrics-address", "127.0.0.1", "--metrics-port", "0"])
            .args(["--exit-timeout-secs", "10"])
            .args(extra)
            .env("ORT_DYLIB_PATH", onnxruntime_library())
            // The log lines below are read: a developer's RUST_LOG must not hide them.
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the nereid-server binary starts");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<(String, String)>();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                for (marker, kind) in [
                    ("Started HTTPService at ", "http"),
                    ("Started GRPCInferenceService at ", "grpc"),
                    ("Started Metrics Service at ", "metrics"),
                ] {
                    if let Some(at) = line.find(marker) {
                        let addr = line[at + marker.len()..].trim().to_string();
                        let _ = tx.send((kind.to_string(), addr));
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        // The server logs the metrics address (when it serves metrics) before
        // the HTTP one, so it is known once both front ends are.
        let (mut http, mut grpc, mut metrics) = (None, None, None);
        while http.is_none() || grpc.is_none() {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok((kind, addr)) if kind == "http" => http = Some(addr),
                Ok((kind, addr)) if kind == "metrics" => metrics = Some(addr),
                Ok((_, addr)) => grpc = Some(addr),
                Err(_) => {
                    let _ = child.kill();
                    panic!("server did not start in 60 s:\n{}", log.lock().unwrap().join("\n"));
                }
            }
        }
        TestServer {
            child,
            http: format!("http://{}", http.unwrap()),
            grpc: format!("http://{}", grpc.unwrap()),
            metrics: metrics.map(|addr| format!("http://{addr}")),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        panic!(
            "server did not exit within 30 s of SIGTERM:\n{}",
            self.log.lock().unwrap().join("\n")
        );
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A fresh folder under the target directory for a test's repository, its
/// own even when tests of one binary (one process) run at once and ask for
/// the same name: one removing the other's folder made them fail at random.
pub fn scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = repo_root()
        .join("target/test-scratch")
        .join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a model folder with a config and an empty version 1.
pub fn write_model(repo: &Path, name: &str, config: &str) {
    std::fs::create_dir_all(repo.join(name).join("1")).unwrap();
    std::fs::write(repo.join(name).join("config.pbtxt"), config).unwrap();
}

/// GETs a URL and parses its JSON body.
pub async fn get_json(url: impl reqwest::IntoUrl) -> serde_json::Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// POSTs `body` as JSON to a URL and parses the JSON reply, whatever its status.
pub async fn post_json(url: impl reqwest::IntoUrl, body: &serde_json::Value) -> serde_json::Value {
    let client = reqwest::Client::new();
    client.post(url).json(body).send().await.unwrap().json().await.unwrap()
}
