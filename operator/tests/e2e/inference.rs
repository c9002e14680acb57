//! Real inference against a serving pod: KServe v2 over HTTP on the pod's
//! IP, with the `simple` example model (Triton's add/sub), and every answer
//! checked against the arithmetic.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

/// The example model every serving scenario uses: OUTPUT0 = INPUT0 + INPUT1,
/// OUTPUT1 = INPUT0 - INPUT1, INT32 [16], batched.
pub const MODEL_FOLDER: &str = "examples/models/simple";

/// A client for pods: no proxy, a bound on every request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a reqwest client")
}

/// Infers with `model` (served from the `simple` example) at `ip:port`,
/// inputs derived from `seed`, and checks both outputs.
pub async fn add_sub(http: &reqwest::Client, ip: IpAddr, port: i32, model: &str, seed: i32) -> Result<()> {
    add_sub_at(http, &format!("http://{ip}:{port}"), model, seed).await
}

/// [`add_sub`] against any KServe v2 base URL (a pod, or a proxy's prefix).
pub async fn add_sub_at(http: &reqwest::Client, base: &str, model: &str, seed: i32) -> Result<()> {
    let a: Vec<i32> = (0..16).map(|i| seed.wrapping_mul(31).wrapping_add(i)).collect();
    let b: Vec<i32> = (0..16).map(|i| i * 7 - seed % 1000).collect();
    let request = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b},
        ]
    });
    let (url, body) = infer(http, base, model, &request).await?;
    let output = |name: &str| -> Result<Vec<i64>> {
        let tensor = body["outputs"]
            .as_array()
            .and_then(|outputs| outputs.iter().find(|o| o["name"] == name))
            .with_context(|| format!("no {name} in {body}"))?;
        ensure!(
            tensor["datatype"] == "INT32" && tensor["shape"] == json!([1, 16]),
            "{name}: {tensor}"
        );
        tensor["data"]
            .as_array()
            .context("data")?
            .iter()
            .map(|v| v.as_i64().context("an integer"))
            .collect()
    };
    let sum: Vec<i64> = a.iter().zip(&b).map(|(x, y)| i64::from(x.wrapping_add(*y))).collect();
    let difference: Vec<i64> = a.iter().zip(&b).map(|(x, y)| i64::from(x.wrapping_sub(*y))).collect();
    ensure!(
        output("OUTPUT0")? == sum,
        "OUTPUT0 of {url} is not INPUT0 + INPUT1: {body}"
    );
    ensure!(
        output("OUTPUT1")? == difference,
        "OUTPUT1 of {url} is not INPUT0 - INPUT1: {body}"
    );
    Ok(())
}

/// POSTs `request` to `model`'s infer endpoint under `base`; returns the
/// URL and the answer, which must be a success.
async fn infer(http: &reqwest::Client, base: &str, model: &str, request: &Value) -> Result<(String, Value)> {
    let url = format!("{base}/v2/models/{model}/infer");
    let response = http
        .post(&url)
        .json(request)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let body: Value = response.json().await.with_context(|| format!("the answer of {url}"))?;
    ensure!(status.is_success(), "POST {url}: {status}: {body}");
    Ok((url, body))
}

/// How many requests for `model` the server at `ip:metrics_port` has served
/// (its `nv_inference_request_success`, under Triton's name).
pub async fn requests_served(http: &reqwest::Client, ip: IpAddr, metrics_port: i32, model: &str) -> Result<f64> {
    let url = format!("http://{ip}:{metrics_port}/metrics");
    let text = http.get(&url).send().await?.error_for_status()?.text().await?;
    text.lines()
        .find(|l| l.starts_with("nv_inference_request_success{") && l.contains(&format!("model=\"{model}\"")))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .with_context(|| format!("no nv_inference_request_success for {model} at {url}"))
}

/// `examples/models/mlp_small`: FP32 [256] in, [256] out, batched.
pub const MLP_FOLDER: &str = "examples/models/mlp_small";

/// Infers with `model` (served from `mlp_small`) at `ip:port`, `rows` rows
/// at once, and checks the answer's shape and that every value is finite.
pub async fn mlp(http: &reqwest::Client, ip: IpAddr, port: i32, model: &str, rows: usize) -> Result<()> {
    let data: Vec<f32> = (0..rows * 256).map(|i| (i % 17) as f32 / 17.0).collect();
    let request = json!({
        "inputs": [{"name": "INPUT0", "shape": [rows, 256], "datatype": "FP32", "data": data}]
    });
    let (url, body) = infer(http, &format!("http://{ip}:{port}"), model, &request).await?;
    let output = &body["outputs"][0];
    ensure!(
        output["name"] == "OUTPUT0" && output["datatype"] == "FP32" && output["shape"] == json!([rows, 256]),
        "{url}: unexpected output {}",
        output["shape"]
    );
    let values = output["data"].as_array().context("OUTPUT0 data")?;
    ensure!(
        values.len() == rows * 256 && values.iter().all(|v| v.as_f64().is_some_and(f64::is_finite)),
        "{url}: OUTPUT0 is not {rows}x256 finite numbers"
    );
    Ok(())
}
