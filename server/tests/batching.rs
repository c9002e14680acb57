//! Dynamic batching through the real binary: batches form, every response
//! is its own request's, priorities, timeouts and queue limits hold.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{TestServer, get_json, scratch, write_model};

/// A builtin identity model (FP32 [-1]) that takes `delay_ms` per execution.
fn identity(name: &str, max_batch: u32, delay_ms: u32, batching: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "identity"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
dynamic_batching {{ {batching} }}
"#
    )
}

fn body(values: &[f32], parameters: Value) -> Value {
    json!({
        "parameters": parameters,
        "inputs": [{"name": "INPUT0", "shape": [1, values.len()], "datatype": "FP32", "data": values}]
    })
}

async fn infer(url: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Polls the server's Prometheus endpoint until `gauge` of `model` reads
/// `expected`: a test orders its requests by what the server has seen, not
/// by sleeping and hoping.
async fn wait_for_gauge(server: &TestServer, gauge: &str, model: &str, expected: u64) {
    let url = format!("{}/metrics", server.metrics.as_deref().expect("metrics are served"));
    let series = format!("{gauge}{{model=\"{model}\",version=\"1\"}} ");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let client = reqwest::Client::new();
    loop {
        let text = client.get(&url).send().await.unwrap().text().await.unwrap();
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .and_then(|value| value.trim().parse::<f64>().ok());
        if value == Some(expected as f64) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series}never reached {expected} (last {value:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn stats(server: &TestServer, model: &str) -> Value {
    get_json(format!("{}/v2/models/{model}/stats", server.http)).await["model_stats"][0].clone()
}

#[tokio::test]
async fn concurrent_requests_run_as_batches_and_get_their_own_answers() {
    let repo = scratch("batching");
    write_model(
        &repo,
        "batched",
        &identity("batched", 8, 20, "max_queue_delay_microseconds: 20000"),
    );
    let server = TestServer::start(&repo, &[]);
    let url = format!("{}/v2/models/batched/infer", server.http);
    let mut tasks = Vec::new();
    for i in 0..32 {
        // Two shapes in the same burst: they must not share a batch.
        let values: Vec<f32> = (0..(3 + i % 2)).map(|j| (i * 10 + j) as f32).collect();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            (values.clone(), infer(&url, body(&values, json!({}))).await)
        }));
    }
    for task in tasks {
        let (values, (status, reply)) = task.await.unwrap();
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["outputs"][0]["data"], json!(values));
        assert_eq!(reply["outputs"][0]["shape"], json!([1, values.len()]));
    }
    let stats = stats(&server, "batched").await;
    let inferences = stats["inference_count"].as_u64().unwrap();
    let executions = stats["execution_count"].as_u64().unwrap();
    assert_eq!(inferences, 32);
    assert!(executions < inferences, "{stats}");
    assert!(
        stats["batch_stats"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["batch_size"].as_u64().unwrap() > 1)
    );
    assert_eq!(stats["inference_stats"]["success"]["count"], 32);
    assert!(server.terminate().success());
}

#[tokio::test]
async fn higher_priority_requests_are_served_first() {
    let repo = scratch("priorities");
    write_model(
        &repo,
        "prio",
        // The first execution must outlast four requests' arrival, each
        // waited for through /metrics: seconds on a loaded CI machine.
        &identity("prio", 1, 1500, "priority_levels: 2 default_priority_level: 2"),
    );
    let server = TestServer::start(&repo, &[]);
    let url = format!("{}/v2/models/prio/infer", server.http);
    // The first request occupies the only instance; the rest queue behind it.
    // Each send waits until the server has counted the previous one, so the
    // arrival order is the one written here however slow the machine is.
    let blocker = tokio::spawn({
        let url = url.clone();
        async move { infer(&url, body(&[0.0], json!({}))).await }
    });
    wait_for_gauge(&server, "nereid_inference_executing_request_count", "prio", 1).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, priority) in [2, 2, 1, 1].into_iter().enumerate() {
        let (url, tx) = (url.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let (status, _) = infer(&url, body(&[i as f32], json!({ "priority": priority }))).await;
            tx.send((i, priority, status)).unwrap();
        }));
        wait_for_gauge(&server, "nv_inference_pending_request_count", "prio", i as u64 + 1).await;
    }
    drop(tx);
    assert_eq!(blocker.await.unwrap().0, 200);
    let mut order = Vec::new();
    while let Some((i, priority, status)) = rx.recv().await {
        assert_eq!(status, 200);
        order.push((priority, i));
    }
    assert_eq!(order, vec![(1, 2), (1, 3), (2, 0), (2, 1)]);

    let (status, error) = infer(&url, body(&[1.0], json!({ "priority": 3 }))).await;
    assert_eq!(status, 400);
    assert!(
        error["error"].as_str().unwrap().contains("invalid priority 3"),
        "{error}"
    );
    assert!(server.terminate().success());
}

