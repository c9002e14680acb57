//! Dynamic batching through the real binary: batches form, every response
//! is its own request's, and requests' priority and timeout parameters are
//! checked. The queue's timing is tested on paused time in nereid-core.

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

/// The queue's timing (priority order, timeouts at their deadline, full
/// levels) is tested on paused time in nereid-core
/// (dynamic_batch_scheduler/paused_tests.rs), the test playing the
/// instance; here, through HTTP, what a request's `priority` and `timeout`
/// parameters may say.
#[tokio::test]
async fn priority_and_timeout_parameters_are_checked_as_triton_does() {
    let repo = scratch("queue-parameters");
    write_model(
        &repo,
        "prio",
        &identity("prio", 1, 0, "priority_levels: 2 default_priority_level: 2"),
    );
    write_model(
        &repo,
        "fixed",
        &identity(
            "fixed",
            1,
            0,
            "default_queue_policy { default_timeout_microseconds: 100000 }",
        ),
    );
    write_model(
        &repo,
        "overridable",
        &identity(
            "overridable",
            1,
            0,
            "default_queue_policy { allow_timeout_override: true timeout_action: REJECT }",
        ),
    );
    let server = TestServer::start(&repo, &[]);
    let url = |m: &str| format!("{}/v2/models/{m}/infer", server.http);

    for priority in [1, 2] {
        let (status, reply) = infer(&url("prio"), body(&[1.0], json!({ "priority": priority }))).await;
        assert_eq!(status, 200, "{reply}");
    }
    let (status, error) = infer(&url("prio"), body(&[1.0], json!({ "priority": 3 }))).await;
    assert_eq!(status, 400);
    assert!(
        error["error"].as_str().unwrap().contains("invalid priority 3"),
        "{error}"
    );
    // Overriding the timeout is refused where the policy does not allow it.
    let (status, error) = infer(&url("fixed"), body(&[3.0], json!({ "timeout": 5000 }))).await;
    assert_eq!(status, 400);
    assert!(
        error["error"].as_str().unwrap().contains("allow_timeout_override"),
        "{error}"
    );
    let (status, _) = infer(&url("overridable"), body(&[2.0], json!({ "timeout": 5000000 }))).await;
    assert_eq!(status, 200);
    for bad in [json!(-1), json!(86_400_000_000u64), json!("soon")] {
        let (status, error) = infer(&url("overridable"), body(&[2.0], json!({ "timeout": bad }))).await;
        assert_eq!(status, 400, "{error}");
        assert!(error["error"].as_str().unwrap().contains("timeout"), "{error}");
    }
    assert!(server.terminate().success());
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
