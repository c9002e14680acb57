//! The Prometheus families of nereid-server that other processes read.
//!
//! Names are Triton's (`nv_*`) where Triton has the family, so dashboards
//! and prometheus-adapter rules written for Triton work unchanged; Nereid's
//! own additions start with `nereid_`. Every per-model family has the labels
//! [`MODEL_LABEL`] and [`VERSION_LABEL`].
//!
//! Who reads what:
//!
//! - the operator's scraper (`operator/src/autoscaling/exposition.rs`):
//!   [`QUEUE_LATENCY`]'s duration, [`REQUEST_SUCCESS`], [`INFERENCE_COUNT`],
//!   [`PENDING_REQUEST_COUNT`], [`EXECUTING_REQUEST_COUNT`] and
//!   [`GPU_UTILIZATION`];
//! - the chart's prometheus-adapter rules: the same, but for GPU utilisation.
//!
//! The [`GPU_FAMILIES`] are exported only by a server that sees a GPU (and
//! NVML), as Triton's are; the test that scrapes a real server checks them
//! present or absent by what the machine has.

/// The model a series is about.
pub const MODEL_LABEL: &str = "model";
/// The model version a series is about.
pub const VERSION_LABEL: &str = "version";

/// Successful inference requests (counter).
pub const REQUEST_SUCCESS: &str = "nv_inference_request_success";
/// Failed inference requests (counter), also labelled `reason`.
pub const REQUEST_FAILURE: &str = "nv_inference_request_failure";
/// Inferences performed: a batch of 8 counts 8 (counter).
pub const INFERENCE_COUNT: &str = "nv_inference_count";
/// Model executions performed: a batch counts once (counter).
pub const EXEC_COUNT: &str = "nv_inference_exec_count";
/// Requests waiting in the model's queue now (gauge, Triton's).
pub const PENDING_REQUEST_COUNT: &str = "nv_inference_pending_request_count";
/// Requests in an execution of the model now (gauge, Nereid's).
pub const EXECUTING_REQUEST_COUNT: &str = "nereid_inference_executing_request_count";
/// How long the model version took to load, seconds (gauge).
pub const MODEL_LOAD_DURATION: &str = "nv_model_load_duration_secs";
/// Requests being handled by a front end (gauge, labelled `protocol`; no model).
pub const REQUESTS_IN_FLIGHT: &str = "nereid_requests_in_flight";
/// CPU utilisation of the host, 0 to 1 (gauge; no model).
pub const CPU_UTILIZATION: &str = "nv_cpu_utilization";
/// Total memory of the host, bytes (gauge; no model).
pub const CPU_MEMORY_TOTAL: &str = "nv_cpu_memory_total_bytes";
/// Used memory of the host, bytes (gauge; no model).
pub const CPU_MEMORY_USED: &str = "nv_cpu_memory_used_bytes";
/// The device a GPU series is about, as NVML names it (`GPU-…`).
pub const GPU_UUID_LABEL: &str = "gpu_uuid";
/// Utilisation of one GPU, 0 to 1 (gauge, labelled [`GPU_UUID_LABEL`]; no model).
pub const GPU_UTILIZATION: &str = "nv_gpu_utilization";
/// Total memory of one GPU, bytes (gauge, labelled [`GPU_UUID_LABEL`]).
pub const GPU_MEMORY_TOTAL: &str = "nv_gpu_memory_total_bytes";
/// Used memory of one GPU, bytes (gauge, labelled [`GPU_UUID_LABEL`]).
pub const GPU_MEMORY_USED: &str = "nv_gpu_memory_used_bytes";
/// Power drawn by one GPU, watts (gauge, labelled [`GPU_UUID_LABEL`]).
pub const GPU_POWER_USAGE: &str = "nv_gpu_power_usage";
/// Power management limit of one GPU, watts (gauge, labelled [`GPU_UUID_LABEL`]).
pub const GPU_POWER_LIMIT: &str = "nv_gpu_power_limit";
/// Energy one GPU used since the server started, joules (counter, labelled
/// [`GPU_UUID_LABEL`]).
pub const GPU_ENERGY: &str = "nv_energy_consumption";

