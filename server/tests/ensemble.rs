//! Ensembles through the real binary: the DAG answers with its members'
//! arithmetic, independent steps run at once, a member batches the
//! ensemble's requests with its direct callers', remote steps run in another
//! server process, and every bad ensemble or failing step is a clear error
//! that names the step while the other models keep serving.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{TestServer, get_json, scratch, write_model};

/// `add_sub` over FP32 [4]: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.
const ADD_SUB: &str = r#"name: "addsub"
backend: "add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"#;

/// A builtin identity over FP32 [4] that takes `delay_ms` per execution.
fn echo(name: &str, delay_ms: u32, batching: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
{batching}
"#
    )
}

/// An ensemble over FP32 [4] tensors with `inputs`, `outputs` and `steps`.
fn ensemble(name: &str, inputs: &[&str], outputs: &[&str], steps: &[String]) -> String {
    let tensors = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!(r#"{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}"#))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        r#"name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {} ]
output [ {} ]
ensemble_scheduling {{ step [ {} ] }}
"#,
        tensors(inputs),
        tensors(outputs),
        steps.join(", ")
    )
}

/// One step: `model` with (member input, tensor) and (member output, tensor) maps.
fn step(model: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> String {
    let map = |field: &str, pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| format!(r#"{field} {{ key: "{k}" value: "{v}" }}"#))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        r#"{{ model_name: "{model}" model_version: -1 {} {} }}"#,
        map("input_map", inputs),
        map("output_map", outputs)
    )
}

/// The arithmetic DAG: A, B -> (sum, diff) -> (2A, 2B), and sum -> SUM in
/// parallel with the second add_sub.
fn arithmetic() -> String {
    ensemble(
        "arith",
        &["A", "B"],
        &["TWICE_A", "TWICE_B", "SUM"],
        &[
            step(
                "addsub",
                &[("INPUT0", "A"), ("INPUT1", "B")],
                &[("OUTPUT0", "sum"), ("OUTPUT1", "diff")],
            ),
            step(
                "addsub",
                &[("INPUT0", "sum"), ("INPUT1", "diff")],
                &[("OUTPUT0", "TWICE_A"), ("OUTPUT1", "TWICE_B")],
            ),
            step("echo", &[("INPUT0", "sum")], &[("OUTPUT0", "SUM")]),
        ],
    )
}

fn tensor(name: &str, values: &[f32]) -> Value {
    json!({"name": name, "shape": [1, values.len()], "datatype": "FP32", "data": values})
}

async fn infer(url: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .json(body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn output<'a>(reply: &'a Value, name: &str) -> &'a Value {
    reply["outputs"]
        .as_array()
        .and_then(|outputs| outputs.iter().find(|o| o["name"] == name))
        .unwrap_or_else(|| panic!("no output {name} in {reply}"))
}

async fn stats(server: &TestServer, model: &str) -> Value {
    get_json(format!("{}/v2/models/{model}/stats", server.http)).await["model_stats"][0].clone()
}

/// The value of a gauge series of `model` in one scrape, if present.
fn gauge(metrics: &str, gauge: &str, model: &str) -> Option<f64> {
    let series = format!("{gauge}{{model=\"{model}\",version=\"1\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test]
async fn the_dag_answers_with_its_members_arithmetic() {
    let repo = scratch("ensemble-dag");
    write_model(&repo, "addsub", ADD_SUB);
    write_model(&repo, "echo", &echo("echo", 0, ""));
    write_model(&repo, "arith", &arithmetic());
    let server = TestServer::start(&repo, &[]);
    let (a, b) = ([1.0, 2.0, 3.0, 4.0], [0.5, 0.25, -1.0, 10.0]);
    let body = json!({"id": "r-7", "inputs": [tensor("A", &a), tensor("B", &b)]});
    let (status, reply) = infer(&format!("{}/v2/models/arith/infer", server.http), &body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["id"], "r-7");
    assert_eq!(output(&reply, "TWICE_A")["data"], json!([2.0, 4.0, 6.0, 8.0]));
    assert_eq!(output(&reply, "TWICE_B")["data"], json!([1.0, 0.5, -2.0, 20.0]));
    assert_eq!(output(&reply, "SUM")["data"], json!([1.5, 2.25, 2.0, 14.0]));
    assert_eq!(output(&reply, "SUM")["shape"], json!([1, 4]));

    // Asked for one output, the client gets that one.
    let one = json!({"inputs": [tensor("A", &a), tensor("B", &b)], "outputs": [{"name": "SUM"}]});
    let (status, reply) = infer(&format!("{}/v2/models/arith/infer", server.http), &one).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["outputs"].as_array().unwrap().len(), 1);

    // Metadata and statistics: the ensemble's own, and each member's.
    let metadata = get_json(format!("{}/v2/models/arith", server.http)).await;
    assert_eq!(metadata["platform"], "ensemble");
    assert_eq!(metadata["inputs"][0]["shape"], json!([-1, 4]));
    let arith = stats(&server, "arith").await;
    assert_eq!(arith["inference_count"], 2, "{arith}");
    assert_eq!(arith["inference_stats"]["success"]["count"], 2, "{arith}");
    assert_eq!(
        stats(&server, "addsub").await["inference_count"],
        4,
        "two steps per request"
    );
    assert_eq!(stats(&server, "echo").await["inference_count"], 2);
    assert!(server.terminate().success());
}

#[tokio::test]
async fn independent_steps_run_at_the_same_time() {
    let repo = scratch("ensemble-parallel");
    write_model(&repo, "left", &echo("left", 1500, ""));
    write_model(&repo, "right", &echo("right", 1500, ""));
    let fork = ensemble(
        "fork",
        &["IN"],
        &["L", "R"],
        &[
            step("left", &[("INPUT0", "IN")], &[("OUTPUT0", "L")]),
            step("right", &[("INPUT0", "IN")], &[("OUTPUT0", "R")]),
        ],
    );
    write_model(&repo, "fork", &fork);
    let server = TestServer::start(&repo, &[]);
    let url = format!("{}/v2/models/fork/infer", server.http);
    let request = tokio::spawn(async move { infer(&url, &json!({"inputs": [tensor("IN", &[1.0; 4])]})).await });
    // Both members execute in one scrape: the steps overlap. Run one after
    // the other, they never would.
    let metrics = format!("{}/metrics", server.metrics.as_deref().unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        let busy = |model| gauge(&text, "nereid_inference_executing_request_count", model);
        if busy("left") == Some(1.0) && busy("right") == Some(1.0) {
            break;
        }
        assert!(
            !request.is_finished(),
            "the request finished without both steps running at once"
        );
        assert!(tokio::time::Instant::now() < deadline, "the steps never ran together");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, reply) = request.await.unwrap();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(output(&reply, "L")["data"], json!(vec![1.0; 4]));
    assert_eq!(output(&reply, "R")["data"], json!(vec![1.0; 4]));
    assert!(server.terminate().success());
}

#[tokio::test]
async fn a_member_batches_the_ensembles_requests_with_its_direct_callers() {
    let repo = scratch("ensemble-batching");
    // A batch of two forms at once; one request alone would wait 30 s.
    let batching = "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 30000000 }";
    write_model(&repo, "shared", &echo("shared", 0, batching));
    let wrap = ensemble(
        "wrap",
        &["IN"],
        &["OUT"],
        &[step("shared", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")])],
    );
    write_model(&repo, "wrap", &wrap);
    let server = TestServer::start(&repo, &[]);
    let direct = format!("{}/v2/models/shared/infer", server.http);
    let through = format!("{}/v2/models/wrap/infer", server.http);
    let (to_member, to_ensemble) = (
        json!({"inputs": [tensor("INPUT0", &[1.0; 4])]}),
        json!({"inputs": [tensor("IN", &[2.0; 4])]}),
    );
    let (a, b) = tokio::join!(infer(&direct, &to_member), infer(&through, &to_ensemble));
    assert_eq!(a.0, 200, "{}", a.1);
    assert_eq!(b.0, 200, "{}", b.1);
    assert_eq!(a.1["outputs"][0]["data"], json!(vec![1.0; 4]));
    assert_eq!(output(&b.1, "OUT")["data"], json!(vec![2.0; 4]));
    // Two inferences in one execution: the direct request and the step
    // shared one batch.
    let shared = stats(&server, "shared").await;
    assert_eq!(shared["inference_count"], 2, "{shared}");
    assert_eq!(shared["execution_count"], 1, "{shared}");
    assert_eq!(shared["batch_stats"][0]["batch_size"], 2, "{shared}");

    // And under load: 16 direct and 16 ensemble requests, all answered
    // with their own data, in fewer executions than inferences.
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (url, name) = if i % 2 == 0 {
            (&direct, "INPUT0")
        } else {
            (&through, "IN")
        };
        let (url, value) = (url.clone(), i as f32);
        tasks.push(tokio::spawn(async move {
            (
                value,
                infer(&url, &json!({"inputs": [tensor(name, &[value; 4])]})).await,
            )
        }));
    }
    for task in tasks {
        let (value, (status, reply)) = task.await.unwrap();
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["outputs"][0]["data"], json!(vec![value; 4]));
    }
    let shared = stats(&server, "shared").await;
    assert_eq!(shared["inference_count"], 34, "{shared}");
    assert!(shared["execution_count"].as_u64().unwrap() <= 18, "{shared}");
    assert!(server.terminate().success());
}

#[tokio::test]
async fn bad_ensembles_do_not_load_and_say_why() {
    let repo = scratch("ensemble-bad");
    write_model(&repo, "addsub", ADD_SUB);
    write_model(&repo, "echo", &echo("echo", 0, ""));
    let cycle = ensemble(
        "cycle",
        &["IN"],
        &["OUT"],
        &[
            step("echo", &[("INPUT0", "b")], &[("OUTPUT0", "OUT")]),
            step("echo", &[("INPUT0", "OUT")], &[("OUTPUT0", "b")]),
        ],
    );
    let twice = ensemble(
        "twice",
        &["IN"],
        &["OUT"],
        &[
            step("echo", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")]),
            step("echo", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")]),
        ],
    );
    let unread = ensemble(
        "unread",
        &["IN"],
        &["OUT"],
        &[step("echo", &[("INPUT0", "nowhere")], &[("OUTPUT0", "OUT")])],
    );
    let absent = ensemble(
        "absent",
        &["IN"],
        &["OUT"],
        &[step("ghost", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")])],
    );
    for (name, config) in [
        ("cycle", &cycle),
        ("twice", &twice),
        ("unread", &unread),
        ("absent", &absent),
    ] {
        write_model(&repo, name, config);
    }
    let server = TestServer::start(&repo, &[]);
    let index: Value = reqwest::Client::new()
        .post(format!("{}/v2/repository/index", server.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reason = |name: &str| {
        let row = index
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {index}"));
        assert_eq!(row["state"], "UNAVAILABLE", "{row}");
        row["reason"].as_str().unwrap().to_string()
    };
    assert!(
        reason("cycle").contains("the steps form a cycle through step 1 (model 'echo'), step 2 (model 'echo')"),
        "{}",
        reason("cycle")
    );
    assert!(
        reason("twice").contains("tensor 'OUT' is produced more than once"),
        "{}",
        reason("twice")
    );
    assert!(
        reason("unread").contains("step 1 (model 'echo') reads tensor 'nowhere'"),
        "{}",
        reason("unread")
    );
    assert!(
        reason("absent").contains("ensemble 'absent' needs model 'ghost', which did not load"),
        "{}",
        reason("absent")
    );
    // The members and the server are fine.
    let (status, _) = infer(
        &format!("{}/v2/models/echo/infer", server.http),
        &json!({"inputs": [tensor("INPUT0", &[1.0; 4])]}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(server.terminate().success());
}

#[tokio::test]
async fn an_unloaded_member_is_named_and_other_models_keep_serving() {
    let repo = scratch("ensemble-unloaded");
    write_model(&repo, "addsub", ADD_SUB);
    write_model(&repo, "echo", &echo("echo", 0, ""));
    write_model(&repo, "arith", &arithmetic());
    // Explicit mode: loading the ensemble loads its members first.
    let server = TestServer::start(&repo, &["--model-control-mode", "explicit", "--load-model", "arith"]);
    let client = reqwest::Client::new();
    let ready = |model: &str| client.get(format!("{}/v2/models/{model}/ready", server.http)).send();
    assert_eq!(ready("arith").await.unwrap().status(), 200);
    assert_eq!(ready("addsub").await.unwrap().status(), 200, "loaded as a member");
    let unload = client
        .post(format!("{}/v2/repository/models/echo/unload", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(unload.status(), 200);
    // The ensemble is not ready and says which member is missing.
    assert_ne!(ready("arith").await.unwrap().status(), 200);
    let body = json!({"inputs": [tensor("A", &[1.0; 4]), tensor("B", &[1.0; 4])]});
    let (status, reply) = infer(&format!("{}/v2/models/arith/infer", server.http), &body).await;
    assert_eq!(status, 503, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains("ensemble 'arith': step 3 (model 'echo') cannot run: Request for unknown model: 'echo'"),
        "{error}"
    );
    // Its other member still answers directly.
    let (status, _) = infer(
        &format!("{}/v2/models/addsub/infer", server.http),
        &json!({"inputs": [tensor("INPUT0", &[1.0; 4]), tensor("INPUT1", &[1.0; 4])]}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(server.terminate().success());
}

#[tokio::test]
async fn remote_steps_run_in_another_server_and_a_dead_one_is_named() {
    // Server A serves addsub; server B runs the ensemble, whose addsub is a
    // remote model with nothing but an endpoint (its config comes from A).
    let members = scratch("ensemble-remote-a");
    write_model(&members, "addsub", ADD_SUB);
    let a = TestServer::start(&members, &[]);
    let endpoint = a.grpc.trim_start_matches("http://").to_string();

    let front = scratch("ensemble-remote-b");
    let remote = format!(
        r#"name: "addsub"
backend: "remote"
parameters {{ key: "endpoint" value: {{ string_value: "{endpoint}" }} }}
parameters {{ key: "timeout_ms" value: {{ string_value: "20000" }} }}
"#
    );
    write_model(&front, "addsub", &remote);
    write_model(&front, "echo", &echo("echo", 0, ""));
    write_model(&front, "arith", &arithmetic());
    let stray = echo("stray", 0, "")
        .replace("backend: \"identity\"", "backend: \"remote\"")
        .replace(
            "parameters {",
            &format!(
                "parameters {{ key: \"endpoint\" value: {{ string_value: \"{endpoint}\" }} }}\n\
                 parameters {{ key: \"model_name\" value: {{ string_value: \"nope\" }} }}\nparameters {{"
            ),
        );
    write_model(&front, "stray", &stray);
    let b = TestServer::start(&front, &[]);

    let config = get_json(format!("{}/v2/models/addsub/config", b.http)).await;
    assert_eq!(config["backend"], "remote");
    assert_eq!(
        config["max_batch_size"], 8,
        "completed from the remote's config: {config}"
    );
    assert_eq!(config["input"][1]["name"], "INPUT1");

    let (x, y) = ([3.0, 1.0, 4.0, 1.0], [5.0, 9.0, 2.0, 6.0]);
    let body = json!({"id": "remote-1", "inputs": [tensor("A", &x), tensor("B", &y)]});
    let url = format!("{}/v2/models/arith/infer", b.http);
    let (status, reply) = infer(&url, &body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(output(&reply, "TWICE_A")["data"], json!([6.0, 2.0, 8.0, 2.0]));
    assert_eq!(output(&reply, "TWICE_B")["data"], json!([10.0, 18.0, 4.0, 12.0]));
    assert_eq!(output(&reply, "SUM")["data"], json!([8.0, 10.0, 6.0, 7.0]));
    // Both add_sub steps ran on A.
    assert_eq!(stats(&a, "addsub").await["inference_count"], 2);

    // A remote error comes back with its kind and its words: a remote
    // model (declared, so nothing is asked of A at load) that A lacks.
    let (status, reply) = infer(
        &format!("{}/v2/models/stray/infer", b.http),
        &json!({"inputs": [tensor("INPUT0", &[1.0; 4])]}),
    )
    .await;
    assert_eq!(status, 404, "{reply}");
    assert_eq!(
        reply["error"],
        format!("remote model 'nope' at http://{endpoint}: Request for unknown model: 'nope' is not found")
    );

    // A goes away: the step's error names the step and the remote.
    assert!(a.terminate().success());
    let (status, reply) = infer(&url, &body).await;
    assert_eq!(status, 503, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains("in ensemble 'arith', step 1 (model 'addsub') failed: remote model 'addsub' at http://"),
        "{error}"
    );
    // B and its local model keep serving.
    let (status, _) = infer(
        &format!("{}/v2/models/echo/infer", b.http),
        &json!({"inputs": [tensor("INPUT0", &[1.0; 4])]}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(b.terminate().success());
}
