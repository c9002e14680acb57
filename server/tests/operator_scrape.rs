//! The operator scales models on what it reads from their pods' /metrics.
//! A family it reads and the server never exports is a silent failure: the
//! autoscaler sees zero forever. This starts a real nereid-server, serves
//! one request so the per-model series exist, and reads the scrape with the
//! operator's own reader (`nereid_operator::autoscaling::exposition`): every
//! family the operator reads must be there, and every family of the
//! contract (`nereid_proto::contract::metrics`) with it. The GPU families
//! are there exactly when this machine has a GPU the server can read; the
//! operator's reader then finds a utilisation, and none without.

mod support;

use nereid_operator::autoscaling::exposition;
use nereid_proto::contract::metrics;
use serde_json::json;
use support::{TestServer, scratch, write_model};

const ADD_SUB: &str = r#"
backend: "add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
"#;

#[tokio::test]
async fn the_operator_reads_every_family_it_needs_from_a_real_server() {
    let repo = scratch("operator-scrape");
    write_model(&repo, "add_sub", ADD_SUB);
    // Summaries and histograms too, so every latency family of the contract shows.
    let server = TestServer::start(
        &repo,
        &[
            "--metrics-config",
            "summary_latencies=true",
            "--metrics-config",
            "histogram_latencies=true",
            // Triton's default, said aloud: it must not fail without a GPU.
            "--allow-gpu-metrics",
            "true",
        ],
    );
    let input = |name: &str| json!({"name": name, "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]});
    let answer = reqwest::Client::new()
        .post(format!("{}/v2/models/add_sub/infer", server.http))
        .json(&json!({"inputs": [input("INPUT0"), input("INPUT1")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());

    let url = format!("{}/metrics", server.metrics.as_deref().expect("metrics are served"));
    let text = reqwest::get(&url).await.unwrap().text().await.unwrap();

    // The operator's reader takes the whole scrape, and sees the request.
    let sample = exposition::parse(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert_eq!((sample.requests, sample.inferences), (1.0, 1.0), "{text}");
    let names = exposition::sample_names(&text).unwrap();

    // Every family the operator reads is exported; the GPU ones where the
    // server has a GPU to read (NVML as well as the driver).
    let gpus = nereid_gpu::Gpus::discover();
    let has_gpu_metrics = nereid_gpu::GpuMonitor::open(&gpus).is_ok();
    let expected = |family: &str| has_gpu_metrics || !metrics::GPU_FAMILIES.contains(&family);
    for family in exposition::FAMILIES {
        assert_eq!(
            names.contains(family),
            expected(family),
            "the operator reads {family}; exported is wrong for a machine with{} GPU metrics:\n{text}",
            if has_gpu_metrics { "" } else { "out" }
        );
    }
    assert_eq!(sample.gpu_percent.is_some(), has_gpu_metrics, "{text}");

    // And the whole contract: a summary or histogram shows as its parts.
    let exported = |family: &str| {
        names
            .iter()
            .any(|n| *n == family || n.strip_prefix(family).is_some_and(|rest| rest.starts_with('_')))
    };
    for family in metrics::all() {
        assert_eq!(
            exported(family),
            expected(family),
            "{family} of the contract: exported is wrong for a machine with{} GPU metrics:\n{text}",
            if has_gpu_metrics { "" } else { "out" }
        );
    }
    assert!(server.terminate().success());
}