/// The families only a server that sees a GPU exports.
pub const GPU_FAMILIES: [&str; 6] = [
    GPU_UTILIZATION,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_POWER_USAGE,
    GPU_POWER_LIMIT,
    GPU_ENERGY,
];

/// The three latency families of one phase of a request, each exported
/// when `--metrics-config` asks for it (the durations by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    /// Cumulative microseconds (counter).
    pub duration: &'static str,
    /// Sliding-window quantiles, microseconds (summary).
    pub summary: &'static str,
    /// Microseconds in buckets (histogram).
    pub histogram: &'static str,
}

/// End-to-end request handling.
pub const REQUEST_LATENCY: Latency = Latency {
    duration: "nv_inference_request_duration_us",
    summary: "nv_inference_request_summary_us",
    histogram: "nv_inference_request_histogram_us",
};
/// Waiting in the scheduling queue: the queue time autoscaling reads.
pub const QUEUE_LATENCY: Latency = Latency {
    duration: "nv_inference_queue_duration_us",
    summary: "nv_inference_queue_summary_us",
    histogram: "nv_inference_queue_histogram_us",
};
/// Preparing the inputs.
pub const COMPUTE_INPUT_LATENCY: Latency = Latency {
    duration: "nv_inference_compute_input_duration_us",
    summary: "nv_inference_compute_input_summary_us",
    histogram: "nv_inference_compute_input_histogram_us",
};
/// Running the model.
pub const COMPUTE_INFER_LATENCY: Latency = Latency {
    duration: "nv_inference_compute_infer_duration_us",
    summary: "nv_inference_compute_infer_summary_us",
    histogram: "nv_inference_compute_infer_histogram_us",
};
/// Handing back the outputs.
pub const COMPUTE_OUTPUT_LATENCY: Latency = Latency {
    duration: "nv_inference_compute_output_duration_us",
    summary: "nv_inference_compute_output_summary_us",
    histogram: "nv_inference_compute_output_histogram_us",
};

/// Every family named here, for checks that a name someone uses is one of
/// them (the chart test).
pub fn all() -> Vec<&'static str> {
    let mut names = vec![
        REQUEST_SUCCESS,
        REQUEST_FAILURE,
        INFERENCE_COUNT,
        EXEC_COUNT,
        PENDING_REQUEST_COUNT,
        EXECUTING_REQUEST_COUNT,
        MODEL_LOAD_DURATION,
        REQUESTS_IN_FLIGHT,
        CPU_UTILIZATION,
        CPU_MEMORY_TOTAL,
        CPU_MEMORY_USED,
    ];
    names.extend(GPU_FAMILIES);
    for latency in [
        REQUEST_LATENCY,
        QUEUE_LATENCY,
        COMPUTE_INPUT_LATENCY,
        COMPUTE_INFER_LATENCY,
        COMPUTE_OUTPUT_LATENCY,
    ] {
        names.extend([latency.duration, latency.summary, latency.histogram]);
    }
    names
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn names_are_unique_and_valid_prometheus_names() {
        let names = all();
        let unique: BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        for name in names {
            assert!(name.starts_with("nv_") || name.starts_with("nereid_"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
        }
    }

    #[test]
    fn latency_families_follow_tritons_pattern() {
        for (phase, latency) in [
            ("request", REQUEST_LATENCY),
            ("queue", QUEUE_LATENCY),
            ("compute_input", COMPUTE_INPUT_LATENCY),
            ("compute_infer", COMPUTE_INFER_LATENCY),
            ("compute_output", COMPUTE_OUTPUT_LATENCY),
        ] {
            assert_eq!(latency.duration, format!("nv_inference_{phase}_duration_us"));
            assert_eq!(latency.summary, format!("nv_inference_{phase}_summary_us"));
            assert_eq!(latency.histogram, format!("nv_inference_{phase}_histogram_us"));
        }
    }
}
