//! The Helm chart and the shipped Grafana dashboard name the server's
//! metric families in YAML and JSON, where the contract constants
//! (`nereid_proto::contract::metrics`) cannot reach: this reads every chart
//! template, the values and the dashboards, and checks each family-like
//! name they use is one the contract defines (or one of the operator's own
//! external metric names), so a renamed or misspelt family fails here
//! rather than in a cluster whose autoscaler never scales.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nereid_crds::AutoscalingMetric;
use nereid_proto::contract::metrics;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The chart's sources (`values.yaml` and everything under `templates/`)
/// and the dashboards under `deploy/grafana/`.
fn files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let chart = repo().join("charts/nereid");
    let mut files = vec![chart.join("values.yaml")];
    walk(&chart.join("templates"), &mut files);
    walk(&repo().join("deploy/grafana"), &mut files);
    files.sort();
    files
}

/// Every word that starts with `prefix` (letters, digits and `_` after it).
fn words_with_prefix<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut words = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let start = &rest[at..];
        let len = start
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(start.len());
        // Only whole words: `xnv_` is not a family.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            words.push(&start[..len]);
        }
        rest = &start[len..];
    }
    words
}

#[test]
fn every_family_the_chart_and_dashboards_name_is_in_the_contract() {
    let families = metrics::all();
    // A histogram's or summary's series carry a suffix.
    let known = |word: &str| {
        families.iter().any(|family| {
            word.strip_prefix(family)
                .is_some_and(|rest| ["", "_bucket", "_sum", "_count"].contains(&rest))
        })
    };
    let external: BTreeSet<&str> = AutoscalingMetric::ALL.iter().map(|m| m.external_name()).collect();
    // Not metrics: the operator's log target in a RUST_LOG example.
    let other = ["nereid_operator"];
    let mut used = BTreeSet::new();
    for file in files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for word in words_with_prefix(&text, "nv_") {
            assert!(
                known(word),
                "{}: {word} is not a family of nereid_proto::contract::metrics",
                file.display()
            );
            used.insert(word.to_string());
        }
        for word in words_with_prefix(&text, "nereid_") {
            assert!(
                known(word) || external.contains(word) || other.contains(&word),
                "{}: {word} is neither a server family of the contract nor an external metric name",
                file.display()
            );
        }
    }
    // The check reads something: the adapter rules and the dashboard use
    // the queue time, the dashboard the compute time.
    assert!(used.contains(metrics::QUEUE_LATENCY.duration), "{used:?}");
    assert!(used.contains(metrics::COMPUTE_INFER_LATENCY.duration), "{used:?}");
}

#[test]
fn the_word_finder_takes_whole_words_only() {
    assert_eq!(
        words_with_prefix("rate(nv_inference_count{a}) xnv_no nv_gpu_utilization", "nv_"),
        ["nv_inference_count", "nv_gpu_utilization"]
    );
}
