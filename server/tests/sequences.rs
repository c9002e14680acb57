//! Stateful models through the real binary: `accumulate` keeps a running
//! sum per sequence as implicit state. Many interleaved sequences each get
//! their own sums while their requests batch, with either strategy; every
//! misuse of a sequence is a clear error that leaves the others alone.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{TestServer, get_json, scratch, write_model};

/// `accumulate` over INT32 [1]: OUTPUT is the running sum of INPUT.
fn accumulate(name: &str, max_batch: u32, instances: u32, sequence: &str, parameters: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "accumulate"
max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
sequence_batching {{
  {sequence}
  control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
  state [ {{ input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
}}
{parameters}
"#
    )
}

fn start() -> TestServer {
    let repo = scratch("sequences");
    // 2 instances x 32 slots: 64 sequences each hold a slot at once.
    write_model(&repo, "acc_direct", &accumulate("acc_direct", 32, 2, "", ""));
    write_model(
        &repo,
        "acc_oldest",
        &accumulate(
            "acc_oldest",
            16,
            2,
            "oldest { max_candidate_sequences: 64 preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 2000 }",
            "",
        ),
    );
    // One slot, no backlog, a short idle limit, a string CORRID.
    write_model(
        &repo,
        "acc_tight",
        &accumulate(
            "acc_tight",
            1,
            1,
            r#"max_sequence_idle_microseconds: 300000
               control_input [ { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]"#,
            r#"parameters { key: "max_sequence_backlog" value: { string_value: "0" } }"#,
        ),
    );
    TestServer::start(&repo, &[])
}

/// One request of a sequence; the status and the JSON answer.
async fn step(
    client: &reqwest::Client,
    http: &str,
    model: &str,
    id: Value,
    value: i32,
    flags: (bool, bool),
) -> (u16, Value) {
    let body = json!({
        "parameters": {"sequence_id": id, "sequence_start": flags.0, "sequence_end": flags.1},
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
    });
    let response = client
        .post(format!("{http}/v2/models/{model}/infer"))
        .json(&body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn sum_of(answer: &Value) -> i64 {
    answer["outputs"][0]["data"][0]
        .as_i64()
        .unwrap_or_else(|| panic!("no sum in {answer}"))
}

/// Runs `sequences` interleaved sequences of `steps` requests each against
/// `model` and checks every running sum.
async fn interleaved(server: &TestServer, model: &str, sequences: u64, steps: i32) {
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for id in 1..=sequences {
        let client = client.clone();
        let http = server.http.clone();
        let model = model.to_string();
        tasks.push(tokio::spawn(async move {
            let mut expected = 0i64;
            let mut sums = Vec::new();
            for s in 0..steps {
                let value = (id as i32) * 1000 + s;
                expected += i64::from(value);
                let flags = (s == 0, s == steps - 1);
                let (status, answer) = step(&client, &http, &model, json!(id), value, flags).await;
                assert_eq!(status, 200, "{answer}");
                sums.push((sum_of(&answer), expected));
            }
            sums
        }));
    }
    for task in tasks {
        for (got, expected) in task.await.unwrap() {
            assert_eq!(got, expected);
        }
    }
}

/// (inference_count, execution_count, largest batch) of a model.
async fn batching(server: &TestServer, model: &str) -> (u64, u64, u64) {
    let stats = get_json(format!("{}/v2/models/{model}/stats", server.http)).await;
    let s = &stats["model_stats"][0];
    let largest = s["batch_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch_size"].as_u64().unwrap())
        .max()
        .unwrap_or(0);
    (
        s["inference_count"].as_u64().unwrap(),
        s["execution_count"].as_u64().unwrap(),
        largest,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleaved_sequences_keep_their_own_sums_and_batch() {
    let server = start();
    for model in ["acc_direct", "acc_oldest"] {
        interleaved(&server, model, 64, 12).await;
        let (inferences, executions, largest) = batching(&server, model).await;
        assert_eq!(inferences, 64 * 12, "{model}");
        assert!(
            executions < inferences,
            "{model}: {executions} executions for {inferences} requests"
        );
        assert!(largest > 1, "{model}: no batch held more than one request");
    }
}

#[tokio::test]
async fn misuse_of_a_sequence_is_a_clear_error() {
    let server = start();
    let client = reqwest::Client::new();
    let c = &client;
    let s = &server;
    let h = server.http.as_str();
    let error = |answer: &Value| answer["error"].as_str().unwrap_or_default().to_string();

    // No id, an unknown sequence, a batch of two.
    let body = json!({"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]});
    let answer = support::post_json(format!("{}/v2/models/acc_direct/infer", s.http), &body).await;
    assert!(
        error(&answer).contains("must specify a non-zero or non-empty correlation ID"),
        "{answer}"
    );
    let (status, answer) = step(c, h, "acc_direct", json!(77), 1, (false, false)).await;
    assert_eq!(status, 400);
    assert!(
        error(&answer).contains("must specify the START flag on the first request"),
        "{answer}"
    );
    let two = json!({
        "parameters": {"sequence_id": 5, "sequence_start": true},
        "inputs": [{"name": "INPUT", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]}],
    });
    let answer = support::post_json(format!("{}/v2/models/acc_direct/infer", s.http), &two).await;
    assert!(error(&answer).contains("must specify batch-size 1"), "{answer}");

    // END, then END again without a START.
    assert_eq!(step(c, h, "acc_direct", json!(8), 5, (true, false)).await.0, 200);
    let (_, answer) = step(c, h, "acc_direct", json!(8), 1, (false, true)).await;
    assert_eq!(sum_of(&answer), 6);
    let (status, answer) = step(c, h, "acc_direct", json!(8), 1, (false, true)).await;
    assert_eq!(status, 400);
    assert!(error(&answer).contains("must specify the START flag"), "{answer}");

    // CORRID is a string here: a numeric id is refused.
    let (status, answer) = step(c, h, "acc_tight", json!(3), 1, (true, false)).await;
    assert_eq!(status, 400);
    assert!(error(&answer).contains("must be a string"), "{answer}");
    // One slot and no backlog: a second live sequence is refused.
    assert_eq!(step(c, h, "acc_tight", json!("a"), 2, (true, false)).await.0, 200);
    let (status, answer) = step(c, h, "acc_tight", json!("b"), 2, (true, false)).await;
    assert_eq!(status, 503);
    assert!(error(&answer).contains("no free sequence slot"), "{answer}");
    // Its release after the idle limit, and what a late request of it is
    // told, are tested on paused time in nereid-core
    // (sequence_batcher/paused_tests.rs).

    // The other models' sequences never noticed.
    let (_, answer) = step(c, h, "acc_direct", json!(9), 4, (true, false)).await;
    assert_eq!(sum_of(&answer), 4);
    let (_, answer) = step(c, h, "acc_direct", json!(9), 4, (false, true)).await;
    assert_eq!(sum_of(&answer), 8);
}