#[tokio::test]
async fn queue_timeouts_and_limits_are_honoured() {
    let repo = scratch("queue-policy");
    write_model(
        &repo,
        "timeouts",
        &identity(
            "timeouts",
            1,
            300,
            "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 }",
        ),
    );
    write_model(
        &repo,
        "bounded",
        &identity("bounded", 1, 1500, "default_queue_policy { max_queue_size: 2 }"),
    );
    write_model(
        &repo,
        "overridable",
        &identity(
            "overridable",
            1,
            300,
            "default_queue_policy { allow_timeout_override: true timeout_action: REJECT }",
        ),
    );
    let server = TestServer::start(&repo, &[]);
    let url = |m: &str| format!("{}/v2/models/{m}/infer", server.http);

    // A request queued behind a 300 ms execution outlives its 100 ms timeout.
    let blocker = tokio::spawn(infer_owned(url("timeouts"), body(&[1.0], json!({}))));
    wait_for_gauge(&server, "nereid_inference_executing_request_count", "timeouts", 1).await;
    let (status, error) = infer(&url("timeouts"), body(&[2.0], json!({}))).await;
    assert_eq!(status, 503, "{error}");
    assert_eq!(error["error"], "Request timeout expired");
    assert_eq!(blocker.await.unwrap().0, 200);
    // Overriding the timeout is refused where the policy does not allow it.
    let (status, error) = infer(&url("timeouts"), body(&[3.0], json!({ "timeout": 5000 }))).await;
    assert_eq!(status, 400);
    assert!(
        error["error"].as_str().unwrap().contains("allow_timeout_override"),
        "{error}"
    );
    // And allowed where it does: a short override expires, a long one does not.
    let blocker = tokio::spawn(infer_owned(url("overridable"), body(&[1.0], json!({}))));
    wait_for_gauge(&server, "nereid_inference_executing_request_count", "overridable", 1).await;
    let (status, error) = infer(&url("overridable"), body(&[2.0], json!({ "timeout": 50000 }))).await;
    assert_eq!(status, 503, "{error}");
    let (status, _) = infer(&url("overridable"), body(&[2.0], json!({ "timeout": 5000000 }))).await;
    assert_eq!(status, 200);
    assert_eq!(blocker.await.unwrap().0, 200);
    for bad in [json!(-1), json!(86_400_000_000u64), json!("soon")] {
        let (status, error) = infer(&url("overridable"), body(&[2.0], json!({ "timeout": bad }))).await;
        assert_eq!(status, 400, "{error}");
        assert!(error["error"].as_str().unwrap().contains("timeout"), "{error}");
    }

    // One executing and two queued fill the model; the next is refused at once.
    let mut accepted = Vec::new();
    accepted.push(tokio::spawn(infer_owned(url("bounded"), body(&[0.0], json!({})))));
    wait_for_gauge(&server, "nereid_inference_executing_request_count", "bounded", 1).await;
    for i in 1..3 {
        accepted.push(tokio::spawn(infer_owned(url("bounded"), body(&[i as f32], json!({})))));
        wait_for_gauge(&server, "nv_inference_pending_request_count", "bounded", i).await;
    }
    let (status, error) = infer(&url("bounded"), body(&[9.0], json!({}))).await;
    assert_eq!(status, 503, "{error}");
    assert_eq!(error["error"], "Exceeds maximum queue size");
    for (i, task) in accepted.into_iter().enumerate() {
        let (status, reply) = task.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(reply["outputs"][0]["data"], json!([i as f32]));
    }
    assert!(server.terminate().success());
}

async fn infer_owned(url: String, body: Value) -> (u16, Value) {
    infer(&url, body).await
}

/// Each answer tells how many requests of its model still wait in the
/// queue, the load signal nereid-gateway balances on.
#[tokio::test]
async fn answers_report_the_queue_depth_they_leave_behind() {
    let repo = scratch("queue-depth");
    write_model(
        &repo,
        "slow",
        r#"name: "slow"
backend: "identity"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "execute_delay_ms" value: { string_value: "150" } }
"#,
    );
    let server = TestServer::start(&repo, &[]);
    let url = format!("{}/v2/models/slow/infer", server.http);
    let depth_of = |url: String| async move {
        let body = json!({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]});
        let response = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let depth = response.headers()[nereid_proto::QUEUE_DEPTH_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        depth.parse::<u32>().unwrap()
    };
    // Four at once on one instance: the first answer leaves the others
    // waiting or executing, the last leaves an empty queue.
    let tasks: Vec<_> = (0..4).map(|_| tokio::spawn(depth_of(url.clone()))).collect();
    let mut depths = Vec::new();
    for task in tasks {
        depths.push(task.await.unwrap());
    }
    depths.sort_unstable();
    assert_eq!(depths[0], 0, "{depths:?}");
    assert!(depths[3] >= 1, "{depths:?}");
    assert!(server.terminate().success());
}
