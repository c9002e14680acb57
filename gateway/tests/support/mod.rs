//! Real processes on loopback for the gateway's integration tests:
//! nereid-server pods serving a builtin identity model, and the gateway in
//! front of them with static endpoints; [`raw`]: clients that speak HTTP
//! by hand.

#![allow(dead_code)]

pub mod raw;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::inference::model_infer_request::InferInputTensor;
use nereid_proto::inference::{InferTensorContents, ModelInferRequest};
use tonic::transport::Channel;

/// The folder of the workspace's binaries, built first when this test runs
/// on its own (`cargo test -p nereid-gateway` builds the gateway only); under
/// the README's `cargo test --workspace` the build is a no-op.
pub fn binaries() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let dir = Path::new(env!("CARGO_BIN_EXE_nereid-gateway"))
        .parent()
        .unwrap()
        .to_path_buf();
    BUILT.call_once(|| {
        if let Some(cargo) = std::env::var_os("CARGO") {
            let status = Command::new(cargo)
                .args(["test", "--workspace", "--no-run", "--locked", "--quiet"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building the workspace's binaries failed");
        }
    });
    dir
}

/// A running process whose stderr is kept, killed when dropped.
pub struct Process {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Process {
    /// Starts `command` and waits for a line with every marker in `wanted`,
    /// returning what follows each marker up to the next space.
    fn start(mut command: Command, wanted: &[&'static str]) -> (Process, Vec<String>) {
        let mut child = command
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<(usize, String)>();
        let sink = Arc::clone(&log);
        let markers = wanted.to_vec();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                for (index, marker) in markers.iter().enumerate() {
                    if let Some(at) = line.find(marker) {
                        let value = line[at + marker.len()..].split_whitespace().next().unwrap_or("");
                        let _ = tx.send((index, value.to_string()));
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let mut found = vec![None; wanted.len()];
        while found.iter().any(Option::is_none) {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok((index, value)) => found[index] = Some(value),
                Err(_) => {
                    let _ = child.kill();
                    panic!("did not start in 60 s:\n{}", log.lock().unwrap().join("\n"));
                }
            }
        }
        (Process { child, log }, found.into_iter().map(Option::unwrap).collect())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, as the kubelet stops a pod, and the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal_term();
        self.wait_exit()
    }

    /// Sends SIGTERM and returns at once.
    pub fn signal_term(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits (blocking, up to 30 s) for the process to exit.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("did not exit within 30 s:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A nereid-server "pod" serving the builtin identity model `identity`
/// (FP32 [-1], one instance) that takes `delay_ms` per execution.
pub struct Pod {
    pub process: Process,
    pub http: String,
    pub grpc: String,
}

impl Pod {
    pub fn start(name: &str, delay_ms: u32) -> Pod {
        let repository = scratch(name);
        let model = repository.join("identity");
        std::fs::create_dir_all(model.join("1")).unwrap();
        std::fs::write(
            model.join("config.pbtxt"),
            format!(
                r#"name: "identity"
backend: "identity"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
"#
            ),
        )
        .unwrap();
        let mut command = Command::new(binaries().join("nereid-server"));
        command
            .arg("--model-repository")
            .arg(&repository)
            .args(["--http-address", "127.0.0.1", "--http-port", "0"])
            .args(["--grpc-address", "127.0.0.1", "--grpc-port", "0"])
            .args(["--metrics-address", "127.0.0.1", "--metrics-port", "0"])
            .args(["--exit-timeout-secs", "10"]);
        let (process, found) = Process::start(
            command,
            &["Started HTTPService at ", "Started GRPCInferenceService at "],
        );
        Pod {
            process,
            http: found[0].clone(),
            grpc: found[1].clone(),
        }
    }

    /// `--endpoint` for this pod as model `model`.
    pub fn endpoint(&self, model: &str) -> String {
        format!("{model}={},{}", self.http, self.grpc)
    }

    /// Inferences this pod has answered for `identity`.
    pub async fn inferences(&self) -> u64 {
        let stats: serde_json::Value = reqwest::get(format!("http://{}/v2/models/identity/stats", self.http))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        stats["model_stats"][0]["inference_count"].as_u64().unwrap()
    }
}

/// The gateway, with the endpoints given.
pub struct Gateway {
    pub process: Process,
    pub http: String,
    pub grpc: String,
    pub metrics: String,
}

impl Gateway {
    pub fn start(endpoints: &[String], extra: &[&str]) -> Gateway {
        let mut command = Command::new(binaries().join("nereid-gateway"));
        command.args([
            "--address",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ]);
        for endpoint in endpoints {
            command.args(["--endpoint", endpoint]);
        }
        command.args(extra);
        let (process, found) = Process::start(command, &["http=", "grpc=", "metrics="]);
        Gateway {
            process,
            http: found[0].clone(),
            grpc: found[1].clone(),
            metrics: found[2].clone(),
        }
    }

    /// One gRPC connection to the gateway (tonic's channel is one HTTP/2
    /// connection), as a client that balances nothing itself.
    pub async fn grpc_client(&self) -> GrpcInferenceServiceClient<Channel> {
        GrpcInferenceServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.metrics))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Polls the gateway's metrics (for up to about 20 s) until a line
    /// starting with `series` ends with `value`.
    pub async fn wait_for_metric(&self, series: &str, value: &str) {
        for _ in 0..400 {
            let metrics = self.metrics().await;
            if metrics.lines().any(|l| l.starts_with(series) && l.ends_with(value)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no {series}..{value} in\n{}", self.metrics().await);
    }
}

/// An identity request for `model` with `values`.
pub fn request(model: &str, values: &[f32]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.to_string(),
        id: format!("{}", values.first().copied().unwrap_or_default()),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![values.len() as i64],
            contents: Some(InferTensorContents {
                fp32_contents: values.to_vec(),
                ..InferTensorContents::default()
            }),
            ..InferInputTensor::default()
        }],
        ..ModelInferRequest::default()
    }
}

/// A fresh folder under the target directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/test-scratch/gateway")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
