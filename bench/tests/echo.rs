//! End to end: nereid-perf against nereid-echo on 127.0.0.1, over every
//! transport and both load modes. Each process is bounded in time and
//! killed by the test that started it (also when the test fails).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills and reaps the child when dropped, so a failing assertion does not
/// leave a server running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts nereid-echo on ports chosen by the OS; returns it with its
/// HTTP and gRPC addresses.
fn start_echo() -> (Running, String, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_nereid-echo"))
        .args(["--http-port", "0", "--grpc-port", "0", "--address", "127.0.0.1"])
        .args(["--input", "INPUT0:FP32:-1,16", "--output-name", "OUTPUT0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start nereid-echo");
    let mut echo = Running(child);
    let stdout = echo.0.stdout.take().expect("piped stdout");
    // The line is printed as soon as both ports are bound; reading it
    // blocks until then (or EOF if the process dies).
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            .to_string()
    };
    let (http, grpc) = (field("http="), field("grpc="));
    assert!(
        http.starts_with("127.0.0.1:") && grpc.starts_with("127.0.0.1:"),
        "{line}"
    );
    (echo, http, grpc)
}

/// Runs nereid-perf with `args` (killed after a deadline) and returns its
/// JSON rows.
fn perf(name: &str, url: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("perf-{name}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&json);
    let child = Command::new(env!("CARGO_BIN_EXE_nereid-perf"))
        .args([
            "-u",
            url,
            "-m",
            "echo",
            "--measurement-interval",
            "300",
            "--warmup",
            "100",
        ])
        .args(["--max-trials", "3", "--request-timeout-ms", "5000", "--json"])
        .arg(&json)
        .args(args)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start nereid-perf");
    let mut perf = Running(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = perf.0.try_wait().expect("wait for nereid-perf") {
            break status;
        }
        assert!(Instant::now() < deadline, "nereid-perf {name} did not finish in time");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "nereid-perf {name} failed: {status}");
    let text = std::fs::read_to_string(&json).expect("read the JSON output");
    let _ = std::fs::remove_file(&json);
    serde_json::from_str(&text).expect("JSON output parses")
}

fn assert_clean(name: &str, rows: &[serde_json::Value], levels: usize) {
    assert_eq!(rows.len(), levels, "{name}: {rows:?}");
    for row in rows {
        assert_eq!(row["errors"], 0, "{name}: {row}");
        assert!(row["throughput"].as_f64().unwrap() > 0.0, "{name}: {row}");
        assert!(
            row["p99_us"].as_u64().unwrap() >= row["p50_us"].as_u64().unwrap(),
            "{name}: {row}"
        );
    }
}

#[test]
fn http_binary_and_json() {
    let (_echo, http, _grpc) = start_echo();
    let rows = perf("http", &http, &["--protocol", "http", "--concurrency-range", "2"]);
    assert_clean("http", &rows, 1);
    assert_eq!(rows[0]["protocol"], "http");
    assert_eq!(rows[0]["mode"], "concurrency");
    assert_eq!(rows[0]["concurrency"], 2);

    let rows = perf(
        "http-json",
        &http,
        &[
            "--protocol",
            "http",
            "--http-json",
            "--concurrency-range",
            "2",
            "-b",
            "4",
        ],
    );
    assert_clean("http-json", &rows, 1);

    // Inputs from a file instead of generated ones.
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("inputs-{}.json", std::process::id()));
    let values: Vec<f32> = (0..16).map(|i| i as f32 / 2.0).collect();
    let file =
        serde_json::json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": values}]});
    std::fs::write(&data, file.to_string()).expect("write the input-data file");
    let data_arg = data.to_str().expect("UTF-8 path");
    let rows = perf(
        "http-file",
        &http,
        &["--input-data", data_arg, "--concurrency-range", "1"],
    );
    let _ = std::fs::remove_file(&data);
    assert_clean("http-file", &rows, 1);
}

#[test]
fn grpc_unary_and_streaming() {
    let (_echo, _http, grpc) = start_echo();
    let rows = perf("grpc", &grpc, &["--protocol", "grpc", "--concurrency-range", "2"]);
    assert_clean("grpc", &rows, 1);
    assert_eq!(rows[0]["protocol"], "grpc");

    let rows = perf(
        "grpc-stream",
        &grpc,
        &["--protocol", "grpc", "--streaming", "--concurrency-range", "1:2"],
    );
    assert_clean("grpc-stream", &rows, 2);
}

#[test]
fn open_loop_request_rate() {
    let (_echo, http, grpc) = start_echo();
    for (name, url, protocol) in [("rate-http", &http, "http"), ("rate-grpc", &grpc, "grpc")] {
        let rows = perf(name, url, &["--protocol", protocol, "--request-rate-range", "200"]);
        assert_clean(name, &rows, 1);
        assert_eq!(rows[0]["mode"], "request_rate");
        let throughput = rows[0]["throughput"].as_f64().unwrap();
        // An idle echo keeps up: the rate is what is delivered.
        assert!((150.0..250.0).contains(&throughput), "{name}: {throughput}");
    }
}
